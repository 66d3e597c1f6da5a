"""F27: the example Worker (``examples/cloudflare``) in real ``workerd``, its Durable Object on
workerd's own SQLite storage: a note kept through the Worker's route.

workerd cannot start a Python worker offline: at start it downloads a Pyodide bundle that
no registry ships. So this test runs only where ``PYODIDE_BUNDLE_DIR`` names a folder that
holds one (workerd's ``--pyodide-bundle-disk-cache-dir``, with the packages of its lock in
``PYODIDE_PACKAGE_DIR`` when set), with a ``workerd`` binary (``WORKERD``, or npm
``workerd`` in tests/pyodide); it is skipped otherwise, saying which is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cloudflare" / "src"
WAIT = 120.0


def _workerd() -> str:
    bundle = os.environ.get("PYODIDE_BUNDLE_DIR")
    if not bundle or not Path(bundle).is_dir():
        pytest.skip("real workerd needs a Pyodide bundle on disk (PYODIDE_BUNDLE_DIR): workerd "
                    "downloads it at start, and no registry ships one")
    found = os.environ.get("WORKERD") or shutil.which(
        "workerd", path=str(REPO / "tests" / "pyodide" / "node_modules" / ".bin"))
    if not found:
        pytest.skip("PYODIDE_BUNDLE_DIR is set but no workerd binary (WORKERD, or npm workerd "
                    "in tests/pyodide)")
    return found


def _modules() -> list[str]:
    """The worker's modules: the example's, then the engine's sources, as Python modules."""
    out = [f'(name = "entry.py", pythonModule = embed "{EXAMPLE / "entry.py"}")',
           f'(name = "notes.py", pythonModule = embed "{EXAMPLE / "notes.py"}")']
    for path in sorted((REPO / "src").rglob("*.py")):
        name = path.relative_to(REPO / "src").as_posix()
        out.append(f'(name = "{name}", pythonModule = embed "{path}")')
    for requirement in ("pydantic", "jsonschema"):
        out.append(f'(name = "{requirement}", pythonRequirement = "")')
    return out


def _config(port: int, storage: Path) -> str:
    modules = ",\n        ".join(_modules())
    return f'''using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [(name = "main", worker = .worker), (name = "disk", disk = "{storage}")],
  sockets = [(name = "http", address = "127.0.0.1:{port}", http = (), service = "main")],
);
const worker :Workerd.Worker = (
  modules = [
        {modules}
  ],
  compatibilityDate = "2026-11-01",
  compatibilityFlags = ["python_workers"],
  bindings = [(name = "MODEL", text = "scripted")],
  durableObjectNamespaces = [(className = "Notes", uniqueKey = "notes", enableSql = true)],
  durableObjectStorage = (localDisk = "disk"),
);
'''


def test_the_example_keeps_a_note_in_real_workerd(tmp_path: Path) -> None:
    workerd = _workerd()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "do").mkdir()
    config = tmp_path / "worker.capnp"
    config.write_text(_config(port, tmp_path / "do"))
    argv = [workerd, "serve", str(config), "--experimental",
            f"--pyodide-bundle-disk-cache-dir={os.environ['PYODIDE_BUNDLE_DIR']}"]
    if os.environ.get("PYODIDE_PACKAGE_DIR"):
        argv.append(f"--pyodide-package-disk-cache-dir={os.environ['PYODIDE_PACKAGE_DIR']}")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/agents/notes/sessions/s1/chat"
        body = json.dumps({"text": 'remember {"note": "milk"}'}).encode()
        deadline = time.monotonic() + WAIT
        while True:
            try:
                request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=WAIT) as r:
                    result = json.load(r)
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "workerd never answered"
                time.sleep(0.5)  # polling a server that is starting: no event to wait on
        assert result["status"] == "completed" and "1 notes so far" in result["text"]
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)
