from __future__ import annotations

from collections.abc import Callable

import pytest

from durable_turns.stores import SessionStore
from durable_turns.testing import CONFORMANCE, Check, needs, run_check


@pytest.mark.parametrize("check", CONFORMANCE, ids=lambda c: c.__name__.removeprefix("check_"))
async def test_store_conformance(check: Check, store_factory: Callable[[], SessionStore]) -> None:
    if not await run_check(check, store_factory):
        pytest.skip(f"the store does not declare {needs(check)}")
