"""``serve --reload``: serve the app folder in a child process, and start a new one whenever a
file of the folder changes (``watchfiles``, the ``server`` extra).

The store is the one the command names, a file or a database outside the child, so a new
child opens it as the last one left it: sessions, their history and parked turns stay. The
old child is stopped with SIGINT, as Ctrl-C stops ``serve``: its running turns get their
grace period, and what is cut short replays when the new child recovers the store. Files of
the store inside the app folder, caches and editors' swap files are not changes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigurationError
from ._args import PROG

WATCHED = frozenset({".py", ".md", ".json", ".toml", ".yaml", ".yml", ".txt"})
"""The suffixes of the files whose change restarts the server."""


def reload_serving(args: argparse.Namespace, argv: Sequence[str], folder: Path) -> int:
    """Serve ``folder`` in a child ``durable-turns serve`` (``argv`` less ``--reload``),
    restarted on every change to the folder, until interrupted.

    Raises:
        ConfigurationError: ``folder`` is not a directory, or the store is ``memory:``
            (a new child would start empty).
    """
    import watchfiles  # the server extra, as serve's other dependencies

    if not folder.is_dir():
        raise ConfigurationError(f"{folder} is not an app folder (no such directory)")
    if str(getattr(args, "store", None) or "").startswith("memory:"):
        raise ConfigurationError("--reload keeps the store across restarts: a memory: store "
                                 "would start empty each time; use --db or --store")
    command = shlex.join([sys.executable, "-m", "durable_turns.cli",
                          *(a for a in argv if a != "--reload")])

    def watched(_change: watchfiles.Change, path: str) -> bool:
        p = Path(path)
        return (p.suffix in WATCHED and "__pycache__" not in p.parts
                and not any(part.startswith(".") for part in p.parts[-2:]))

    def restarting(changes: set[tuple[watchfiles.Change, str]]) -> None:
        names = sorted({str(Path(p).relative_to(folder.resolve())) for _c, p in changes})
        print(f"{PROG} serve --reload: {', '.join(names)} changed; restarting",
              file=sys.stderr, flush=True)

    print(f"{PROG} serve --reload: watching {folder}/ (Ctrl-C stops)", file=sys.stderr,
          flush=True)
    watchfiles.run_process(folder.resolve(), target=command, target_type="command",
                           callback=restarting, watch_filter=watched)
    return 0


__all__ = ["WATCHED", "reload_serving"]
