"""The log's decisions, sans I/O: the next seq, what an ack deletes, how verification moves rows.

:class:`LogState` is the one owner of the facts a run log decides (SPEC
"The log", "Dial"): the next seq, the stored ack cursor, ``unverified_from``,
the seq of the unacked ``Done`` and whether the run is completed. Every
transaction of :class:`walchannel.log.writer.RunLog` asks it first; it returns the
new state and, for an ack or a verification, an :class:`AckPlan` saying what
to do to the rows ("shift seqs ``>= S`` by ``k``", "delete seqs ``<= X``",
"set ``completed_at``"). ``RunLog`` only carries that out in SQL, and the
channel's :class:`walchannel.core.driver.Driver` reads these facts from the
log's state instead of tracking copies of them. No I/O, no clock, no
SQLite: the rules are tested exhaustively on plain values, and
``tools/sim.py`` runs them inside the real ``RunLog``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple

from walchannel.errors import ChannelClosedError, RunCompletedError

__all__ = [
    "COMPLETED_BY_ANOTHER",
    "FAILED_CORRUPT",
    "FAILED_DONE_REFUSED",
    "FAILED_ENGINE_BEHIND",
    "FAILED_FENCED",
    "FAILED_GROUP_LOST",
    "FAILED_INTERNAL",
    "FAILED_UNDELIVERABLE",
    "KINDS",
    "MAX_SEQ",
    "AckPlan",
    "LogState",
    "impossible_answer",
    "Writer",
    "completed_by_another",
    "fenced_reason",
    "refused_at_open",
    "next_seq_after",
    "next_seq_at_open",
    "unverified_at_open",
    "verification_shift",
]

#: The row kinds: the ``UpMessage`` oneof names that go through the log
#: (SPEC "Control vs data"). ``walchannel.log.format.KINDS`` is this set.
KINDS = frozenset({"event", "finding", "approval_request", "done", "progress"})

#: The largest seq: SQLite's largest INTEGER. No row's seq, and no high-water,
#: may pass it (SPEC "Dial": an answer that would is impossible).
MAX_SEQ: Final = 2**63 - 1

#: ``failed_reason``: an engine answered below the stored cursor (SPEC "Dial").
FAILED_ENGINE_BEHIND: Final = (
    "engine behind: an engine answered below the stored cursor; it lost rows this log "
    "already deleted, which cannot be re-sent"
)
#: ``failed_reason``: the engine says "run completed" while this log holds
#: unacked rows and no ``Done`` (docs/design.md). The engine applied a
#: ``Done`` and, taking seqs in order, every seq before it: these rows are
#: most likely among them (an older copy of the log), so the text never
#: suggests re-sending them. Logs written before it hold an older text that
#: also begins "run completed with ".
FAILED_UNDELIVERABLE: Final = (
    "run completed with rows unacked here: the engine says the run is completed (it "
    "applied a Done, and every seq before it) while this log still holds unacked rows; "
    "they may already be applied (this log may be an older copy: restored, copied or "
    "rolled back), and re-sending them could apply them twice"
)
#: ``failed_reason``: the log file turned out damaged where the channel read it.
FAILED_CORRUPT: Final = (
    "the log file is damaged: the channel stopped reading it (walchannel inspect --verify; "
    "walchannel export saves what is readable)"
)
#: ``failed_reason`` begins so when walchannel's own invariant broke (a bug in
#: walchannel, never a condition of the network or the engine): the run
#: stopped, every row stays in the log; the type and message follow.
FAILED_INTERNAL: Final = "walchannel stopped the run: its own invariant broke"
#: ``failed_reason``: under ``group_commit`` the disk refused a group of rows
#: handed out, on every try (SPEC "Group commit"). The log is whole: what it
#: holds is committed, the group was never in it nor sent.
FAILED_GROUP_LOST: Final = (
    "group lost: a group of rows handed out could not be committed (see last_error); "
    "they are not in the log and were never sent: resume the harness from its "
    "progress marker once the disk takes writes again"
)
#: ``failed_reason``: the log's files were removed or replaced while the channel
#: had them open (``WalRemovedError``). Stored into the open, unlinked file:
#: it shows only where that file is still read (a restored copy).
FAILED_LOG_REMOVED: Final = (
    "log removed: the log's files were removed or replaced while the channel had them open; "
    "rows committed since live only in the unlinked file"
)
#: ``failed_reason``: the engine refuses the run's ``Done`` for its size (docs/design.md).
FAILED_DONE_REFUSED: Final = (
    "Done refused: the engine refuses the run's Done for its size; raise the engine's "
    "limit, then resume or flush"
)


#: ``failed_reason`` begins so when the run is not this log's to write
#: (``WriterFencedError``, SPEC "The channel"): the engine says another
#: writer owns the run, or that a newer copy of this log (a restore)
#: superseded it, or that another writer completed it; or this log never had
#: an answered handshake and meets an engine that already holds rows of the
#: run (a lost or misplaced log, a second harness). The cause follows; every
#: row is kept, and the log stays refused until ``walchannel takeover``.
FAILED_FENCED: Final = "fenced: the run is another writer's"


#: The cause of a fenced log that another writer completed the run beside
#: (``WriterFencedError``): ``completed_by_another(failed_reason)`` reads the
#: writer back. A takeover cannot reopen a completed run (SPEC "Operating tools").
COMPLETED_BY_ANOTHER: Final = "the engine says writer {writer} completed the run"
_COMPLETED_BY_ANOTHER: Final = re.compile(
    re.escape(COMPLETED_BY_ANOTHER).replace(re.escape("{writer}"), r"(\S+)")
)


def completed_by_another(failed_reason: str | None) -> str | None:
    """The writer another writer's completion names in a fenced ``failed_reason``, or None.

    Args:
        failed_reason: the log's stored ``failed_reason`` (None: not failed).

    Returns:
        The writer id the engine named as having completed the run, when the
        log was fenced for that (:data:`COMPLETED_BY_ANOTHER`); else None.
    """
    if failed_reason is None or not failed_reason.startswith(FAILED_FENCED):
        return None
    found = _COMPLETED_BY_ANOTHER.search(failed_reason)
    return found.group(1) if found is not None else None


def fenced_reason(cause: str) -> str:
    """The ``failed_reason`` of a fenced log: :data:`FAILED_FENCED`, then the cause.

    Args:
        cause: why (the engine's words, or the evidence of a never-answered log).
    """
    return f"{FAILED_FENCED} ({cause}); every row is kept"


def refused_at_open(failed_reason: str | None, take_over: bool) -> bool:
    """Tell whether a log stays refused when opened: it was fenced, and is not marked to take over.

    A fenced log (``failed_reason`` :data:`FAILED_FENCED`) is refused by
    the channel and ``flush`` before any dial, until ``walchannel takeover``
    marks it (SPEC "The channel").

    Args:
        failed_reason: the stored ``failed_reason``.
        take_over: the log is marked to take the run over.
    """
    return not take_over and failed_reason is not None and failed_reason.startswith(FAILED_FENCED)


class Writer(NamedTuple):
    """The writer identity of a log: who writes the run through it. SPEC "The log".

    Sent in every handshake (``Handshake.writer_id``, ``writer_epoch``,
    ``take_over``); the engine keeps the run's owner and refuses any other
    writer (SPEC "Engine duties").

    Attributes:
        id: random, made in the log's creation transaction (at the owner's
            first open for a log made before it, anew by ``walchannel takeover``).
        epoch: 0 when made; raised by one by each ``walchannel restore``, so
            a restored copy supersedes a still-living original.
        take_over: the operator marked the log (``walchannel takeover``): its
            handshakes ask to take the run over until the first answered one.
        answered: an engine answered one of its handshakes, or acked its rows
            (a durable mark, set in the verification transaction).
    """

    id: str
    epoch: int
    take_over: bool
    answered: bool

    @property
    def may_meet_rows(self) -> bool:
        """True when this log may meet an engine that already holds rows of the run.

        It had an answered handshake (the rows may be its own), was restored
        (``epoch > 0``: an older copy, the verification rule renumbers past
        them) or was marked to take the run over. Otherwise an engine that
        holds rows holds another writer's: a lost or misplaced log, or a
        second harness (SPEC "Dial"); the channel refuses to join them.
        """
        return self.answered or self.take_over or self.epoch > 0


def next_seq_after(high_water: int, last_acked_seq: int) -> int:
    """Return the next seq to assign: ``max(high-water, last_acked_seq) + 1``.

    Never ``MAX(seq) + 1`` over the rows: once every row is acked and
    deleted there are none, and a reused seq would be dropped by the engine
    as a duplicate. SPEC "The log" (seq is never reused).
    """
    return max(high_water, last_acked_seq) + 1


def next_seq_at_open(high_water: int, top_seq: int | None, last_acked_seq: int) -> int:
    """Return the next seq of a log being opened, from its stored meta and its rows.

    ``next_seq_after(max(high_water, top_seq), last_acked_seq)``: the stored
    high-water and cursor count, not only the rows, which may all be gone.

    Args:
        high_water: the meta's stored high-water mark.
        top_seq: the highest seq among the rows (None: no rows).
        last_acked_seq: the stored ack cursor.
    """
    return next_seq_after(max(high_water, top_seq or 0), last_acked_seq)


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
        else 0. SPEC "Dial".
    """
    if unverified_from is None or engine_high < unverified_from:
        return 0
    return engine_high + 1 - unverified_from


