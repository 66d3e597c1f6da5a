"""Helpers for testing stores and agents, shipped with the package.

**A model for an app's tests.** :class:`TestModel` calls each of the agent's tools once,
with an input generated from the tool's JSON schema (:func:`example_input`), then ends the
turn with a summary of what they returned: an app's tools run offline, parks and replays
included, with no scripting (``--model test`` on the command line)::

    agent = load_agent("myapp")
    agent.model = TestModel()

**The store conformance suite.** Every :class:`~durable_turns.stores.SessionStore` passes
the checks of two tiers:

- :data:`REQUIRED`: every store passes every one (leases and epochs, atomic commits, every
  write read back as written, the chain's rules, generations, workers' claims, turn data,
  the feed and its live events, the queries hosts read (sessions' owners, and what a
  listing shows whom), a session's history and its forks, wake-ups (a park arms its timers,
  each due one claimed once: F24), schedules (stored, claimed once, moved on once: F24),
  and a well-formed declaration of capabilities);
- :data:`OPTIONAL`: checks keyed by the capability they need (``store.capabilities``, a
  :class:`~durable_turns.stores.StoreCapabilities`). A store passes the checks of every
  capability it declares, and :func:`run_check` skips the others; a store that declares
  what it cannot do fails:

  - ``exactly_once_local``: a local tool's writes through the raw handle commit with its
    step and roll back with it (a raising tool, a failed step, a refused commit);
  - ``local_off_loop``: a cancel requested while a local tool's step is open returns at once
    (it never waits for the step), and the lease's cancel check sees it after the step;
  - ``durable``: a store opened afterwards on the same storage reads what one committed;
  - ``shared_by`` (``processes`` or ``machines``): two stores open on one storage see each
    other's writes, exclude each other's leases, wake each other's subscribers and carry
    each other's live events (``publish_live``) to them;
  - ``lease_ttl``: a lease nobody renews is taken over after about that long.

Which tiers the shipped stores pass (``tests/stores/test_store_conformance.py`` runs every tier on
each):

=================  ========  ==================  ==============  =======  =========  =========
store              required  exactly_once_local  local_off_loop  durable  shared_by  lease_ttl
=================  ========  ==================  ==============  =======  =========  =========
``MemoryStore``    yes       yes                 yes             --       --         --
``SqliteStore``    yes       yes                 yes             yes      yes        --
``PostgresStore``  yes       yes                 yes             yes      yes        yes
=================  ========  ==================  ==============  =======  =========  =========

:data:`CONFORMANCE` is every check of both tiers. Run them from your own tests with a
factory of stores on fresh storage (each call of it within one check on the *same* storage:
the optional tiers open a second store on it)::

    @pytest.mark.parametrize("check", CONFORMANCE, ids=lambda c: c.__name__)
    async def test_my_store(check, tmp_path):
        if not await run_check(check, lambda: MyStore(tmp_path / "db")):
            pytest.skip(f"MyStore does not declare {needs(check)}")

Checks are plain coroutines, so they need no test framework: a check of :data:`REQUIRED`
and of ``exactly_once_local`` takes a store; the other optional ones take a store and the
factory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from ..models._test_model import TestModel, example_input
from ..stores import SessionStore, StoreCapabilities
from . import capabilities, chain, history, leases, log, queries, schedules, timers
from .capabilities import StoreFactory
from .helpers import get_turn, step_result

__all__ = [
    "CAPABILITIES",
    "CONFORMANCE",
    "OPTIONAL",
    "REQUIRED",
    "Check",
    "StoreFactory",
    "TestModel",
    "declares",
    "example_input",
    "get_turn",
    "needs",
    "run_check",
    "step_result",
]

Check = Callable[..., Awaitable[None]]
"""A conformance check: ``check(store)``, or ``check(store, factory)`` for the optional
checks that open a second store (see :func:`run_check`)."""

REQUIRED: list[Check] = [
    chain.check_enqueue_is_durable_and_idempotent,
    leases.check_lease_is_exclusive,
    log.check_transaction_commits_everything,
    log.check_every_write_reads_back_as_written,
    log.check_failed_transaction_writes_nothing,
    chain.check_cancel_requests_are_durable,
    chain.check_turn_data_is_set_without_a_lease,
    chain.check_turn_data_of_two_writers_merges,
    chain.check_turn_data_commits_with_any_step,
    chain.check_parked_session_refuses_other_turns,
    chain.check_a_cancel_withdraws_a_park,
    queries.check_sessions_are_found_by_turn_id,
    queries.check_sessions_are_listed_newest_first,
    queries.check_sessions_are_summarised_with_what_they_wait_for,
    queries.check_owed_deliveries_are_an_outbox,
    queries.check_a_session_is_owned_once,
    queries.check_listings_show_what_a_principal_may_see,
    log.check_reset_starts_a_new_generation,
    log.check_a_long_transcript_reads_back_whole,
    history.check_history_lists_every_commit_in_order,
    history.check_a_fork_copies_a_session_up_to_a_checkpoint,
    history.check_a_fork_before_any_checkpoint_is_an_empty_session,
    history.check_a_fork_is_owned_by_its_plan_s_owner,
    chain.check_supersede_cancels_unfinished_turns_but_not_a_park,
    log.check_events_are_read_by_turn,
    leases.check_subscribe_replays_then_goes_live,
    leases.check_live_events_are_slotted_after_their_durable_event,
    leases.check_watchers_hear_commits_and_cancels,
    leases.check_two_holders_contend_for_one_session,
    log.check_a_stale_epoch_is_refused,
    leases.check_ready_sessions_are_claimed_once,
    timers.check_a_park_arms_its_timers,
    timers.check_due_timers_are_claimed_once,
    schedules.check_schedules_are_stored_and_read_back,
    schedules.check_due_schedules_are_claimed_once,
    capabilities.check_capabilities_are_declared,
]
"""The checks every store passes."""

OPTIONAL: dict[str, list[Check]] = {
    "exactly_once_local": [capabilities.check_local_writes_join_the_transaction],
    "local_off_loop": [capabilities.check_a_cancel_never_waits_for_a_step],
    "durable": [capabilities.check_commits_outlive_the_store],
    "shared_by": [capabilities.check_stores_on_one_storage_share_sessions,
                  capabilities.check_live_events_reach_a_store_on_the_same_storage],
    "lease_ttl": [capabilities.check_an_unrenewed_lease_expires],
}
"""The checks a store passes when it declares the capability they are keyed by."""

CAPABILITIES: dict[str, Callable[[StoreCapabilities], bool]] = {
    "exactly_once_local": lambda c: c.exactly_once_local,
    "local_off_loop": lambda c: c.exactly_once_local and c.local_off_loop,
    "durable": lambda c: c.durable,
    "shared_by": lambda c: c.shared_by != "process",
    "lease_ttl": lambda c: c.lease_ttl is not None,
}
"""Whether a store's capabilities declare each optional tier's capability."""

CONFORMANCE: list[Check] = [*REQUIRED, *(c for checks in OPTIONAL.values() for c in checks)]
"""Every check of both tiers (:func:`run_check` skips the optional ones a store does not
declare)."""

_WITH_FACTORY = frozenset({
    capabilities.check_commits_outlive_the_store,
    capabilities.check_stores_on_one_storage_share_sessions,
    capabilities.check_live_events_reach_a_store_on_the_same_storage,
    capabilities.check_an_unrenewed_lease_expires,
})


def needs(check: Check) -> str | None:
    """The capability an optional check needs (a key of :data:`OPTIONAL`), or ``None`` for a
    required check."""
    return next((name for name, checks in OPTIONAL.items() if check in checks), None)


def declares(caps: StoreCapabilities, capability: str) -> bool:
    """Whether ``caps`` declare an optional tier's capability.

    Raises:
        KeyError: not a key of :data:`OPTIONAL`.
    """
    return CAPABILITIES[capability](caps)


async def run_check(check: Check, factory: StoreFactory) -> bool:
    """Open a fresh store from ``factory``, run ``check`` on it, close it; skip an optional
    check the store does not declare the capability of.

    Args:
        check: a check of :data:`CONFORMANCE` (or one of your own taking a store).
        factory: makes a store on fresh storage; a check may call it again for a second
            store on the same storage.

    Returns:
        Whether the check ran (``False``: skipped, the store does not declare what it needs).

    Raises:
        AssertionError: the store failed the check (or whatever else the store raised).
    """
    store = factory()
    capability = needs(check)
    if capability is not None and not declares(store.capabilities, capability):
        return False
    await store.open()
    try:
        if check in _WITH_FACTORY:
            await cast(Callable[[SessionStore, StoreFactory], Awaitable[Any]], check)(
                store, factory)
        else:
            await check(store)
    finally:
        await store.close()
    return True
