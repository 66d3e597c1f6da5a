"""Values across the border between Python and JavaScript, as Pyodide hands them.

A statement's bindings go to JavaScript and its rows come back from it: ``None`` would arrive
as ``undefined`` (not a SQL value), so it is sent as JavaScript's ``null``; a ``null`` comes
back as ``pyodide.ffi.jsnull`` (not ``None``); an array comes back as a proxy until it is
converted. Outside Pyodide (CPython, against ``durable_turns.cloudflare.testing``'s fake),
:data:`JS_NULL` is a sentinel of this module that the fake hands back the same way.
"""

from __future__ import annotations

from typing import Any


class SqlError(Exception):
    """What a refused or failed statement raises outside Pyodide (the fake's; a JavaScript
    ``Error`` on workerd, which Pyodide raises as ``pyodide.ffi.JsException``)."""


_JsProxy: Any = None
_jsnull: Any = None
STORAGE_ERRORS: tuple[type[Exception], ...] = (SqlError,)
"""What a failed storage call raises here."""
try:  # under Pyodide
    from pyodide.ffi import JsException, JsProxy, jsnull  # type: ignore[import-not-found]
except ImportError:  # CPython: the fake of the storage stands in for JavaScript
    pass
else:
    _JsProxy, _jsnull = JsProxy, jsnull
    STORAGE_ERRORS = (SqlError, JsException)


class JsNull:
    """JavaScript's ``null`` where there is no JavaScript (the fake's rows carry it)."""

    def __repr__(self) -> str:
        return "jsnull"

    def __bool__(self) -> bool:
        return False


JS_NULL: Any = _jsnull if _jsnull is not None else JsNull()
"""JavaScript's ``null`` as Python sees it: ``pyodide.ffi.jsnull``, or the fake's."""
ON_PYODIDE = _JsProxy is not None
"""Whether this interpreter is Pyodide's (JavaScript is the host)."""


def to_js(value: Any) -> Any:
    """A binding as it must cross: ``None`` as ``null``, a bool as 0 or 1."""
    if value is None:
        return JS_NULL
    if isinstance(value, bool):
        return int(value)
    return value


def to_py(value: Any) -> Any:
    """A column's value as the kit reads it: ``null`` as ``None``, an integral double as an
    ``int`` (JavaScript has no other number)."""
    if value is JS_NULL or value is None:
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2 ** 53:
        return int(value)
    return value


def rows(found: Any) -> list[list[Any]]:
    """A cursor's ``raw().toArray()`` as Python lists of Python values."""
    if _JsProxy is not None and isinstance(found, _JsProxy):
        found = found.to_py()
    return [[to_py(v) for v in row] for row in found]


def callback(fn: Any) -> Any:
    """``fn`` as JavaScript may keep it after the call that hands it over (a proxy under
    Pyodide; :func:`release` it once JavaScript is done)."""
    if _JsProxy is None:
        return fn
    from pyodide.ffi import create_proxy

    return create_proxy(fn)


def release(fn: Any) -> None:
    """Free what :func:`callback` made."""
    destroy = getattr(fn, "destroy", None)
    if _JsProxy is not None and destroy is not None:
        destroy()