def impossible_answer(
    engine_high: int, *, unverified_from: int | None, high_water: int
) -> str | None:
    """Say why a handshake answer ``Ack(h)`` is impossible, or None when it is not.

    ``h`` past :data:`MAX_SEQ` cannot be stored; on a log not yet verified,
    an ``h`` whose verification shift would carry a row to :data:`MAX_SEQ`
    or past it (leaving no seq for the next row) cannot be carried out.
    Either way the engine is wrong: a protocol error, never applied (SPEC
    "Dial", "Acks").

    Args:
        engine_high: ``h``, the engine's answer (an uint64).
        unverified_from: the log's ``unverified_from`` (None once verified).
        high_water: the log's high-water mark.
    """
    limit = "2**63 - 1, the largest seq SQLite holds"
    if engine_high > MAX_SEQ:
        return f"handshake answer Ack({engine_high}) is past {limit}"
    shift = verification_shift(unverified_from, engine_high)
    if unverified_from is not None and max(high_water + shift, engine_high) >= MAX_SEQ:
        return (
            f"handshake answer Ack({engine_high}) would move the unverified rows (seq "
            f"{unverified_from} on) by {shift}, up to seq {high_water + shift}: no seq "
            f"would be left below {limit}"
        )
    return None


@dataclass(frozen=True, slots=True)
class AckPlan:
    """What storing an ack (or the verifying answer) does to the rows and the meta.

    Carried out in one transaction, in this order: shift, delete, meta.

    Attributes:
        state: the log's state once committed.
        shift_from: move every row (and quarantined row) with ``seq >=
            shift_from`` by :attr:`shift_by`; None: move nothing.
        shift_by: the constant shift (0 when nothing moves).
        delete_through: delete every row with ``seq <=`` it (the new cursor).
        high_water: the high-water mark to store (at least).
        clear_unverified: set ``unverified_from`` to NULL (verification done).
        completed: set ``completed_at``: the ack covers the ``Done`` row, and
            the log becomes a tombstone (SPEC "Completion").
        advanced: the cursor moved (rows were acked): set ``last_ack_at``.
    """

    state: LogState
    shift_from: int | None
    shift_by: int
    delete_through: int
    high_water: int
    clear_unverified: bool
    completed: bool
    advanced: bool


