"""Channels: what puts an agent on a platform, and the seam every host is built on.

- :mod:`.contract`: the :class:`Channel` Protocol a platform implements (its routes, its
  start and stop, its recovery, ``deliver`` for F9) and :class:`Deliverer`, the part
  ``receive()`` needs.
- :mod:`.context`: :func:`mount_agent` gives a :class:`ChannelContext` (start a turn and
  stream it, answer a park, reset a session); the HTTP host and the REPL use it too.
- :mod:`.delivery`: ``receive()`` runs a turn nobody typed and delivers it (F9), and
  :func:`recover_deliveries` makes what a crash left owed.
- :mod:`.thread_channel`: the base of a platform with threads
  (:class:`~.thread_channel.ThreadChannel`): a platform is its routes and its calls.
- :mod:`.threads`: the delivery of turns into chat threads, which that base drives
  (:class:`~.threads.ThreadPlatform`: the calls a reply is made of).
- :mod:`.registry`: channels found by name (:func:`channel_from_env`).
- :mod:`.slack` (the ``slack`` extra), :mod:`.repl` (``durable-turns chat``).

Importing this package imports no web framework or SDK: a channel's own module does.
"""

from __future__ import annotations

from ._context import ChannelContext, TurnStream, mount_agent
from ._contract import Channel, Deliverer
from ._delivery import DELIVERED, deliver_owed, receive, recover_deliveries
from ._registry import BUILTIN_CHANNELS, ChannelFactory, channel_from_env

__all__ = [
    "BUILTIN_CHANNELS",
    "DELIVERED",
    "Channel",
    "ChannelContext",
    "ChannelFactory",
    "Deliverer",
    "TurnStream",
    "channel_from_env",
    "deliver_owed",
    "mount_agent",
    "receive",
    "recover_deliveries",
]
