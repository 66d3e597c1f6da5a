"""MkDocs hooks of the documentation site (named in ``mkdocs.yml``).

Material draws Mermaid diagrams with the ``mermaid`` script the page has loaded, and fetches
it from a CDN only when none is. The site must work offline (a built folder opened from
``file://``, a test's Chromium without a network), so it ships its own copy: npm's
``mermaid`` package, installed here by ``npm ci --prefix docs_build`` (``.ci/run`` does it).
Without that install the site still builds and a browser that is online fetches the script.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MERMAID = HERE / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
"""The script ``npm ci --prefix docs_build`` installs (the version ``package.json`` pins)."""

log = logging.getLogger("mkdocs.hooks.durable_turns")


def on_post_build(config: Any, **_: Any) -> None:
    """Copy Mermaid into the built site, where ``extra_javascript`` names it.

    Args:
        config: the MkDocs configuration (its ``site_dir`` is the built folder).
    """
    if not MERMAID.is_file():
        # info, not a warning: --strict fails on warnings, and a site without its own copy
        # is still whole online.
        log.info("no %s: diagrams load Mermaid from its CDN (run npm ci --prefix docs_build)",
                 MERMAID)
        return
    target = Path(config["site_dir"]) / "js" / "mermaid.min.js"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(MERMAID, target)
