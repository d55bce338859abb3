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
database. Every decision of the channel is the product's too:
:class:`SimDriver` carries out, in simulated time, what
:mod:`walchannel.session` (``plan_answer``, ``plan_end``,
``plan_run_completed``, ``ack_timer_ms``, ``WriteCounter``,
``stream_verdict``) and :mod:`walchannel.protocol` (``Cursor``,
``ReconnectPolicy``, ``StateMachine``) decide, with the rows and their
``UpMessage`` bytes from the real :class:`walchannel.row_source.RowSource`
and ``Backoff.delay_ms`` on a seeded rng — always through the module
(``S.plan_answer``, ``P.Cursor``), so a test can plant a bug in the product
by monkeypatching it (tests/test_simulation.py). ``SimDriver`` is to the
scheduler what ``walchannel/channel/`` is to asyncio and gRPC: the carrying
out, with no rule of its own.

What is simulated is the world: the disk (images, syncs, crashes, power
loss, a full disk, a lost or restored log), the network (latency, cuts,
stalls, GOAWAY, gRPC's transport keepalive, proxies), the engine (it
fulfils the SPEC's duties: seqs in order, cumulative acks, one live stream
per run, "run completed"; it dies, is replaced, and may lose its newest
rows to an older backup), the harness and the operator (restarts,
``flush``), and the checker.

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
from walchannel import session as S
from walchannel._proto import engine_channel_pb2 as pb
from walchannel.config import Backoff
from walchannel.errors import (
    ChannelClosedError,
    EngineBehindError,
    RunCompletedError,
    WalWriteError,
)
from walchannel.log import RunLog
from walchannel.log_format import FAILED_ENGINE_BEHIND, FAILED_UNDELIVERABLE, encode_body
from walchannel.row_source import RowMissingError, RowSource

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
KEEPALIVE_MS = 25_000
#: gRPC's transport keepalive timeout (the world's: it ends a stalled transport).
KEEPALIVE_TIMEOUT_MS = 10_000.0
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
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


# UpMessage bytes -> (seq, content): the engine reads what RowSource encoded.
_WIRE: dict[bytes, tuple[int, int]] = {}


def _decode(data: bytes) -> tuple[int, int]:
    """The ``(seq, content)`` of an ``UpMessage`` the writer wrote (decoded once per bytes)."""
    found = _WIRE.get(data)
    if found is None:
        msg = pb.UpMessage.FromString(data)
        kind = msg.WhichOneof("body")
        if kind == "done":
            content = DONE
        elif kind == "event":
            content = int(msg.event.payload["c"])
        else:
            content = int(msg.finding.fields["i"])
        found = _WIRE[data] = (msg.seq, content)
    return found


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
    contents = _CONTENTS
    rows = {q: contents[b] for q, b in conn.execute("SELECT seq, body FROM rows")}
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


class Link:
    """The simulated transport of one dial, with what each end reads of it.

    The world's: the queues, latency and stall of the link, the engine's side
    (open, epoch, unacked count), the checker's notes (first row written,
    progress). The channel's side holds the times and counters its real
    ``channel.stream.Stream`` holds for ``session.stream_verdict`` (last down
    message, heartbeats since, the write in progress, the next heartbeat).
    """

    __slots__ = (
        "answered",
        "ch",
        "connected",
        "down_t",
        "downq",
        "e_open",
        "epoch",
        "first_written",
        "heartbeats_since_down",
        "idle_gen",
        "inst",
        "keepalive",
        "last_down_ms",
        "link",
        "next_beat_ms",
        "productive",
        "sid",
        "stalled_until",
        "unacked",
        "up_at",
        "up_t",
        "upq",
        "write_since_ms",
        "writer_idle",
        "writing",
    )

    def __init__(self, sid: int, ch: SimDriver, inst: Inst | None) -> None:
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
        # The channel's view of the stream, as channel.stream.Stream keeps it.
        self.last_down_ms = 0.0
        self.heartbeats_since_down = 0
        self.write_since_ms: float | None = None
        self.next_beat_ms = _INF
        self.keepalive = KEEPALIVE_MS


