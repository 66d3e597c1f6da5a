// One agent object (tests/cloudflare/object_app.py's DeskObject) under Pyodide in Node 22, on
// ctx.storage faked over node:sqlite (storage.mjs): what tests/cloudflare/test_pyodide.py
// drives. Offline: Pyodide from node_modules, the engine's wheels from a local folder, the
// project's source from its checkout.
//
//   node object.mjs REPO WHEELS DATABASE RUNS [--die-in-tool]
//
// It reads commands, one JSON object a line, on stdin, and answers on stdout, one JSON
// object a line (each with the command's id):
//   {"id", "op": "fetch", "method", "path", "headers", "body"} -> {"id", "status",
//       "headers"}, then {"id", "chunk"} as the body's chunks come, then {"id", "end": true}
//       ("leaveAfter": N: the reader cancels the body after N chunks)
//   {"id", "op": "alarm"} -> {"id", "done": true} once the object's alarm() returned
//   {"id", "op": "alarmAt"} -> {"id", "at"} (null: no alarm set)
//   {"id", "op": "probe"} -> {"id", "probe": {platform, threads, modules}}
// Each run of the note tool appends its value to the file RUNS; with --die-in-tool the
// process SIGKILLs itself inside the tool's step, after the tool wrote its row.
import fs from "node:fs";
import readline from "node:readline";
import { loadPyodide } from "pyodide";
import { Storage } from "./storage.mjs";

const [repo, wheels, database, runs, ...flags] = process.argv.slice(2);
const dieInTool = flags.includes("--die-in-tool");
const say = (line) => fs.writeSync(1, JSON.stringify(line) + "\n");
const log = (text) => fs.writeSync(2, text + "\n");

const pyodide = await loadPyodide({
  indexURL: new URL("./node_modules/pyodide/", import.meta.url).pathname,
  stdout: log,
  stderr: log,
});
await pyodide.loadPackage(
  fs.readdirSync(wheels).filter((f) => f.endsWith(".whl")).map((f) => `${wheels}/${f}`),
  { messageCallback: () => {} },
);
pyodide.FS.mkdirTree("/repo");
pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root: repo }, "/repo");

const storage = new Storage(database);
globalThis.objectCtx = {
  storage,
  id: "desk/s1",
  blockConcurrencyWhile: (fn) => fn(),
  waitUntil: () => undefined,
};
globalThis.noteRan = (value) => {
  fs.appendFileSync(runs, `${value}\n`);
  if (dieInTool) {
    say({ ran: value });
    process.kill(process.pid, "SIGKILL");
  }
};
const object = await pyodide.runPythonAsync(`
import asyncio, sys, types
sys.path[:0] = ["/repo/src", "/repo/tests/cloudflare"]
import js
from object_app import DeskObject

gate = asyncio.Event()  # what a "hold" turn waits on, until the op "open"
DeskObject(js.objectCtx, types.SimpleNamespace(ran=js.noteRan, gate=gate))
`);

// What the engine's core needed here: which modules it imported, which threads run.
const PROBE = `
import json, sys, threading
json.dumps({"platform": sys.platform, "threads": threading.active_count(),
            "modules": sorted(m for m in ("orjson", "rpds", "jsonschema", "starlette")
                              if m in sys.modules)})
`;

async function serve(command) {
  const { id } = command;
  try {
    if (command.op === "fetch") {
      const request = new Request(`http://localhost${command.path}`, {
        method: command.method,
        headers: command.headers ?? {},
        body: command.body ?? undefined,
      });
      const response = await object.fetch(request);
      say({ id, status: response.status, headers: Object.fromEntries(response.headers) });
      const reader = response.body.getReader();
      const text = new TextDecoder();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        say({ id, chunk: text.decode(value, { stream: true }) });
        if (command.leaveAfter !== undefined && --command.leaveAfter <= 0) {
          reader.cancel().catch(() => undefined);  // the client leaves: the turn goes on
          break;
        }
      }
      say({ id, end: true });
    } else if (command.op === "alarm") {
      await object.alarm();
      say({ id, done: true });
    } else if (command.op === "probe") {
      say({ id, probe: JSON.parse(pyodide.runPython(PROBE)) });
    } else if (command.op === "open") {
      pyodide.runPython("gate.set()");
      say({ id, done: true });
    } else if (command.op === "alarmAt") {
      say({ id, at: await storage.getAlarm() });
    } else {
      say({ id, error: `no op ${command.op}` });
    }
  } catch (e) {
    say({ id, error: String(e && e.stack ? e.stack : e) });
  }
}

say({ ready: true });
for await (const line of readline.createInterface({ input: process.stdin })) {
  if (line.trim()) serve(JSON.parse(line));
}
