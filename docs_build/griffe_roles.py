"""A griffe extension for the Reference: Sphinx roles in docstrings become code spans.

The package's docstrings name other objects the Sphinx way (``:class:`~durable_turns.Agent```,
``:meth:`settle_delivery```), which a reader of the source knows and Markdown does not: the
Reference would show the role's markup. This writes each as the code span it stands for
(``~`` keeps the last name, as Sphinx shows it). mkdocs.yml loads it for mkdocstrings.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|exc|mod|data|obj|const):`(~?)([^`]+)`")
"""A Sphinx cross-reference role: its ``~`` and its target."""


def plain(text: str) -> str:
    """``text`` with every Sphinx role written as a Markdown code span.

    Args:
        text: a docstring.

    Returns:
        The docstring, ``:class:`~a.B``` as ```B```, ``:func:`a.b``` as ```a.b```.
    """
    return ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`",
                    text)


class SphinxRoles(Extension):
    """Rewrite the roles of every docstring as the objects are loaded."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring.

        Args:
            obj: the object just made (a module, a class, a function, an attribute).
            **kwargs: the rest of griffe's arguments, unused.
        """
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
