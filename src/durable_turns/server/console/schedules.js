// durable_turns web console: the schedules page (F24). Each agent's schedules (GET
// /agents/{agent}/schedules): when each fires, its next fire time, and the turns it started,
// each a link to its session. Plain JavaScript, no build step; helpers from kit.js.
"use strict";
(() => {
  const DC = window.DurableConsole;
  const { app, el, enc, api, explain, notice } = DC;

  function when(s) {
    if (s.cron) return `cron ${s.cron} (${s.tz})`;
    if (s.every) return `every ${s.every} s`;
    return `once at ${s.at}`;
  }

  const time = (iso) => (iso ? new Date(iso).toLocaleString() : "—");

  function showSchedules(view) {
    const tables = el("div");
    view.replaceChildren(el("h1", { text: "Schedules" }), tables);
    let closed = false;
    async function load() {
      const parts = [];
      for (const a of app.agents) {
        let found;
        try { found = (await api(`/agents/${enc(a.agent)}/schedules`)).schedules; } catch (e) {
          parts.push(notice("error", explain(e)));
          continue;
        }
        const session = (s) => `#/s/${enc(a.agent)}/${enc(s.session)}`;
        parts.push(el("h2", { text: a.agent }), found.length ? el("table", { class: "sessions" },
          el("thead", {}, el("tr", {}, ["schedule", "when", "next fire", "session", "turns"]
            .map((h) => el("th", { text: h })))),
          el("tbody", {}, found.map((s) => el("tr", { "data-schedule": s.name },
            el("td", { text: s.name }),
            el("td", { class: "muted", text: `${when(s)} · overlap ${s.overlap} · missed ${s.missed}` }),
            el("td", { "data-role": "next-fire", text: time(s.next_fire) }),
            el("td", {}, el("a", { href: session(s), text: s.session })),
            el("td", { "data-role": "turns" }, s.turns.length ? s.turns.slice(-5).map((t) =>
              el("div", {}, el("a", { href: session(s), text: t }))) :
              el("span", { class: "muted", text: "none yet" }))))))
          : el("p", { class: "muted", text: "No schedule." }));
      }
      if (!closed) tables.replaceChildren(...parts);
    }
    load();
    const timer = setInterval(load, 10000);
    return { close: () => { closed = true; clearInterval(timer); } };
  }

  DC.showSchedules = showSchedules;
})();
