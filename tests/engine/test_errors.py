"""F12, F18: ``errors.ERRORS``: one table says how hosts answer each exception (HTTP status, exit
code)."""

from __future__ import annotations

import inspect

import pytest

from durable_turns import errors
from durable_turns.errors import ERRORS, ErrorKind, error_kind


def _failures() -> list[type[Exception]]:
    return [c for _n, c in inspect.getmembers(errors, inspect.isclass)
            if issubclass(c, Exception) and c.__module__ == errors.__name__]


@pytest.mark.parametrize("cls", _failures(), ids=lambda c: c.__name__)
def test_every_failure_of_the_package_has_a_kind(cls: type[Exception]) -> None:
    assert any(issubclass(cls, listed) for listed, _kind in ERRORS)


def test_no_entry_is_hidden_behind_one_of_its_bases() -> None:
    for i, (cls, _kind) in enumerate(ERRORS):
        earlier = [c for c, _k in ERRORS[:i] if issubclass(cls, c)]
        assert earlier == [], f"{cls.__name__} comes after its base {earlier[0].__name__}"


def test_the_lookup_takes_the_most_specific_entry() -> None:
    assert error_kind(errors.InvalidInputError("no")) == ErrorKind(422, 2)
    assert error_kind(ValueError("no")) == ErrorKind(400, 2)
    assert error_kind(errors.UnknownTurnError("a/b", "t")) == ErrorKind(404, 2)
    assert error_kind(errors.StoreError("away")) == ErrorKind(503, 2)
    assert error_kind(errors.FatalToolError("x")) == ErrorKind(500, 1)
    assert error_kind(RuntimeError("a bug")) is None
