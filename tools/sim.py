#!/usr/bin/env python3
"""Deterministic simulation of walchannel's protocol (FoundationDB / TigerBeetle VOPR style).

One *schedule* is a whole scan run played in virtual time: a harness that
scans a fixed list of findings and sends ``Done``, its log on a simulated
disk, an engine that can die and be replaced, a network that cuts, stalls
and says GOAWAY, and an operator that restarts crashed harnesses and runs
``flush`` on orphaned logs. Every choice (latencies, which fault, where the
process is killed, how many commits a power loss rolls back) comes from one
``random.Random(seed)``, so a schedule is a pure function of its seed and
``--replay SEED`` plays it again, verbosely.

The product is not re-implemented here. The log *is* walchannel's
``RunLog`` — its transactions and its decisions (:mod:`walchannel.log_state`)
— run on an in-memory SQLite database through ``RunLog.on_connection``; the
simulated disk is that database serialized after every commit
(``Connection.serialize()``): a process crash keeps the last committed
image, a power loss only the last synced one (durability ``"process"``), a
restore an older one, and the next process opens the image with
``Connection.deserialize()``. The checker reads rows and meta from the real
database. The simulated channel calls the same :mod:`walchannel.protocol`
code that ``GrpcEngineChannel`` calls (``Cursor``, which reads the log's
state, ``ReconnectPolicy``, ``StateMachine``, ``classify_end``,
``is_too_many_pings``) and ``Backoff.delay_ms`` with a seeded rng, always
through the module (``P.name``), so a test can plant a bug in the product by
monkeypatching it. What is simulated is the world around it: ``Chan``
drives the channel's decisions as events in virtual time, the engine
fulfils the SPEC's duties, and the network, the operator and the faults are
the schedule's.

After every schedule the invariants of docs/reliability.md are checked;
a violation prints the seed and the last events.

Usage::

    python tools/sim.py --seeds 100000 [--start S] [--jobs N] [--durability both]
    python tools/sim.py --replay 1234
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import multiprocessing
import os
import random
import sqlite3
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from walchannel import protocol as P
from walchannel.config import Backoff
from walchannel.errors import (
    ChannelClosedError,
    EngineBehindError,
    RunCompletedError,
    WalWriteError,
)
from walchannel.log import RunLog
from walchannel.log_format import encode_body

#: Content of the ``done`` row (findings are 0 .. N-1).
DONE = -1
#: Events get unique contents from here on (one per ``send_event``).
EVENT_BASE = 1_000_000

# Up-message kinds (client -> engine) and down-message kinds.
ROW, HS, HB, HALF = 0, 1, 2, 3
ACK, END = 0, 1

CONNECT_TIMEOUT_MS = 10_000.0
DONE_ACK_TIMEOUT_MS = 5_000.0
CLOSE_TIMEOUT_MS = 2_000.0
KEEPALIVE_MS = 25_000.0
KEEPALIVE_TIMEOUT_MS = 10_000.0
MAX_KEEPALIVE_MS = 300_000.0
FLUSH_TIMEOUT_MS = 300_000.0
ENGINE_ACK_IDLE_MS = 50.0
#: After the chaos window the world must settle within this (virtual ms).
SETTLE_MS = 3_600_000.0
#: The trace kept for a violation report.
TRACE_LEN = 40

_INF = float("inf")


class Crash(Exception):
    """The simulated harness process is killed (SIGKILL) at this point."""


RUN_ID = "sim"
CORRELATION_ID = "sim-c"

# The row of each content (findings 0 .. N-1, DONE, events), encoded once.
_ROWS: dict[int, tuple[str, bytes]] = {}
_CONTENTS: dict[bytes, int] = {}


def _row(content: int) -> tuple[str, bytes]:
    """The ``(kind, msgpack body)`` the harness logs for ``content``."""
    row = _ROWS.get(content)
    if row is None:
        if content == DONE:
            kind = "done"
            body: dict[str, Any] = {
                "status": "completed",
                "findings": 0,
                "coverage": [],
                "exit_reason": "",
            }
        elif content >= EVENT_BASE:
            kind = "event"
            body = {"type": "sim", "severity": "info", "payload": {"c": content}, "ts": ""}
        else:
            kind = "finding"
            body = {"fields": {"i": content}}
        row = (kind, encode_body(kind, body))
        _ROWS[content] = row
        _CONTENTS[row[1]] = content
    return row


def _content(blob: bytes) -> int:
    """The content of a stored row body (every body the simulation logs is in ``_ROWS``)."""
    return _CONTENTS[blob]


class Snap(NamedTuple):
    """One committed state of the log: the database image and what the checker read from it."""

    image: bytes  # Connection.serialize() after the commit
    rows: dict[int, int]  # seq -> content, read from the database
    last_acked: int
    unverified: int | None
    completed: bool
    handshake: bool  # handshake fields stored
    touched: tuple[int, ...]  # contents whose rows this commit inserted, moved or deleted


def read_snap(conn: sqlite3.Connection, touched: tuple[int, ...] = ()) -> Snap:
    """Read the log's rows and meta from the real database and take its image."""
    rows = {int(q): _content(b) for q, b in conn.execute("SELECT seq, body FROM rows")}
    acked, unverified, completed, handshake = conn.execute(
        "SELECT last_acked_seq, unverified_from, completed_at IS NOT NULL,"
        " harness_name IS NOT NULL FROM meta WHERE id = 1"
    ).fetchone()
    return Snap(
        conn.serialize(), rows, acked, unverified, bool(completed), bool(handshake), touched
    )


_FRESH: bytes | None = None


def fresh_image() -> bytes:
    """The image of a new log, laid out by ``RunLog.initialize`` (once per process)."""
    global _FRESH
    if _FRESH is None:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        RunLog.initialize(conn, RUN_ID, CORRELATION_ID)
        _FRESH = conn.serialize()
        conn.close()
    return _FRESH


class Disk:
    """The log file: its committed images since it was created, and how many are synced."""

    __slots__ = ("exists", "full", "states", "synced")

    def __init__(self) -> None:
        self.exists = False
        self.full = False
        self.states: list[Snap] = []
        self.synced = 0


class DiskHook:
    """The simulated disk under a real ``RunLog`` (its ``CommitHook``).

    Before each commit: a full disk fails it (SQLite's own error, so the
    product's rollback path runs) and the process may be killed (nothing
    committed). After it: the database image is kept, checked, maybe
    synced, and the process may be killed (committed).
    """

    __slots__ = ("conn", "w")

    def __init__(self, w: World, conn: sqlite3.Connection) -> None:
        self.w = w
        self.conn = conn

    def before_commit(self, what: str) -> None:
        if self.w.disk.full:
            raise sqlite3.OperationalError("database or disk is full")
        self.w.cp()

    def after_commit(self, what: str) -> None:
        self.w.committed(self.conn, what)


class Stream:
    """One dial: the transport, both ends' view of it, and the checker's notes."""

    __slots__ = (
        "answered",
        "ch",
        "connected",
        "down_t",
        "downq",
        "e_open",
        "epoch",
        "first_written",
        "idle_gen",
        "inst",
        "link",
        "productive",
        "sid",
        "stalled_until",
        "unacked",
        "up_at",
        "up_t",
        "upq",
        "writer_idle",
        "writing",
    )

    def __init__(self, sid: int, ch: Chan, inst: Inst | None) -> None:
        self.sid = sid
        self.ch = ch
        self.inst = inst
        self.link = True  # the transport carries messages
        self.e_open = False  # the engine handles this stream
        self.connected = False
        self.answered = False
        self.writing = False
        self.writer_idle = False
        self.epoch = -1
        self.upq: deque[tuple[Any, ...]] = deque()
        self.downq: deque[tuple[Any, ...]] = deque()
        self.up_t = 0.0
        self.down_t = 0.0
        self.stalled_until = 0.0
        self.unacked = 0
        self.idle_gen = 0
        self.first_written: int | None = None
        self.productive = False
        self.up_at: float | None = None


