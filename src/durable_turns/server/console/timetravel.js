// durable_turns web console: a session's past (issue 30). The timeline's table, with "Fork
// from here" on each step that has a checkpoint (GET …/history says where each step's commit
// stands); a replay form (POST …/replay); and the replay's report, recorded and replayed side
// by side. Loaded after kit.js, before app.js, which calls these from its views.
"use strict";
(() => {
  const DC = window.DurableConsole;
  const { app, el, badge, enc, sessionPath, randomHex, api, explain, notice, took } = DC;
  const REPORTS = "durable_turns.replay:"; // sessionStorage: a replay's report, by its session

  // Where each step of the live generation was checkpointed: "turn_id step_id" → place.
  async function places(agent, session) {
    const got = await api(`${sessionPath(agent, session)}/history`);
    const live = Math.max(-1, ...got.checkpoints.map((cp) => cp.generation));
    const found = new Map();
    for (const cp of got.checkpoints) {
      if (cp.generation !== live) continue;
      for (const step of cp.steps) {
        found.set(`${step.turn_id} ${step.id}`,
          { generation: cp.generation, seq: cp.seq, sub: cp.sub });
      }
    }
    return found;
  }

  // Copy the session up to `at` into a new one (the caller owns it), and open it. A fork
  // inside a turn whose local tool calls are owed there would run them again for real: the
  // server says so (409 ForkRerunsToolsError) and the person chooses, as a replay does.
  async function fork(agent, session, at, status, tools) {
    const to = `${session.slice(0, 180)}-fork-${randomHex(3)}`;
    try {
      await api(`${sessionPath(agent, session)}/fork`, tools ? { to, at, tools } : { to, at });
      location.hash = `#/s/${enc(agent)}/${enc(to)}`;
    } catch (e) {
      if (e.status === 409 && e.type === "ForkRerunsToolsError") {
        const choose = (how, text) => el("button", { type: "button", class: "secondary small",
          "data-role": `fork-${how}`, onclick: () => fork(agent, session, at, status, how), text });
        status.replaceChildren(notice("warning", e.message),
          choose("recorded", "Answer them from the recording"),
          choose("live", "Run them for real"));
        return;
      }
      status.replaceChildren(notice("error", explain(e)));
    }
  }

  // One turn of the timeline: a row per step (its kind, status, time and bar), and on each
  // checkpointed step a button that forks the session right after it.
  function timelineTurn(t, { agent, session, at, status, usageText }) {
    const total = Math.max(t.duration || 0, ...t.steps.map((r) => r.duration || 0), 1e-9);
    const rows = t.steps.map((r, i) => {
      const place = at && r.id ? at.get(`${t.turn_id} ${r.id}`) : undefined;
      const forkHere = place ? el("button", { type: "button", class: "secondary small",
        "data-role": "fork", title: "a new session with everything up to this step",
        onclick: () => fork(agent, session, place, status), text: "Fork from here" }) : "";
      return el("tr", { class: `step ${r.status}`, "data-kind": r.kind, "data-step": r.id },
        el("td", { class: "num muted hide-narrow", text: String(i + 1) }),
        el("td", {}, r.kind === "tool" ? `tool ${r.resumed ? "↻ " : ""}${r.name}` :
          r.kind === "input" ? `input: ${r.prompt}` :
          r.kind === "steered" ? `steered: ${r.text}` :
          r.kind === "compact" ? `compaction: ${r.tokens_before} → ${r.tokens_after} tokens` : "model"),
        el("td", {}, badge(r.status)),
        el("td", { class: "num", text: r.duration === null ? (r.ended_at ? "" : "…") : took(r.duration) }),
        el("td", { class: "bar-cell" }, el("div", { class: `bar ${r.status}`,
          style: { width: `${r.duration === null ? 2 : Math.max(1, (100 * r.duration) / total)}%` } })),
        el("td", {}, forkHere));
    });
    return el("section", { class: "turn", "data-turn": t.turn_id },
      el("h2", {}, badge(t.status), " ", t.text.length > 80 ? `${t.text.slice(0, 80)}…` : t.text),
      el("table", { class: "timeline" },
        el("thead", {}, el("tr", {}, el("th", { class: "num hide-narrow", text: "#" }),
          el("th", { text: "step" }), el("th", { text: "status" }),
          el("th", { class: "num", text: "time" }), el("th", { text: "" }), el("th", { text: "" }))),
        el("tbody", {}, rows)),
      el("div", { class: "turn-end" }, [t.duration !== null ? `turn: ${took(t.duration)}` : "",
        usageText(t.usage)].filter(Boolean).join(" · ")));
  }

  // The toolbar's replay: which model answers (the agent's own, or one the host offers by
  // name) and what an unrecorded tool call gets; the report opens once it ran.
  function replayForm(agent, session, status) {
    const model = el("select", { name: "model", id: "replay-model" },
      el("option", { value: "", text: "the agent's model" }),
      app.replay_models.map((m) => el("option", { value: m, text: m })));
    const tools = el("select", { name: "tools", id: "replay-tools" },
      el("option", { value: "recorded", text: "tools: recorded only" }),
      el("option", { value: "live", text: "tools: run unrecorded calls" }));
    const go = el("button", { type: "submit", class: "secondary", id: "replay", text: "Replay" });
    return el("form", {
      class: "toolbar replay",
      onsubmit: async (ev) => {
        ev.preventDefault();
        go.disabled = true;
        status.replaceChildren(el("span", { class: "muted", text: "Replaying…" }));
        try {
          const report = await api(`${sessionPath(agent, session)}/replay`, {
            // No "to": the server names the replay as the CLI's replay does (…~replay-…).
            model: model.value || null, tools: tools.value,
          });
          const to = report.replay.slice(agent.length + 1);
          sessionStorage.setItem(`${REPORTS}${agent}/${to}`, JSON.stringify(report));
          location.hash = `#/r/${enc(agent)}/${enc(to)}`;
        } catch (e) {
          status.replaceChildren(notice("error", explain(e)));
        } finally {
          go.disabled = false;
        }
      },
    }, model, tools, go);
  }

  const outcome = (r) => r.status === "completed" ? r.text || "" :
    r.status === "failed" ? `failed: ${r.error}` : r.status === "suspended" ?
      `waiting: ${r.request ? r.request.prompt : ""}` : r.status;
  const call = (c) => `${c.name} ${JSON.stringify(c.input)}`;

  // A replay's report: a card per turn, what was recorded beside what the replay did.
  function showReplay(view, agent, replayed) {
    const saved = sessionStorage.getItem(`${REPORTS}${agent}/${replayed}`);
    const head = el("h1", {}, el("a", { href: "#/", text: "Sessions" }), " / replay ",
      el("a", { href: `#/s/${enc(agent)}/${enc(replayed)}`, text: `${agent} / ${replayed}` }));
    if (saved === null) {
      view.replaceChildren(head, notice("error", "This page's report is gone (a report " +
        "stays in the tab that ran the replay); open the replayed session, or replay again."));
      return { close: () => {} };
    }
    const report = JSON.parse(saved);
    const [, source] = report.source.split(/\/(.*)/s);
    const same = report.turns.filter((t) => t.summary === "identical").length;
    view.replaceChildren(head,
      el("p", { id: "replay-summary" }, badge(report.identical ? "identical" : "differs"), " ",
        `${same} of ${report.turns.length} turns identical; recorded: `,
        el("a", { href: `#/s/${enc(agent)}/${enc(source)}`, text: report.source })),
      ...report.turns.map((t) => el("section", { class: "card replay-turn", "data-turn": t.turn_id,
        "data-summary": t.summary },
      el("h2", {}, el("span", { class: `badge ${t.summary.replace(/ /g, "-")}`,
        text: t.summary }), " ", t.opening),
      el("div", { class: "side-by-side" },
        el("div", {}, el("div", { class: "muted", text: "recorded" }),
          el("div", { class: "msg assistant recorded", text: outcome(t.original) })),
        el("div", {}, el("div", { class: "muted", text: "replayed" }),
          el("div", { class: "msg assistant replayed", text: outcome(t.replayed) }))),
      el("ul", { class: "calls" },
        t.calls_added.map((c) => el("li", { class: "added", text: `+ ${call(c)}` })),
        t.calls_removed.map((c) => el("li", { class: "removed", text: `− ${call(c)}` })),
        t.calls_changed.map(([a, b]) => el("li", { class: "changed",
          text: `~ ${call(a)} → ${JSON.stringify(b.input)}` }))),
      JSON.stringify(t.tokens_original) !== JSON.stringify(t.tokens_replayed) ?
        el("div", { class: "muted", text: `tokens ${JSON.stringify(t.tokens_original)} → ` +
          JSON.stringify(t.tokens_replayed) }) : "")));
    return { close: () => {} };
  }

  Object.assign(DC, { places, timelineTurn, replayForm, showReplay });
})();
