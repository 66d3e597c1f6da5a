// Drives a durable_turns server with AG-UI's own client (@ag-ui/client's HttpAgent, which
// checks the order of a run's events and throws on a malformed sequence), and prints what
// it saw as JSON for tests/server/test_frontends.py to check.
//
//   node ag_ui.mjs <scenario> <base url> <thread id>
//
// Scenarios: weather (a run, then the same runId again), interrupt (a park, a wrong answerer,
// the right one), bad (malformed messages, a forged interrupt).
import { HttpAgent } from "@ag-ui/client";

const [scenario, base, threadId] = process.argv.slice(2);

function agent(who) {
  return new HttpAgent({
    url: `${base}/agents/desk/ag-ui`,
    headers: { authorization: `Bearer ${who}` },
    threadId,
  });
}

// One run: the event types in order, the outcome, the interrupts, or the error it threw.
async function run(a, params) {
  const types = [];
  let finished = null;
  let error = null;
  try {
    const result = await a.runAgent(params, {
      onEvent: ({ event }) => { types.push(event.type); },
      onRunFinishedEvent: (e) => { finished = { outcome: e.outcome, result: e.result ?? null,
                                                interrupts: e.interrupts ?? null }; },
      onRunErrorEvent: ({ event }) => { error = `RUN_ERROR ${event.code}: ${event.message}`; },
    });
    void result;
  } catch (e) {
    error = error ?? `threw: ${e.message}`;
  }
  return { types, finished, error, messages: structuredClone(a.messages) };
}

async function main() {
  const out = {};
  if (scenario === "weather") {
    const a = agent("ann");
    a.messages = [{ id: "u1", role: "user", content: "what is the weather in Paris?" }];
    out.first = await run(a, { runId: "run-1" });
    const b = agent("ann"); // the same run delivered again (a retry after a lost answer)
    b.messages = [{ id: "u1", role: "user", content: "what is the weather in Paris?" }];
    out.again = await run(b, { runId: "run-1" });
  } else if (scenario === "interrupt") {
    const a = agent("ann");
    a.messages = [{ id: "u1", role: "user", content: "refund order A-12" }];
    out.parked = await run(a, { runId: "run-1" });
    const interrupt = out.parked.finished.interrupts[0];
    out.refused = await run(a, { runId: "run-2", resume: [
      { interruptId: interrupt.id, status: "resolved", payload: true }] });
    const boss = agent("boss");
    boss.messages = a.messages;
    out.approved = await run(boss, { runId: "run-3", resume: [
      { interruptId: interrupt.id, status: "resolved", payload: true }] });
  } else if (scenario === "bad") {
    const a = agent("ann");
    a.messages = [{ id: "a1", role: "assistant", content: "no user here" }];
    out.malformed = await run(a, { runId: "run-1" });
    const b = agent("ann");
    b.messages = [{ id: "u1", role: "user", content: "refund order A-12" }];
    out.parked = await run(b, { runId: "run-2" });
    // A client that forges an answer (the thread's own client checks that a resume answers
    // what it was asked: a forger's does not).
    const forger = agent("ann");
    out.forged = await run(forger, { runId: "run-3", resume: [
      { interruptId: "resume:run-2:not-asked", status: "resolved", payload: true }] });
  } else {
    throw new Error(`no scenario ${scenario}`);
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
