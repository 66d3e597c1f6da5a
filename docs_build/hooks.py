"""MkDocs hooks of the documentation site (named in ``mkdocs.yml``).

The site must work offline: a built folder opened from ``file://``, a test's Chromium with no
network. Two scripts Material would fetch from a CDN are therefore the site's own, from npm's
registry, installed here by ``npm ci --prefix docs_build`` (``.ci/run`` does it):

- ``mermaid``: Material draws diagrams with the ``mermaid`` the page has loaded, and fetches
  it only when there is none (``extra_javascript`` loads ours);
- ``iframe-worker``'s shim: Material's ``offline`` plugin runs search in a worker, which a
  page from ``file://`` may not start; the shim runs it in an iframe (``extra.polyfills``).

Without that install the site still builds, and a browser that is online fetches them.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODULES = HERE / "node_modules"
SCRIPTS = {
    "js/mermaid.min.js": MODULES / "mermaid" / "dist" / "mermaid.min.js",
    "js/iframe-worker-shim.js": MODULES / "iframe-worker" / "shim" / "index.js",
}
"""Where each script goes in the site (as ``mkdocs.yml`` names it) ← the file npm installed."""

log = logging.getLogger("mkdocs.hooks.durable_turns")


def on_config(config: Any, **_: Any) -> Any:
    """Name the local shim as the page's polyfill, or Material's CDN one without it.

    Args:
        config: the MkDocs configuration.

    Returns:
        The configuration, with ``extra.polyfills`` set.
    """
    if SCRIPTS["js/iframe-worker-shim.js"].is_file():
        # Set before Material's offline plugin looks: it adds the CDN's only when no
        # polyfill named iframe-worker is there.
        config["extra"]["polyfills"] = ["js/iframe-worker-shim.js"]
    return config


def on_post_build(config: Any, **_: Any) -> None:
    """Copy the scripts into the built site, where ``mkdocs.yml`` names them.

    Args:
        config: the MkDocs configuration (its ``site_dir`` is the built folder).
    """
    for name, source in SCRIPTS.items():
        if not source.is_file():
            # info, not a warning: --strict fails on warnings, and a site without its own
            # copy is still whole online.
            log.info("no %s: the site loads it from a CDN (run npm ci --prefix docs_build)",
                     source)
            continue
        target = Path(config["site_dir"]) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
