"""Test-only crash points: SIGKILL this process at a named point of the channel.

Armed only by the environment variable ``WALCHANNEL_TEST_KILL_AT``, set to
``point`` or ``point:N`` (die on the N-th time the point is reached,
default 1). The chaos suite uses it to land crashes in windows a random
SIGKILL on a two-core machine almost never hits (``tools/chaos.py``).
Unarmed, :func:`reached` is one global lookup.

Points: ``after_commit`` (row committed, not yet written), ``after_write``
(written, not acked), ``after_ack_received`` (ack received, not stored),
``in_replay`` (re-sending after a reconnect), ``in_send_done`` (Done
logged, waiting for its ack), ``in_close``.
"""

from __future__ import annotations

import os
import signal

__all__ = ["POINTS", "reached"]

POINTS = (
    "after_commit",
    "after_write",
    "after_ack_received",
    "in_replay",
    "in_send_done",
    "in_close",
)


def _parse(spec: str) -> tuple[str, int] | None:
    if not spec:
        return None
    point, _, count = spec.partition(":")
    if point not in POINTS:
        raise ValueError(f"WALCHANNEL_TEST_KILL_AT: unknown point {point!r} (one of {POINTS})")
    return point, int(count) if count else 1


_ARMED = _parse(os.environ.get("WALCHANNEL_TEST_KILL_AT", ""))
_hits = 0


def reached(point: str) -> None:
    """Die here (SIGKILL, no cleanup) if this point is armed and its count is reached."""
    global _hits
    if _ARMED is None or _ARMED[0] != point:
        return
    _hits += 1
    if _hits >= _ARMED[1]:
        os.kill(os.getpid(), signal.SIGKILL)
