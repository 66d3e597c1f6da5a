"""F3, F12: guides that must keep up with the code they document (issue 37).

The tools guide (``docs/guides/tools.md``, the navigation's "Tools") names every field and
method of :class:`ToolContext` and every keyword ``@tool`` takes, and documents local and
remote tools, ``request_input``, calls in doubt and idempotency keys; its examples run with
the others (``test_readme.py``).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

from durable_turns import ToolContext, tool

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "docs" / "guides" / "tools.md"


def test_the_tools_guide_names_every_field_and_method_of_the_context() -> None:
    page = TOOLS.read_text()
    fields = [f.name for f in dataclasses.fields(ToolContext) if not f.name.startswith("_")]
    methods = [name for name, _ in inspect.getmembers(ToolContext, inspect.isfunction)
               if not name.startswith("_")]
    assert {"idempotency_key", "store", "attempt"} <= set(fields)
    assert {"request_input", "cancelled"} <= set(methods)
    missing = [name for name in fields + methods if f"`{name}" not in page
               and f"`ctx.{name}" not in page]
    assert missing == [], f"docs/guides/tools.md does not name ToolContext's {missing}"


def test_the_tools_guide_names_every_keyword_of_tool() -> None:
    page = TOOLS.read_text()
    keywords = [p.name for p in inspect.signature(tool).parameters.values()
                if p.kind is p.KEYWORD_ONLY]
    assert {"timeout", "retries", "in_doubt"} <= set(keywords)
    missing = [k for k in keywords if k not in ("name", "description")
               and not re.search(rf"\b{k}\b", page)]
    assert missing == [], f"docs/guides/tools.md does not name @tool's {missing}"


def test_the_tools_guide_covers_what_a_tool_author_needs() -> None:
    headings = re.findall(r"^## (.+)$", TOOLS.read_text(), re.M)
    for topic in ("Local and remote", "What the model reads", "ToolContext",
                  "Idempotency keys", "request_input", "in_doubt", "Timeouts and retries"):
        assert any(topic in h for h in headings), (topic, headings)
