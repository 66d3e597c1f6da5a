// durable_turns web console: the helpers every view shares (loaded first; app.js and
// timetravel.js take them from window.DurableConsole). Plain JavaScript, no build step.
"use strict";
(() => {
  const ME = "durable_turns.me";
  // What GET /agents said: the agents served, development mode, who asks, replay models.
  const app = { development: true, by: null, agents: [], replay_models: [] };

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      // Through the CSSOM: the Content-Security-Policy refuses style attributes.
      else if (k === "style") Object.assign(e.style, v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids.flat()) {
      if (kid === null || kid === undefined || kid === false) continue;
      e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return e;
  }

  const json = (v) => JSON.stringify(v, null, 2);
  const badge = (status) => el("span", { class: `badge ${status}`, text: status });
  const enc = encodeURIComponent;
  const sessionPath = (agent, session) => `/agents/${enc(agent)}/sessions/${enc(session)}`;

  function me() {
    return app.development ? (localStorage.getItem(ME) || "").trim() || undefined : app.by;
  }

  // `bytes` random bytes in hex: an Idempotency-Key, a new session's suffix (crypto.randomUUID
  // needs a secure context; this does not).
  function randomHex(bytes) {
    return Array.from(crypto.getRandomValues(new Uint8Array(bytes)),
      (b) => b.toString(16).padStart(2, "0")).join("");
  }
  const idempotencyKey = () => randomHex(16);

  class ApiError extends Error {
    constructor(status, type, message) {
      super(message);
      this.status = status;
      this.type = type;
    }
  }

  async function api(path, body, keep, headers) {
    const init = body === undefined ? {} : {
      method: "POST", headers: { "Content-Type": "application/json", ...(headers || {}) },
      body: JSON.stringify(body),
    };
    const r = await fetch(path, { ...init, credentials: "same-origin" });
    if (r.ok && keep === "headers") {
      // The page follows what comes next on the session's event stream, not on this one.
      await r.body.cancel();
      return r.headers;
    }
    let data = null;
    try { data = await r.json(); } catch (_) { data = null; }
    if (!r.ok) {
      const err = (data && data.error) || { type: `HTTP ${r.status}`, message: r.statusText };
      throw new ApiError(r.status, err.type, err.message);
    }
    return data;
  }

  // What a person reads when a call is refused: the server's own words, and what they mean.
  function explain(e) {
    if (!(e instanceof ApiError)) return `Could not reach the server (${e.message}).`;
    const what = {
      401: "You are not signed in", 403: "You may not do this",
      404: "Not found", 409: "Conflict", 413: "Too large",
      422: "That answer does not fit the request",
    }[e.status] || `Refused (${e.status})`;
    let hint = "";
    if (e.status === 409 && /answered already/.test(e.message)) {
      // The server names who answered: one's own earlier answer (another tab, a click
      // before a reload) is not "someone else's".
      const first = (e.message.match(/answered already by '([^']*)'/) || [])[1];
      hint = first !== undefined && first === me() ?
        " You answered it yourself, in another tab or window; your first answer stands." :
        " Someone answered this request first; their answer stands.";
    } else if (e.status === 409 && /parked on turn .* waiting for input/.test(e.message)) {
      hint = " The session is waiting for an answer: answer it (here or in the inbox) first.";
    }
    return `${what}: ${e.message}.${hint}`;
  }

  const notice = (kind, text) => el("div", { class: `notice ${kind}`, role: "status", text });

  function ago(t) {
    if (t === null || t === undefined) return "—";
    const s = Math.max(0, Date.now() / 1000 - t);
    if (s < 60) return `${Math.round(s)} s ago`;
    if (s < 3600) return `${Math.round(s / 60)} min ago`;
    if (s < 86400) return `${Math.round(s / 3600)} h ago`;
    return new Date(t * 1000).toLocaleString();
  }

  function took(d) {
    if (d === null || d === undefined) return "";
    return d < 1 ? `${Math.round(d * 1000)} ms` : `${d.toFixed(2)} s`;
  }

  function whoMay(answerers) {
    if (!answerers) return "Anyone may answer (no answerer was named).";
    if (answerers.user !== undefined) return `Only ${answerers.user} may answer.`;
    if (answerers.policy !== undefined) {
      return `Whoever the agent's policy “${answerers.policy}” allows may answer` +
        (answerers.scope !== undefined ? ` (scope ${answerers.scope}).` : ".");
    }
    return `Answerers: ${JSON.stringify(answerers)}`;
  }

  window.DurableConsole = {
    ME, app, el, json, badge, enc, sessionPath, me, randomHex, idempotencyKey, ApiError, api,
    explain, notice, ago, took, whoMay,
  };
})();
