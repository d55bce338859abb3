"""The seam between the channel and the network: one stream call, dialing, discovery.

:class:`~walchannel.channel.GrpcEngineChannel` never touches grpc or httpx
itself: it asks a :class:`Transport` for a :class:`StreamCall` per dial and
for the engine's address before a redial. Production fills the seam with
grpc.aio and httpx (:class:`walchannel.transport.grpc.GrpcTransport`);
the simulator (``tools/sim.py``) fills it with its simulated network and
engines, so it runs the very channel production runs. This module imports
neither grpc nor httpx.

The contract of a call, as grpc.aio's bidirectional stream gives it (SPEC
"Wire contract": ``/EngineChannel/Open``): writes and reads may be in flight
together (one writer task, one reader task); every error of a call comes out
as :class:`StreamEnded`, naming the gRPC status when one is known.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["StreamCall", "StreamEnded", "Transport"]


class StreamEnded(Exception):
    """Why one stream ended (internal: the channel backs off and dials again).

    Attributes:
        code: the gRPC status name (``"UNAVAILABLE"``), None when none is known.
        details: the status details.
        debug: gRPC's debug string (where some GOAWAY reasons show), or "".
    """

    def __init__(
        self, message: str, code: str | None = None, details: str = "", debug: str = ""
    ) -> None:
        super().__init__(message)
        self.code = code
        self.details = details
        self.debug = debug


class StreamCall(Protocol):
    """One dial's bidirectional call (``/EngineChannel/Open``) and its connection.

    Attributes:
        route: `` via proxy host:port`` when the dial goes through a proxy,
            else "" (for log lines).
    """

    route: str

    async def write(self, message: bytes) -> None:
        """Write one serialized ``UpMessage``; returns when the transport took it.

        Raises:
            StreamEnded: the call is over (or broke during the write).
        """
        ...

    async def read(self) -> bytes:
        """Return the next ``DownMessage`` as the engine sent it, serialized.

        The channel parses it (:func:`walchannel.wire.protobuf.decode_down`): text
        that is not UTF-8 is repaired there, above this seam, so the
        simulator can send such bytes too.

        Raises:
            StreamEnded: the engine ended the call (with its status; OK
                included) or the call broke.
        """
        ...

    async def done_writing(self) -> None:
        """Half-close: no more writes (``close()`` waits for the engine's end)."""
        ...

    def cancel(self) -> None:
        """Cancel the call at once (a pending write or read returns)."""
        ...

    async def final_status(self) -> tuple[str, str] | None:
        """The call's final status ``(code name, details)`` once it is over, else None.

        When a write failed because the engine ended the call, this is the
        engine's reason, not the write's error.
        """
        ...

    async def close(self) -> None:
        """Release the connection (bounded: never hangs); idempotent."""
        ...


class Transport(Protocol):
    """Dials the engine and asks discovery where it is. SPEC "Dial", "Reconnect".

    Attributes:
        discovery_route: `` via proxy host:port`` when discovery goes
            through a proxy, else "" (for log lines).
    """

    discovery_route: str

    def dial(self, addr: str, *, keepalive_ms: int) -> StreamCall:
        """Open a call to ``addr`` (``host:port``) with the run's metadata; no wait.

        Args:
            addr: the engine's address.
            keepalive_ms: the keepalive of this dial (doubled after a GOAWAY
                ``too_many_pings``).
        """
        ...

    async def discover(self, timeout_s: float) -> str:
        """Ask discovery (``GET {http_addr}/grpc-address``) for the engine's address.

        Args:
            timeout_s: the bound of the whole exchange (seconds).

        Returns:
            A validated ``host:port`` allowed by ``allowed_hosts``.

        Raises:
            DiscoveryError: no usable address (the channel keeps its last).
        """
        ...

    async def aclose(self) -> None:
        """Release what the transport owns (its own discovery client); idempotent."""
        ...
