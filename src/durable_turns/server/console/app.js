// durable_turns web console. Plain JavaScript, no build step, no library, nothing fetched from
// anywhere but this server's public routes (see the README's "Web console" section).
//
// A session's page is a snapshot (GET …/timeline, which says up to which event `seq` it is)
// followed by the session's event stream from that cursor (EventSource on …/events?after=seq).
// Durable events after the snapshot make the page fetch a new snapshot; live text deltas are
// shown as they come. So a reload (a new snapshot, a new cursor) or a dropped connection (the
// browser reconnects with Last-Event-ID) shows every row once: rows only ever come from a
// snapshot.
"use strict";
(() => {
  const view = document.getElementById("view");
  let page = null; // what the current view holds open: {close()}

  const {
    ME, app, el, json, badge, enc, sessionPath, me, idempotencyKey, ApiError, api, explain,
    notice, ago, took, whoMay,
  } = window.DurableConsole;
  const DC = window.DurableConsole; // and timetravel.js's views

  // -- answering a parked turn -------------------------------------------------------------

  const answeredAlready = (e) => e instanceof ApiError && e.status === 409 &&
    /answered already/.test(e.message);

  // A form for `request`: Approve / Deny for a boolean, else fields built from its JSON schema.
  // Once the request is answered (here, or as a refusal says, elsewhere) its buttons stay off;
  // `form.settle()` turns them off from outside (an inbox card whose request went away).
  function answerForm(request, send) {
    const schema = request.schema || {};
    const out = el("div", { class: "outcome" });
    const buttons = [];
    let settled = false;
    function settle() {
      settled = true;
      buttons.forEach((b) => { b.disabled = true; });
    }
    async function submit(value) {
      if (settled) return;
      buttons.forEach((b) => { b.disabled = true; });
      out.replaceChildren(el("span", { class: "muted", text: "Answering…" }));
      try {
        out.replaceChildren(await send(value));
        settle();
      } catch (e) {
        out.replaceChildren(notice("error", explain(e)));
        if (answeredAlready(e)) settle();
      } finally {
        if (!settled) buttons.forEach((b) => { b.disabled = false; });
      }
    }
    const done = (form) => Object.assign(el("div", { class: "answer" }, form, out), { settle });
    if (schema.type === "boolean") {
      buttons.push(el("button", { type: "button", onclick: () => submit(true), text: "Approve" }),
        el("button", { type: "button", class: "danger", onclick: () => submit(false),
          text: "Deny" }));
      return done(el("form", { onsubmit: (ev) => ev.preventDefault() }, buttons));
    }
    const fields = [];
    const props = schema.type === "object" && schema.properties ? schema.properties : null;
    const entries = props ? Object.entries(props) : [["value", schema]];
    const required = new Set(schema.required || []);
    for (const [name, s] of entries) {
      let input;
      if (Array.isArray(s.enum)) {
        input = el("select", { name }, s.enum.map((v) => el("option", { value: JSON.stringify(v),
          text: String(v) })));
      } else if (s.type === "boolean") {
        input = el("input", { type: "checkbox", name });
      } else if (s.type === "integer" || s.type === "number") {
        input = el("input", { type: "number", name, step: s.type === "integer" ? "1" : "any",
          required: !props || required.has(name) });
      } else if (s.type === "string") {
        input = el("input", { type: "text", name, required: !props || required.has(name) });
      } else {
        input = el("textarea", { name, rows: "3", placeholder: "JSON" });
      }
      fields.push({ name, s, input });
    }
    function read() {
      const values = {};
      for (const { name, s, input } of fields) {
        if (Array.isArray(s.enum)) values[name] = JSON.parse(input.value);
        else if (s.type === "boolean") values[name] = input.checked;
        else if (s.type === "integer" || s.type === "number") {
          if (input.value !== "") values[name] = Number(input.value);
        } else if (s.type === "string") {
          if (input.value !== "" || !props) values[name] = input.value;
        } else if (input.value.trim() !== "") values[name] = JSON.parse(input.value);
        else if (!props) values[name] = null;
      }
      return props ? values : values.value;
    }
    const go = el("button", { type: "submit", text: "Answer" });
    buttons.push(go);
    const form = el("form", {
      onsubmit: (ev) => {
        ev.preventDefault();
        let value;
        try { value = read(); } catch (e) {
          out.replaceChildren(notice("error", `That is not JSON: ${e.message}`));
          return;
        }
        submit(value);
      },
    }, fields.map(({ name, s, input }) => el("label", {},
      el("span", { text: `${s.title || name}${props && required.has(name) ? " *" : ""}` }),
      input)), go);
    return done(form);
  }

  function resumeOutcome(result) {
    if (result.status === "completed") return notice("ok", `Answered: the turn completed. ${result.text || ""}`);
    if (result.status === "suspended") return notice("ok", `Answered: the turn is waiting again (${result.request.prompt}).`);
    if (result.status === "failed") return notice("error", `Answered, but the turn failed: ${result.error}`);
    if (result.status === "cancelled") return notice("error", `Answered, but the turn was cancelled: ${result.reason}`);
    return notice("ok", `Answered: the turn is ${result.status}.`);
  }

  function resume(agent, session, request) {
    return async (value) => {
      const result = await api(`${sessionPath(agent, session)}/resume`, {
        turn_id: request.turn_id, input_id: request.input_id, value, by: me(),
      });
      updateCount();
      return resumeOutcome(result);
    };
  }

  // -- the inbox ---------------------------------------------------------------------------

  async function inboxItems() {
    const lists = await Promise.all(app.agents.map(async (a) => {
      const got = await api(`/agents/${enc(a.agent)}/pending`);
      // A parallel batch may park on several calls at once (F15): each is its own card.
      // A sleep (F24) is parked too, but only the clock answers it: not a card.
      return got.pending.flatMap((p) => [p.request, ...(p.request.more || [])]
        .filter((request) => !request.sleep)
        .map((request) => ({ agent: a.agent, ...p, request })));
    }));
    return lists.flat();
  }

  // A request's deadline and reminders (F24), in words: empty for one that has neither.
  function deadlineOf(request) {
    const parts = [];
    if (request.expires) {
      parts.push(`Answer by ${new Date(request.expires).toLocaleString()}, else: ` +
        JSON.stringify(request.default === undefined ? null : request.default));
    }
    if (request.remind_every) {
      parts.push(`reminded every ${Math.round(request.remind_every / 60)} min`);
    }
    return parts.join("; ");
  }

  async function updateCount() {
    try {
      const n = (await inboxItems()).length;
      document.getElementById("inbox-count").textContent = n ? String(n) : "";
    } catch (_) { /* the page shows its own error */ }
  }

  function showInbox() {
    const list = el("div", { id: "inbox" });
    const status = el("div");
    view.replaceChildren(el("h1", { text: "Inbox" }),
      el("p", { class: "muted", text: "Turns parked until a person answers." }), status, list);
    const cards = new Map();
    async function load() {
      let items;
      try { items = await inboxItems(); } catch (e) {
        status.replaceChildren(notice("error", explain(e)));
        return;
      }
      status.replaceChildren();
      document.getElementById("inbox-count").textContent = items.length ? String(items.length) : "";
      const seen = new Set();
      for (const it of items) {
        const key = `${it.agent}/${it.session}/${it.request.turn_id}/${it.request.input_id}`;
        seen.add(key);
        if (cards.has(key)) continue;
        const form = answerForm(it.request, resume(it.agent, it.session, it.request));
        const card = el("div", { class: "card request", "data-session": it.session },
          el("div", {}, el("a", { href: `#/s/${enc(it.agent)}/${enc(it.session)}`,
            text: `${it.agent} / ${it.session}` })),
          el("div", { class: "prompt", text: it.request.prompt }),
          el("div", { class: "muted answerers", text: whoMay(it.request.answerers) }),
          el("div", { class: "muted deadline", text: deadlineOf(it.request) }),
          el("div", { class: "gone" }), form);
        cards.set(key, { card, form });
        list.append(card);
      }
      for (const [key, { card, form }] of cards) {
        if (seen.has(key)) continue;
        // Left in place (its outcome may still matter), said to be gone, its buttons off.
        form.settle();
        card.querySelector(".gone").replaceChildren(
          el("span", { class: "muted", text: "No longer waiting (answered, or reset)." }));
      }
      if (!cards.size) list.replaceChildren(el("p", { class: "muted", text: "Nothing is waiting." }));
    }
    load();
    const timer = setInterval(load, 5000);
    return { close: () => clearInterval(timer) };
  }

  // -- agents and their sessions -----------------------------------------------------------

  function showSessions(filter) {
    const tables = el("div");
    const select = el("select", {
      id: "status-filter",
      onchange: () => { location.hash = select.value ? `#/?status=${select.value}` : "#/"; },
    }, ["", "new", "idle", "running", "suspended"].map((s) => el("option", { value: s,
      text: s || "every status", selected: s === filter })));
    const agentPick = el("select", { name: "agent" },
      app.agents.map((a) => el("option", { value: a.agent, text: a.agent })));
    const sid = el("input", { name: "session", placeholder: "session id", required: true });
    const open = el("form", {
      class: "toolbar",
      onsubmit: (ev) => {
        ev.preventDefault();
        location.hash = `#/s/${enc(agentPick.value)}/${enc(sid.value.trim())}`;
      },
    }, "Open or start a session:", agentPick, sid, el("button", { type: "submit", text: "Open" }));
    view.replaceChildren(el("h1", { text: "Sessions" }),
      el("div", { class: "toolbar" }, el("label", {}, "Show ", select)), open, tables);
    async function load() {
      const parts = [];
      for (const a of app.agents) {
        let sessions;
        try { sessions = (await api(`/agents/${enc(a.agent)}/sessions`)).sessions; } catch (e) {
          parts.push(notice("error", explain(e)));
          continue;
        }
        // Most recently active first; sessions with no activity yet keep the server's order
        // (newest first) after them.
        const order = new Map(sessions.map((s, i) => [s.session, i]));
        sessions.sort((x, y) => (y.last_activity ?? -1) - (x.last_activity ?? -1) ||
          order.get(x.session) - order.get(y.session));
        const shown = sessions.filter((s) => !filter || s.status === filter);
        parts.push(el("h2", { text: a.agent }), shown.length ? el("table", { class: "sessions" },
          el("thead", {}, el("tr", {}, el("th", { text: "session" }), el("th", { text: "status" }),
            el("th", { text: "last activity" }))),
          el("tbody", {}, shown.map((s) => el("tr", { "data-session": s.session },
            el("td", {}, el("a", { href: `#/s/${enc(a.agent)}/${enc(s.session)}`,
              text: s.session })),
            el("td", {}, badge(s.status)),
            el("td", { class: "muted", text: ago(s.last_activity) })))))
          : el("p", { class: "muted", text: filter ? `No ${filter} session.` : "No session yet." }));
      }
      tables.replaceChildren(...parts);
    }
    load();
    const timer = setInterval(load, 5000);
    return { close: () => clearInterval(timer) };
  }

  // -- one session -------------------------------------------------------------------------

  function showSession(agent, session) {
    if (!app.agents.some((a) => a.agent === agent)) {
      // Nothing to start, cancel or reset here: say so, and offer what is served.
      const served = app.agents.map((a) => `“${a.agent}”`).join(", ") || "none";
      view.replaceChildren(
        el("h1", {}, el("a", { href: "#/", text: "Sessions" }), " / ", agent, " / ", session),
        el("div", { id: "session-notice" }, notice("error",
          `There is no agent “${agent}” here; the agents served are: ${served}.`)));
      return { close: () => {} };
    }
    const base = sessionPath(agent, session);
    const s = { snap: null, live: null, fetching: false, again: false, closed: false,
      tab: "transcript", es: null, opened: new Set(), last: 20, sending: null,
      forms: new Map(), places: null };
    const title = el("span", { id: "session-status" });
    const body = el("div", { id: "turns" });
    const status = el("div", { id: "session-notice" });
    const tabs = {};
    for (const [name, label] of [["transcript", "Transcript"], ["timeline", "Timeline"]]) {
      tabs[name] = el("button", { type: "button", class: "secondary", id: `tab-${name}`,
        "aria-pressed": String(name === s.tab),
        onclick: () => { s.tab = name; render(); if (name === "timeline") refresh(); } }, label);
    }
    const text = el("textarea", { id: "ask", name: "text", placeholder: "Ask the agent…",
      required: true, rows: "2" });
    const send = el("button", { type: "submit", text: "Send" });
    const cancel = el("button", { type: "button", class: "danger", id: "cancel",
      text: "Cancel", onclick: doCancel });
    const reset = el("button", { type: "button", class: "secondary", id: "reset",
      text: "Reset", onclick: doReset });
    view.replaceChildren(
      el("h1", {}, el("a", { href: "#/", text: agent }), " / ", session, " ", title),
      el("div", { class: "toolbar" }, tabs.transcript, tabs.timeline, cancel, reset),
      DC.replayForm(agent, session, status), status, body,
      el("form", { class: "ask", onsubmit: doSend }, text, send));

    async function doSend(ev) {
      ev.preventDefault();
      const t = text.value.trim();
      if (!t) return;
      send.disabled = true;
      status.replaceChildren();
      // A send that got no answer (the server or its store away) is sent again with its
      // Idempotency-Key: the server starts its turn once, however often it is sent.
      if (!s.sending || s.sending.text !== t) s.sending = { text: t, key: idempotencyKey() };
      try {
        // Accepted (durably) once the answer's headers come; the turn goes on without us.
        // While a turn runs, the message steers it: it joins before its next model call.
        const steer = s.snap && s.snap.status === "running" ? "?mode=steer" : "";
        await api(`${base}/turn${steer}`, { text: t, by: me() }, "headers",
          { "Idempotency-Key": s.sending.key });
        s.sending = null;
        text.value = "";
      } catch (e) {
        status.replaceChildren(notice("error", explain(e)));
      } finally {
        send.disabled = false;
        refresh();
      }
    }

    async function doCancel() {
      try {
        const got = await api(`${base}/cancel`, { reason: "cancelled from the console" });
        status.replaceChildren(notice("ok", got.cancelled.length ?
          `Cancelling ${got.cancelled.length} turn(s); they stop at their next checkpoint.` :
          "Nothing to cancel."));
      } catch (e) { status.replaceChildren(notice("error", explain(e))); }
    }

    let resetArmed = null;
    async function doReset() {
      if (!resetArmed) { // a second click confirms: a reset archives the whole history
        reset.textContent = "Confirm reset";
        resetArmed = setTimeout(() => { resetArmed = null; reset.textContent = "Reset"; }, 4000);
        return;
      }
      clearTimeout(resetArmed);
      resetArmed = null;
      reset.textContent = "Reset";
      try {
        const got = await api(`${base}/reset`, {});
        status.replaceChildren(notice("ok", `Reset: the history is archived as ${got.previous_session}.`));
      } catch (e) { status.replaceChildren(notice("error", explain(e))); }
      refresh();
    }

    async function doRetry(turnId) {
      status.replaceChildren();
      try {
        await api(`${base}/retry`, { turn_id: turnId });
        status.replaceChildren(notice("ok", "Retrying: the turn goes on from the step that failed."));
      } catch (e) { status.replaceChildren(notice("error", explain(e))); }
      refresh();
    }

    async function refresh() {
      if (s.fetching) { s.again = true; return; }
      s.fetching = true;
      try {
        const snap = await api(`${base}/timeline${s.last ? `?last=${s.last}` : ""}`);
        if (s.closed) return;
        // The timeline's "Fork from here" needs each step's checkpoint (a new session has none).
        if (s.tab === "timeline" && snap.turns.length) {
          try { s.places = await DC.places(agent, session); } catch (_) { s.places = null; }
        }
        if (s.closed) return;
        s.snap = snap;
        if (s.live && s.live.seq < snap.seq) s.live = null;
        // A stream the browser gave up on (its reconnect met a 503 while the store was
        // away) is followed again from the snapshot's cursor. A session not started yet has
        // no stream (a 404): it is followed from the snapshot after its first turn.
        if (snap.exists && (!s.es || s.es.readyState === EventSource.CLOSED)) {
          follow(snap.seq);
          updateCount(); // what the snapshot holds (a park, say) the stream will not repeat
        }
        render();
      } catch (e) {
        status.replaceChildren(notice("error", explain(e)));
      } finally {
        s.fetching = false;
        if (s.again && !s.closed) { s.again = false; refresh(); }
      }
    }

    function follow(after) {
      s.es = new EventSource(`${base}/events?after=${after}`);
      const durable = ["turn.started", "message.completed", "message.steered", "context.compacted",
        "action.requested", "action.completed", "action.in_doubt", "input.requested", "turn.completed",
        "turn.failed", "turn.cancelled", "input.reminder", "input.expired", "turn.sleeping"];
      const inbox = new Set(["input.requested", "turn.completed", "turn.failed",
        "turn.cancelled", "input.reminder", "input.expired"]);
      for (const type of durable) {
        s.es.addEventListener(type, (ev) => {
          const e = JSON.parse(ev.data);
          if (s.snap && e.seq <= s.snap.seq) return; // already in the snapshot
          if (inbox.has(type)) updateCount(); // a park (or its end) changes the inbox
          refresh();
        });
      }
      s.es.addEventListener("message.delta", (ev) => {
        const e = JSON.parse(ev.data);
        // A delta carries the seq of the last durable event before it: older than the
        // snapshot means its message is in the snapshot already.
        if (s.snap && e.seq < s.snap.seq) return;
        if (!s.live || s.live.seq !== e.seq || s.live.turn !== e.turn_id) {
          s.live = { seq: e.seq, turn: e.turn_id, text: "" };
        }
        s.live.text += e.text;
        render();
      });
      s.es.addEventListener("message.retry", (ev) => {
        const e = JSON.parse(ev.data);
        status.replaceChildren(notice("error", `The model call failed (${e.error}); retrying in ${e.delay.toFixed(1)} s.`));
      });
    }

    function render() {
      const snap = s.snap;
      if (!snap) return;
      for (const [name, b] of Object.entries(tabs)) b.setAttribute("aria-pressed", String(name === s.tab));
      send.textContent = snap.status === "running" ? "Steer" : "Send";
      title.replaceChildren(badge(snap.status),
        snap.generation ? el("span", { class: "muted", text: ` generation ${snap.generation}` }) : "");
      const turns = snap.turns.map((t) => (s.tab === "timeline" ?
        DC.timelineTurn(t, { agent, session, at: s.places, status, usageText }) :
        transcriptTurn(t)));
      if (s.live && !snap.turns.some((t) => t.turn_id === s.live.turn)) {
        turns.push(liveBubble());
      }
      if (snap.earlier) {
        turns.unshift(el("p", { class: "muted", id: "earlier" },
          `${snap.earlier} earlier turn(s) not shown. `,
          el("button", { type: "button", class: "secondary",
            onclick: () => { s.last = null; refresh(); } }, "Show them")));
      }
      body.replaceChildren(...(turns.length ? turns :
        [el("p", { class: "muted", text: "No turn yet: ask something below." })]));
    }

    function liveBubble() {
      return el("div", { class: "msg assistant streaming", "data-role": "streaming" },
        el("span", { class: "who", text: "assistant (streaming)" }), s.live.text);
    }

    function transcriptTurn(t) {
      const rows = [el("div", { class: "msg user", "data-role": t.role },
        el("span", { class: "who", text: t.role === "trigger" ? `trigger · ${t.by || ""}` : (t.by || "user") }),
        t.text)];
      for (const step of t.steps) {
        if (step.kind === "model" && step.status === "done") {
          if (step.thinking && step.thinking.length) {
            rows.push(el("details", { class: "thinking" }, el("summary", { text: "thinking" }),
              step.thinking.join("\n\n")));
          }
          if (step.text) {
            rows.push(el("div", { class: "msg assistant", "data-role": "assistant" },
              el("span", { class: "who", text: "assistant" }), step.text));
          }
        } else if (step.kind === "model" && step.status === "failed") {
          rows.push(el("div", { class: "tool failed", "data-role": "model-failed" },
            el("span", { class: "label", text: `model call failed: ${step.error}` })));
        } else if (step.kind === "tool") {
          rows.push(toolRow(step));
        } else if (step.kind === "input") {
          rows.push(inputRow(t, step));
        } else if (step.kind === "compact") {
          rows.push(compactRow(step));
        } else if (step.kind === "steered") {
          // Sent while the turn ran: it joined the turn before its next model call (F25).
          rows.push(el("div", { class: "msg user", "data-role": "steered" },
            el("span", { class: "who", text: `${step.by || "user"} · steered` }), step.text));
        }
      }
      if (s.live && s.live.turn === t.turn_id) rows.push(liveBubble());
      rows.push(turnEnd(t));
      return el("section", { class: "turn", "data-turn": t.turn_id }, rows);
    }

    function toolRow(step) {
      const failed = step.status === "error" || step.status === "failed";
      // A row the person opened stays open when the page renders again.
      const key = `${step.call_id}:${step.resumed}`;
      return el("details", { class: `tool ${step.status}`, "data-role": "tool",
        "data-call": step.call_id, open: failed || s.opened.has(key),
        ontoggle: (ev) => { if (ev.target.open) s.opened.add(key); else s.opened.delete(key); } },
      el("summary", {}, el("span", { class: "label", text: `${step.resumed ? "↻ " : ""}${step.name}` }),
        " ", badge(step.status), " ", el("span", { class: "muted", text: took(step.duration) }),
        step.in_doubt ? [" ", el("span", { class: "muted", "data-role": "in-doubt",
          text: inDoubt(step.in_doubt) })] : ""),
      el("div", { class: "muted", text: "input" }), el("pre", { text: json(step.input) }),
      step.status === "queued" || step.status === "running" || step.status === "parked" ? "" :
        [el("div", { class: "muted", text: failed ? "error" : "result" }),
          el("pre", { class: "result", text: failed && step.error ? step.error : json(step.result) })]);
    }

    // Where the session was compacted (F23): the tokens before and after, and the summary
    // later model calls are sent instead of the messages before it, to read.
    function compactRow(step) {
      const what = step.summarised ? `messages before #${step.covered} summarised` +
        (step.summary_calls > 1 ? ` in ${step.summary_calls} parts` : "") :
        `tool results before #${step.cleared} cleared`;
      return el("details", { class: "tool compaction", "data-role": "compaction" },
        el("summary", {}, el("span", { class: "label", text: "context compacted" }),
          ` ${step.tokens_before} → ${step.tokens_after} tokens · ${what}`),
        step.summary ? [el("div", { class: "muted", text: "summary" }),
          el("pre", { class: "summary", text: step.summary })] :
          el("div", { class: "muted", text: "the store keeps every message whole" }));
    }

    // A call found in doubt on a replay (F26), and how it was settled.
    function inDoubt(d) {
      const words = { run: "run again", skipped: "not run again", reconciled: "it had run (reconciled)" };
      return `in doubt (attempt ${d.attempt}): ${words[d.settled] || "may have run; asking"}`;
    }

    function inputRow(t, step) {
      const request = { input_id: step.id.split(":").slice(2).join(":"), turn_id: t.turn_id,
        prompt: step.prompt, schema: step.schema, answerers: step.answerers };
      const box = el("div", { class: "request", "data-role": "input" },
        el("div", { class: "prompt", text: step.prompt }),
        el("div", { class: "muted", text: whoMay(step.answerers) }));
      if (step.status === "answered") {
        box.append(el("div", {}, badge("answered"), ` ${JSON.stringify(step.value)}` +
          (step.by ? ` by ${step.by}` : "")));
      } else if (t.status === "suspended") {
        // One form per request for the page's life: a render (every snapshot) moves it
        // rather than making a new one, so what it says (a refusal explained) stays.
        const key = `${t.turn_id}/${request.input_id}`;
        if (!s.forms.has(key)) {
          s.forms.set(key, answerForm(request, async (value) => {
            const out = await resume(agent, session, request)(value);
            refresh();
            return out;
          }));
        }
        box.append(s.forms.get(key));
      } else {
        box.append(badge(t.status));
      }
      return box;
    }

    function usageText(u) {
      const parts = Object.entries(u || {}).map(([k, v]) => `${k.replace(/_tokens$/, "")} ${v}`);
      return parts.length ? `tokens: ${parts.join(" · ")}` : "";
    }

    function turnEnd(t) {
      const what = { completed: "", failed: t.error, cancelled: t.reason,
        suspended: "waiting for an answer", running: "running…", queued: "queued" }[t.status];
      const usage = usageText(t.usage);
      // The last turn, failed: it may be re-opened where it failed (F2).
      const last = s.snap.turns[s.snap.turns.length - 1];
      const retry = t.status === "failed" && last && last.turn_id === t.turn_id ?
        [" ", el("button", { type: "button", class: "secondary", "data-role": "retry",
          onclick: () => doRetry(t.turn_id), text: "Retry" })] : "";
      return el("div", { class: `turn-end ${t.status}` }, badge(t.status), " ", what || "",
        t.duration !== null ? ` · ${took(t.duration)}` : "", usage ? " · " : "",
        el("span", { class: "usage", text: usage }), retry);
    }

    refresh();
    // What leaves no event behind (a reset or an answer given elsewhere) shows within 10 s.
    const timer = setInterval(refresh, 10000);
    return {
      close: () => {
        clearInterval(timer);
        s.closed = true;
        if (s.es) s.es.close();
        if (resetArmed) clearTimeout(resetArmed);
      },
    };
  }

  // -- routing -----------------------------------------------------------------------------

  function route() {
    if (page) page.close();
    page = null;
    const hash = location.hash || "#/";
    const m = hash.match(/^#\/s\/([^/]+)\/(.+)$/);
    const r = hash.match(/^#\/r\/([^/]+)\/(.+)$/);
    if (m) page = showSession(decodeURIComponent(m[1]), decodeURIComponent(m[2]));
    else if (r) page = DC.showReplay(view, decodeURIComponent(r[1]), decodeURIComponent(r[2]));
    else if (hash.startsWith("#/inbox")) page = showInbox();
    else if (hash.startsWith("#/schedules")) page = DC.showSchedules(view);
    else page = showSessions((hash.match(/status=(\w+)/) || [])[1] || "");
    updateCount();
  }

  async function start() {
    try {
      const got = await api("/agents");
      Object.assign(app, got);
    } catch (e) {
      view.replaceChildren(notice("error", explain(e)));
      return;
    }
    const who = document.getElementById("who");
    const input = document.getElementById("me");
    if (app.development) {
      who.hidden = false;
      input.value = localStorage.getItem(ME) || "";
      input.addEventListener("change", () => localStorage.setItem(ME, input.value.trim()));
    } else {
      const p = document.getElementById("principal");
      p.hidden = false;
      p.textContent = `Signed in as ${app.by}`;
    }
    window.addEventListener("hashchange", route);
    route();
  }

  start();
})();
