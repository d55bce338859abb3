"""The sans-I/O core: seq arithmetic, the ack cursor, replay and verification decisions.

Nothing here does I/O, awaits, reads a clock or touches SQLite: every
function takes plain values and returns plain values, so the rules that keep
a run exactly-once are tested exhaustively without sockets or files, and
``tools/sim.py`` drives this very code through simulated crashes (the h11
pattern). The storage layer (:mod:`walchannel.log`) and the channel
(:mod:`walchannel.channel`) carry out what it decides.
"""

from __future__ import annotations

__all__ = [
    "next_seq_after",
    "unverified_at_open",
    "verification_shift",
]


def next_seq_after(high_water: int, last_acked_seq: int) -> int:
    """Return the next seq to assign: ``max(high-water, last_acked_seq) + 1``.

    Never ``MAX(seq) + 1`` over the rows: once every row is acked and
    deleted there are none, and a reused seq would be dropped by the engine
    as a duplicate. SPEC "The log" (seq is never reused).
    """
    return max(high_water, last_acked_seq) + 1


def unverified_at_open(stored: int | None, next_seq: int) -> int:
    """Return ``unverified_from`` for a log being opened: ``min(stored, next_seq)``.

    Rows at or above it have never been written after an answered
    handshake, so the engine may hold other content under those seqs (a
    rolled-back, restored or lost log). SPEC "Dial" (verification).
    """
    return next_seq if stored is None else min(stored, next_seq)


def verification_shift(unverified_from: int | None, engine_high: int) -> int:
    """Return how far the unverified rows must move after the first answered handshake.

    Args:
        unverified_from: the log's ``unverified_from`` (None once verified).
        engine_high: ``h`` from the engine's ``Ack(h)`` answer to the handshake.

    Returns:
        ``h + 1 - unverified_from`` when the engine already holds seqs at or
        above ``unverified_from`` (they move to ``h+1, h+2, …`` in order),
        else 0.
    """
    if unverified_from is None or engine_high < unverified_from:
        return 0
    return engine_high + 1 - unverified_from
