"""MkDocs hooks of the documentation site (named in ``mkdocs.yml``).

The site must work offline, from a fresh clone with only ``pip install -e '.[docs]'``: a built
folder opened from ``file://`` or served over http, a test's Chromium with no network. So it
fetches nothing from a CDN:

- search: Material's ``offline`` plugin runs search in a worker, which a page from ``file://``
  may not start; ``iframe-worker``'s shim runs it in an iframe. The shim (1.4 kB, MIT) is kept
  in the repository (``docs_build/vendor/iframe-worker/``) and named as the pages' polyfill, so
  Material never adds the CDN's;
- diagrams: Material draws them with the ``mermaid`` the page has loaded, and fetches it from a
  CDN when there is none; offline that fetch fails and takes search down with it. Mermaid is
  installed by ``npm ci --prefix docs_build`` (``.ci/run`` does it) and then loaded by the
  pages (``extra_javascript``). Without it, a diagram is shown as its source, a code block,
  and nothing is fetched.

The pages are written as GitHub renders Markdown (they were the README's sections, and they
still read as files): a nested list or a list item's next paragraph is indented by two
spaces. Python-Markdown wants four, and would run such an item's paragraphs together, so the
site's Markdown counts two (``TwoSpaceIndent``); the pages indent no code block (they fence it).
It also wants a blank line before an item that follows an item's second paragraph, where
GitHub needs none (``ItemAfterParagraph``).
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from markdown import Extension, Markdown
from markdown.blockprocessors import build_block_parser
from markdown.preprocessors import Preprocessor

ITEM = re.compile(r"^( *)(?:[-*+]|\d+\.) ")
"""A list item's first line."""
INTERRUPTS = re.compile(r"^( *)(?:[-*+]|1\.) ")
"""An item that may begin a list right after a paragraph (GitHub's rule: "409." may not)."""

HERE = Path(__file__).resolve().parent
MODULES = HERE / "node_modules"
MERMAID = "js/mermaid.min.js"
"""Where the site's Mermaid goes (as ``mkdocs.yml``'s ``extra_javascript`` names it)."""
SHIM = "js/iframe-worker-shim.js"
"""Where the search worker's shim goes (the pages' polyfill)."""
SCRIPTS = {
    MERMAID: MODULES / "mermaid" / "dist" / "mermaid.min.js",
    SHIM: HERE / "vendor" / "iframe-worker" / "shim.js",
}
"""Where each script goes in the site ← its file (npm's, or the repository's copy)."""

log = logging.getLogger("mkdocs.hooks.durable_turns")


class ItemAfterParagraph(Preprocessor):
    """A blank line before a list item that ends a paragraph, as GitHub reads it.

    GitHub lets a list begin right after a paragraph, and starts the next item at its marker
    after an item's later paragraph (a block begun indented, after a blank line).
    Python-Markdown would read either item as the paragraph's next line, unless a blank line
    parts them. A block that began as a list item at this item's indent or less is that
    list, and is left alone.
    """

    def run(self, lines: list[str]) -> list[str]:
        """Insert the blank lines (fenced code is left as it is).

        Args:
            lines: the page's lines.

        Returns:
            The lines, with a blank line before each such item.
        """
        out: list[str] = []
        fenced = False
        start = ""  # the first line of the current block (since the last blank line)
        for line in lines:
            if line.lstrip().startswith("```"):
                fenced = not fenced
            item = None if fenced else ITEM.match(line)
            if item and out and out[-1].strip() and self.parts(start, line, len(item.group(1))):
                out.append("")
                start = line
            if not line.strip():
                start = ""
            elif not start:
                start = line
            out.append(line)
        return out


    @staticmethod
    def parts(start: str, line: str, indent: int) -> bool:
        """Whether the item ``line`` (at ``indent``) is parted from the block begun ``start``."""
        began = ITEM.match(start)
        if began and len(began.group(1)) <= indent:
            return False  # the same list, or an item nested in it
        if len(start) - len(start.lstrip()) > indent:
            return True  # an item's later block ends: the next item begins
        return INTERRUPTS.match(line) is not None  # a list right after a paragraph


class TwoSpaceIndent(Extension):
    """Python-Markdown reading two spaces as one level of a list's indentation."""

    def extendMarkdown(self, md: Markdown) -> None:
        """Count two spaces, and make the block parser again with it.

        The block processors build their patterns from ``tab_length`` when they are made, so
        the parser is made again; this extension comes first (``on_config``), before any
        other adds its processors to it.

        Args:
            md: the page's Markdown instance.
        """
        md.tab_length = 2
        md.parser = build_block_parser(md)
        # before the other preprocessors (fences' placeholders hide nothing it needs)
        md.preprocessors.register(ItemAfterParagraph(md), "item_after_paragraph", 40)


def on_config(config: Any, **_: Any) -> Any:
    """Count two spaces an indent; name the local shim; without Mermaid, show diagrams as code.

    Args:
        config: the MkDocs configuration.

    Returns:
        The configuration, with the indentation's extension and ``extra.polyfills`` set, and
        without the Mermaid fence and script when npm has not installed Mermaid.
    """
    config["markdown_extensions"].insert(0, TwoSpaceIndent())
    # Set before Material's offline plugin looks: it adds the CDN's only when no polyfill
    # named iframe-worker is there.
    config["extra"]["polyfills"] = [SHIM]
    if not SCRIPTS[MERMAID].is_file():
        # No ``pre.mermaid`` in the pages, so Material fetches no Mermaid: a ```mermaid block
        # is highlighted as code, and the pages load no script that is not in the site.
        config["extra_javascript"] = [s for s in config["extra_javascript"] if str(s) != MERMAID]
        fences = config["mdx_configs"].get("pymdownx.superfences", {})
        fences["custom_fences"] = [f for f in fences.get("custom_fences", [])
                                   if f.get("name") != "mermaid"]
        log.info("no %s: diagrams are shown as their source (run npm ci --prefix docs_build "
                 "to draw them)", SCRIPTS[MERMAID])
    return config


def on_post_build(config: Any, **_: Any) -> None:
    """Copy the scripts into the built site, where the pages name them.

    Args:
        config: the MkDocs configuration (its ``site_dir`` is the built folder).
    """
    for name, source in SCRIPTS.items():
        if source.is_file():  # only Mermaid may be missing (on_config has told)
            target = Path(config["site_dir"]) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
