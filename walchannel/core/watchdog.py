"""When a live stream is dead or stalled: the watchdog's bounds and verdict (pure; times in ms).

grpc.aio reports no progress inside a write and a half-open connection
stays silent: the stream's watchdog (``channel/stream.py``) looks a few
times per bound and asks :func:`stream_verdict`, from plain times and
byte counts, whether to end the stream. SPEC "Reconnect" (keepalive,
``dead_stream_ms``, ``min_send_rate_bytes_per_s``).
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "KEEPALIVE_TIMEOUT_MS",
    "Verdict",
    "loop_stalled",
    "stall_bound_ms",
    "stream_verdict",
    "watchdog_period_ms",
]

#: gRPC keepalive ping timeout (ms), as in the design note; also the slack
#: a blocked write gets beyond ``keepalive_ms`` (and the pending bytes' time
#: at ``min_send_rate_bytes_per_s``) before it counts as stalled.
KEEPALIVE_TIMEOUT_MS: Final = 10_000


class Verdict(enum.Enum):
    """Why the watchdog ends a live stream."""

    # Each bound also waits the time the pending bytes need at the minimum rate.
    DEAD = "dead"  # dead_stream_ms of silence while heartbeats went out
    STALLED = "stalled"  # a write blocked past keepalive + 10 s, silent as long


def watchdog_period_ms(dead_stream_ms: float | None, keepalive_ms: float) -> float:
    """How often the watchdog looks (ms): a quarter of the shortest bound, at least 50 ms."""
    stall_ms = keepalive_ms + KEEPALIVE_TIMEOUT_MS
    return max(50.0, min(dead_stream_ms or stall_ms, keepalive_ms) / 4)


def loop_stalled(late_ms: float, keepalive_ms: float) -> bool:
    """Tell whether the watchdog woke so late that the process itself did not run.

    ``late_ms`` past its timer, more than twice the keepalive: no heartbeat
    could go out and no down message be read in that time (a ``SIGSTOP``, a
    ``docker pause``, a starved host), so silence then says nothing of the
    stream, which gets a fresh chance (SPEC "Reconnect").
    """
    return late_ms > 2 * keepalive_ms


def stall_bound_ms(keepalive_ms: float, pending_bytes: int, min_send_rate: float) -> float:
    """How long a write may be blocked, and the stream silent, before it is stalled (ms).

    ``keepalive_ms + 10 s + pending_bytes / min_send_rate``: gRPC's
    keepalive and ping timeout, plus the time the bytes the engine must
    receive before it can answer need at the slowest rate the operator
    states (``min_send_rate_bytes_per_s``). grpc.aio reports no progress
    inside a write, so a large row on a slow link looks blocked and silent
    for as long as it takes to cross (grpc/grpc#22963, #15871). SPEC
    "Reconnect".

    Args:
        keepalive_ms: the current keepalive (ms).
        pending_bytes: the bytes ahead of the engine's next answer (see
            :func:`stream_verdict`).
        min_send_rate: the slowest rate a live link moves (bytes/s, > 0).

    Returns:
        The bound (ms).
    """
    return keepalive_ms + KEEPALIVE_TIMEOUT_MS + pending_bytes * 1000.0 / min_send_rate


def stream_verdict(
    now_ms: float,
    *,
    last_down_ms: float,
    heartbeats_since_down: int,
    write_since_ms: float | None,
    next_beat_ms: float,
    pending_bytes: int,
    dead_stream_ms: float | None,
    keepalive_ms: float,
    min_send_rate: float,
) -> tuple[Verdict, float, float, bool, float] | None:
    """Decide whether a live stream is dead; None while it looks alive.

    Both rules wait, beyond their own bound, the time ``pending_bytes``
    need at ``min_send_rate``: the engine cannot answer before those bytes
    have crossed, and a slow link is not a dead one (SPEC "Reconnect").

    ``dead_stream_ms`` (SPEC "Reconnect"): no down message for that long
    (plus the pending bytes' time) while heartbeats go out. A heartbeat that
    falls due while the writer is blocked in a write (flow control: a
    frozen engine, or a proxy that stopped reading) counts as going out: it
    is only stuck behind that write.

    Stalled write (always on, docs/design.md): a write blocked for
    :func:`stall_bound_ms` with no down message for as long. gRPC keepalive
    cannot catch it: its ping queues behind the blocked bytes.

    Args:
        now_ms: the time (ms).
        last_down_ms: when the last down message arrived (ms; the dial's
            time before the first).
        heartbeats_since_down: heartbeats written since then.
        write_since_ms: when the write in progress started, None when the
            writer is not in a write.
        next_beat_ms: when the next heartbeat is due (ms).
        pending_bytes: the bytes the engine must receive before it can
            answer: the larger of the oldest row written on this stream that
            no ack covers and the write in progress (bytes; 0: none).
        dead_stream_ms: the config's bound (None: off).
        keepalive_ms: the current keepalive (ms).
        min_send_rate: ``min_send_rate_bytes_per_s`` (bytes/s, > 0).

    Returns:
        None, or ``(verdict, silent ms, blocked ms, a heartbeat is overdue
        behind a blocked write, the bound that was passed in ms)``.
    """
    silent = now_ms - last_down_ms
    blocked = 0.0 if write_since_ms is None else now_ms - write_since_ms
    beat_overdue = write_since_ms is not None and now_ms >= next_beat_ms
    crossing = pending_bytes * 1000.0 / min_send_rate
    if (
        dead_stream_ms is not None
        and silent >= dead_stream_ms + crossing
        and (heartbeats_since_down > 0 or beat_overdue)
    ):
        return Verdict.DEAD, silent, blocked, beat_overdue, dead_stream_ms + crossing
    stall_ms = stall_bound_ms(keepalive_ms, pending_bytes, min_send_rate)
    if blocked >= stall_ms and silent >= stall_ms:
        return Verdict.STALLED, silent, blocked, beat_overdue, stall_ms
    return None
