"""Channels found by name: ``durable-turns serve --channel slack``, ``receive --channel …``.

A name maps to a :data:`ChannelFactory`, which makes the channel from the environment (its
secrets and settings). The package's own are :data:`BUILTIN_CHANNELS`; an app adds its own
(or replaces one) with ``channels = {"name": factory}`` in its ``agent.py``, or by passing
``factories`` to :func:`channel_from_env`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from types import MappingProxyType

from ..errors import ConfigurationError
from ._contract import Channel

ChannelFactory = Callable[[Mapping[str, str]], Channel]
"""Makes a channel from the environment's variables.

It raises :class:`~durable_turns.errors.ConfigurationError` naming what is missing (a
variable, an extra to install); a channel that only delivers (``receive``) may leave what
serving needs (a signing secret) to ``Channel.mount``."""


def _slack(env: Mapping[str, str]) -> Channel:
    try:
        from .slack import slack_from_env  # slack_sdk and aiohttp load only when asked for
    except ImportError as e:
        raise ConfigurationError(str(e)) from None
    return slack_from_env(env)


def _teams(env: Mapping[str, str]) -> Channel:
    try:
        from .teams import teams_from_env  # the Teams SDK, msal and PyJWT load when asked for
    except ImportError as e:
        raise ConfigurationError(str(e)) from None
    return teams_from_env(env)


BUILTIN_CHANNELS: Mapping[str, ChannelFactory] = MappingProxyType({"slack": _slack,
                                                                   "teams": _teams})
"""The channels the package ships, by name."""


def channel_from_env(name: str, env: Mapping[str, str] | None = None, *,
                     factories: Mapping[str, ChannelFactory] | None = None) -> Channel:
    """The channel called ``name``, made from the environment.

    Args:
        name: the channel's name (``"slack"``).
        env: the variables it reads (default ``os.environ``).
        factories: an app's own channels, by name; they come before the built-in ones.

    Returns:
        The channel, not mounted yet.

    Raises:
        ConfigurationError: no channel has that name (the message lists the known ones), or
            the environment lacks what it needs.
    """
    table = {**BUILTIN_CHANNELS, **(factories or {})}
    factory = table.get(name)
    if factory is None:
        raise ConfigurationError(
            f"no channel named {name!r}; known channels: {', '.join(sorted(table))}")
    return factory(os.environ if env is None else env)


__all__ = ["BUILTIN_CHANNELS", "ChannelFactory", "channel_from_env"]