class Inst:
    """One engine process: its address and its streams (the store is the World's)."""

    __slots__ = ("addr", "alive", "gen", "reject_until", "streams")

    def __init__(self, gen: int, addr: str, reject_until: float) -> None:
        self.gen = gen
        self.addr = addr
        self.alive = True
        self.reject_until = reject_until
        self.streams: set[Link] = set()


class SimDriver:
    """The channel's tasks in simulated time: it carries out the product's decisions.

    ``GrpcEngineChannel`` runs its dial, reader, writer, heartbeat, watchdog
    and timers as grpc.aio tasks; here each is an event of the scheduler,
    and the harness's calls (``send_*``, ``send_done``, ``wait_acked``,
    ``close``) are continuations. It decides nothing: every decision is the
    product's, called through its module so a test can plant a bug in it —

    - the handshake answer: :func:`walchannel.session.plan_answer` (over
      :meth:`walchannel.protocol.Cursor.on_answer`), carried out with
      ``RunLog.verify``, ``Cursor.on_verified`` / ``on_forgot``;
    - acks: ``Cursor.on_ack``, ``Cursor.ack_to_store`` (coalescing),
      :func:`walchannel.session.ack_timer_ms`, ``RunLog.ack``,
      ``Cursor.on_stored``;
    - the writer: ``Cursor.start_stream`` / ``next_to_write`` /
      ``on_written`` / ``rewind`` / ``translate``, the rows and their bytes
      from the real :class:`walchannel.row_source.RowSource` (tail,
      readahead, ``UpMessage`` encoding), :class:`walchannel.session.WriteCounter`;
    - ends of stream: :func:`walchannel.session.plan_end`,
      :func:`walchannel.session.plan_run_completed` (``RunLog.complete_by_engine``),
      :func:`walchannel.session.doubled_keepalive_ms`;
    - reconnecting: :class:`walchannel.protocol.ReconnectPolicy` (the
      backoff reset rule), ``Backoff.delay_ms``, :class:`~walchannel.protocol.StateMachine`;
    - the watchdog: :func:`walchannel.session.stream_verdict` (dead streams,
      and writes blocked by flow control on a stalled path: the world's
      :meth:`World.write` says when a write returns),
      :func:`walchannel.session.watchdog_period_ms`;
    - the log: ``RunLog`` and its :class:`~walchannel.log_state.LogState`.

    Not driven, because the simulated world never produces their input:
    size refusals (``pick_refused_row``, ``held_done_reached``), ``Stop``
    and approvals (``DownLatch``), checkpoints (``CheckpointPolicy``: the
    in-memory log has no file to give back). Method names follow the channel's
    (``_take_answer`` -> :meth:`take_answer`, ``_record_end`` ->
    :meth:`record_end`, ...). The checker's notes (``exp_attempt``,
    ``dials``) are written by the world, never read here.
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
        # ChannelBase.__init__: the cursor reads the log's facts from the log.
        self.cursor = P.Cursor(log=log, acked=log.last_acked_seq)
        self.sm = P.StateMachine()
        self.reconnect = P.ReconnectPolicy()
        self.writes = S.WriteCounter()
        self.rows = RowSource(log, RUN_ID, CORRELATION_ID, MAX_MESSAGE_BYTES)
        self.rng = random.Random(w.rng.getrandbits(32))
        self.addr = w.first_addr
        self.keepalive = w.keepalive_ms
        self.stream: Link | None = None
        self.running = False
        self.closed = False
        self.closing = False
        self.close_cont: Callable[[], None] | None = None
        self.done_sent = False
        self.failure: Exception | None = None
        self.ack_timer = False
        self.protocol_errors = 0
        self.waiter: tuple[Callable[[], bool], Callable[[bool], None]] | None = None
        # harness
        self.next = 0
        self.early = False
        # the checker's notes (backoff), kept by the world
        self.exp_attempt = 0
        self.dials: deque[float] = deque()

    # -- small helpers ---------------------------------------------------------

    def at(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self.w.at(self.w.now + delay, self._guard, fn, args)

    def _guard(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.alive:
            fn(*args)

    def move(self, state: P.ChannelState) -> None:
        """``_move``: the state machine refuses an illegal move (StateError)."""
        if self.sm.state is state:
            return
        self.sm.move(state)
        if state is P.ChannelState.STREAMING or self.sm.final:
            self.notify()
            if self.sm.final:
                self.wakeup()

    def notify(self) -> None:
        """``_acked_changed.set()``: the waiter looks at its condition again."""
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

    def set_error(self, failed: str | None = None) -> None:
        fields: dict[str, Any] = {"last_error": "sim", "last_error_at": self.w.now}
        if failed is not None:
            fields["failed_at"] = self.w.now
            fields["failed_reason"] = failed
        with contextlib.suppress(WalWriteError):
            self.log.update_meta(**fields)

    def close_log(self) -> None:
        if not self.log.closed:
            self.log.close()
            self.w.sync()  # closing the last connection checkpoints the WAL

    def fail(self, error: Exception) -> None:
        """``_fail``."""
        self.failure = error
        self.set_error(FAILED_ENGINE_BEHIND if isinstance(error, EngineBehindError) else None)
        if not self.sm.final:
            self.move(P.ChannelState.FAILED)

    def protocol_error(self, message: str) -> None:
        """``_protocol_error``: counted, never applied (the world's engine never earns one)."""
        self.protocol_errors += 1
        self.w.violation(f"protocol error: {message}")

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
        rows = [_row(c) for c in items]
        try:
            seqs = self.log.append_encoded(
                rows, progress=None if progress is None else {"n": progress}
            )
        except (WalWriteError, ChannelClosedError, RunCompletedError) as exc:
            cont(exc)
            return
        self.w.tr(
            "log commits seq %d..%d = %s (progress=%s)",
            seqs[0],
            seqs[-1],
            ", ".join(_name(c) for c in items),
            progress,
        )
        self.rows.on_commit(seqs, rows)
        self.wakeup()
        cont(None)

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
        """``_run``'s loop head: rediscover (not before the first dial), then dial."""
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
        """``_stream_once``: dial, then the handshake once connected, under the connect timeout."""
        w = self.w
        self.move(P.ChannelState.CONNECTING)
        w.note_dial(self)
        s = w.net_dial(self, self.addr)
        s.last_down_ms = w.now
        self.stream = s
        w.tr("dial #%d to %s", s.sid, self.addr)
        self.at(CONNECT_TIMEOUT_MS, self.answer_timeout, s)

    def on_connected(self, s: Link) -> None:
        """``_open``: the handshake is written; without answers the stream is up at once."""
        if s is not self.stream:
            return
        self.w.send_up(s, (HS,))
        if not self.w.acks_hs:
            self.open_stream(s, None)

    def answer_timeout(self, s: Link) -> None:
        if s is self.stream and s.up_at is None:
            self.stream_end(s, None, "no handshake answer")

    def open_stream(self, s: Link, h: int | None) -> None:
        """``_open`` after the answer (None: no answer awaited): decide, then start writing."""
        if h is not None:
            self.w.tr("answer Ack(%d) on #%d", h, s.sid)
        replay_from = self.take_answer(h)
        if s is not self.stream:
            return
        if replay_from is None:
            self.stream_end(s, None, "handshake answer refused")
            return
        if self.sm.final:
            self.stream_end(s, None, "the channel stopped")
            return
        w = self.w
        self.writes.on_stream_up()
        self.move(P.ChannelState.STREAMING)
        self.reconnect.on_stream_up(w.now)
        s.up_at = w.now
        with contextlib.suppress(WalWriteError):
            # _record_up
            self.log.update_meta(last_engine_addr=self.addr, reconnects=self.writes.reconnects)
        self.cursor.start_stream(replay_from)
        s.writing = True
        s.keepalive = self.keepalive
        s.next_beat_ms = w.now + s.keepalive
        w.tr("streaming on #%d from seq %d", s.sid, self.cursor.write_pos)
        self.at(0.0, self.writer, s)
        self.at(s.keepalive, self.heartbeat, s)
        self.at(S.watchdog_period_ms(w.dead_stream_ms, self.keepalive), self.watchdog, s)

    def take_answer(self, h: int | None) -> int | None:
        """``_take_answer``: carry out :func:`walchannel.session.plan_answer` for ``Ack(h)``."""
        c = self.cursor
        w = self.w
        plan = S.plan_answer(c, h, failed_mark=False)
        step = plan.step
        if h is None or step is S.AnswerStep.NO_ANSWER:
            return plan.replay_from
        if step is S.AnswerStep.FAIL_BEHIND:
            w.note_behind(h)
            self.fail(EngineBehindError("engine behind"))
            return None
        if step is S.AnswerStep.VERIFY:
            try:
                shift = self.log.verify(h)
            except WalWriteError:
                self.set_error()
                return None
            w.tr("verify h=%d: shift %d", h, shift)
            if shift:
                w.stats["shifts"] += 1
                self.rows.clear_tail()
            c.on_verified(h, shift)
            self.after_ack()
            return plan.replay_from
        if step is S.AnswerStep.PROTOCOL_ERROR:
            self.protocol_error(f"answer {h} above the high-water {c.high_water}")
            return plan.replay_from
        if step is S.AnswerStep.RESEND_FORGOTTEN:
            w.note_forgot(h, c.acked)
            c.on_forgot(h)
            return plan.replay_from
        self.on_ack(h)
        return plan.replay_from

    def stream_end(self, s: Link, code: str | None, details: str) -> None:
        """The stream is over: ``_stream_once``'s finally, ``_record_end``, then ``_run``."""
        if s is not self.stream:
            return
        w = self.w
        self.stream = None
        s.writing = False
        self.cursor.end_stream()
        self.rows.clear_readahead()
        w.client_close(s)
        w.tr("#%d ended: %s %s", s.sid, code, details)
        w.note_stream_end(self, s)
        if self.closing:
            if self.close_cont is not None:
                self.close_finish()
            return
        self.record_end(code, details)
        if self.closing or self.sm.final:
            return
        # _run: back off, then dial again
        self.move(P.ChannelState.BACKOFF)
        delay = self.reconnect.next_delay_ms(
            w.now, lambda attempt: w.backoff.delay_ms(attempt, self.rng)
        )
        w.check_delay(self, delay)
        self.at(delay, self.loop_dial, False)

    def record_end(self, code: str | None, details: str) -> None:
        """``_record_end``: carry out :func:`walchannel.session.plan_end`."""
        plan = S.plan_end(code, details, "", final=self.sm.final)
        if plan.double_keepalive:
            self.keepalive = S.doubled_keepalive_ms(int(self.keepalive))
        if plan.outcome is S.EndOutcome.RUN_COMPLETED:
            self.on_run_completed()
            return
        if plan.outcome is S.EndOutcome.ALREADY_OVER:
            return
        if plan.outcome is S.EndOutcome.SIZE_REFUSAL:
            self.w.violation(f"a size refusal the simulated engine never sends: {details}")
        self.set_error()

    def on_run_completed(self) -> None:
        """``_on_run_completed``: carry out :func:`walchannel.session.plan_run_completed`."""
        error = RunCompletedError("the engine says the run is completed")
        plan = S.plan_run_completed(self.log.state)
        if plan.tombstone and self.log.writable:
            try:
                self.log.complete_by_engine()
            except WalWriteError:
                self.w.complete_failed = True  # the checker's note (disk full)
            else:
                self.w.tr("the engine applied our Done: the log is a tombstone")
                self.notify()
                self.failure = error
                if not self.sm.final:
                    self.move(P.ChannelState.FAILED)
                return
        self.fail(error)
        if self.log.writable and plan.mark_undeliverable:
            with contextlib.suppress(WalWriteError):
                self.log.update_meta(failed_at=self.w.now, failed_reason=FAILED_UNDELIVERABLE)

    # -- the writer, heartbeats, the watchdog and the reader ----------------------------

    def wakeup(self) -> None:
        """``_wakeup.set()``: an idle writer looks again."""
        s = self.stream
        if s is not None and s.writing and s.writer_idle:
            s.writer_idle = False
            self.at(0.0, self.writer, s)

    def writer(self, s: Link) -> None:
        """One turn of ``_write_loop``: a due heartbeat, else the next row, else idle."""
        if s is not self.stream or not s.writing or s.write_since_ms is not None:
            return
        w = self.w
        if w.now >= s.next_beat_ms:
            s.heartbeats_since_down += 1
            self.write(s, (HB,), 0)
            return
        c = self.cursor
        seq = c.next_to_write()
        if seq is None:
            s.writer_idle = True
            return
        try:
            data = self.rows.row_bytes(seq)
        except RowMissingError:
            w.note_row_missing(seq, c.stored, c.high_water)
            self.stream_end(s, None, f"row seq {seq} is not in the log")
            return
        wrote, content = _decode(data)
        if wrote != seq:
            w.violation(f"the writer asked for seq {seq} and got the message of seq {wrote}")
        w.cp()
        self.write(s, (ROW, seq, content), seq)

    def write(self, s: Link, msg: tuple[Any, ...], seq: int) -> None:
        """``await call.write(...)``: returns when the transport takes it (flow control)."""
        w = self.w
        s.write_since_ms = w.now
        returns_at = w.write(s, msg)
        if returns_at > w.now:
            self.at(returns_at - w.now, self.wrote, s, seq)
        else:
            self.wrote(s, seq)

    def wrote(self, s: Link, seq: int) -> None:
        """The write of row ``seq`` (0: a heartbeat) returned; the writer goes on."""
        if s is not self.stream or not s.writing:
            return  # the stream was torn down: the write was cancelled
        w = self.w
        s.write_since_ms = None
        if seq:
            self.cursor.on_written(seq)
            self.reconnect.on_written(seq)
            self.writes.on_written(seq)
        else:
            s.next_beat_ms = w.now + s.keepalive
            self.at(s.keepalive, self.heartbeat, s)
        self.at(w.write_gap(), self.writer, s)

    def heartbeat(self, s: Link) -> None:
        """A heartbeat falls due (every ``keepalive`` whatever the traffic): wake the writer.

        A busy writer (or one blocked in a write) sends it at its next turn.
        """
        if s is self.stream and s.writing and s.writer_idle:
            s.writer_idle = False
            self.writer(s)

    def watchdog(self, s: Link) -> None:
        """``_watchdog``: end the stream when :func:`~walchannel.session.stream_verdict` says so."""
        if s is not self.stream or not s.writing:
            return
        w = self.w
        verdict = S.stream_verdict(
            w.now,
            last_down_ms=s.last_down_ms,
            heartbeats_since_down=s.heartbeats_since_down,
            write_since_ms=s.write_since_ms,
            next_beat_ms=s.next_beat_ms,
            dead_stream_ms=w.dead_stream_ms,
            keepalive_ms=self.keepalive,
        )
        if verdict is None:
            self.at(S.watchdog_period_ms(w.dead_stream_ms, self.keepalive), self.watchdog, s)
            return
        w.stats[f"{verdict.kind.value}_streams"] += 1
        self.stream_end(s, None, f"{verdict.kind.value} stream: silent {verdict.silent_ms:.0f} ms")

    def on_down(self, s: Link, msg: tuple[Any, ...]) -> None:
        """``_read_loop`` / ``_on_down``: the first ack answers the handshake."""
        if s is not self.stream:
            return
        s.last_down_ms = self.w.now
        s.heartbeats_since_down = 0
        if msg[0] == ACK:
            if not s.answered and self.w.acks_hs:
                s.answered = True
                self.open_stream(s, msg[1])
                return
            self.on_ack(msg[1])
        else:
            self.stream_end(s, msg[1], msg[2])

    def on_ack(self, seq: int) -> None:
        """``_on_ack``."""
        kind = self.cursor.on_ack(seq, self.w.now)
        if kind is P.AckKind.ABOVE_HIGH_WATER:
            self.protocol_error(f"Ack({seq}) above the high-water {self.cursor.high_water}")
            return
        self.reconnect.on_ack(seq)
        if kind is P.AckKind.ADVANCE:
            self.after_ack()

    def after_ack(self) -> None:
        """``_after_ack``."""
        self.w.note_received(self.cursor.acked)
        self.rows.drop_acked(self.cursor.acked)
        self.store_ack()
        self.notify()

    def store_ack(self, *, force: bool = False) -> None:
        """``_store_ack``: store the cursor when ``Cursor.ack_to_store`` says so."""
        c = self.cursor
        seq = c.ack_to_store(self.w.now, force=force)
        if seq is None:
            delay = S.ack_timer_ms(c, timer_armed=self.ack_timer)
            if delay is not None:
                self.ack_timer = True
                self.at(delay, self.ack_timer_fired)
            return
        if not self.log.writable:
            return
        try:
            self.log.ack(seq)
        except WalWriteError:
            return
        self.w.tr("log stores ack %d%s", seq, " (tombstone)" if c.completed else "")
        c.on_stored(seq)
        if c.completed:
            self.notify()

    def ack_timer_fired(self) -> None:
        self.ack_timer = False
        self.store_ack()

    # -- public operations used by the harness and flush -----------------------------

    def replay_unacked(self) -> None:
        self.rows.clear_readahead()
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
                # Failed while waiting (engine behind).
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

    def _close_timeout(self, s: Link) -> None:
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
                "dead_streams",
                "stalled_streams",
                "engine_losses",
                "engine_behind",
                "forgot_answers",
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
        # The channel's keepalive_ms and dead_stream_ms (None: off): the default
        # heartbeat, or a short one (the run's virtual time is mostly below a
        # second) with the dead-stream rule at three heartbeats.
        self.keepalive_ms = KEEPALIVE_MS
        self.dead_stream_ms: float | None = None
        if rng.random() < 0.3:
            self.keepalive_ms = 200
            self.dead_stream_ms = rng.choice((None, 600.0))
        # An engine that loses acked rows (restored from an older backup): only
        # with handshake answers, which is how the channel learns of it (SPEC "Dial").
        self.p_engine_loss = 0.12 if self.acks_hs else 0.0
        # Behind an L7 proxy gRPC's keepalive pings are answered by the proxy:
        # a stalled path is then noticed by dead_stream_ms alone (docs/design.md).
        self.proxy = rng.random() < 0.5
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
        # The most the engine ever held: acks are checked against it (a loss
        # makes the engine hold less than it once acked).
        self.peak = 0
        self.engine_lost = False
        self.behind = False
        self.complete_failed = False
        self.completed = False
        self.epoch = 0
        self.live: Link | None = None
        self.insts: list[Inst] = []
        self.sid = 0
        self.first_addr = "e0"
        self.new_engine(0.0)
        self.flaky_until = -1.0
        self.flaky_from = _INF
        # -- operator ------------------------------------------------------------------
        self.proc: SimDriver | None = None
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
        if rng.random() < self.p_engine_loss:
            self.at(rng.random() * end, self.fault_engine_loss)
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

    def fault_engine_loss(self) -> None:
        """The engine's store goes back to an older backup: it loses its newest rows.

        Every engine process restarts on it. The channel learns of it from
        the next handshake answer: below the stored cursor -> engine behind
        (the run fails, the rows are gone from the log too); else the rows
        the engine lost are still in the log and are sent again.
        """
        applied = self.applied
        if not self.chaos or self.completed or not applied:
            return
        rng = self.rng
        k = min(len(applied), rng.choice((1, 1, 2, rng.randint(1, len(applied)))))
        del applied[-k:]
        self.stats["engine_losses"] += 1
        self.engine_lost = True
        self.tr("the engine's store loses its last %d rows (h=%d)", k, len(applied))
        for inst in self.insts:
            self.kill_engine(inst)
        self.at(self.now + rng.random() * 2_000.0, self.replace_engine)

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
            # gRPC's transport keepalive (the world's, not walchannel's) ends it.
            detect = KEEPALIVE_TIMEOUT_MS + rng.random() * ch.keepalive
            self.tr("#%d stalls for %.0f ms", s.sid, d)
            if d >= detect and not self.proxy:
                self.at(self.now + detect, self.stall_kill, s)

    def stall_kill(self, s: Link) -> None:
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
        # Most commits (meta, claim) leave the rows alone: compare before diffing.
        touched = [] if prev.rows == st.rows else [c for _, c in old ^ new if c >= 0]
        if prev.unverified is not None and st.unverified is None:
            # The verification rule declares every unverified row (re)placed.
            touched.extend(c for q, c in old if q >= prev.unverified and c >= 0)
        if touched:
            st = st._replace(touched=tuple(touched))
        if prev.completed and (kind == "append" or st.last_acked > prev.last_acked):
            self.violation(f"a completed run was written to ({kind})")
        if st.last_acked > self.peak:
            self.violation(
                f"stored cursor {st.last_acked} exceeds what the engine has ({self.peak})"
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

    def net_dial(self, ch: SimDriver, addr: str) -> Link:
        self.sid += 1
        inst = None
        for i in reversed(self.insts):
            if i.alive and i.addr == addr:
                inst = i
                break
        s = Link(self.sid, ch, inst)
        if inst is not None:
            self.at(self.now + self.lat(), self.connected, s)
        elif self.rng.random() < 0.7:
            self.at(self.now + self.lat(), self.client_end, s, "UNAVAILABLE", "connection refused")
        # else: a black hole; the connect timeout ends it
        return s

    def connected(self, s: Link) -> None:
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

    def send_up(self, s: Link, msg: tuple[Any, ...]) -> None:
        if msg[0] == ROW:
            # The checker's notes: the first row written on the stream; cut points.
            if s.first_written is None:
                s.first_written = msg[1]
            self.wpn += 1
            if self.cut_points and self.cut_points[0] <= self.wpn:
                del self.cut_points[0]
                self.at(self.now + self.rng.random() * 2.0, self.fault_cut, "cut")
        if not s.link:
            return
        s.upq.append(msg)
        t = self.now + self.lat()
        if t < s.up_t:
            t = s.up_t
        s.up_t = t
        self.at(t, self.deliver_up, s)

    def write(self, s: Link, msg: tuple[Any, ...]) -> float:
        """The client writes ``msg``: when does its write return (flow control)?

        On a stalled path the windows fill and the write blocks until the
        stall ends (or the stream does); otherwise it returns at once.
        """
        self.send_up(s, msg)
        if s.link and s.stalled_until > self.now:
            return s.stalled_until
        return self.now

    def deliver_up(self, s: Link) -> None:
        if not s.upq:
            return
        if s.stalled_until > self.now:
            self.at(s.stalled_until, self.deliver_up, s)
            return
        msg = s.upq.popleft()
        if s.e_open:
            self.engine_up(s, msg)

    def send_down(self, s: Link, msg: tuple[Any, ...]) -> None:
        if not s.link:
            return
        s.downq.append(msg)
        t = self.now + self.lat()
        if t < s.down_t:
            t = s.down_t
        s.down_t = t
        self.at(t, self.deliver_down, s)

    def deliver_down(self, s: Link) -> None:
        if not s.downq:
            return
        if s.stalled_until > self.now:
            self.at(s.stalled_until, self.deliver_down, s)
            return
        msg = s.downq.popleft()
        ch = s.ch
        if ch.alive and ch.stream is s:
            if msg[0] == ACK and s.first_written is not None and msg[1] >= s.first_written:
                s.productive = True  # the checker's note: progress on this stream
            ch.on_down(s, msg)

    def client_end(self, s: Link, code: str | None, details: str) -> None:
        s.link = False
        ch = s.ch
        if ch.alive and ch.stream is s:
            ch.stream_end(s, code, details)

    def reset(self, s: Link, code: str, details: str, *, keep_prefix: bool = False) -> None:
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

    def client_close(self, s: Link) -> None:
        """The client tears the stream down; what it wrote before still lands, then RST."""
        if not s.link:
            return
        s.link = False
        s.downq.clear()
        self.at(max(self.now, s.up_t) + self.lat(), self.engine_cancel, s)

    def client_die(self, s: Link) -> None:
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

    def engine_cancel(self, s: Link) -> None:
        s.upq.clear()
        self.engine_drop(s)

    def engine_drop(self, s: Link) -> None:
        s.e_open = False
        if s.inst is not None:
            s.inst.streams.discard(s)
        if self.live is s:
            self.live = None

    def engine_end(self, s: Link, code: str | None, details: str) -> None:
        """The engine ends a stream with a status (sent after what it already sent)."""
        if not s.e_open:
            return
        self.engine_drop(s)
        self.send_down(s, (END, code, details))

    def engine_up(self, s: Link, msg: tuple[Any, ...]) -> None:
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

    def engine_handshake(self, s: Link) -> None:
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

    def engine_row(self, s: Link, seq: int, content: int) -> None:
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
            if seq > self.peak:
                self.peak = seq
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

    def engine_idle(self, s: Link, gen: int) -> None:
        if s.idle_gen == gen and s.unacked and s.e_open:
            self.engine_ack(s)

    def engine_ack(self, s: Link) -> None:
        s.unacked = 0
        s.idle_gen += 1
        if self.ack_delay:
            self.at(self.now + self.ack_delay, self.send_down, s, (ACK, len(self.applied)))
        else:
            self.send_down(s, (ACK, len(self.applied)))

    # -- the checker's online notes ---------------------------------------------------------------

    def note_dial(self, ch: SimDriver) -> None:
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

    def note_stream_end(self, ch: SimDriver, s: Link) -> None:
        """The checker's model of progress: an ack of a row written on it, or up 30 s."""
        if s.productive or (s.up_at is not None and self.now - s.up_at >= P.STABLE_STREAM_MS):
            ch.exp_attempt = 0

    def note_received(self, acked: int) -> None:
        """The channel's received cursor moved: the engine must have acked that much."""
        if acked > self.peak:
            self.violation(f"received cursor {acked} beyond the engine's {self.peak}")

    def note_behind(self, h: int) -> None:
        """The channel says "engine behind": only true when the engine lost acked rows."""
        stored = self.disk.states[-1].last_acked
        if not (self.engine_lost and h < stored):
            self.violation(
                f"engine behind declared for answer {h}, stored cursor {stored} "
                f"(the engine lost rows: {self.engine_lost})"
            )

    def note_forgot(self, h: int, acked: int) -> None:
        """The answer is below acks received: only an engine that lost rows does that."""
        self.stats["forgot_answers"] += 1
        if not self.engine_lost:
            self.violation(f"engine forgot acks: answer {h} below the received ack {acked}")

    def note_row_missing(self, seq: int, stored: int, high: int) -> None:
        """The cursor asked for a row the log does not hold: never, with a correct core."""
        self.violation(
            f"row seq {seq} is not in the log (stored cursor {stored}, high-water {high})"
        )

    def check_delay(self, ch: SimDriver, delay: float) -> None:
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

    def exit(self, ch: SimDriver, why: str) -> None:
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
        if why == "engine behind":
            # The run cannot complete: its acked rows are gone from both sides.
            self.behind = True
            self.stats["engine_behind"] += 1
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
            ch = SimDriver(self, "harness")
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

    def harness_handshake(self, ch: SimDriver) -> None:
        try:
            ch.handshake(lambda ok: self.harness_scan_start(ch))
        except WalWriteError:
            ch.close(lambda: self.exit(ch, "error"))
        except RunCompletedError:
            ch.close(lambda: self.exit(ch, "refused"))

    def harness_scan_start(self, ch: SimDriver) -> None:
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

    def harness_next(self, ch: SimDriver) -> None:
        rng = self.rng
        pause = rng.random() * self.think
        if rng.random() < 0.05:
            pause += 200.0 + rng.random() * 3_000.0
        ch.at(pause, self.harness_step, ch)

    def harness_failed(self, ch: SimDriver, error: BaseException) -> None:
        if isinstance(error, RunCompletedError):
            ch.close(lambda: self.exit(ch, "refused"))
        elif isinstance(error, EngineBehindError):
            ch.close(lambda: self.exit(ch, "engine behind"))
        else:
            self.violation(f"harness got {type(error).__name__}: {error}")
            ch.close(lambda: self.exit(ch, "error"))

    def harness_step(self, ch: SimDriver) -> None:
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
            ch = SimDriver(self, "flush")
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

    def flush_wait(self, ch: SimDriver, t0: float) -> None:
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
        self.stats["events_logged"] = len(self.events_logged)
        if self.behind:
            # The engine lost rows the log had deleted (checked in note_behind):
            # nothing more can be delivered; what it applied was checked online.
            return
        d = self.disk
        if (
            self.completed
            and d.exists
            and not d.states[-1].completed
            and DONE in d.states[-1].rows.values()
            and not self.complete_failed
        ):
            self.violation("the engine applied Done, but the log holding it is no tombstone")
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
        if d.exists and not d.states[-1].completed:
            self.stats["done_ack_lost"] += 1

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