class Inst:
    """One engine process: its address and its streams (the store is the World's)."""

    __slots__ = ("addr", "alive", "gen", "reject_until", "streams")

    def __init__(self, gen: int, addr: str, reject_until: float) -> None:
        self.gen = gen
        self.addr = addr
        self.alive = True
        self.reject_until = reject_until
        self.streams: set[Stream] = set()


class Chan:
    """Mirrors ``GrpcEngineChannel`` (its tasks as events) plus the harness or ``flush`` on top.

    Method names follow channel.py (``_take_answer`` -> :meth:`take_answer`, ...).
    """

    def __init__(self, w: World, role: str) -> None:
        self.w = w
        self.role = role
        self.alive = True
        self.log = w.open_log()  # WalWriteError: the open fails
        if self.log.completed:
            self.close_log()
            raise RunCompletedError("the log is a tombstone")
        self.handshake_stored = w.disk.states[-1].handshake
        log = self.log
        # GrpcEngineChannel.__init__: the cursor reads the log's facts from the log.
        self.cursor = P.Cursor(log=log, acked=log.last_acked_seq)
        self.sm = P.StateMachine()
        self.policy = P.ReconnectPolicy()
        self.rng = random.Random(w.rng.getrandbits(32))
        self.addr = w.first_addr
        self.keepalive = KEEPALIVE_MS
        self.tail: dict[int, int] = {}
        self.tail_last = -1
        self.stream: Stream | None = None
        self.running = False
        self.closed = False
        self.closing = False
        self.close_cont: Callable[[], None] | None = None
        self.done_sent = False
        self.failure: Exception | None = None
        self.max_written = 0
        self.ack_timer = False
        self.streams_up = 0
        self.waiter: tuple[Callable[[], bool], Callable[[bool], None]] | None = None
        # harness
        self.next = 0
        self.early = False
        # checker notes (backoff)
        self.exp_attempt = 0
        self.dials: deque[float] = deque()

    # -- small helpers ---------------------------------------------------------

    def at(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self.w.at(self.w.now + delay, self._guard, fn, args)

    def _guard(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.alive:
            fn(*args)

    def move(self, state: P.ChannelState) -> None:
        if self.sm.state is state:
            return
        self.sm.move(state)
        if state is P.ChannelState.STREAMING or self.sm.final:
            self.notify()
            if self.sm.final:
                self.wakeup()

    def notify(self) -> None:
        waiter = self.waiter
        if waiter is not None and waiter[0]():
            self.waiter = None
            self.at(0.0, waiter[1], True)

    def wait(self, cond: Callable[[], bool], timeout: float, cont: Callable[[bool], None]) -> None:
        if cond():
            self.at(0.0, cont, True)
            return
        waiter = (cond, cont)
        self.waiter = waiter
        self.at(timeout, self._wait_timeout, waiter)

    def _wait_timeout(self, waiter: tuple[Callable[[], bool], Callable[[bool], None]]) -> None:
        if self.waiter is waiter:
            self.waiter = None
            waiter[1](waiter[0]())

    def set_error(self) -> None:
        with contextlib.suppress(WalWriteError):
            self.log.update_meta(last_error="sim", last_error_at=self.w.now)

    def close_log(self) -> None:
        if not self.log.closed:
            self.log.close()
            self.w.sync()  # closing the last connection checkpoints the WAL

    def fail(self, error: Exception) -> None:
        self.failure = error
        self.set_error()
        if not self.sm.final:
            self.move(P.ChannelState.FAILED)

    # -- sending (buffer first) --------------------------------------------------

    def check_sendable(self) -> None:
        if self.closed:
            raise ChannelClosedError("the channel is closed")
        if self.done_sent:
            raise ChannelClosedError("send_done() was called")
        if self.failure is not None:
            raise self.failure

    def log_rows(
        self, items: list[int], progress: int | None, cont: Callable[[BaseException | None], None]
    ) -> None:
        """``_log_rows``: commit, then hand to the writer; ``cont(error)`` when it returns."""
        w = self.w
        try:
            seqs = self.log.append_encoded(
                [_row(c) for c in items], progress=None if progress is None else {"n": progress}
            )
        except (WalWriteError, ChannelClosedError, RunCompletedError) as exc:
            cont(exc)
            return
        w.tr(
            "log commits seq %d..%d = %s (progress=%s)",
            seqs[0],
            seqs[-1],
            ", ".join(_name(c) for c in items),
            progress,
        )
        self._enqueue(seqs, items)
        self.wakeup()
        cont(None)

    def _enqueue(self, seqs: list[int], items: list[int]) -> None:
        if seqs[0] != self.tail_last + 1:
            self.tail.clear()
        for seq, c in zip(seqs, items, strict=True):
            self.tail[seq] = c
        self.tail_last = seqs[-1]

    # -- handshake and the connection loop ---------------------------------------

    def handshake(self, cont: Callable[[bool], None]) -> None:
        """``handshake()``: store the fields, start the loop, wait for STREAMING (or not)."""
        if self.failure is not None:
            raise self.failure
        self.log.update_meta(
            connector_version="sim", harness_name="sim-harness", harness_version="1"
        )
        self.handshake_stored = True
        if not self.running:
            self.running = True
            self.at(0.0, self.loop_dial, True)
        self.wait(
            lambda: self.sm.state is P.ChannelState.STREAMING or self.sm.final,
            CONNECT_TIMEOUT_MS,
            cont,
        )

    def loop_dial(self, first: bool) -> None:
        if self.sm.final or self.closing:
            return
        if not first and self.w.discovery:
            self.at(self.w.lat() * 2, self.after_discovery, self.w.discover(self.addr))
            return
        self.dial()

    def after_discovery(self, addr: str) -> None:
        if self.closing or self.sm.final:
            return
        self.addr = addr
        self.dial()

    def dial(self) -> None:
        w = self.w
        self.move(P.ChannelState.CONNECTING)
        w.note_dial(self)
        s = w.net_dial(self, self.addr)
        self.stream = s
        w.tr("dial #%d to %s", s.sid, self.addr)
        self.at(CONNECT_TIMEOUT_MS, self.answer_timeout, s)

    def on_connected(self, s: Stream) -> None:
        if s is not self.stream:
            return
        self.w.send_up(s, (HS,))
        if not self.w.acks_hs:
            self.stream_up(s, None)

    def answer_timeout(self, s: Stream) -> None:
        if s is self.stream and s.up_at is None:
            self.stream_end(s, None, "no handshake answer")

    def on_answer(self, s: Stream, h: int) -> None:
        self.w.tr("answer Ack(%d) on #%d", h, s.sid)
        replay_from = self.take_answer(s, h)
        if s is not self.stream:
            return
        if replay_from is None:
            self.stream_end(s, None, "handshake answer refused")
            return
        self.stream_up(s, replay_from)

    def take_answer(self, s: Stream, h: int) -> int | None:
        """``_take_answer``: carry out the core's decision for the answer ``Ack(h)``."""
        c = self.cursor
        w = self.w
        answer = c.on_answer(h)
        kind = answer.kind
        if kind is P.AnswerKind.BEHIND:
            w.violation(f"engine behind: answer {h} below the stored cursor {c.stored}")
            self.fail(EngineBehindError("engine behind"))
            return None
        if kind is P.AnswerKind.VERIFY:
            try:
                shift = self.log.verify(h)
            except WalWriteError:
                self.set_error()
                return None
            w.tr("verify h=%d: shift %d", h, shift)
            if shift:
                w.stats["shifts"] += 1
                self.tail.clear()
                self.tail_last = -1
            c.on_verified(h, shift)
            self.after_ack()
            return h + 1
        if kind is P.AnswerKind.AHEAD:
            w.violation(f"protocol error: answer {h} above the high-water {c.high_water}")
            return answer.replay_from
        if kind is P.AnswerKind.FORGOT:
            w.violation(f"engine forgot acks: answer {h} below the received ack {c.acked}")
            c.on_forgot(h)
            return answer.replay_from
        self.on_ack(s, h)
        return answer.replay_from

    def stream_up(self, s: Stream, replay_from: int | None) -> None:
        c = self.cursor
        if replay_from is None:
            replay_from = c.acked + 1
        self.streams_up += 1
        self.move(P.ChannelState.STREAMING)
        self.policy.on_stream_up(self.w.now)
        s.up_at = self.w.now
        with contextlib.suppress(WalWriteError):
            # _record_up
            self.log.update_meta(last_engine_addr=self.addr, reconnects=self.streams_up)
        c.start_stream(replay_from)
        s.writing = True
        self.w.tr("streaming on #%d from seq %d", s.sid, c.write_pos)
        self.at(0.0, self.writer, s)
        self.at(self.keepalive, self.heartbeat, s)

    def stream_end(self, s: Stream, code: str | None, details: str) -> None:
        """The stream is over (``_stream_once``'s finally, then ``_run``'s loop)."""
        if s is not self.stream:
            return
        w = self.w
        self.stream = None
        s.writing = False
        self.cursor.end_stream()
        w.client_close(s)
        w.tr("#%d ended: %s %s", s.sid, code, details)
        productive = s.productive or (s.up_at is not None and w.now - s.up_at >= P.STABLE_STREAM_MS)
        if productive:
            self.exp_attempt = 0
        if self.closing:
            if self.close_cont is not None:
                self.close_finish()
            return
        # _record_end
        if P.is_too_many_pings(details):
            self.keepalive = min(self.keepalive * 2, MAX_KEEPALIVE_MS)
        if P.classify_end(code, details) is P.EndKind.RUN_COMPLETED:
            # _on_run_completed: a logged Done was applied, its ack lost.
            if self.log.done_seq is not None:
                try:
                    self.log.complete_by_engine()
                except WalWriteError:
                    pass  # logged by the channel; the rows stay, the run fails below
                else:
                    self.failure = RunCompletedError("the engine says the run is completed")
                    if not self.sm.final:
                        self.move(P.ChannelState.FAILED)
                    return
            self.fail(RunCompletedError("the engine says the run is completed"))
            return
        if self.sm.final:
            return
        self.set_error()
        # _run: back off, then dial again
        self.move(P.ChannelState.BACKOFF)
        delay = self.policy.next_delay_ms(
            w.now, lambda attempt: w.backoff.delay_ms(attempt, self.rng)
        )
        w.check_delay(self, delay)
        self.at(delay, self.loop_dial, False)

    # -- the writer and the reader -------------------------------------------------

    def wakeup(self) -> None:
        s = self.stream
        if s is not None and s.writing and s.writer_idle:
            s.writer_idle = False
            self.at(0.0, self.writer, s)

    def writer(self, s: Stream) -> None:
        if s is not self.stream or not s.writing:
            return
        c = self.cursor
        seq = c.next_to_write()
        if seq is None:
            s.writer_idle = True
            return
        content = self.tail.get(seq)
        if content is None:
            # _row_bytes: the next rows from disk, as the channel reads them.
            row = next(self.log.unacked(after_seq=seq - 1, limit=1), None)
            if row is None or row.seq != seq:
                c = self.cursor
                self.w.violation(
                    f"row seq {seq} is not in the log (stored cursor {c.stored}, "
                    f"high-water {c.high_water}, read {None if row is None else row.seq})"
                )
                self.stream_end(s, None, f"row seq {seq} is not in the log")
                return
            content = _content(encode_body(row.kind, row.body))
        w = self.w
        w.cp()
        w.send_up(s, (ROW, seq, content))
        w.wpn += 1
        if w.cut_points and w.cut_points[0] <= w.wpn:
            del w.cut_points[0]
            w.at(w.now + w.rng.random() * 2.0, w.fault_cut, "cut")
        c.on_written(seq)
        self.policy.on_written(seq)
        if s.first_written is None:
            s.first_written = seq
        if seq > self.max_written:
            self.max_written = seq
        self.at(w.write_gap(), self.writer, s)

    def heartbeat(self, s: Stream) -> None:
        if s is self.stream and s.writing:
            self.w.send_up(s, (HB,))
            self.at(self.keepalive, self.heartbeat, s)

    def on_down(self, s: Stream, msg: tuple[Any, ...]) -> None:
        if s is not self.stream:
            return
        if msg[0] == ACK:
            if not s.answered and self.w.acks_hs:
                s.answered = True
                self.on_answer(s, msg[1])
                return
            self.on_ack(s, msg[1])
        else:
            self.stream_end(s, msg[1], msg[2])

    def on_ack(self, s: Stream, seq: int) -> None:
        """``_on_ack``."""
        w = self.w
        kind = self.cursor.on_ack(seq, w.now)
        if kind is P.AckKind.ABOVE_HIGH_WATER:
            w.violation(f"protocol error: Ack({seq}) above the high-water {self.cursor.high_water}")
            return
        self.policy.on_ack(seq)
        if s.first_written is not None and seq >= s.first_written:
            s.productive = True
        if kind is P.AckKind.ADVANCE:
            self.after_ack()

    def after_ack(self) -> None:
        w = self.w
        if self.cursor.acked > len(w.applied):
            w.violation(f"received cursor {self.cursor.acked} beyond the engine's {len(w.applied)}")
        self.store_ack()
        self.notify()

    def store_ack(self, *, force: bool = False) -> None:
        """``_store_ack``: store the cursor when the core says so (coalescing)."""
        c = self.cursor
        seq = c.ack_to_store(self.w.now, force=force)
        if seq is None:
            if c.pending_since_ms is not None and not self.ack_timer and not self.closed:
                self.ack_timer = True
                self.at(P.ACK_STORE_AFTER_MS, self.ack_timer_fired)
            return
        if self.log.closed:
            return
        try:
            self.log.ack(seq)
        except WalWriteError:
            return
        self.w.tr("log stores ack %d%s", seq, " (tombstone)" if c.completed else "")
        c.on_stored(seq)
        if c.completed:
            self.w.tr("Done acked at %d: tombstone", seq)
            self.notify()

    def ack_timer_fired(self) -> None:
        self.ack_timer = False
        if not self.closed:
            self.store_ack()

    # -- public operations used by the harness and flush -----------------------------

    def replay_unacked(self) -> None:
        self.cursor.rewind()
        self.wakeup()

    def send_done(self, cont: Callable[[BaseException | bool], None]) -> None:
        """``send_done``: log Done (unless logged), then wait for the tombstone."""
        if self.closed or self.done_sent:
            cont(ChannelClosedError("closed or Done sent"))
            return
        if self.failure is not None:
            cont(self.failure)
            return

        def logged(error: BaseException | None) -> None:
            if error is not None:
                cont(error)
                return
            self.done_sent = True
            self.wait(self._done_or_over, DONE_ACK_TIMEOUT_MS, waited)

        def waited(acked: bool) -> None:
            acked = self.cursor.completed
            if not acked and self.failure is not None:
                # Failed while waiting (e.g. "run completed" after the Done ack was lost).
                cont(self.failure)
                return
            cont(acked)

        if self.cursor.done_seq is None:
            self.log_rows([DONE], None, logged)
        else:
            logged(None)

    def _done_or_over(self) -> bool:
        # _wait_for gives up at once in FAILED or EXPIRED: no ack can come.
        return self.cursor.completed or self.sm.final

    def close(self, cont: Callable[[], None]) -> None:
        """``close()``: half-close, wait up to close_timeout for the end, tear down."""
        if self.closed:
            cont()
            return
        self.closed = True
        self.closing = True
        self.close_cont = cont
        s = self.stream
        if s is not None and s.writing:
            s.writing = False
            self.w.send_up(s, (HALF,))
            self.at(CLOSE_TIMEOUT_MS, self._close_timeout, s)
            return
        self.close_finish()

    def _close_timeout(self, s: Stream) -> None:
        if self.close_cont is not None:
            self.close_finish()

    def close_finish(self) -> None:
        cont = self.close_cont
        self.close_cont = None
        s = self.stream
        if s is not None:
            self.stream = None
            self.cursor.end_stream()
            self.w.client_close(s)
        self.store_ack(force=True)
        self.move(P.ChannelState.CLOSED)
        if self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            self.at(0.0, waiter[1], waiter[0]())
        self.close_log()
        if cont is not None:
            cont()


class World:
    """One schedule: the disk, the engine, the network, the operator and the checker."""

    def __init__(
        self,
        seed: int,
        durability: str = "both",
        *,
        verbose: bool = False,
        rollback_without_answer: bool = False,
    ) -> None:
        rng = self.rng = random.Random(seed)
        self.seed = seed
        self.verbose = verbose
        if durability == "both":
            durability = "process" if seed % 2 == 0 else "power"
        self.durability = durability
        self.now = 0.0
        self.heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self.n = 0
        self.events = 0
        self.trace: deque[tuple[float, str, tuple[Any, ...]]] = deque(maxlen=TRACE_LEN)
        self.violations: list[str] = []
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "crashes",
                "power_losses",
                "rolled_back_commits",
                "lost_logs",
                "restores",
                "engine_deaths",
                "engine_replacements",
                "cuts",
                "goaways",
                "stalls",
                "late_answers",
                "disk_full",
                "flushes",
                "harness_runs",
                "commits",
                "shifts",
                "events_logged",
                "dup_by_content",
                "dup_by_seq",
                "done_ack_lost",
                "dials",
            ),
            0,
        )
        self.max_dials_per_s = 0
        # -- the profile of this schedule --------------------------------------
        self.nf = rng.randint(1, 24)
        self.acks_hs = rng.random() >= 0.2
        # Without the handshake answer there is no verification rule: rollbacks
        # are outside the guarantee (SPEC "Dial"), so only the option plays them.
        self.rollback_ok = self.acks_hs or rollback_without_answer
        self.discovery = rng.random() < 0.5
        self.ack_every = rng.choice((1, 1, 2, 3, 8))
        self.ack_delay = rng.choice((0.0, 0.0, 1.0, 5.0, 30.0))
        self.lat_base = rng.choice((0.05, 0.2, 1.0))
        self.lat_jit = rng.choice((0.1, 1.0, 5.0))
        self.think = rng.choice((0.5, 5.0, 30.0))
        self.p_late = rng.choice((0.0, 0.0, 0.15))
        self.p_power = 0.6 if (durability == "process" and self.rollback_ok) else 0.0
        self.p_lost = 0.04 if self.rollback_ok else 0.0
        self.p_restore = 0.05 if self.rollback_ok else 0.0
        self.p_sync = rng.choice((0.02, 0.1, 0.3))
        self.p_flush = 0.3
        self.backoff = Backoff()
        self.chaos_end = 200.0 + self.nf * (self.think + 10.0) * 2 + rng.random() * 4000.0
        self.limit = self.chaos_end + SETTLE_MS
        self.chaos = True
        # crash points: the k-th commit or write kills the harness
        npoints = rng.choice((0, 0, 1, 1, 2, 3))
        span = 12 + 6 * self.nf
        self.crash_points = sorted(rng.randint(1, span) for _ in range(npoints))
        self.cpn = 0
        self.next_crash = self.crash_points.pop(0) if self.crash_points else -1
        # cut points: the k-th row written is followed by a cut
        self.cut_points = sorted(
            rng.randint(1, 4 + 2 * self.nf) for _ in range(rng.choice((0, 1, 2)))
        )
        self.wpn = 0
        self.next_event = EVENT_BASE
        self.post_completion: set[int] = set()
        # -- disk --------------------------------------------------------------------
        self.disk = Disk()
        self.affected: set[int] = set()
        self.logged = [0] * self.nf
        self.events_logged: list[int] = []
        # -- engine (the durable store shared by its processes) ----------------------
        self.applied: list[int] = []
        self.completed = False
        self.epoch = 0
        self.live: Stream | None = None
        self.insts: list[Inst] = []
        self.sid = 0
        self.first_addr = "e0"
        self.new_engine(0.0)
        self.flaky_until = -1.0
        self.flaky_from = _INF
        # -- operator ------------------------------------------------------------------
        self.proc: Chan | None = None
        self.finished = False
        self.recheck = rng.random() < 0.25

    # -- the scheduler ---------------------------------------------------------------

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self.n += 1
        heapq.heappush(self.heap, (t, self.n, fn, args))

    def tr(self, fmt: str, *args: Any) -> None:
        if self.verbose:
            print(f"{self.now:12.3f}  {fmt % args}")
        else:
            self.trace.append((self.now, fmt, args))

    def violation(self, message: str) -> None:
        self.tr("VIOLATION: %s", message)
        self.violations.append(message)

    def lat(self) -> float:
        return self.lat_base + self.rng.random() * self.lat_jit

    def write_gap(self) -> float:
        return self.rng.random() * 0.2

    def cp(self) -> None:
        """A crash point: the process may be killed here."""
        self.cpn += 1
        if self.cpn == self.next_crash:
            self.tr("crash point %d reached", self.cpn)
            self.next_crash = self.crash_points.pop(0) if self.crash_points else -1
            while self.next_crash == self.cpn:
                self.next_crash = self.crash_points.pop(0) if self.crash_points else -1
            raise Crash

    def run(self) -> World:
        self.plan_faults()
        self.at(0.0, self.start_harness)
        heap = self.heap
        pop = heapq.heappop
        try:
            while heap and not self.finished:
                t, _, fn, args = pop(heap)
                if t > self.limit:
                    break
                self.now = t
                if self.chaos and t > self.chaos_end:
                    self.end_chaos()
                self.events += 1
                try:
                    fn(*args)
                except Crash:
                    self.crash(timed=False)
        except Exception as exc:  # a bug surfaced as an exception is a violation too
            self.violation(f"exception {type(exc).__name__}: {exc}")
            return self
        if not self.finished:
            self.violation(
                f"stuck: the run did not finish (engine h={len(self.applied)}, "
                f"completed={self.completed}, t={self.now:.0f} ms)"
            )
        self.final_checks()
        return self

    # -- faults --------------------------------------------------------------------------

    def plan_faults(self) -> None:
        rng = self.rng
        end = self.chaos_end

        def some(choices: tuple[int, ...], fn: Callable[..., None], *args: Any) -> None:
            for _ in range(rng.choice(choices)):
                self.at(rng.random() * end, fn, *args)

        some((0, 0, 1, 2), self.fault_crash)
        some((0, 0, 1, 2, 3), self.fault_engine)
        some((0, 1, 2, 4), self.fault_cut, "cut")
        some((0, 0, 0, 1), self.fault_cut, "goaway")
        some((0, 0, 1, 2), self.fault_cut, "stall")
        some((0, 0, 0, 1, 2), self.fault_disk_full)
        if rng.random() < 0.15:
            self.flaky_from = rng.random() * end
            self.flaky_until = self.flaky_from + rng.random() * 60_000.0

    def end_chaos(self) -> None:
        self.chaos = False
        self.next_crash = -1
        self.crash_points = []
        self.disk.full = False
        self.flaky_until = -1.0
        if not any(i.alive for i in self.insts):
            self.new_engine(0.0)

    def fault_crash(self) -> None:
        if self.proc is not None and self.chaos:
            self.crash(timed=True)

    def crash(self, *, timed: bool, starting: str | None = None) -> None:
        ch = self.proc
        if ch is None and starting is None:
            return
        rng = self.rng
        self.stats["crashes"] += 1
        role = starting or "?"
        if ch is not None:
            role = ch.role
            ch.alive = False
            self.proc = None
            s = ch.stream
            if s is not None:
                ch.stream = None
                self.client_die(s)
        d = self.disk
        what = "crash"
        if d.exists and rng.random() < self.p_power:
            self.stats["power_losses"] += 1
            what = "power loss"
            unsynced = len(d.states) - 1 - d.synced
            if unsynced > 0:
                k = rng.randint(1, unsynced)
                self.rollback(len(d.states) - k)
                what += f" (rolled back {k} commits)"
        if d.exists and rng.random() < self.p_lost:
            self.stats["lost_logs"] += 1
            for st in d.states:
                self.affected.update(st.touched)
            d.exists = False
            d.states = []
            what += ", log lost"
        elif d.exists and len(d.states) > 1 and rng.random() < self.p_restore:
            self.stats["restores"] += 1
            keep = rng.randrange(1, len(d.states))
            self.rollback(keep)
            d.synced = len(d.states) - 1
            what += f", older copy restored ({keep} commits)"
        self.tr("%s of the %s (%s)", what, role, "timed" if timed else "at a crash point")
        self.at(self.now + self.restart_delay(), self.restart, True)

    def restart_delay(self) -> float:
        rng = self.rng
        return 10.0 + rng.random() * (20_000.0 if rng.random() < 0.2 else 2_000.0)

    def rollback(self, keep: int) -> None:
        d = self.disk
        gone = d.states[keep:]
        del d.states[keep:]
        self.stats["rolled_back_commits"] += len(gone)
        for st in gone:
            self.affected.update(st.touched)
        if d.synced >= keep:
            d.synced = keep - 1

    def fault_engine(self) -> None:
        if not self.chaos:
            return
        rng = self.rng
        live = [i for i in self.insts if i.alive]
        if not live:
            return
        inst = live[-1]
        zombie = rng.random() < 0.3
        if not zombie:
            self.kill_engine(inst)
        self.at(self.now + rng.random() * (5_000.0 if not zombie else 100.0), self.replace_engine)
        if zombie:
            self.at(self.now + rng.random() * 20_000.0, self.kill_engine, inst)

    def kill_engine(self, inst: Inst) -> None:
        if not inst.alive:
            return
        self.stats["engine_deaths"] += 1
        self.tr("engine %s dies", inst.addr)
        inst.alive = False
        for s in list(inst.streams):
            self.reset(s, "UNAVAILABLE", "Connection reset by peer")
        inst.streams.clear()

    def replace_engine(self) -> None:
        self.stats["engine_replacements"] += 1
        reject = self.rng.random() * 3_000.0 if self.rng.random() < 0.2 else 0.0
        self.new_engine(reject)

    def new_engine(self, reject_ms: float) -> None:
        gen = len(self.insts)
        addr = f"e{gen}" if self.discovery else "e0"
        self.insts.append(Inst(gen, addr, self.now + reject_ms))
        if gen:
            self.tr("engine %s (#%d) up", addr, gen)

    def fault_cut(self, kind: str) -> None:
        ch = self.proc
        if ch is None or ch.stream is None or not self.chaos:
            return
        s = ch.stream
        if not s.link:
            return
        rng = self.rng
        if kind == "cut":
            self.stats["cuts"] += 1
            code = rng.choice(("UNAVAILABLE", "INTERNAL", "UNKNOWN", "CANCELLED"))
            self.tr("network cuts #%d (%s)", s.sid, code)
            self.reset(s, code, "stream cut", keep_prefix=True)
        elif kind == "goaway":
            if s.e_open:
                self.stats["goaways"] += 1
                self.tr("GOAWAY on #%d", s.sid)
                self.engine_end(s, "UNAVAILABLE", "GOAWAY received; Debug Error: too_many_pings")
        else:
            self.stats["stalls"] += 1
            d = rng.choice((200.0, 3_000.0, 15_000.0, 60_000.0))
            s.stalled_until = self.now + d
            detect = KEEPALIVE_TIMEOUT_MS + rng.random() * ch.keepalive
            self.tr("#%d stalls for %.0f ms", s.sid, d)
            if d >= detect:
                self.at(self.now + detect, self.stall_kill, s)

    def stall_kill(self, s: Stream) -> None:
        if s.link:
            self.stats["cuts"] += 1
            self.reset(s, "UNAVAILABLE", "keepalive watchdog timeout", keep_prefix=False)

    def fault_disk_full(self) -> None:
        if not self.chaos:
            return
        self.stats["disk_full"] += 1
        self.disk.full = True
        self.tr("disk full")
        self.at(self.now + self.rng.random() * 2_000.0, self.disk_space)

    def disk_space(self) -> None:
        self.disk.full = False

    # -- the disk ---------------------------------------------------------------------------

    def open_log(self) -> RunLog:
        """A process opens the log: the real ``RunLog`` on the disk's last committed image.

        Raises:
            WalWriteError: the open's claim could not commit (disk full).
            Crash: the process is killed during the open.
        """
        d = self.disk
        conn = sqlite3.connect(":memory:", isolation_level=None)
        if not d.exists:
            # Created with synchronous=FULL and renamed into place: synced at once.
            conn.deserialize(fresh_image())
            d.exists = True
            d.states = [read_snap(conn)]
            d.synced = 0
        else:
            conn.deserialize(d.states[-1].image)
        try:
            return RunLog.on_connection(
                conn,
                run_id=RUN_ID,
                correlation_id=CORRELATION_ID,
                commit_hook=DiskHook(self, conn),
            )
        except WalWriteError:
            conn.close()
            raise

    def committed(self, conn: sqlite3.Connection, kind: str) -> None:
        """A transaction of the real log committed: keep its image and check it."""
        d = self.disk
        prev = d.states[-1]
        st = read_snap(conn)
        old, new = prev.rows.items(), st.rows.items()
        touched = [c for _, c in old ^ new if c >= 0]
        if prev.unverified is not None and st.unverified is None:
            # The verification rule declares every unverified row (re)placed.
            touched.extend(c for q, c in old if q >= prev.unverified and c >= 0)
        st = st._replace(touched=tuple(touched))
        if prev.completed and (kind == "append" or st.last_acked > prev.last_acked):
            self.violation(f"a completed run was written to ({kind})")
        if st.last_acked > len(self.applied):
            self.violation(
                f"stored cursor {st.last_acked} exceeds what the engine has ({len(self.applied)})"
            )
        if kind == "verify":
            self.tr("db after verify: cursor %d, rows %s", st.last_acked, sorted(st.rows))
        d.states.append(st)
        self.stats["commits"] += 1
        if kind == "append":
            logged = self.logged
            for _, c in new - old:
                if c < 0:
                    continue
                if c < EVENT_BASE:
                    logged[c] += 1
                else:
                    self.events_logged.append(c)
                if self.completed:
                    self.post_completion.add(c)
        if self.rng.random() < self.p_sync:
            d.synced = len(d.states) - 1
        self.cp()

    def sync(self) -> None:
        if self.disk.exists:
            self.disk.synced = len(self.disk.states) - 1

    # -- the network ----------------------------------------------------------------------

    def net_dial(self, ch: Chan, addr: str) -> Stream:
        self.sid += 1
        inst = None
        for i in reversed(self.insts):
            if i.alive and i.addr == addr:
                inst = i
                break
        s = Stream(self.sid, ch, inst)
        if inst is not None:
            self.at(self.now + self.lat(), self.connected, s)
        elif self.rng.random() < 0.7:
            self.at(self.now + self.lat(), self.client_end, s, "UNAVAILABLE", "connection refused")
        # else: a black hole; the connect timeout ends it
        return s

    def connected(self, s: Stream) -> None:
        inst = s.inst
        assert inst is not None
        if not s.link:
            return
        if not inst.alive:
            self.reset(s, "UNAVAILABLE", "connection refused")
            return
        s.connected = True
        s.e_open = True
        inst.streams.add(s)
        ch = s.ch
        if ch.alive and ch.stream is s:
            ch.on_connected(s)

    def discover(self, current: str) -> str:
        rng = self.rng
        r = rng.random()
        if self.chaos and r < 0.2:
            return current  # a bad answer: keep the last address
        if self.chaos and r < 0.4:
            return rng.choice(self.insts).addr  # stale
        live = [i for i in self.insts if i.alive]
        return (live[-1] if live else self.insts[-1]).addr

    def send_up(self, s: Stream, msg: tuple[Any, ...]) -> None:
        if not s.link:
            return
        s.upq.append(msg)
        t = self.now + self.lat()
        if t < s.up_t:
            t = s.up_t
        s.up_t = t
        self.at(t, self.deliver_up, s)

    def deliver_up(self, s: Stream) -> None:
        if not s.upq:
            return
        if s.stalled_until > self.now:
            self.at(s.stalled_until, self.deliver_up, s)
            return
        msg = s.upq.popleft()
        if s.e_open:
            self.engine_up(s, msg)

    def send_down(self, s: Stream, msg: tuple[Any, ...]) -> None:
        if not s.link:
            return
        s.downq.append(msg)
        t = self.now + self.lat()
        if t < s.down_t:
            t = s.down_t
        s.down_t = t
        self.at(t, self.deliver_down, s)

    def deliver_down(self, s: Stream) -> None:
        if not s.downq:
            return
        if s.stalled_until > self.now:
            self.at(s.stalled_until, self.deliver_down, s)
            return
        msg = s.downq.popleft()
        ch = s.ch
        if ch.alive and ch.stream is s:
            ch.on_down(s, msg)

    def client_end(self, s: Stream, code: str | None, details: str) -> None:
        s.link = False
        ch = s.ch
        if ch.alive and ch.stream is s:
            ch.stream_end(s, code, details)

    def reset(self, s: Stream, code: str, details: str, *, keep_prefix: bool = False) -> None:
        """The transport dies: a prefix of the in-flight up-messages may still land."""
        s.link = False
        s.downq.clear()
        if keep_prefix and s.upq:
            keep = self.rng.randint(0, len(s.upq))
            while len(s.upq) > keep:
                s.upq.pop()
            self.at(max(self.now, s.up_t) + 0.001, self.engine_cancel, s)
        else:
            s.upq.clear()
            self.engine_cancel(s)
        self.at(self.now + self.lat(), self.client_end, s, code, details)

    def client_close(self, s: Stream) -> None:
        """The client tears the stream down; what it wrote before still lands, then RST."""
        if not s.link:
            return
        s.link = False
        s.downq.clear()
        self.at(max(self.now, s.up_t) + self.lat(), self.engine_cancel, s)

    def client_die(self, s: Stream) -> None:
        """The harness process dies: a prefix of its in-flight writes lands."""
        if not s.link:
            return
        s.link = False
        s.downq.clear()
        keep = self.rng.randint(0, len(s.upq))
        while len(s.upq) > keep:
            s.upq.pop()
        self.at(max(self.now, s.up_t) + self.lat(), self.engine_cancel, s)

    # -- the engine ---------------------------------------------------------------------------

    def engine_cancel(self, s: Stream) -> None:
        s.upq.clear()
        self.engine_drop(s)

    def engine_drop(self, s: Stream) -> None:
        s.e_open = False
        if s.inst is not None:
            s.inst.streams.discard(s)
        if self.live is s:
            self.live = None

    def engine_end(self, s: Stream, code: str | None, details: str) -> None:
        """The engine ends a stream with a status (sent after what it already sent)."""
        if not s.e_open:
            return
        self.engine_drop(s)
        self.send_down(s, (END, code, details))

    def engine_up(self, s: Stream, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == ROW:
            self.engine_row(s, msg[1], msg[2])
        elif kind == HS:
            self.engine_handshake(s)
        elif kind == HB:
            if s.epoch == self.epoch:
                self.engine_ack(s)
        else:  # the client half-closed
            if s.unacked:
                self.engine_ack(s)
            self.engine_end(s, None, "")

    def engine_handshake(self, s: Stream) -> None:
        inst = s.inst
        assert inst is not None
        if self.now < inst.reject_until:
            self.engine_end(s, "UNAUTHENTICATED", "unknown run or invalid token")
            return
        # One live stream per run: the newer ends the older, which applies nothing more.
        self.epoch += 1
        s.epoch = self.epoch
        old = self.live
        self.live = s
        if old is not None and old is not s:
            self.engine_end(old, "ABORTED", "superseded by a newer stream for the run")
        if self.completed:
            self.engine_end(s, "FAILED_PRECONDITION", "run completed")
            return
        if self.acks_hs:
            delay = self.ack_delay
            if self.chaos and self.rng.random() < self.p_late:
                self.stats["late_answers"] += 1
                delay += self.rng.random() * 15_000.0
            self.at(self.now + delay, self.send_down, s, (ACK, len(self.applied)))
        if self.flaky_from <= self.now < self.flaky_until:
            self.at(
                self.now + self.ack_delay + 1.0,
                self.engine_end,
                s,
                "UNAVAILABLE",
                "engine dropped the stream",
            )

    def engine_row(self, s: Stream, seq: int, content: int) -> None:
        if s.epoch != self.epoch:
            return  # fenced: a newer stream owns the run
        applied = self.applied
        h = len(applied)
        if seq <= h:
            self.stats["dup_by_seq"] += 1
            if applied[seq - 1] != content:
                self.violation(
                    f"seq {seq} carries two contents at the engine: "
                    f"{_name(applied[seq - 1])} applied, {_name(content)} re-sent"
                )
        elif seq > h + 1:
            self.violation(f"gap: the engine expected seq {h + 1}, got {seq}")
            self.engine_end(s, "FAILED_PRECONDITION", f"expected seq {h + 1}, got seq {seq}")
            return
        elif self.completed:
            self.violation(f"{_name(content)} at seq {seq} after the run's Done")
            self.engine_end(s, "FAILED_PRECONDITION", "run completed")
            return
        else:
            applied.append(content)
            self.tr("engine applies seq %d = %s", seq, _name(content))
            if content == DONE:
                self.completed = True
                self.engine_ack(s)
                return
        s.unacked += 1
        if s.unacked >= self.ack_every:
            self.engine_ack(s)
        else:
            s.idle_gen += 1
            self.at(self.now + ENGINE_ACK_IDLE_MS, self.engine_idle, s, s.idle_gen)

    def engine_idle(self, s: Stream, gen: int) -> None:
        if s.idle_gen == gen and s.unacked and s.e_open:
            self.engine_ack(s)

    def engine_ack(self, s: Stream) -> None:
        s.unacked = 0
        s.idle_gen += 1
        if self.ack_delay:
            self.at(self.now + self.ack_delay, self.send_down, s, (ACK, len(self.applied)))
        else:
            self.send_down(s, (ACK, len(self.applied)))

    # -- the checker's online notes ---------------------------------------------------------------

    def note_dial(self, ch: Chan) -> None:
        self.stats["dials"] += 1
        dq = ch.dials
        dq.append(self.now)
        while self.now - dq[0] > 1000.0:
            dq.popleft()
        n = len(dq)
        if n > self.max_dials_per_s:
            self.max_dials_per_s = n
        if n > 3:
            self.violation(f"tight loop: {n} dials within one virtual second")

    def check_delay(self, ch: Chan, delay: float) -> None:
        """The attempt counter resets only after progress (SPEC "Reconnect")."""
        b = self.backoff
        floor = min(b.max_ms, b.initial_ms * b.multiplier**ch.exp_attempt)
        if delay < floor - 1e-6:
            self.violation(
                f"backoff reset without progress: delay {delay:.0f} ms after "
                f"{ch.exp_attempt} unproductive streams (at least {floor:.0f} ms)"
            )
        ch.exp_attempt += 1

    # -- the harness, flush and the operator -------------------------------------------

    def restart(self, flush_ok: bool = True) -> None:
        if self.proc is not None or self.finished:
            return
        d = self.disk
        if (
            flush_ok
            and d.exists
            and d.states[-1].handshake
            and not d.states[-1].completed
            and self.rng.random() < self.p_flush
        ):
            self.start_flush()
        else:
            self.start_harness()

    def exit(self, ch: Chan, why: str) -> None:
        if self.proc is not ch:
            return
        ch.alive = False
        self.proc = None
        self.tr("%s exits: %s", ch.role, why)
        if why in ("completed", "refused"):
            if not self.completed:
                self.violation(f"the harness exited '{why}' but the engine lacks Done")
            if self.recheck:
                self.recheck = False
                self.at(self.now + self.rng.random() * 1_000.0, self.restart, False)
            else:
                self.finished = True
            return
        if why == "gave up":
            self.at(self.now + self.restart_delay(), self.start_flush)
            return
        self.at(self.now + self.restart_delay(), self.restart, why != "flushed")

    def start_harness(self) -> None:
        if self.proc is not None or self.finished:
            return
        self.stats["harness_runs"] += 1
        try:
            ch = Chan(self, "harness")
        except Crash:
            self.crash(timed=False, starting="harness")
            return
        except WalWriteError:
            self.tr("harness cannot open the log (disk full)")
            self.at(self.now + 100.0 + self.rng.random() * 2_000.0, self.start_harness)
            return
        except RunCompletedError:
            self.tr("harness: the log is a tombstone; exits")
            if not self.completed:
                self.violation("a tombstone while the engine lacks Done")
            self.finished = True
            return
        self.proc = ch
        self.tr(
            "harness starts (progress=%s, acked=%d, next_seq=%d, unverified=%s)",
            ch.log.progress,
            ch.log.last_acked_seq,
            ch.log.next_seq,
            ch.log.unverified_from,
        )
        ch.early = self.rng.random() < 0.3 and ch.cursor.done_seq is None
        if ch.early:
            # Sends before handshake() are logged and delivered once connected (SPEC).
            ch.log_rows([self.new_event()], None, lambda error: self.harness_handshake(ch))
        else:
            self.harness_handshake(ch)

    def harness_handshake(self, ch: Chan) -> None:
        try:
            ch.handshake(lambda ok: self.harness_scan_start(ch))
        except WalWriteError:
            ch.close(lambda: self.exit(ch, "error"))
        except RunCompletedError:
            ch.close(lambda: self.exit(ch, "refused"))

    def harness_scan_start(self, ch: Chan) -> None:
        if ch.failure is not None:
            self.harness_failed(ch, ch.failure)
            return
        progress = ch.log.progress
        ch.next = 0 if progress is None else int(progress["n"])
        if ch.cursor.done_seq is None and ch.failure is None and not ch.early:
            # A real harness announces itself: the seq -> content map differs per life.
            ch.log_rows([self.new_event()], None, lambda error: self.harness_next(ch))
        else:
            self.harness_next(ch)

    def new_event(self) -> int:
        self.next_event += 1
        return self.next_event

    def harness_next(self, ch: Chan) -> None:
        rng = self.rng
        pause = rng.random() * self.think
        if rng.random() < 0.05:
            pause += 200.0 + rng.random() * 3_000.0
        ch.at(pause, self.harness_step, ch)

    def harness_failed(self, ch: Chan, error: BaseException) -> None:
        if isinstance(error, RunCompletedError):
            ch.close(lambda: self.exit(ch, "refused"))
        elif isinstance(error, EngineBehindError):
            ch.close(lambda: self.exit(ch, "engine behind"))
        else:
            self.violation(f"harness got {type(error).__name__}: {error}")
            ch.close(lambda: self.exit(ch, "error"))

    def harness_step(self, ch: Chan) -> None:
        rng = self.rng
        nf = self.nf
        if rng.random() < 0.03:
            ch.replay_unacked()
        if ch.next < nf:
            try:
                ch.check_sendable()
            except (RunCompletedError, EngineBehindError, ChannelClosedError) as exc:
                self.harness_failed(ch, exc)
                return
            first = ch.next
            items = list(range(first, min(nf, first + rng.randint(1, 3))))

            if rng.random() < 0.15:
                # A progress event between findings (no marker: it changes no position).
                ch.log_rows([self.new_event()], None, lambda error: self.harness_next(ch))
                return

            def sent(error: BaseException | None) -> None:
                if error is None:
                    ch.next = items[-1] + 1
                    self.harness_next(ch)
                elif isinstance(error, WalWriteError):
                    ch.at(50.0 + rng.random() * 500.0, self.harness_step, ch)
                else:
                    self.harness_failed(ch, error)

            ch.log_rows(items, items[-1] + 1, sent)
            return

        def done(result: BaseException | bool) -> None:
            if result is True:
                ch.close(lambda: self.exit(ch, "completed"))
            elif result is False:
                ch.close(lambda: self.exit(ch, "gave up"))
            elif isinstance(result, WalWriteError):
                ch.at(50.0 + rng.random() * 500.0, self.harness_step, ch)
            else:
                assert isinstance(result, BaseException)
                self.harness_failed(ch, result)

        ch.send_done(done)

    def start_flush(self) -> None:
        if self.proc is not None or self.finished:
            return
        self.stats["flushes"] += 1
        try:
            ch = Chan(self, "flush")
        except Crash:
            self.crash(timed=False, starting="flush")
            return
        except WalWriteError:
            self.at(self.now + 100.0 + self.rng.random() * 2_000.0, self.start_harness)
            return
        except RunCompletedError:
            self.at(self.now + 10.0, self.start_harness)
            return
        self.proc = ch
        if not ch.handshake_stored:
            self.tr("flush refuses: no stored handshake")
            ch.close(lambda: self.exit(ch, "flush refused"))
            return
        self.tr(
            "flush starts (acked=%d, next_seq=%d, unverified=%s)",
            ch.log.last_acked_seq,
            ch.log.next_seq,
            ch.log.unverified_from,
        )
        t0 = self.now
        try:
            ch.handshake(lambda ok: self.flush_wait(ch, t0))
        except WalWriteError:
            ch.close(lambda: self.exit(ch, "error"))

    def flush_wait(self, ch: Chan, t0: float) -> None:
        if ch.failure is not None:
            self.harness_failed(ch, ch.failure)
            return
        c = ch.cursor
        target = c.high_water  # wait_acked(None)
        remaining = max(0.0, FLUSH_TIMEOUT_MS - (self.now - t0))

        def waited(ok: bool) -> None:
            if ch.failure is not None:
                self.harness_failed(ch, ch.failure)
                return
            ch.close(lambda: self.exit(ch, "flushed" if ok else "flush timed out"))

        ch.wait(lambda: c.acked >= c.translate(target) or ch.sm.final, remaining, waited)

    # -- the end ----------------------------------------------------------------------------------

    def final_checks(self) -> None:
        if not self.finished:
            return
        applied = self.applied
        counts = [0] * self.nf
        ev_counts: dict[int, int] = {}
        dones = 0
        for c in applied:
            if c == DONE:
                dones += 1
            elif c >= EVENT_BASE:
                ev_counts[c] = ev_counts.get(c, 0) + 1
            else:
                counts[c] += 1
        for e in self.events_logged:
            n = ev_counts.get(e, 0)
            if e in self.affected or e in self.post_completion:
                if n > 1:
                    self.stats["dup_by_content"] += n - 1
            elif n != 1:
                self.violation(f"event {e - EVENT_BASE} applied {n} times")
        for i, n in enumerate(counts):
            if n == 0:
                self.violation(f"finding {i} never applied by the engine")
            elif n > 1:
                if i in self.affected:
                    self.stats["dup_by_content"] += n - 1
                else:
                    self.violation(f"finding {i} applied {n} times (no rolled-back commit of it)")
        if dones != 1:
            self.violation(f"Done applied {dones} times")
        elif applied[-1] != DONE:
            self.violation("Done is not the last message applied")
        for i, n in enumerate(self.logged):
            if n == 0:
                self.violation(f"the harness never logged finding {i}")
            elif n > 1 and i not in self.affected:
                self.violation(f"the harness logged finding {i} {n} times")
        d = self.disk
        if d.exists and not d.states[-1].completed:
            self.stats["done_ack_lost"] += 1
        self.stats["events_logged"] = len(self.events_logged)

    def report(self) -> str:
        lines = [f"seed {self.seed}: {len(self.violations)} violation(s)"]
        lines += [f"  - {v}" for v in self.violations[:5]]
        lines.append(
            f"  profile: findings={self.nf} durability={self.durability} "
            f"acks_handshake={self.acks_hs} discovery={self.discovery} ack_every={self.ack_every}"
        )
        lines.append("  last events:")
        for t, fmt, args in self.trace:
            lines.append(f"    {t:12.3f}  {fmt % args}")
        return "\n".join(lines)


def _name(content: int) -> str:
    if content == DONE:
        return "Done"
    if content >= EVENT_BASE:
        return f"event {content - EVENT_BASE}"
    return f"finding {content}"


# -- sweeps ----------------------------------------------------------------------------------------


def run_schedule(
    seed: int,
    durability: str = "both",
    *,
    verbose: bool = False,
    rollback_without_answer: bool = False,
) -> World:
    """Run one schedule; the returned world holds ``violations``, ``stats`` and ``events``.

    Args:
        seed: the schedule; the same seed plays the same schedule.
        durability: ``"process"``, ``"power"`` or ``"both"`` (by the seed's parity).
        verbose: print every traced event as it happens.
        rollback_without_answer: also play rollbacks when the engine does not
            answer handshakes (outside the guarantee: shows the degradation).
    """
    return World(
        seed,
        durability,
        verbose=verbose,
        rollback_without_answer=rollback_without_answer,
    ).run()


class Totals:
    """What a sweep adds up."""

    def __init__(self) -> None:
        self.schedules = 0
        self.events = 0
        self.stats: dict[str, int] = {}
        self.max_dials_per_s = 0
        self.violations: list[tuple[int, str]] = []
        self.failing = 0

    def add(self, w: World) -> None:
        self.schedules += 1
        self.events += w.events
        for k, v in w.stats.items():
            self.stats[k] = self.stats.get(k, 0) + v
        self.max_dials_per_s = max(self.max_dials_per_s, w.max_dials_per_s)
        if w.violations:
            self.failing += 1
            if len(self.violations) < 20:
                self.violations.append((w.seed, w.report()))

    def merge(self, other: Totals) -> None:
        self.schedules += other.schedules
        self.events += other.events
        for k, v in other.stats.items():
            self.stats[k] = self.stats.get(k, 0) + v
        self.max_dials_per_s = max(self.max_dials_per_s, other.max_dials_per_s)
        self.failing += other.failing
        self.violations.extend(other.violations[: max(0, 20 - len(self.violations))])


def sweep(
    seeds: Iterable[int],
    durability: str = "both",
    *,
    rollback_without_answer: bool = False,
    stop_at_first: bool = False,
) -> Totals:
    """Run many schedules in this process (see :func:`run_schedule`)."""
    totals = Totals()
    for seed in seeds:
        w = run_schedule(
            seed,
            durability,
            rollback_without_answer=rollback_without_answer,
        )
        totals.add(w)
        if stop_at_first and w.violations:
            break
    return totals


def _chunk(args: tuple[int, int, str, bool]) -> Totals:
    start, count, durability, unsafe = args
    return sweep(range(start, start + count), durability, rollback_without_answer=unsafe)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/sim.py",
        description="Deterministic simulation of walchannel's protocol core.",
        epilog="example: python tools/sim.py --seeds 100000 --jobs 2; "
        "python tools/sim.py --replay 4711",
    )
    parser.add_argument("--seeds", type=int, default=10_000, help="schedules to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--replay", type=int, default=None, help="re-run one seed verbosely")
    parser.add_argument(
        "--durability", choices=("process", "power", "both"), default="both", help="log durability"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    parser.add_argument(
        "--rollback-without-answer",
        action="store_true",
        help="also roll logs back when the engine does not answer handshakes "
        "(outside the guarantee: shows what engine_acks_handshake=False costs)",
    )
    args = parser.parse_args(argv)
    unsafe = bool(args.rollback_without_answer)

    if args.replay is not None:
        w = run_schedule(args.replay, args.durability, verbose=True, rollback_without_answer=unsafe)
        print(w.report() if w.violations else f"seed {args.replay}: no violation")
        print(f"events={w.events} " + " ".join(f"{k}={v}" for k, v in w.stats.items() if v))
        return 1 if w.violations else 0

    t0 = time.monotonic()
    totals = Totals()
    chunk = 2_000
    tasks = [
        (s, min(chunk, args.start + args.seeds - s), args.durability, unsafe)
        for s in range(args.start, args.start + args.seeds, chunk)
    ]
    if args.jobs > 1 and len(tasks) > 1:
        with multiprocessing.Pool(args.jobs) as pool:
            for part in pool.imap_unordered(_chunk, tasks):
                totals.merge(part)
                if not args.quiet:
                    _progress(totals, t0)
    else:
        for task in tasks:
            totals.merge(_chunk(task))
            if not args.quiet:
                _progress(totals, t0)
    elapsed = time.monotonic() - t0
    if not args.quiet:
        print(file=sys.stderr)
    st = totals.stats
    print(
        f"schedules={totals.schedules} events={totals.events} crashes={st.get('crashes', 0)} "
        f"power_losses={st.get('power_losses', 0)} "
        f"engine_replacements={st.get('engine_replacements', 0)} cuts={st.get('cuts', 0)} "
        f"violations={totals.failing}"
    )
    print(
        "  "
        + " ".join(f"{k}={v}" for k, v in sorted(st.items()))
        + f" max_dials_per_virtual_s={totals.max_dials_per_s}"
    )
    print(
        f"  {elapsed:.1f} s wall, {totals.schedules / max(elapsed, 1e-9):.0f} schedules/s, "
        f"jobs={args.jobs}, durability={args.durability}, seeds {args.start}.."
        f"{args.start + args.seeds - 1}"
    )
    for seed, text in totals.violations[:5]:
        print(text)
        print(f"  replay: python tools/sim.py --replay {seed} --durability {args.durability}")
    return 1 if totals.failing else 0


def _progress(totals: Totals, t0: float) -> None:
    elapsed = time.monotonic() - t0
    print(
        f"\r{totals.schedules} schedules, {totals.failing} failing, "
        f"{totals.schedules / max(elapsed, 1e-9):.0f}/s",
        end="",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
