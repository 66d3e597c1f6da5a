"""F1: the store conformance suite, every tier, on every shipped store."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from durable_turns import testing
from durable_turns.stores import SessionStore
from durable_turns.testing import CONFORMANCE, OPTIONAL, Check, declares, needs, run_check


@pytest.mark.parametrize("check", CONFORMANCE, ids=lambda c: c.__name__.removeprefix("check_"))
async def test_store_conformance(check: Check, store_factory: Callable[[], SessionStore]) -> None:
    if not await run_check(check, store_factory):
        pytest.skip(f"the store does not declare {needs(check)}")


TIERS = {
    "memory": ["exactly_once_local", "local_off_loop"],
    "sqlite": ["exactly_once_local", "local_off_loop", "durable", "shared_by"],
    "postgres": ["exactly_once_local", "local_off_loop", "durable", "shared_by", "lease_ttl"],
}
"""The optional tiers each shipped store declares, as ``durable_turns.testing``'s docstring
says (its table)."""


def test_the_shipped_stores_declare_the_tiers_the_suite_says(
        request: pytest.FixtureRequest, store_factory: Callable[[], SessionStore]) -> None:
    name = request.node.callspec.params["store_factory"]
    caps = store_factory().capabilities
    assert [tier for tier in OPTIONAL if declares(caps, tier)] == TIERS[name]
    table = testing.__doc__ or ""
    row = next(line for line in table.splitlines() if line.startswith(f"``{name.title()}"))
    assert row.split()[2:] == ["yes" if t in TIERS[name] else "--" for t in OPTIONAL], row
