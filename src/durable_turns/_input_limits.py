"""HTTP input limits: what arrives over the wire, bounded before anything trusts it: a body
read within a size and a time, JSON decoded within a depth, a cursor that is a number of this
world.

The HTTP host and the channels read their requests through these, so a bad request is a
refusal with its status (:class:`HttpError`: 400, 408, 413), never a failure of the server:

- a body over its size is refused as it comes in (413), one that trickles in slower than
  :data:`BODY_TIMEOUT` allows is cut off (408);
- JSON nested deeper than :data:`MAX_DEPTH` containers is refused (400): Python's decoder
  recurses, and a body of 200,000 ``[`` would otherwise end in a ``RecursionError``; the
  encoders the store uses refuse far less (orjson stops at 255 levels);
- a cursor (``?after=``, ``Last-Event-ID``, ``?last=``) is ASCII digits, at most
  :data:`MAX_CURSOR` (a 64-bit sequence number): ``str.isdigit`` also takes
  Arabic-Indic digits and superscripts.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["BODY_TIMEOUT", "LONE_SURROGATE", "MAX_CURSOR", "MAX_DEPTH", "HttpError",
           "blank_body", "cursor", "loads", "read_limited"]

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects a JSON body may have."""
MAX_CURSOR = (1 << 63) - 1
"""The largest cursor (a 64-bit signed sequence number, as the stores keep them)."""
BODY_TIMEOUT = 10.0
"""Seconds a request's whole body may take to arrive."""


class HttpError(Exception):
    """A refusal with its status, error type and message, answered as JSON.

    Args:
        status: the HTTP status.
        type_: the error's type (``{"error": {"type"}}``).
        message: what was wrong, in words; it names nothing secret.
    """

    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message


async def read_limited(chunks: AsyncIterator[bytes], limit: int, *,
                       timeout: float = BODY_TIMEOUT) -> bytes:
    """A body, whole, from its chunks.

    Args:
        chunks: the body as it arrives (Starlette's ``request.stream()``).
        limit: the most bytes it may have.
        timeout: the most seconds it may take to arrive.

    Raises:
        HttpError: 413 longer than ``limit``; 408 slower than ``timeout``.
    """
    raw = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in chunks:
                raw += chunk
                if len(raw) > limit:
                    raise HttpError(413, "PayloadTooLarge", f"the body is over {limit} bytes")
    except TimeoutError:
        raise HttpError(408, "RequestTimeout",
                        f"the body did not arrive within {timeout:g} s") from None
    return bytes(raw)


class _NotFinite(ValueError):
    """A number no JSON reader keeps: ``NaN``, ``Infinity``, or one past a double's range."""


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _NotFinite(text)
    return number


def _constant(text: str) -> Any:
    raise _NotFinite(text)


LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""Half of a UTF-16 pair, alone (``"\\ud800"`` in JSON): no text has one."""


def loads(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Decode JSON text of at most ``max_depth`` nested arrays and objects, with finite
    numbers only and no lone surrogate in a string.

    Raises:
        HttpError: 400, saying why: not UTF-8, not JSON, a number that is not finite
            (``1e400``, ``NaN``, ``Infinity``: it would be stored as something else than was
            sent), a string with a lone surrogate (it is no text), or nested too deep.
    """
    try:
        value = json.loads(raw, parse_float=_finite, parse_constant=_constant)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except UnicodeDecodeError:
        raise HttpError(400, "MalformedBody", "the body is not UTF-8 text") from None
    except _NotFinite as e:
        raise HttpError(400, "MalformedBody",
                        f"the body holds the number {str(e)[:40]}, which is not finite (past a "
                        "double's range, or NaN or Infinity, which JSON does not have)") from None
    except ValueError as e:
        raise HttpError(400, "MalformedBody", f"the body is not JSON: {e}") from None
    level, depth = [value], 0
    while level:  # breadth first, containers only: no recursion, whatever the depth
        _check_text(level)
        if not isinstance(level[0], (list, dict)):
            break
        depth += 1
        if depth > max_depth:
            raise _too_deep(max_depth)
        deeper: list[Any] = []
        for v in level:
            items = v.values() if isinstance(v, dict) else v
            deeper.extend(x for x in items if isinstance(x, (list, dict, str)))
            if isinstance(v, dict):
                _check_text(list(v))
        level = [x for x in deeper if not isinstance(x, str)]
        _check_text([x for x in deeper if isinstance(x, str)])
    return value


def blank_body(raw: bytes | str) -> bool:
    """Whether a body is empty (what a route that takes ``{}`` reads as ``{}``).

    Raises:
        HttpError: 400 a body of white space only (``"\\n"``): neither nothing nor JSON.
    """
    if raw and not raw.strip():
        raise HttpError(400, "MalformedBody", "the body is only white space, which is no "
                        "JSON: send a JSON object ({} when there is nothing to say) or no body")
    return not raw


def _check_text(values: list[Any]) -> None:
    for v in values:
        if isinstance(v, str) and LONE_SURROGATE.search(v):
            raise HttpError(400, "MalformedBody",
                            "a string of the body holds a lone surrogate (half of a UTF-16 "
                            "pair, such as \\ud800): it is not text")


def _too_deep(max_depth: int) -> HttpError:
    return HttpError(400, "MalformedBody",
                     f"the JSON is nested deeper than {max_depth} arrays and objects")


def cursor(text: str, name: str, *, minimum: int = 0, error: str = "MalformedCursor") -> int:
    """A cursor (or a count) from a query parameter or a header: ASCII digits, ``minimum`` to
    :data:`MAX_CURSOR`.

    Raises:
        HttpError: 400 of type ``error``, naming ``name`` and what it takes.
    """
    if text.isascii() and text.isdigit() and len(text) <= 19:
        value = int(text)
        if minimum <= value <= MAX_CURSOR:
            return value
    raise HttpError(400, error,
                    f"{name} is a whole number from {minimum} to {MAX_CURSOR}, not {text[:40]!r}")