class LogState(NamedTuple):
    """What a run log has decided, as a value. SPEC "The log".

    An immutable ``NamedTuple``: every append builds a new one, and a tuple is
    the cheapest value Python builds (a frozen dataclass costs ~1 µs more
    per append on the send path).

    Attributes:
        run_id: the run (for error messages).
        next_seq: the seq the next committed row gets; ``next_seq - 1`` is
            the high-water mark.
        last_acked: the stored ack cursor: every seq ``<=`` it is deleted.
        unverified_from: rows at or above it were never written after an
            answered handshake; None once verified (SPEC "Dial").
        done_seq: the seq of the unacked ``Done`` row, if one is logged.
        completed: the ack covering ``Done`` was stored: a tombstone.
    """

    run_id: str
    next_seq: int
    last_acked: int
    unverified_from: int | None
    done_seq: int | None
    completed: bool

    # -- opening --------------------------------------------------------------

    @classmethod
    def at_open(
        cls,
        run_id: str,
        *,
        high_water: int,
        last_acked: int,
        stored_unverified: int | None,
        completed: bool,
        top_seq: int | None,
        top_is_done: bool,
    ) -> LogState:
        """The state of a log being opened, from its stored meta and its top row.

        The next seq counts the stored high-water and cursor, not only the
        rows (which may all be acked and gone); ``unverified_from`` becomes
        ``min(stored, next_seq)`` and is stored at open (SPEC "Dial").

        Args:
            run_id: the run.
            high_water: the meta's stored high-water mark.
            last_acked: the meta's stored cursor.
            stored_unverified: the meta's stored ``unverified_from``.
            completed: ``completed_at`` is set.
            top_seq: the highest seq among the rows (None: no rows).
            top_is_done: that row is a ``done`` row.
        """
        next_seq = next_seq_at_open(high_water, top_seq, last_acked)
        return cls(
            run_id,
            next_seq,
            last_acked,
            unverified_at_open(stored_unverified, next_seq),
            top_seq if top_is_done else None,
            completed,
        )

    # -- derived ----------------------------------------------------------------

    @property
    def high_water(self) -> int:
        """The highest seq ever used by this log (0 for a new one)."""
        return self.next_seq - 1

    @property
    def unacked_count(self) -> int:
        """Rows above the stored cursor (from seqs, not a scan); 0 for a tombstone."""
        return 0 if self.completed else self.next_seq - 1 - self.last_acked

    def read_after(self, after_seq: int) -> int:
        """The exclusive lower bound of a read of unacked rows above ``after_seq``.

        Rows at or below the stored cursor are gone, whatever the caller asks:
        ``RunLog.unacked(after_seq)`` reads ``seq > read_after(after_seq)``.
        """
        return max(after_seq, self.last_acked)

    # -- appending ----------------------------------------------------------------

    def append(self, kinds: Iterable[str]) -> LogState:
        """Decide an append of rows of ``kinds`` (in order); they get ``next_seq, next_seq+1, …``.

        Returns:
            The state once they are committed (``done_seq`` set when the
            last is ``done``). Nothing is decided about a failed commit: it
            uses no seq (SPEC "The log").

        Raises:
            RunCompletedError: the log is a tombstone.
            ChannelClosedError: the log holds an unacked ``Done`` (SPEC
                "Completion"), or a row follows ``done`` in ``kinds``.
            ValueError: an unknown kind.
        """
        if self.completed:
            raise RunCompletedError(f"run {self.run_id}: completed (its Done was acked)")
        if self.done_seq is not None:
            raise ChannelClosedError(
                f"run {self.run_id}: Done is logged at seq {self.done_seq}; no new rows"
            )
        seq = self.next_seq
        done_at: int | None = None
        for kind in kinds:
            if kind not in KINDS:
                raise ValueError(f"run {self.run_id}: unknown row kind {kind!r}")
            if done_at is not None:
                raise ChannelClosedError(
                    f"run {self.run_id}: rows after Done (seq {done_at}) are refused"
                )
            if kind == "done":
                done_at = seq
            seq += 1
        if seq == self.next_seq:
            return self
        return LogState(
            self.run_id, seq, self.last_acked, self.unverified_from, done_at, self.completed
        )

    def follow_disk(
        self,
        *,
        high_water: int,
        last_acked: int,
        unverified_from: int | None,
        completed: bool,
        top_seq: int | None,
        top_is_done: bool,
    ) -> LogState:
        """A commit failed or was interrupted; the disk says what landed: take its word.

        An I/O error reported after the commit frame reached the WAL may
        still have landed the rows (docs/design.md, "A failed commit"), and
        an exception from a signal handler can land anywhere, right after
        ``COMMIT`` too, before this state followed it. What the disk holds
        is the state then, read as at open but for ``unverified_from``,
        taken as stored; the next seq never goes back and never names a
        row the disk holds (SPEC "The log": a seq is never reused).

        Args:
            high_water: the meta's stored high-water mark.
            last_acked: the meta's stored cursor.
            unverified_from: the meta's stored ``unverified_from``.
            completed: ``completed_at`` is set.
            top_seq: the highest seq among the rows (None: no rows).
            top_is_done: that row is a ``done`` row.
        """
        return LogState(
            self.run_id,
            max(self.next_seq, next_seq_at_open(high_water, top_seq, last_acked)),
            last_acked,
            unverified_from,
            top_seq if top_is_done and not completed else None,
            completed,
        )

    # -- acks and verification --------------------------------------------------------

    def ack(self, seq: int) -> AckPlan | None:
        """Decide storing the cumulative ``Ack(seq)``. SPEC "The log", "Acks".

        Returns:
            The plan, or None when it changes nothing (at or below the
            stored cursor, or a tombstone, which takes no more writes).

        Raises:
            ValueError: ``seq`` is above the high-water mark (never applied).
        """
        if seq <= self.last_acked or self.completed:
            return None
        if seq > self.high_water:
            raise ValueError(
                f"run {self.run_id}: ack {seq} is above the high-water mark {self.high_water}"
            )
        return self._store(seq, 0, verify=False)

    def verify(self, engine_high: int) -> AckPlan:
        """Decide the verification rule for the first answered handshake ``Ack(h)``. SPEC "Dial".

        When the engine holds seqs at or above ``unverified_from``, the
        unverified rows move to ``h+1, h+2, …`` (a constant shift, order
        kept) and the high-water becomes at least ``h``; ``unverified_from``
        is cleared; then ``Ack(h)`` is stored as any ack is.

        Raises:
            ValueError: the log is already verified, ``h`` is below the
                stored cursor (the engine-behind rule is the caller's), or
                it is impossible (:func:`impossible_answer`).
        """
        if self.unverified_from is None:
            raise ValueError(f"run {self.run_id}: the log is already verified")
        if engine_high < self.last_acked:
            raise ValueError(
                f"run {self.run_id}: engine high {engine_high} is below the stored "
                f"cursor {self.last_acked}"
            )
        why = impossible_answer(
            engine_high, unverified_from=self.unverified_from, high_water=self.high_water
        )
        if why is not None:
            raise ValueError(f"run {self.run_id}: {why}")
        return self._store(
            engine_high, verification_shift(self.unverified_from, engine_high), verify=True
        )

    def _store(self, seq: int, shift: int, *, verify: bool) -> AckPlan:
        start = self.unverified_from
        done = self.done_seq
        if shift and done is not None and start is not None and done >= start:
            done += shift  # the Done row is among the rows that move
        high = max(self.next_seq - 1 + shift, seq)
        acked = max(self.last_acked, seq)
        completed = done is not None and acked >= done
        state = LogState(
            self.run_id,
            high + 1,
            acked,
            None if verify else start,
            None if completed else done,
            self.completed or completed,
        )
        return AckPlan(
            state=state,
            shift_from=start if shift else None,
            shift_by=shift,
            delete_through=acked,
            high_water=high,
            clear_unverified=verify,
            completed=completed,
            advanced=acked > self.last_acked,
        )

    # -- completion -------------------------------------------------------------------

    def complete_by_engine(self) -> LogState:
        """Decide the engine's "run completed" answer while this log holds an unacked ``Done``.

        The engine applied a ``Done`` of this run (and, taking seqs in
        order, everything before it) but its ack was lost: every row is
        deleted and ``completed_at`` set; the stored cursor does not move
        (after a rollback the engine's ``Done`` may sit at another seq).
        docs/design.md, "A channel that fails while send_done waits".

        A log holding nothing unacked becomes a tombstone too: nothing of it
        can be lost, and a restart then knows the run is over without a dial
        (a new log after ``prune`` stayed ``idle`` for ever, issue 58).

        Raises:
            ValueError: the log holds unacked rows but no ``Done``: they are
                undeliverable and stay (the channel marks the run failed).
        """
        if self.done_seq is None and self.unacked_count > 0:
            raise ValueError(
                f"run {self.run_id}: rows are unacked and no Done is logged; the log stays as it is"
            )
        return LogState(
            self.run_id, self.next_seq, self.last_acked, self.unverified_from, None, True
        )

    def row_replaced(self, seq: int) -> LogState:
        """A damaged row at ``seq`` was replaced by a ``row_lost`` event (SPEC "The log").

        When it was the ``Done`` row, no ``Done`` is logged any more.
        """
        if self.done_seq != seq:
            return self
        return LogState(
            self.run_id,
            self.next_seq,
            self.last_acked,
            self.unverified_from,
            None,
            self.completed,
        )
