// bench/cloudflare_steps.py's Durable Object store under Pyodide in Node 22: the same Python
// measure() on tests/pyodide/storage.mjs (node:sqlite). Prints one JSON line of figures.
//   node bench/cloudflare_steps.mjs REPO WHEELS FOLDER TURNS CALLS
import fs from "node:fs";
import { loadPyodide } from "../tests/pyodide/node_modules/pyodide/pyodide.mjs";
import { Storage } from "../tests/pyodide/storage.mjs";

const [repo, wheels, folder, turns, calls] = process.argv.slice(2);
fs.mkdirSync(folder, { recursive: true });
const quiet = (text) => fs.writeSync(2, text + "\n");
const pyodide = await loadPyodide({
  indexURL: new URL("../tests/pyodide/node_modules/pyodide/", import.meta.url).pathname,
  stdout: quiet,
  stderr: quiet,
});
await pyodide.loadPackage(
  fs.readdirSync(wheels).filter((f) => f.endsWith(".whl")).map((f) => `${wheels}/${f}`),
  { messageCallback: () => {} },
);
pyodide.FS.mkdirTree("/repo");
pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root: repo }, "/repo");
let n = 0;
globalThis.newStorage = () => new Storage(`${folder}/${n++}.db`);
const figures = await pyodide.runPythonAsync(`
import json, sys
sys.path[:0] = ["/repo/src", "/repo/bench"]
import js
from cloudflare_steps import floor, measure
from durable_turns.cloudflare import DurableObjectStore

json.dumps({
    "durable_object_pyodide": await measure(lambda: DurableObjectStore(js.newStorage()),
                                            ${turns}, ${calls}),
    "floor_pyodide": await floor(js.newStorage(), ${turns} * (2 * ${calls} + 1)),
})
`);
fs.writeSync(1, figures + "\n");
process.exit(0);
