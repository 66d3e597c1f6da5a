"""Turns nobody typed (F9): ``receive()`` runs one and delivers it through a channel, and
what a crash left owed is delivered on recovery.

A delivery is a step of its own, keyed by the turn and the end it delivers (a park, then
the turn's end), stored on the turn's chain entry under :data:`DELIVERED`: at least once,
never again after it was stored.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ..errors import ConfigurationError
from ..events import TurnEvent
from ..inbound import InboundEvent, Trigger
from ..records import ChainEntry, TurnResult
from ..sessions import AgentSession
from ._context import ChannelContext
from ._contract import Deliverer

log = logging.getLogger("durable_turns")

DELIVERED = "delivered"
"""The name ``receive()`` keeps its delivery step under, on the turn's chain entry:
``{"step", "receipt", "final"}`` (``final``: the turn's end was delivered, not a park)."""


def delivery_target(rec: ChainEntry) -> Mapping[str, Any] | None:
    """Where a ``receive()`` turn is delivered (its ``target``), or ``None`` for any other
    turn."""
    spec = ((rec.event or {}).get("meta") or {}).get("deliver")
    target = spec.get("target") if isinstance(spec, Mapping) else None
    return target if isinstance(target, Mapping) else None


def delivery_settled(rec: ChainEntry) -> bool:
    """Whether a ``receive()`` turn's end was delivered (nothing is owed any more)."""
    return bool(((rec.data or {}).get(DELIVERED) or {}).get("final"))


async def receive(channel: Deliverer, ctx: ChannelContext, *, seed: str,
                  target: Mapping[str, Any], trigger: Trigger | None = None,
                  session: str | None = None, turn_id: str | None = None) -> TurnResult:
    """Run a turn nobody typed (a schedule, a webhook) and deliver it through ``channel`` (F9).

    The seed is stored as a ``trigger`` message attributed to ``trigger.by``; the turn runs
    durably (to its end or its park); then the delivery runs as a step of its own, keyed by
    the turn and stored with it (name ``"delivered"``): at least once, never twice after it
    was stored. A crash between the turn's end and the delivery delivers on recovery
    (:func:`recover_deliveries`, or ``receive`` again with the same ``turn_id``).

    Args:
        channel: renders the turn (``deliver(target, events)``), e.g. the Slack channel.
        ctx: the mounted agent (``mount_agent(agent, runtime)``).
        seed: the text that opens the turn.
        target: where the channel delivers (Slack: ``{"channel_id": "C…"}``).
        trigger: who started it (default ``Trigger(kind="proactive", by="system")``).
        session: the session (default ``"<kind>:<by>"``).
        turn_id: the turn's id (default: new); a scheduler that may fire twice passes one.

    Returns:
        The turn's result.

    Raises:
        ConfigurationError: ``channel`` is no :class:`Deliverer` (it has no ``deliver()``),
            or ``ctx`` no :class:`ChannelContext`.
        ValueError: an empty seed.
        Exception: whatever the channel's ``deliver`` raised (the delivery stays owed).
    """
    if not isinstance(channel, Deliverer):
        raise ConfigurationError(
            f"channel {type(channel).__name__} has no name and deliver(target, events): it "
            "cannot render a turn nobody in it started")
    if not isinstance(ctx, ChannelContext):
        raise ConfigurationError(f"{type(ctx).__name__} is no ChannelContext: mount the agent "
                                 "with mount_agent(agent, runtime)")
    trigger = trigger or Trigger()
    session = session or f"{trigger.kind}:{trigger.by}"
    turn_id = turn_id or uuid.uuid4().hex
    # The channel owes the delivery (the store's outbox: what recovery finds it by); where
    # to deliver travels with the turn's event.
    event = InboundEvent(channel.name, None, seed,
                         meta={"deliver": {"channel": channel.name, "target": dict(target)}})
    async for _e in ctx.run_stream(seed, session=session, event=event, turn_id=turn_id,
                                   trigger=trigger, deliver=channel.name):
        pass
    s = ctx.session(session)
    await deliver_owed(channel, s, turn_id)
    return await s.result(turn_id)


async def deliver_owed(channel: Deliverer, s: AgentSession, turn_id: str) -> bool:
    """Deliver a ``receive()`` turn that ended or parked, unless that end's delivery is
    stored; True if it ran.

    Raises:
        Exception: whatever ``deliver`` raised (nothing is stored; the delivery stays owed).
    """
    rec = await s.entry(turn_id)
    if rec is None or not rec.status.ended:
        return False
    target = delivery_target(rec)
    events = await s.events(turn_id=turn_id)
    ends = [e for e in events if e.ends_turn]
    if target is None or not ends:
        return False
    step = f"{turn_id}@{ends[-1].seq}"  # one delivery per end (a park, then the turn's end)
    if ((rec.data or {}).get(DELIVERED) or {}).get("step") == step:
        return False

    async def replay() -> AsyncIterator[TurnEvent]:
        for e in events:
            yield e

    receipt = await channel.deliver(target, replay())
    final = rec.status.final
    await s.set_turn_data(turn_id, DELIVERED, {"step": step, "receipt": receipt,
                                               "final": final})
    if final:  # a park's delivery is not the last: the turn goes on and ends later
        await s.settle_delivery(turn_id)
    return True


async def deliver_when_settled(channel: Deliverer, s: AgentSession, turn_id: str) -> bool:
    """Wait until a ``receive()`` turn ends or parks, then deliver it (:func:`deliver_owed`).

    Raises:
        UnknownTurnError: the session has no such turn.
        Exception: whatever ``deliver`` raised (the delivery stays owed).
    """
    await s.result(turn_id)
    return await deliver_owed(channel, s, turn_id)


async def recover_deliveries(channel: Deliverer, ctx: ChannelContext) -> int:
    """Deliver every ``receive()`` turn of ``ctx``'s agent for ``channel`` that ended or
    parked and whose delivery is not stored (a crash came between the turn's end and its
    delivery). A failing one is logged and left owed.

    Returns:
        How many it delivered.
    """
    n = 0
    for key, rec in await ctx.runtime.queries.owed_deliveries(channel.name, ctx.agent.name):
        if delivery_target(rec) is None or delivery_settled(rec) or not rec.status.ended:
            continue
        try:
            n += await deliver_owed(channel, ctx.session(key.session), rec.turn_id)
        except Exception:
            log.exception("delivering turn %s of %s failed; it stays owed", rec.turn_id, key)
    return n


__all__ = ["DELIVERED", "deliver_owed", "deliver_when_settled", "delivery_settled",
           "delivery_target", "receive", "recover_deliveries"]
