"""The one door to a channel's seams: for the simulator, ``walchannel flush`` and tests.

A harness builds ``GrpcEngineChannel(config)``; what it is built on (the
log, the network, the clocks, the random source) is replaced only here, and
what it decides is read only here (:func:`driver_of`). SPEC "The channel"
(the seams); tools/sim.py is the main user.
"""

from __future__ import annotations

import random
from typing import Literal

from walchannel.channel.grpc_channel import ChannelSeams, GrpcEngineChannel
from walchannel.clock import Clock
from walchannel.config import GrpcChannelConfig
from walchannel.core.driver import Driver
from walchannel.log.writer import RunLog
from walchannel.transport.base import Transport

__all__ = ["driver_of", "log_of", "open_channel"]


def open_channel(
    config: GrpcChannelConfig,
    *,
    rng: random.Random | None = None,
    log: RunLog | None = None,
    transport: Transport | None = None,
    clock: Clock | None = None,
    token_hash_when: Literal["open", "accepted"] = "open",  # noqa: S107 - not a secret
) -> GrpcEngineChannel:
    """Return ``GrpcEngineChannel(config)`` built on the given seams.

    Each seam is described in :class:`~walchannel.channel.grpc_channel.ChannelSeams`
    (None: the real part).

    Raises:
        ValueError: ``token_hash_when`` is neither ``"open"`` nor
            ``"accepted"``, or ``log`` is not the open, owned log of
            ``config.run_id``.
        Otherwise what ``GrpcEngineChannel(config)`` raises.
    """
    if token_hash_when not in ("open", "accepted"):
        raise ValueError(f"token_hash_when must be 'open' or 'accepted', got {token_hash_when!r}")
    channel = GrpcEngineChannel.__new__(GrpcEngineChannel)
    # The constructor's own body, on these seams (its signature keeps them off the face).
    channel._start(config, ChannelSeams(rng, log, transport, clock, token_hash_when))
    return channel


def driver_of(channel: GrpcEngineChannel) -> Driver:
    """Return the channel's :class:`~walchannel.core.driver.Driver`, to read, never to call."""
    return channel._driver


def log_of(channel: GrpcEngineChannel) -> RunLog:
    """Return the channel's own :class:`~walchannel.log.writer.RunLog` (``.log`` is a view)."""
    return channel._log
