#!/usr/bin/env python3
"""Deterministic simulation of walchannel: the real channel in a simulated world.

One *schedule* is a whole scan run played in virtual time: a harness that
scans a fixed list of findings (asking for an approval on the way) and sends
``Done``, its log on a simulated disk, an engine that can die, be replaced,
refuse a row for its size, send ``Stop``, decisions and budget updates, a
network that cuts, stalls and says GOAWAY, a discovery that lies, hangs or
fails, and an operator that restarts crashed harnesses, runs ``flush`` on
orphaned logs and raises an engine's limit. Every choice (latencies, which
fault, where the process is killed, how many commits a power loss rolls back)
comes from one ``random.Random(seed)``, so a schedule is a pure function of
its seed and ``--replay SEED`` plays it again, printing every event.

The product is not re-implemented here (FoundationDB and TigerBeetle run their
production code in their simulators; this does the same): the harness and
``flush`` drive :class:`walchannel.GrpcEngineChannel` itself, through its
public API, on a virtual-time asyncio event loop (``looptime``). Only the
world is fake, plugged into the channel's seams:

- the network: a :class:`walchannel.transport.base.Transport` whose calls are
  links to the simulated engines (latency, cuts, stalls, flow control);
- the clock: a :class:`walchannel.clock.Clock` that reads the loop's virtual
  time (monotonic and wall);
- the disk: the real :class:`walchannel.log.writer.RunLog` on an in-memory SQLite
  database (``RunLog.on_connection``) whose commits are snapshotted
  (``Connection.serialize()``): a process crash keeps the last committed
  image, a power loss only the last synced one, a restore an older one.

A crash (SIGKILL) marks the process dead, cuts its links (a prefix of its
in-flight writes still lands) and cancels its tasks in the order they were
made; nothing it does afterwards reaches the world. Faults also come from
inside the process: a signal handler's exception (``KeyboardInterrupt``, or
the ordinary :class:`Interrupt`) between two statements of the log's
transactions or around a ``COMMIT``, and cancellation of the harness's calls
and task; and from an engine that breaks its duties (acks beyond what was
written, impossible handshake answers, floods, oversize down messages). These
draw from a random stream of their own, so a schedule that draws none of
them plays as it did before they existed.

Every answer the harness gets is checked as it is given (a seq returned is
committed, ``wait_acked``, ``send_done``, ``progress()``, a
``RowRefusedError``, ``stats()``); after every schedule the invariants of
docs/reliability.md are checked; a violation prints the seed and the last
events.

Usage::

    python tools/sim.py --seeds 100000 [--start S] [--jobs N] [--durability both]
    python tools/sim.py --replay 1234
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import contextvars
import dataclasses
import gc
import json
import logging
import multiprocessing
import os
import random
import signal
import sqlite3
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Any, NamedTuple, TypeVar

import looptime
import msgpack
from google.protobuf import json_format

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import walchannel.channel.row_source as _product_rows
import walchannel.log.writer as _product_log
from walchannel import (
    Backoff,
    ExitCode,
    GracePeriod,
    GroupCommit,
    GrpcChannelConfig,
    GrpcEngineChannel,
    Manifest,
    run_harness_async,
)
from walchannel.channel.seams import driver_of, open_channel
from walchannel.contract import load_engine_messages
from walchannel.errors import (
    OWNED_BY_ANOTHER_WRITER,
    WRITER_FENCED,
    ApprovalTimeoutError,
    BacklogFullError,
    ChannelClosedError,
    DiscoveryError,
    EngineBehindError,
    EngineUnavailableError,
    GroupCommitError,
    PayloadError,
    ReentrantCallError,
    RowRefusedError,
    RunCompletedError,
    RunExpiredError,
    RunRefusedError,
    WalchannelError,
    WalRemovedError,
    WalWriteError,
    WriterFencedError,
)
from walchannel.log.format import ROW_LOST_TYPE
from walchannel.log.writer import RunLog
from walchannel.runner import Seams
from walchannel.transport.base import StreamEnded
from walchannel.wire.protobuf import body_of, continues_transaction

pb = load_engine_messages()

#: Content of the ``done`` row (findings are 0 .. N-1); a ``walchannel.row_lost`` event.
DONE = -1
ROW_LOST = -2
#: Content of a ``progress`` row (a marker for an engine that keeps the resume point).
PROGRESS = -3
#: Events and approval requests get unique contents from here on.
EVENT_BASE = 1_000_000
APPROVAL_BASE = 2_000_000
#: The runner's ``runner.finding_skipped`` event of finding i has content SKIP_BASE + i:
#: an event (below APPROVAL_BASE), above any event counter a schedule reaches.
SKIP_BASE = 1_500_000

CONNECT_TIMEOUT_MS = 10_000
DONE_ACK_TIMEOUT_MS = 5_000
CLOSE_TIMEOUT_MS = 2_000
KEEPALIVE_MS = 25_000
#: gRPC's transport keepalive timeout (the world's: it ends a stalled transport).
KEEPALIVE_TIMEOUT_MS = 10_000.0
FLUSH_TIMEOUT_MS = 300_000.0
ENGINE_ACK_IDLE_MS = 50.0
#: A stream up this long resets the backoff attempt (the checker's model of SPEC "Reconnect").
STABLE_STREAM_MS = 30_000.0
#: The world's longest delays, each at its worst (virtual ms): a stall, a replaced
#: engine refusing tokens or a zombie's late death, a restart, a harness's long
#: pause between findings, its slow file, an approval's timeout.
STALL_MAX_MS = 60_000.0
ENGINE_SLOW_MS = 20_000.0
RESTART_MAX_MS = 20_010.0
LONG_PAUSE_MS = 3_200.0
SLOW_FILE_MS = 2_500.0
APPROVAL_TIMEOUT_MS = 2_000.0
#: The trace kept for a violation report.
TRACE_LEN = 60
#: The wall clock's value at virtual time 0 (unix seconds).
EPOCH_S = 1_767_225_600.0  # 2026-01-01

#: A schedule whose loop turns this often at one instant, or this often in
#: all, is stopped as a livelock (a normal one turns a few thousand times).
MAX_TURNS_AT_ONE_INSTANT = 100_000
MAX_TURNS = 3_000_000

#: Shares of the schedules with each fault of the inside and each lie of the engine.
P_INTERRUPTS = 0.25
P_CANCELS = 0.25
P_LIAR = 0.2
P_FORGET = 0.2
P_SEQ_WAITS = 0.3
#: The share of crashes that lose the log in the schedules without handshake
#: answers (where rollbacks are not played; the engine refuses a new writer).
P_LOST_UNANSWERED = 0.04
#: No progress marker waits in a pending group.
UNSET: Any = object()
#: The share of schedules run under group commit (SPEC "Group commit").
P_GROUP_COMMIT = 0.3
#: The share of signal points where the handler sends on the channel instead of raising.
P_REENTER = 0.35
#: The share of schedules (where a lost log is within the world) whose log's files are
#: removed while the harness has them open (a tmp cleaner, a wiped volume).
P_REMOVED = 0.05
#: The share of schedules whose log pages, read-ahead and tail are tiny (World.pages).
P_SMALL_PAGES = 0.1
#: Schedules whose run the first engine does not know for a while (refusing its token).
P_LATE_RUN = 0.05
P_LATE_RUN_RUNNER = 0.2
#: Schedules whose harness is the runner (SPEC "The runner"): run_harness on a simulated scan.
P_RUNNER = 0.25
#: Schedules whose engine keeps the resume point (issue 55), under the runner and not.
P_RESUME_RUNNER = 0.9
P_RESUME = 0.2
#: Schedules of that engine whose answers name an impossible point for a while, and
#: whose run an older engine (keeping none) has for a while.
P_BAD_POINTS = 0.15
P_OLDER_ENGINE = 0.1
#: A crash that loses the log, more under the runner with that engine (its takeover is free).
P_LOST_EXACT = 0.8
#: The share of schedules with a second harness on the run (its own log and writer id).
P_SECOND = 0.15
SECOND = "second harness"
#: What a lying engine does (World.fault_lie).
LIES = (
    "ack",
    "ack",
    "heartbeat",
    "flood",
    "backwards",
    "answer",
    "down_big",
    "control",
    # Issue 53: answers above the engine's truth, above anything the log holds
    # or within what it wrote (then "expected seq N" below the stored cursor).
    "ahead",
    "within",
    "within",
)
#: A text cut mid-character (World.cut_text): two placeholder bytes at its end
#: become the first two of a three-byte character ("€", cut).
CUT_PLACE = "\x00\x00"
CUT_BYTES = b"\xe2\x82"
#: The share of schedules whose engine sends down messages that do not parse.
P_GARBAGE = 0.12
#: The share of schedules with one more "within" answer lie (a stream of its own).
P_WITHIN = 0.25
#: Undecodable down messages (World.fault_garbage): cut mid-field, a
#: wire type no field has, a length past the end.
GARBAGE = (b"\x0a\x05ab", b"\x22\x02\x08", b"\x0f\x00", b"\x12\xff\xff\xff\xff\x0f")

RUN_ID = "sim"
CORRELATION_ID = "sim-c"
TOKEN = "sim-token"
HARNESS = ("sim", "sim-harness", "1")

_INF = float("inf")
_T = TypeVar("_T")

#: A cancelled public coroutine must raise within this (virtual ms; SPEC: ~100 ms).
CANCEL_BOUND_MS = 100.0
#: An ack that reaches a waiter's row must wake it within this (virtual ms).
WAKE_SLACK_MS = 1.0
#: A row committed while the channel streams is written within this, plus the
#: link's write time for each row the log holds (virtual ms; docs/reliability.md).
WRITE_BOUND_MS = 100.0
#: A stream that carried an impossible answer must be ended within this (virtual ms).
REDIAL_BOUND_MS = 1_000.0
#: A process whose event loop ended on an exception (asyncio.run) must stop its tasks within this.
RUNDOWN_MS = 10_000.0
#: The largest value an ``Ack`` can carry (``uint64``), and SQLite's largest integer.
U64_MAX = 2**64 - 1
I64_MAX = 2**63 - 1

# The process whose code runs now: every task a process makes is its own.
PROC: contextvars.ContextVar[Proc | None] = contextvars.ContextVar("sim_proc", default=None)


class Livelock(Exception):
    """The event loop spins without virtual time moving on: the schedule cannot end."""


class Spin(BaseException):
    """A schedule ran :data:`REAL_BOUND_S` of real time: code that loops without ever
    yielding to the event loop (virtual time cannot move, the turn counter never runs)."""


#: Real seconds one schedule may take (they take milliseconds): past it, something spins.
REAL_BOUND_S = float(os.environ.get("SIM_REAL_BOUND_S", "60"))


class Interrupt(Exception):
    """What a harness's signal handler raises (a per-file ``SIGALRM`` timeout): an Exception."""


class Cancelled(Exception):
    """A public coroutine the world cancelled (``asyncio.timeout`` around it) raised in time."""


#: (A handler's refused send, let go, reaches the call it interrupted as its own exception.)
INTERRUPTS = (Interrupt, KeyboardInterrupt, ReentrantCallError)
#: The errors that end a harness's run (the named error of one writer per run among them).
ENDINGS = (
    RunCompletedError,
    EngineBehindError,
    RunExpiredError,
    WriterFencedError,
    GroupCommitError,
    WalRemovedError,
)


# -- contents: what the checker follows through the log and the engine ------------------


def _content_of(kind: str, body: dict[str, Any]) -> int:
    """The content of a logged or delivered row, from its body."""
    if kind == "done":
        return DONE
    if kind == "progress":
        return PROGRESS
    if kind == "finding":
        return int(body["fields"]["i"])
    if kind == "approval_request":
        return int(body["details"]["c"])
    if body.get("type") == ROW_LOST_TYPE:
        return ROW_LOST
    if body.get("type") == "runner.finding_skipped":
        # Named by the item ("lo-hi") and its place in what the scan returned.
        payload = body["payload"]
        return SKIP_BASE + int(payload["item"].partition("-")[0]) + int(payload["finding"])
    return int(body["payload"]["c"])


# Decoded once per distinct bytes, for one schedule: World.run empties both
# caches before each. Kept across a sweep they held tens of thousands of
# tuples that every schedule's full collection walked again (a worker slowed
# by half over 5,000 schedules), and they shared a decoded dict between
# schedules.
_BLOBS: dict[bytes, int] = {}


def _blob_content(kind: str, blob: bytes) -> int:
    """The content of a stored row (its msgpack body), decoded once per distinct body."""
    found = _BLOBS.get(blob)
    if found is None:
        found = _BLOBS[blob] = _content_of(kind, msgpack.unpackb(blob, raw=False))
    return found


class Up(NamedTuple):
    """An up-message as the engine reads it."""

    kind: str  # handshake | heartbeat | data
    seq: int
    content: int
    size: int  # encoded bytes
    body: Any  # the row_lost payload, the approval's request id, Done's (status, findings)
    rk: str = ""  # the row's kind: event | finding | approval_request | done
    point: Any = None  # the (marker, digests) a transaction's first row carries
    data: bytes = b""  # a data message's bytes (the engine reads its content for the point)


_WIRE: dict[bytes, Up] = {}


def _decode(data: bytes) -> Up:
    """Read an ``UpMessage`` the channel wrote (data messages decoded once per bytes)."""
    found = _WIRE.get(data)
    if found is not None:
        return found
    msg = pb.UpMessage.FromString(data)
    kind = msg.WhichOneof("body")
    if kind == "handshake":
        hello = msg.handshake
        writer = (hello.writer_id, int(hello.writer_epoch), bool(hello.take_over))
        return Up(kind, 0, 0, len(data), writer)
    if kind == "heartbeat":
        return Up(kind, 0, 0, len(data), None)
    extra: Any = None
    if kind == "done":
        content = DONE
        extra = (msg.done.status, msg.done.findings)
    elif kind == "progress":
        content = PROGRESS
        extra = (
            json_format.MessageToDict(msg.progress.marker),
            tuple(msg.progress.row_digests),
        )
    elif kind == "finding":
        content = int(msg.finding.fields["i"])
    elif kind == "approval_request":
        content = int(msg.approval_request.details["c"])
        extra = msg.approval_request.request_id
    elif msg.event.type == ROW_LOST_TYPE:
        content = ROW_LOST
        extra = {k: msg.event.payload[k] for k in msg.event.payload}
    elif msg.event.type == "runner.finding_skipped":
        payload = msg.event.payload
        content = SKIP_BASE + int(str(payload["item"]).partition("-")[0]) + int(payload["finding"])
    else:
        content = int(msg.event.payload["c"])
    point = None
    if msg.HasField("transaction"):
        t = msg.transaction
        point = (json_format.MessageToDict(t.marker), tuple(t.row_digests))
    found = Up("data", msg.seq, content, len(data), extra, kind, point, data)
    _WIRE[data] = found
    return found


def _continues(data: bytes, digest: int) -> bool:
    """The engine's rule: is this applied message its open transaction's next row?"""
    return continues_transaction(*body_of(pb.UpMessage.FromString(data)), digest)


def _set_limits(page_rows: int, readahead_rows: int, tail_bytes: int) -> None:
    """Set the log's page (rows a read fetches at a time), the writer's read-ahead
    (rows) and its in-memory tail (bytes): the product's module constants."""
    setattr(_product_log, "_BATCH", page_rows)  # noqa: B010 - Final to the product, not here
    setattr(_product_rows, "READAHEAD_ROWS", readahead_rows)  # noqa: B010
    setattr(_product_rows, "TAIL_BYTES", tail_bytes)  # noqa: B010


def _seqs(seqs: list[int]) -> str:
    """A list of seqs, short: runs of consecutive seqs as ``a..b``."""
    parts: list[str] = []
    for q in seqs:
        if parts and q == int(parts[-1].rsplit(".", 1)[-1]) + 1:
            parts[-1] = f"{parts[-1].split('..')[0]}..{q}"
        else:
            parts.append(str(q))
    return "[" + ", ".join(parts) + "]"


def _name(content: int) -> str:
    if content == DONE:
        return "Done"
    if content == ROW_LOST:
        return "row_lost"
    if content == PROGRESS:
        return "a progress row"
    if content >= APPROVAL_BASE:
        return f"approval {content - APPROVAL_BASE}"
    if content >= SKIP_BASE:
        return f"the skip of finding {content - SKIP_BASE}"
    if content >= EVENT_BASE:
        return f"event {content - EVENT_BASE}"
    return f"finding {content}"


# -- the disk --------------------------------------------------------------------------


class Snap(NamedTuple):
    """One committed state of the log: the database image and what the checker read from it."""

    image: bytes  # Connection.serialize() after the commit
    rows: dict[int, int]  # seq -> content, read from the database
    quarantined: tuple[int, ...]  # contents of the quarantine table
    last_acked: int
    unverified: int | None
    completed: bool
    handshake: bool  # handshake fields stored
    touched: tuple[int, ...]  # contents whose rows this commit inserted, moved or deleted
    progress: Any  # the harness's progress marker (decoded), None for none
    stale_reason: bool = False  # a failed_reason stored without its failed_at


def read_snap(conn: sqlite3.Connection) -> Snap:
    """Read the log's rows and meta from the real database and take its image."""
    rows = {q: _blob_content(k, b) for q, k, b in conn.execute("SELECT seq, kind, body FROM rows")}
    quarantined = tuple(
        _blob_content(k, b) for k, b in conn.execute("SELECT kind, body FROM quarantine")
    )
    acked, unverified, completed, handshake, progress, stale = conn.execute(
        "SELECT last_acked_seq, unverified_from, completed_at IS NOT NULL,"
        " harness_name IS NOT NULL, progress,"
        " failed_at IS NULL AND failed_reason IS NOT NULL FROM meta WHERE id = 1"
    ).fetchone()
    return Snap(
        conn.serialize(),
        rows,
        quarantined,
        acked,
        unverified,
        bool(completed),
        bool(handshake),
        (),
        _progress_of(progress),
        bool(stale),
    )


_MARKERS: dict[str, Any] = {}


def _progress_of(text: str | None) -> Any:
    """A stored progress marker, decoded once per distinct text."""
    if text is None:
        return None
    found = _MARKERS.get(text)
    if found is None:
        if len(_MARKERS) > 10_000:
            _MARKERS.clear()
        found = _MARKERS[text] = json.loads(text)
    return found


def _in_transaction(conn: sqlite3.Connection | None) -> bool:
    """Is ``conn`` (open) inside a transaction? A closed connection is in none."""
    if conn is None:
        return False
    try:
        return conn.in_transaction
    except sqlite3.ProgrammingError:
        return False


_FRESH: bytes | None = None

#: The world running in this process now: the log's writer ids come from it.
_CURRENT: World | None = None
_FROZEN = False  # World.run froze the modules' objects in this process


def _writer_id() -> str:
    """A new writer id for the log (its creation, ``mark_takeover``): the running world's next.

    The product draws them from ``secrets``; here they are numbered per
    schedule, so a seed's trace (and the engine's refusals naming them) is
    the same in every process. Outside a schedule the product's own (the
    simulator may be loaded into a process that opens real logs too).
    """
    w = _CURRENT
    if w is None:
        return _PRODUCT_WRITER_ID()
    w.writers += 1
    return f"sim-w{w.writers}"


_PRODUCT_WRITER_ID = _product_log.new_writer_id
_product_log.new_writer_id = _writer_id


def fresh_image() -> bytes:
    """The image of a new log, laid out by ``RunLog.initialize`` (once per process)."""
    global _FRESH, _CURRENT
    if _FRESH is None:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        w, _CURRENT = _CURRENT, None  # (the layout's id is replaced: not the world's to count)
        try:
            RunLog.initialize(conn, RUN_ID, CORRELATION_ID)
        finally:
            _CURRENT = w
        _FRESH = conn.serialize()
        conn.close()
    return _FRESH


class LockFile:
    """The log's lock file beside it: what its owners keep there (a ``WrittenStore``).

    It outlives crashes and a copy of the log put back (a restore); a lost
    log (its volume gone) and removed files take it with them.
    """

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept: tuple[str | None, int | None] = (None, None)

    def written(self) -> tuple[str | None, int | None]:
        return self.kept

    def keep_written(self, boot_id: str | None, seq: int) -> None:
        self.kept = (boot_id, seq)


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
    committed). After it: the database image is kept, checked, maybe synced,
    and the process may be killed (committed). A dead process's commits
    never reach the disk.
    """

    __slots__ = ("conn", "proc", "w")

    def __init__(self, w: World, conn: sqlite3.Connection, proc: Proc) -> None:
        self.w = w
        self.conn = conn
        self.proc = proc

    def before_commit(self, what: str) -> None:
        if not self.proc.alive or self.proc.detached:
            return
        if self.w.disk.full:
            if what == "complete":
                self.w.complete_failed = True  # the checker's note: no tombstone then
            raise sqlite3.OperationalError("database or disk is full")
        self.w.cp()
        if self.w.next_interrupt > 0:
            self.w.interrupt_point(self.proc, f"before the COMMIT of {what}", after=False)

    def after_commit(self, what: str) -> None:
        if self.proc.alive and not self.proc.detached:
            self.w.committed(self.conn, what, self.proc)
        if self.proc.alive:
            self.w.cp()
        if self.w.next_interrupt > 0:
            self.w.interrupt_point(self.proc, f"after the COMMIT of {what}", after=True)


class SimConnection(sqlite3.Connection):
    """The log's connection on the simulated disk: a signal may land before any statement.

    Inside a transaction of the log (``BEGIN IMMEDIATE`` to ``COMMIT``) the
    world may raise, before a statement, what a harness's signal handler
    would: ``KeyboardInterrupt`` or :class:`Interrupt` (cpython bpo-27334,
    duckdb #5938, sqlite-utils #767). ``ROLLBACK`` is the product's recovery
    and is left alone.
    """

    world: World | None = None
    proc: Proc | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        w = self.world
        if w is not None and self.in_transaction and sql != "ROLLBACK":
            w.interrupt_point(self.proc, sql, after=False)
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        w = self.world
        if w is not None and self.in_transaction:
            w.interrupt_point(self.proc, sql, after=False)
        return super().executemany(sql, parameters)


# -- the processes ------------------------------------------------------------------------


class Proc:
    """One harness (or flush) process: its tasks, links, channel and what it saw."""

    def __init__(self, w: World, role: str) -> None:
        self.w = w
        self.role = role
        self.alive = True
        self.tasks: list[asyncio.Task[Any]] = []
        self.links: list[Link] = []
        self.channel: GrpcEngineChannel | None = None
        self.stops = 0  # on_stop callbacks fired
        # Request id -> when its decision reached the transport, once the channel read it.
        self.decisions_seen: dict[str, float] = {}
        self.done_arrived_at: float | None = None  # the first ack covering Done reached it
        # ... and the channel has read one (the first's arrival: a later ack read
        # after a disk-full spell does not make the wait look shorter).
        self.done_acked_at: float | None = None
        self.padded = False  # it asked for an approval too big for the engine
        self.client_closed = False  # its own discovery client was closed (a harness bug)
        self.budgets = 0
        # The checker's model of the backoff (SPEC "Reconnect").
        self.exp_attempt = 0
        self.last_end_ms: float | None = None
        self.dials: deque[float] = deque()
        # A refused row was set aside then: the next dial comes at the first backoff step.
        self.set_aside_at: float | None = None
        # What its channel answered, and what the checker needs to judge the answers.
        self.main_task: asyncio.Task[Any] | None = None
        self.conn: SimConnection | None = None
        self.signals = 0  # exceptions the world raised in its code (a signal handler's)
        self.ending = False  # its event loop ended on an exception: its tasks run down
        self.closing: str | None = None  # why it closes its channel, once it does
        self.handed: dict[int, int] = {}  # seq returned by send_* -> the content logged
        # Under group commit: seqs handed out whose rows are not committed yet, and
        # the marker set with them (UNSET: none waits; progress() is the log's).
        self.uncommitted: dict[int, int] = {}
        self.marker_set: Any = UNSET
        # Markers sent alone since the group began: each may have taken a seq of its
        # own (a progress row) that no send returns.
        self.marker_only = 0
        # The send in progress: its contents, its marker, the marker stored before it.
        self.pending: tuple[tuple[int, ...], Any, Any] | None = None
        self.ack_t: list[float] = []  # truthful data acks its channel read: when,
        self.ack_v: list[int] = []  # and their seqs
        self.max_truth = 0  # the highest ack or answer the engine gave it (or stored at open)
        self.max_written = 0  # the highest seq its channel ever wrote
        self.lies_read = 0  # impossible answers its channel read
        self.garbage_read = 0  # down messages that do not parse, read by its channel
        self.counters = (0, 0, 0)  # stats() sent, replayed, reconnects, last read
        self.calls = 0  # public coroutines it called, and the one awaited now
        self.in_call = 0
        self.cancel_at: float | None = None  # the world cancelled its main task then,
        self.cancel_call = 0  # during this call (0: outside any)
        # Rows committed while its channel streamed, not written yet: seq -> when committed.
        self.unwritten: dict[int, float] = {}
        # Its log's files were removed while open: its commits reach no file on the disk.
        self.detached = False
        # The engine ended its stream "expected seq N" below the stored cursor S: (N, S).
        self.contradicted: tuple[int, int] | None = None
        self.lied_to = False  # the engine answered it above its truth (issue 53)
        self.grace: GracePeriod | None = None  # the runner's grace period (its SIGTERM)

    def wrote(self, seq: int) -> None:
        """Its channel started writing row ``seq``: the rows up to it went out (seq order)."""
        unwritten = self.unwritten
        if unwritten:
            for q in [q for q in unwritten if q <= seq]:
                del unwritten[q]

    def track(self, task: asyncio.Task[Any]) -> None:
        tasks = self.tasks
        tasks.append(task)
        if len(tasks) > 64:
            self.tasks = [t for t in tasks if not t.done()]


class Life:
    """A harness process's own notes: where its scan stands, the first seq it was handed."""

    __slots__ = ("first", "nxt")

    def __init__(self, nxt: int) -> None:
        self.nxt = nxt
        self.first: int | None = None


class SimScan:
    """The runner's harness in the simulation: items of findings, a scan in virtual time.

    A scan thinks, may add an event to its item's transaction, and may fail:
    once (the runner's retry takes it), or for the rest of its process's life
    (``on_scan_error="exit"``: the next start scans the item again).
    """

    name = "sim-harness"
    version = "1"

    def __init__(self, w: World, proc: Proc) -> None:
        self.w = w
        self.proc = proc
        self.changed = False

    def work(self) -> list[str]:
        w = self.w
        marked = w.disk.exists and w.disk.states[-1].progress is not None
        if w.runner_changed_list and w.stats["runner_runs"] == 2 and marked:
            # A start with another work list (the operator's mistake): refused, exit 2.
            self.changed = True
            return [*w.items, f"{w.nf}-{w.nf}"]
        return w.items

    def coverage(self) -> list[str]:
        return ["/scan"]

    async def scan(self, item: str, ctx: Any) -> list[dict[str, Any]]:
        w = self.w
        rr = w.rng_runner
        ch = self.proc.channel
        answered = ch is None or ch.log.closed or ch.log.meta().answered_at is not None
        if w.acks_hs and not answered:
            # Findings logged into a log no engine ever answered may be another
            # writer's run: fenced, taken over, applied twice (SPEC "The runner").
            w.violation(f"the runner scanned item {item} before the log's first answer")
        if self.changed:
            w.violation(f"the runner scanned item {item} of a work list that changed")
        await asyncio.sleep(rr.random() * w.think / 1000)
        r = rr.random()
        if r < 0.05 or ctx.index in w.runner_fails:
            if 0.04 <= r < 0.05:
                w.runner_fails.add(ctx.index)
            w.stats["runner_scan_failures"] += 1
            w.runner_tries[ctx.index] = w.runner_tries.get(ctx.index, 0) + 1
            raise RuntimeError(f"item {item}: the scanner failed")
        if rr.random() < 0.2:
            ctx.event("sim", {"c": w.new_event()})
        lo, hi = (int(part) for part in item.split("-"))
        return [w.finding(i) for i in range(lo, hi + 1)]


class Second:
    """A second harness on the run: another pod with its own volume (a retried Job).

    Its log is its own (a writer id of its own), on a disk with no faults:
    the world's faults are the network's and the engine's it shares. Its
    operator stops it on the named error, or takes the run over once.
    """

    __slots__ = ("at", "image", "logged", "named", "over", "proc", "took_over", "writers")

    def __init__(self, at: float) -> None:
        self.at = at  # when it starts (virtual ms)
        self.image: bytes | None = None  # its log's last committed image
        self.logged: set[int] = set()  # findings it logged (a seq was returned)
        self.named = False  # it got WriterFencedError
        self.took_over = False  # its operator took the run over
        self.over = asyncio.Event()  # it ended for good
        self.proc: Proc | None = None  # its running process
        self.writers: set[str] = set()  # the writer ids its log has had


class SecondHook:
    """The second harness's disk: every commit lands (its ``CommitHook``)."""

    __slots__ = ("conn", "second")

    def __init__(self, second: Second, conn: sqlite3.Connection) -> None:
        self.second = second
        self.conn = conn

    def before_commit(self, what: str) -> None:
        return None

    def after_commit(self, what: str) -> None:
        self.second.image = self.conn.serialize()


def _task_factory(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, Any],
    context: contextvars.Context | None = None,
) -> asyncio.Task[Any]:
    task = asyncio.Task(coro, loop=loop, context=context)
    proc = PROC.get() if context is None else context.get(PROC)
    if proc is not None:
        proc.track(task)
    return task


class VirtualClock:
    """The channel's and the log's clocks, read from the event loop's virtual time (a ``Clock``).

    The wall clock may be stepped (NTP) and a power loss reboots the host:
    a new boot id, boot time from 0.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.wall_step_s = 0.0
        self.boot = 0
        self._boot_at = 0.0

    def monotonic_ms(self) -> float:
        return self._loop.time() * 1000.0

    def wall_s(self) -> float:
        return EPOCH_S + self._loop.time() + self.wall_step_s

    def boot_s(self) -> float:
        return self._loop.time() - self._boot_at

    def boot_id(self) -> str | None:
        return f"sim-boot-{self.boot}"

    def reboot(self) -> None:
        self.boot += 1
        self._boot_at = self._loop.time()


# -- the network ----------------------------------------------------------------------------


class _Lie:
    """An impossible ack on its way to the client; made when the client reads it."""

    __slots__ = ()


class Inst:
    """One engine process: its address and its streams (the store is the World's)."""

    __slots__ = ("addr", "alive", "gen", "reject_until", "streams")

    def __init__(self, gen: int, addr: str, reject_until: float) -> None:
        self.gen = gen
        self.addr = addr
        self.alive = True
        self.reject_until = reject_until
        self.streams: list[Link] = []


class Link:
    """The simulated transport of one dial, with what each end reads of it."""

    __slots__ = (
        "answer_h",
        "answered",
        "blocked_until",
        "connect_wait",
        "connected",
        "contradiction",
        "down_t",
        "downq",
        "e_open",
        "end",
        "end_t",
        "epoch",
        "first_written",
        "idle_gen",
        "inbox",
        "inst",
        "keepalive",
        "link",
        "marks",
        "proc",
        "productive",
        "reader",
        "sid",
        "size_refused",
        "stalled_until",
        "status",
        "unacked",
        "up_at",
        "up_t",
        "upq",
        "write_wait",
        "writer",
    )

    def __init__(self, sid: int, proc: Proc, inst: Inst | None, keepalive: float) -> None:
        self.sid = sid
        self.proc = proc
        self.inst = inst
        self.keepalive = keepalive
        self.link = True  # the transport carries messages
        self.e_open = False  # the engine handles this stream
        self.connected = False
        self.size_refused = False  # the engine refused a row on it for its size
        self.epoch = -1
        self.writer: tuple[str, int] | None = None  # the writer its handshake named, admitted
        self.upq: deque[Up] = deque()
        self.downq: deque[tuple[Any, ...]] = deque()
        self.up_t = 0.0
        self.down_t = 0.0
        self.stalled_until = 0.0
        # When the last write the client made returns (a stall blocks it to its end).
        self.blocked_until = 0.0
        self.unacked = 0
        self.idle_gen = 0
        self.first_written: int | None = None
        self.productive = False
        self.up_at: float | None = None
        self.end_t: float | None = None
        self.answered = False  # the handshake's answer was delivered
        self.answer_h: int | None = None  # its value (a true answer)
        # The engine ended it "expected seq N" below the stored cursor S: (N, S).
        self.contradiction: tuple[int, int] | None = None
        # Down messages the checker follows, (message, what, value): a note of what
        # the channel learnt is taken only when it reads the message (one behind an
        # undecodable message never is: its stream ends first).
        self.marks: deque[tuple[Any, str, Any]] = deque()
        # The client's side: what its reads and writes wait on.
        self.inbox: deque[Any] = deque()
        self.end: StreamEnded | None = None
        self.status: tuple[str, str] | None = None
        self.reader: asyncio.Future[Any] | None = None
        self.connect_wait: asyncio.Future[None] | None = None
        self.write_wait: asyncio.Future[None] | None = None


class SimCall:
    """The client's end of a link: a :class:`walchannel.transport.base.StreamCall`."""

    def __init__(self, w: World, link: Link) -> None:
        self.w = w
        self.link = link
        self.acks_read = 0
        self.route = " via proxy sim-proxy" if w.proxy else ""

    async def write(self, message: bytes) -> None:
        w, s = self.w, self.link
        up = _decode(message)
        if up.kind == "data":
            s.proc.wrote(up.seq)
        if up.seq > s.proc.max_written:
            # The checker's note of what this channel ever wrote: from the moment
            # a write starts, as the channel bounds acks (a write into a call
            # already over, or waiting for the connection, started too: the
            # channel cannot tell what a transport sent before it failed).
            s.proc.max_written = up.seq
        if s.end is not None or not s.link:
            raise StreamEnded("the call is over")
        if not s.connected:
            s.connect_wait = w.loop.create_future()
            await s.connect_wait
        if (
            up.kind == "data"
            and s.proc.role != SECOND
            and s.proc.alive
            and (up.seq, up.content) not in w.ever_committed
        ):
            # SPEC "Buffer first": a row reaches the stream only once it is committed.
            w.violation(
                f"{_name(up.content)} written to the stream at seq {up.seq}, but no "
                "transaction of the log ever committed it there"
            )
        if up.kind == "data" and s.proc is w.proc:
            w.cp()  # the process may die before the row goes out
            if not s.proc.alive:
                await w.loop.create_future()  # dead: its cancel comes next
        elif up.kind == "handshake" and not w.acks_hs:
            s.up_at = w.now  # no answer awaited: the stream is up once this is written
        # The transport takes the bytes a moment later (longer on a stalled path).
        returns_at = max(w.write(s, up), w.now + w.rng.random() * w.write_ms)
        s.blocked_until = max(s.blocked_until, returns_at)
        s.write_wait = w.loop.create_future()
        w.at(returns_at, w.wake_writer, s)
        await s.write_wait

    async def read(self) -> bytes:
        s = self.link
        if s.inbox:
            msg = s.inbox.popleft()
        elif s.end is not None:
            raise s.end
        else:
            s.reader = self.w.loop.create_future()
            msg = await s.reader
        w = self.w
        marks = s.marks
        if marks and marks[0][0] is msg:
            msg = w.read_mark(s, marks.popleft())
        if isinstance(msg, bytes):
            return msg  # as the engine sent it (bad text, or no message at all)
        if w.rng_group is not None and self.acks_read == 0 and msg.HasField("ack"):
            self.acks_read = 1
            if w.rng_group.random() < 0.5:
                # Another task of the harness sends as the answer is taken: its row
                # waits in a group while the answer is verified (SPEC "Group commit").
                w.loop.call_soon(w.send_beside, s.proc)
        return msg.SerializeToString()  # the seam carries bytes (wire.decode_down parses)

    async def done_writing(self) -> None:
        w, s = self.w, self.link
        if s.link and s.connected and s.end is None:
            w.send_up(s, Up("half", 0, 0, 0, None))

    def cancel(self) -> None:
        w, s = self.w, self.link
        if s.end_t is None:
            s.end_t = w.now
            w.note_stream_end(s)
        w.client_close(s)
        w.end_client(s, StreamEnded("cancelled"))

    async def final_status(self) -> tuple[str, str] | None:
        return self.link.status

    async def close(self) -> None:
        return None


class SimTransport:
    """The network as one process sees it (a :class:`~walchannel.transport.base.Transport`)."""

    def __init__(self, w: World, proc: Proc) -> None:
        self.w = w
        self.proc = proc
        self.changed = False
        self.discovery_route = ""

    def dial(self, addr: str, *, keepalive_ms: int) -> SimCall:
        w = self.w
        w.note_redial(self.proc)
        if w.chaos and w.rng.random() < 0.02:
            # Raised outside walchannel: grpc refusing a malformed proxy variable.
            w.stats["foreign_errors"] += 1
            raise ValueError("Invalid IPv6 URL")
        return SimCall(w, w.net_dial(self.proc, addr, keepalive_ms))

    async def discover(self, timeout_s: float) -> str:
        w = self.w
        w.note_redial(self.proc)
        await asyncio.sleep(w.lat() * 2 / 1000)
        if self.proc.client_closed:
            # The harness closed the http_client it passed (encode/httpx #1332):
            # discovery stays dead for this process; the last address is dialed.
            w.stats["foreign_errors"] += 1
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        return await w.discover(timeout_s)

    async def aclose(self) -> None:
        return None


# -- the world --------------------------------------------------------------------------------


class World:
    """One schedule: the disk, the engine, the network, the operator and the checker."""

    def __init__(
        self,
        seed: int,
        durability: str = "both",
        *,
        verbose: bool = False,
        rollback_without_answer: bool = False,
        record: bool = False,
        group: str = "share",
    ) -> None:
        rng = self.rng = random.Random(seed)
        # Every traced event, formatted (the determinism tests compare two runs).
        self.record: list[str] | None = [] if record else None
        self.seed = seed
        self.verbose = verbose
        if durability == "both":
            durability = "process" if seed % 2 == 0 else "power"
        self.durability = durability
        self.loop = looptime.new_event_loop(start=0, noop_cycles=0)
        self.loop.set_task_factory(_task_factory)  # type: ignore[arg-type]
        self.turns = 0
        self._watch_turns()
        self.clock = VirtualClock(self.loop)
        self.events = 0
        self.trace: deque[tuple[float, str, tuple[Any, ...]]] = deque(maxlen=TRACE_LEN)
        self.violations: list[str] = []
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "crashes",
                "runner_runs",
                "runner_exits",
                "runner_lists_refused",
                "runner_scan_failures",
                "runner_sigterms",
                "runner_stopped",
                "runner_findings_skipped",
                "runs_refused",
                "bad_text",
                "undecodable",
                "batch_events",
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
                "engine_losses",
                "engine_behind",
                "refusals",
                "set_aside",
                "unproven_refusals",
                "done_refused",
                "stops",
                "decisions",
                "approvals",
                "approval_timeouts",
                "discovery_failures",
                "discovery_hangs",
                "backlog_full",
                "expired",
                "budgets",
                "clock_steps",
                "foreign_errors",
                # Group commit: rows a crash took from a pending group, groups given up.
                "group_schedules",
                "group_rows_lost",
                "groups_given_up",
                "group_rows_given_up",
                # The faults from inside the process, and the misbehaving engine.
                "interrupts",
                "interrupts_after_commit",
                "keyboard_interrupts",
                "loop_escapes",
                "cancels",
                "task_cancels",
                "ack_lies",
                "heartbeat_lies",
                "answer_lies",
                "ahead_lies",
                "within_lies",
                "contradictions",
                "ack_floods",
                "backward_acks",
                "down_too_large",
                "control_details",
                "engine_forgets",
                "forgot_answers",
                "seq_waits",
                "protocol_errors",
                # One writer per run.
                "writer_refusals",
                "fenced_errors",
                "fenced_stops",
                "takeovers",
                "takeover_dups",
                "exact_takeovers",
                "bad_points",
                "partial_points",
                # A second harness on the run.
                "second_harnesses",
                "second_runs",
                "second_fenced",
                "second_completed",
                "second_takeovers",
                # Liveness and the log's physical state (issue 51).
                "write_bounds",
                "stored_acks",
                "recoveries",
                "recoveries_past_a_page",
                "clean_closes",
                "small_pages",
                # A signal handler's send re-entering the channel; the log's files removed.
                "reentries",
                "reentries_refused",
                "reentries_let_go",
                "files_removed",
                "removals_named",
            ),
            0,
        )
        self.max_dials_per_s = 0
        # -- the profile of this schedule --------------------------------------
        self.nf = rng.randint(1, 24)
        # In a share of schedules the log's page, the writer's read-ahead and its
        # in-memory tail are tiny and the scan longer, so rows are read from disk
        # page after page, as a backlog of thousands would be (a stream of its own).
        r5 = random.Random(f"walchannel-sim-pages:{seed}")
        self.pages: tuple[int, int, int] | None = None
        if r5.random() < P_SMALL_PAGES:
            self.stats["small_pages"] = 1
            self.pages = (r5.choice((2, 3, 8)), r5.choice((1, 4, 16)), r5.choice((600, 4_096)))
            self.nf = r5.randint(25, 80)
        # The log's files removed while open: a stream of its own.
        self.rng6 = random.Random(f"walchannel-sim-removed:{seed}")
        self.refused_reentries: set[int] = set()  # contents of refused handler sends
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
        # How long the transport takes to accept a write (ms): a fast or a slow link.
        self.write_ms = rng.choice((0.2, 0.2, 3.0))
        self.p_late = rng.choice((0.0, 0.0, 0.15))
        self.p_power = 0.6 if (durability == "process" and self.rollback_ok) else 0.0
        self.p_lost = 0.04 if self.rollback_ok else 0.0
        self.p_restore = 0.05 if self.rollback_ok else 0.0
        self.p_sync = rng.choice((0.02, 0.1, 0.3))
        self.p_flush = 0.3
        self.backoff = Backoff()
        # The channel's keepalive_ms and dead_stream_ms: the default heartbeat,
        # or the shortest one (1 s) with the dead-stream rule at three heartbeats.
        keepalive_ms = KEEPALIVE_MS
        dead_stream_ms: int | None = None
        if rng.random() < 0.3:
            keepalive_ms = 1_000
            dead_stream_ms = rng.choice((None, 3_000))
        # An engine that loses acked rows (restored from an older backup): only
        # with handshake answers, which is how the channel learns of it (SPEC "Dial").
        self.p_engine_loss = 0.12 if self.acks_hs else 0.0
        # Behind an L7 proxy gRPC's keepalive pings are answered by the proxy:
        # a stalled path is then noticed by dead_stream_ms alone (docs/design.md).
        self.proxy = rng.random() < 0.5
        # The engine's receive limit (bytes): rows over it are refused for
        # their size; findings listed in `big` are made larger than it.
        self.limit: int | None = None
        self.big: set[int] = set()
        self.done_big = False
        if rng.random() < 0.15:
            self.limit = 2_000
            self.big = {i for i in range(self.nf) if rng.random() < 0.25}
            self.done_big = rng.random() < 0.25
        # Every limit the engine ever had: a row set aside under one stays so
        # after the operator raises it (its row_lost may be sent again).
        self.limits_in_force = {self.limit} - {None}
        self.p_proxy_limit = 0.1 if rng.random() < 0.1 else 0.0
        # The client's own bound below the big rows: they are refused at send
        # time (PayloadError, nothing logged) and the scan goes on without them.
        self.max_message_bytes = 4 * 1024 * 1024
        if self.big and rng.random() < 0.3:
            self.max_message_bytes = 3_000
        self.refused_at_send: set[int] = set()
        self.big_contents: set[int] = set()  # approvals over the engine's limit
        self.raising_callbacks = rng.random() < 0.1
        self.approval_at: int | None = rng.randrange(self.nf) if rng.random() < 0.3 else None
        self.stable_approval_id = rng.random() < 0.7
        # A backlog bound (a row over it could never be logged: not with big rows).
        self.max_unacked_bytes = None
        if self.limit is None and rng.random() < 0.08:
            self.max_unacked_bytes = rng.choice((200, 600))
        self.chaos_end = 200.0 + self.nf * (self.think + 10.0) * 2 + rng.random() * 4000.0
        deadline_ms = None
        if rng.random() < 0.03:
            deadline_ms = rng.random() * self.chaos_end * 2
        self.deadline_ms = deadline_ms
        self.chaos = True
        # Group commit in its share of schedules, drawn from a stream of its own:
        # a schedule without it plays as it did before it existed.
        r4 = random.Random(f"walchannel-sim-group:{seed}")
        self.group_commit: GroupCommit | None = None
        self.rng_group: random.Random | None = None
        if {"share": r4.random() < P_GROUP_COMMIT, "on": True, "off": False}[group]:
            self.rng_group = r4
            self.stats["group_schedules"] = 1
            self.group_commit = GroupCommit(
                max_rows=r4.choice((1, 2, 4, 64)),
                max_bytes=r4.choice((300, 1 << 20)),
                max_delay_ms=r4.choice((1.0, 50.0)),
            )
        # Every (seq, content) any transaction of the log ever committed: a row
        # reaches the stream only from there (SPEC "Buffer first").
        self.ever_committed: set[tuple[int, int]] = set()
        self.config = GrpcChannelConfig(
            grpc_addr="e0.sim:1",
            run_id=RUN_ID,
            correlation_id=CORRELATION_ID,
            run_token=TOKEN,
            keepalive_ms=keepalive_ms,
            connect_timeout_ms=CONNECT_TIMEOUT_MS,
            engine_acks_handshake=self.acks_hs,
            dead_stream_ms=dead_stream_ms,
            http_addr="https://discovery.sim" if self.discovery else None,
            done_ack_timeout_ms=DONE_ACK_TIMEOUT_MS,
            close_timeout_ms=CLOSE_TIMEOUT_MS,
            backoff=self.backoff,
            max_unacked_bytes=self.max_unacked_bytes,
            max_message_bytes=self.max_message_bytes,
            hard_deadline=(
                None
                if deadline_ms is None
                else datetime.fromtimestamp(EPOCH_S + deadline_ms / 1000, UTC)
            ),
            proxy_from_env=False,
            metrics=False,
            group_commit=self.group_commit,
        )
        # crash points: the k-th commit or write kills the process
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
        self.next_approval = APPROVAL_BASE
        self.post_completion: set[int] = set()
        # -- disk --------------------------------------------------------------------
        self.disk = Disk()
        self.lock_file = LockFile()
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
        self.expired = False
        self.complete_failed = False
        self.completed = False
        self.done_seq: int | None = None  # where the engine applied Done
        self.tombstone_at: float | None = None  # when the log (as it is now) became one
        self.disk_full_until = -1.0  # the end of the latest full-disk spell
        self.epoch = 0
        self.live: Link | None = None
        self.insts: list[Inst] = []
        self.sid = 0
        self.first_addr = "e0.sim:1"
        self.stop_issued = False
        self.decided: dict[str, tuple[bool, str]] = {}
        self.refused: set[int] = set()  # contents the engine refused for their size
        self.approval_rids: dict[int, str] = {}  # approval content -> its stable request id
        self.new_engine(0.0)
        self.flaky_until = -1.0
        self.flaky_from = _INF
        # -- operator ------------------------------------------------------------------
        self.proc: Proc | None = None
        self.finished = False
        self.over: asyncio.Event | None = None
        self.recheck = rng.random() < 0.25
        # -- the checker's notes on the answers ------------------------------------------
        self.pos_of: dict[int, int] = {}  # content -> the seq its row holds in the log
        self.ever_at: dict[int, set[int]] = {}  # seq -> contents the engine ever applied there
        # seq -> the content, kind, size and limit of a row the engine refused there
        self.refused_rows: dict[int, tuple[int, str, int, int]] = {}
        self.done_body: Any = None  # Done's (status, findings) as the engine applied it
        # -- faults from inside the process and a misbehaving engine ----------------------
        # Drawn from a random stream of their own: a schedule that draws none of
        # them plays exactly as it did before they existed (its seed keeps its meaning).
        r2 = self.rng2 = random.Random(f"walchannel-sim-inside:{seed}")
        # Exceptions raised inside the log's transactions (a signal handler's):
        # the k-th point (a statement of a transaction, before or after a COMMIT).
        points: list[int] = []
        if r2.random() < P_INTERRUPTS:
            span = 20 + 12 * self.nf
            points = sorted(r2.randint(1, span) for _ in range(r2.choice((1, 1, 2, 3))))
        self.ipoints = points
        self.ipn = 0
        self.next_interrupt = points.pop(0) if points else -1
        self.kbd_proc: Proc | None = None  # a KeyboardInterrupt on its way out of the loop
        # Cancellation: asyncio.timeout around a public coroutine, the harness's task cancelled.
        self.p_cancel = r2.choice((0.15, 0.4)) if r2.random() < P_CANCELS else 0.0
        self.task_cancels = self.p_cancel > 0.0 and r2.random() < 0.5
        # An engine that lies: impossible acks and answers, floods, oversize and hostile ends.
        self.liar = r2.random() < P_LIAR
        self.lie_answers_until = -1.0
        # Answers above the engine's truth, until then, of the kind ("ahead"/"within").
        self.false_answers_until = -1.0
        self.false_answer_kind = ""
        self.answer_lied = False  # it told one: a gap it meets is its own doing
        self.lies_armed: list[str] = []  # told as the engine next acks (World.tell_lie)
        self.lies: list[str] = []
        if self.liar:
            self.lies = [r2.choice(LIES) for _ in range(r2.choice((1, 2, 3, 5)))]
        # A file the harness takes 2.5 s to scan: heartbeats go out meanwhile.
        self.slow_file: int | None = None
        if "heartbeat" in self.lies:
            self.slow_file = r2.randrange(self.nf)
            if self.config.keepalive_ms > 1_000:
                # Heartbeats a second apart, for the engine to answer with a lie.
                self.config = dataclasses.replace(self.config, keepalive_ms=1_000)
        # An engine that acked rows its store never kept and dies (the forgot path).
        self.forget = self.acks_hs and r2.random() < P_FORGET
        self.forget_armed = False
        # The harness waits on seqs it was handed (provisional ones too).
        self.seq_waits = r2.random() < P_SEQ_WAITS
        # -- one writer per run (SPEC "Engine duties"): a random stream of their own too -----
        self.rng3 = random.Random(f"walchannel-sim-writers:{seed}")
        # Events in a batch's transaction (send_findings(events=...)): a stream of their own.
        self.rng_events = random.Random(f"walchannel-sim-batch-events:{seed}")
        # -- the runner (issue 54): a stream of its own too ---------------------------------
        rr = self.rng_runner = random.Random(f"walchannel-sim-runner:{seed}")
        self.runner = rr.random() < P_RUNNER
        self.runner_ended: str | None = None  # "stopped" / "deadline": Done says so
        self.runner_fails: set[int] = set()  # items whose scan fails for the rest of a life
        self.runner_tries: dict[int, int] = {}  # failed tries per item, in this life
        self.runner_changed_list = False  # the second start is given another work list
        if self.runner:
            # Items of 1 to 3 findings, the same list on every start.
            self.items: list[str] = []
            lo = 0
            while lo < self.nf:
                hi = min(self.nf, lo + rr.randint(1, 3))
                self.items.append(f"{lo}-{hi - 1}")
                lo = hi
            self.runner_concurrency = rr.choice((1, 1, 2, 4))
            self.runner_changed_list = rr.random() < 0.1
            # Big findings are refused at send time (the client's own bound below
            # them) and the runner skips them; one the engine refuses after it is
            # logged is the channel's (played without the runner). An approval's
            # id is the runner's: not played here.
            if self.big:
                self.max_message_bytes = 3_000
            self.done_big = False
            self.approval_at = None
        # An engine whose encoder cuts text mid-character (issue 57): its Stops,
        # decisions and budget updates carry bytes that are not UTF-8. A stream of
        # its own, so the other draws stay as they were.
        self.bad_text = random.Random(f"walchannel-sim-text:{seed}").random() < 0.1
        # An engine that keeps the run's resume point (issue 55): it stores the last
        # progress row it applied and answers every handshake with it. A stream of its own.
        self.rng_resume = random.Random(f"walchannel-sim-resume:{seed}")
        kept = self.rng_resume.random()
        self.keeps_resume = self.acks_hs and kept < (P_RESUME_RUNNER if self.runner else P_RESUME)
        # There a lost log is taken over at no cost: played more often, and always taken over.
        self.exact_takeover = self.keeps_resume and self.runner and self.rollback_ok
        # Its lies about the point (an impossible one for a while), and a while when an
        # older engine, which keeps none, has the run (no takeover is exact then).
        rp = self.rng_points = random.Random(f"walchannel-sim-points:{seed}")
        self.bad_point_until = -1.0
        self.bad_points = self.keeps_resume and rp.random() < P_BAD_POINTS
        self.older_from = self.older_until = -1.0
        if self.keeps_resume and rp.random() < P_OLDER_ENGINE:
            self.exact_takeover = False
            self.older_from = rp.random() * 20_000.0
            self.older_until = self.older_from + 500.0 + rp.random() * 20_000.0
        # seq -> (marker, digests, point seq, writer, rows it starts with: 1 for a carrier)
        self.marker_at: dict[int, Any] = {}
        self.applied_writer: list[str] = []  # the writer id of each applied row
        self.applied_data: list[bytes] = []  # and its message (the point's rows, by content)
        # (More often under the runner: a new log must not scan before its first answer.)
        if self.rng_events.random() < (P_LATE_RUN_RUNNER if self.runner else P_LATE_RUN):
            # The run is registered after its harness starts: the first engine refuses
            # the token for a while (SPEC "Dial": RunRefusedError, the loop dials on).
            self.insts[0].reject_until = self.rng_events.random() * 2 * CONNECT_TIMEOUT_MS
        self.writers = 0  # writer ids made in this schedule (_writer_id)
        # The run's owner (writer id, epoch), kept with the engine's store; who completed it.
        self.owner: tuple[str, int] | None = None
        self.completed_by: str | None = None
        # Without handshake answers rollbacks are not played; a lost log is (the engine refuses it).
        self.p_lost_unanswered = 0.0 if self.rollback_ok else P_LOST_UNANSWERED
        self.fenced_stop = False  # the operator stopped after a WriterFencedError
        self.taken_over = False  # the operator took the run over (duplicates are counted)
        self.lost_contents: set[int] = set()  # a lost log's rows: logged again, never applied twice
        # Contents the engine lost after acking them to the log (the engine behind).
        self.lost_by_engine: set[int] = set()
        self.refused_stop = False  # the harness got RunCompletedError: undeliverable rows stay
        self.acked_to_log = 0  # the highest ack the engine gave the log's harness
        # ... and the highest it delivered to that harness's transport, read or not yet:
        # a forgetting engine lost every row it had acked by then.
        self.acked_sent = 0
        # A second harness on the run, from a random stream of its own (its own log, its
        # own writer id; never with rows over a limit, a backlog bound or a deadline).
        self.rng4 = random.Random(f"walchannel-sim-second:{seed}")
        self.second: Second | None = None
        if (
            self.rng4.random() < P_SECOND
            and self.limit is None
            and self.max_unacked_bytes is None
            and self.deadline_ms is None
        ):
            # A fifth of them start first (the run becomes theirs), the rest during the scan.
            early = self.rng4.random() < 0.2
            self.second = Second(self.rng4.random() * (5.0 if early else self.chaos_end))
        self.limit_ms = self.chaos_end + self.quiet_bound_ms()

    def _spun(self, signum: int, frame: Any) -> None:
        self.violation(
            f"the schedule ran {REAL_BOUND_S:.0f} s of real time: code loops without "
            "yielding to the event loop (a busy wait; virtual time cannot move)"
        )
        raise Spin

    def quiet_bound_ms(self) -> float:
        """Liveness: once the chaos window closes, the run ends within this (virtual ms).

        From the config and the world's own delays, each at its worst: a stall
        begun as the window closed and the stalled-stream rule that ends it
        (``keepalive_ms`` + gRPC's 10 s keepalive timeout); a replaced engine
        that refuses tokens or a zombie that dies late (20 s); a chain of
        three processes (a harness that gave up, a flush, the harness again),
        each a restart delay, the longest backoff with its jitter, a dial's
        timeout, ``Done``'s ack timeout and ``close``'s; and the scan itself,
        every finding with its longest pause. A run still going past it waits
        on something only a timeout would end (docs/reliability.md "Liveness").
        """
        c = self.config
        b = c.backoff
        stall = STALL_MAX_MS + c.keepalive_ms + KEEPALIVE_TIMEOUT_MS
        process = (
            RESTART_MAX_MS
            + b.max_ms
            + b.jitter_ms
            + c.connect_timeout_ms
            + c.done_ack_timeout_ms
            + c.close_timeout_ms
        )
        scan = self.nf * (self.think + LONG_PAUSE_MS) + SLOW_FILE_MS + APPROVAL_TIMEOUT_MS
        return stall + ENGINE_SLOW_MS + 3 * process + scan

    # -- the scheduler: the loop's virtual time, in ms -------------------------------

    @property
    def now(self) -> float:
        return self.loop.time() * 1000.0

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self.loop.call_at(t / 1000.0, self._event, fn, args)

    def _event(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.events += 1
        try:
            fn(*args)
        except Exception as exc:  # a bug surfaced as an exception is a violation too
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.violation(
                f"world exception {type(exc).__name__}: {exc} (at {where.name}:{where.lineno})"
            )
            self.finish()

    def spawn(self, proc: Proc, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as ``proc``'s main task (its tasks are the process's)."""
        ctx = contextvars.copy_context()
        ctx.run(PROC.set, proc)
        proc.main_task = self.loop.create_task(self._guard(proc, coro), context=ctx)

    async def _guard(self, proc: Proc, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            if proc.alive:
                raise
        except INTERRUPTS as exc:
            if not proc.signals:
                raise  # not the world's: a real Ctrl-C of the simulator
            # The harness let a signal's exception leave its main coroutine:
            # it leaves asyncio.run, which cancels the process's tasks; it ends.
            self.process_ends(proc, f"{type(exc).__name__} left its main coroutine")
        except Exception as exc:
            if proc.alive:
                self.violation(f"{proc.role} raised {type(exc).__name__}: {exc}")
                self.finish()

    def tr(self, fmt: str, *args: Any) -> None:
        if self.record is not None:
            self.record.append(f"{self.now:12.3f}  {fmt % args}")
        if self.verbose:
            print(f"{self.now:12.3f}  {fmt % args}")
        else:
            self.trace.append((self.now, fmt, args))

    def violation(self, message: str) -> None:
        self.tr("VIOLATION: %s", message)
        self.violations.append(message)

    def lat(self) -> float:
        return self.lat_base + self.rng.random() * self.lat_jit

    def cp(self) -> None:
        """A crash point: the running process may be killed here."""
        self.cpn += 1
        if self.cpn == self.next_crash:
            self.tr("crash point %d reached", self.cpn)
            while self.next_crash == self.cpn:
                self.next_crash = self.crash_points.pop(0) if self.crash_points else -1
            self.crash(timed=False)

    def finish(self) -> None:
        self.finished = True
        if self.over is not None:
            self.over.set()

    def _watch_turns(self) -> None:
        """Stop a schedule whose loop turns without virtual time moving (a livelock).

        A product bug can make the loop spin at one instant (a timer re-armed
        for "now", a task that never waits): in virtual time nothing ever
        comes to end it, so the world counts the loop's turns (its selector
        is polled once per turn) and stops the schedule as a violation.
        """
        selector: Any = self.loop._selector  # type: ignore[attr-defined]
        poll = selector.select
        last = [-1.0, 0]

        def select(timeout: float | None = None) -> Any:
            self.turns += 1
            now = self.loop.time()
            if now != last[0]:
                last[0], last[1] = now, 0
            last[1] += 1
            if last[1] > MAX_TURNS_AT_ONE_INSTANT or self.turns > MAX_TURNS:
                raise Livelock(
                    f"livelock: {last[1]} turns of the event loop at t={now * 1000:.3f} ms "
                    f"({self.turns} in all) without virtual time moving on"
                )
            return poll(timeout)

        selector.select = select

    def run(self) -> World:
        global _CURRENT, _FROZEN
        # The last schedule's leftovers (channels, coroutines closed when collected)
        # finalize now, outside any world: a schedule plays the same whatever ran
        # before it (a corpus of a few seeds, or a sweep).
        _WIRE.clear()
        _BLOBS.clear()
        gc.collect()
        if not _FROZEN:
            # The modules' objects (grpc, protobuf, walchannel) live for the whole
            # sweep: frozen once, so each schedule's collection skips them. A flag,
            # not gc.get_freeze_count(): that walks the frozen list (3 ms a call).
            gc.freeze()
            _FROZEN = True
        loop = self.loop
        _CURRENT = self
        limits = (_product_log._BATCH, _product_rows.READAHEAD_ROWS, _product_rows.TAIL_BYTES)
        if self.pages is not None:
            # The product's own limits, lowered for this schedule (module constants).
            _set_limits(*self.pages)
        spin_guard = threading.current_thread() is threading.main_thread()
        if spin_guard:
            signal.signal(signal.SIGALRM, self._spun)
            signal.setitimer(signal.ITIMER_REAL, REAL_BOUND_S)
        try:
            main = loop.create_task(self._main())
            while True:
                try:
                    loop.run_until_complete(main)
                    break
                except KeyboardInterrupt:
                    # A KeyboardInterrupt raised in a task of the channel left the
                    # event loop: as from asyncio.run, the harness's process ends.
                    proc, self.kbd_proc = self.kbd_proc, None
                    if proc is None:
                        raise  # a real Ctrl-C of the simulator
                    self.process_ends(proc, "a KeyboardInterrupt left its event loop")
        except Livelock as exc:
            self.violation(str(exc))
            self.finish()
        except Spin:
            self.finish()  # (said by _spun)
        finally:
            if spin_guard:
                signal.setitimer(signal.ITIMER_REAL, 0)
            self._shutdown()
            _CURRENT = None
            _set_limits(*limits)
        if not self.finished:
            self.violation(
                f"stuck: the run did not finish within the quiet bound, "
                f"{self.limit_ms - self.chaos_end:.0f} ms after the chaos window "
                f"(engine h={len(self.applied)}, completed={self.completed}, t={self.now:.0f} ms)"
            )
        elif not self.violations:
            self.final_checks()
        return self

    async def _main(self) -> None:
        self.over = asyncio.Event()
        self.plan_faults()
        self.at(self.chaos_end, self.end_chaos)
        self.at(0.0, self.start_harness)
        sec = self.second
        if sec is not None:
            self.stats["second_harnesses"] += 1
            self.at(sec.at, self.start_second)
        try:
            async with asyncio.timeout(self.limit_ms / 1000.0):
                await self.over.wait()
                if sec is not None and not self.violations:
                    await sec.over.wait()  # the run is over when both harnesses are
        except TimeoutError:
            if sec is not None and self.finished and not sec.over.is_set():
                self.violation("stuck: the second harness never ended")

    def _shutdown(self) -> None:
        loop = self.loop
        if self.proc is not None:
            self.kill(self.proc)
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        pending.sort(key=lambda t: t.get_name())
        for task in pending:
            task.cancel()
        if pending:
            with contextlib.suppress(Livelock):
                loop.run_until_complete(asyncio.wait(pending, timeout=60))
        loop.close()

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
        some((0, 0, 1, 2, 3), self.fault_cut, "stall")
        some((0, 0, 0, 1, 2), self.fault_disk_full)
        some((0, 0, 0, 1), self.fault_budget)
        some((0, 0, 0, 0, 0, 1), self.fault_clock_step)
        some((0, 0, 0, 0, 0, 1), self.fault_close_client)
        if rng.random() < self.p_engine_loss:
            self.at(rng.random() * end, self.fault_engine_loss)
        if rng.random() < 0.15:
            self.flaky_from = rng.random() * end
            self.flaky_until = self.flaky_from + rng.random() * 60_000.0
        if rng.random() < 0.2:
            self.at(rng.random() * end * 1.5, self.fault_stop)
        if self.rng6.random() < P_REMOVED:
            self.at(self.rng6.random() * end, self.fault_remove_files)
        if self.runner and self.rng_runner.random() < 0.3:
            self.at(self.rng_runner.random() * end, self.fault_sigterm)
        # Down messages that do not parse (issue 57), from a stream of their own.
        r7 = random.Random(f"walchannel-sim-garbage:{self.seed}")
        if r7.random() < P_GARBAGE:
            for _ in range(r7.choice((1, 2, 3))):
                self.at(r7.random() * end, self.fault_garbage, r7.choice(GARBAGE))
        # More answers above the engine's truth within what was written (issue 53's
        # contradiction), from a stream of their own: rare among the lies above.
        if self.bad_points:
            self.at(self.rng_points.random() * end * 0.8, self.fault_bad_point)
        r8 = random.Random(f"walchannel-sim-within:{self.seed}")
        if self.acks_hs and r8.random() < P_WITHIN:
            self.at(r8.random() * end * 0.8, self.fault_lie, "within")
        self.plan_inside(end)

    def plan_inside(self, end: float) -> None:
        """The faults of the inside and of a lying engine (their own random stream)."""
        r2 = self.rng2
        for lie in self.lies:
            self.at(r2.random() * end * 0.8, self.fault_lie, lie)
        if self.forget:
            self.at(r2.random() * end * 0.5, self.arm_forget)
        if self.task_cancels:
            for _ in range(r2.choice((1, 2))):
                self.at(r2.random() * end, self.fault_cancel_task)

    # -- faults from inside the process ---------------------------------------------------

    def interrupt_point(self, proc: Proc | None, where: str, *, after: bool) -> None:
        """A point inside a transaction of the log: a signal's exception may be raised here.

        ``KeyboardInterrupt`` anywhere (in a task of the channel it leaves the
        event loop: the process ends); :class:`Interrupt`, an ordinary class,
        only in the harness's own call (its main task), where its handler
        meant it to land.
        """
        if (
            proc is None
            or proc is not self.proc
            or not proc.alive
            or proc.ending
            or proc is self.kbd_proc  # one is on its way out: the process is ending
            or not self.chaos
        ):
            return
        self.ipn += 1
        if self.next_interrupt < 0 or self.ipn < self.next_interrupt:
            return
        while self.next_interrupt != -1 and self.next_interrupt <= self.ipn:
            self.next_interrupt = self.ipoints.pop(0) if self.ipoints else -1
        r2 = self.rng2
        kbd = r2.random() < 0.4
        try:
            task = asyncio.current_task(self.loop)
        except RuntimeError:
            return
        in_main = task is not None and task is proc.main_task
        if (
            proc.role == "harness"
            and proc.channel is not None
            and not self.runner
            and r2.random() < P_REENTER
        ):
            # The handler sends on the channel instead (a progress tick): re-entry.
            self.reenter(proc, where, in_main=in_main)
            return
        if not kbd and (not in_main or proc.role != "harness"):
            return
        proc.signals += 1
        self.stats["interrupts"] += 1
        if after:
            self.stats["interrupts_after_commit"] += 1
        name = "KeyboardInterrupt" if kbd else "Interrupt"
        if kbd:
            self.stats["keyboard_interrupts"] += 1
        if not in_main:
            self.kbd_proc = proc
            self.at(self.now + RUNDOWN_MS, self.check_escaped, proc)
        self.tr(
            "%s raised in the %s's %s (%s)",
            name,
            proc.role,
            "call" if in_main else "channel task",
            where.split("(", 1)[0].strip(),
        )
        if kbd:
            raise KeyboardInterrupt(f"a signal, {where}")
        raise Interrupt(f"a signal, {where}")

    def reenter(self, proc: Proc, where: str, *, in_main: bool) -> None:
        """A signal handler sends an event on the channel from inside ``where`` (issue 52).

        The send completes (its seq committed with its row, as any send's) or
        is refused at once with ``ReentrantCallError``, nothing of it logged.
        The handler catches the refusal, or (half the time, in the harness's
        own call) lets it go: it then reaches the interrupted call, which
        landed whole or not at all, as after any signal's exception.
        """
        ch = proc.channel
        assert ch is not None
        self.stats["reentries"] += 1
        c = self.new_event()
        self.tr(
            "a signal handler sends %s from inside the %s's %s (%s)",
            _name(c),
            proc.role,
            "call" if in_main else "channel task",
            where.split("(", 1)[0].strip(),
        )
        # Not through sent(): the interrupted call is half done, so progress() and
        # the rest are judged once it returns; here only the handler's own answer.
        try:
            seq = ch.send_event("sim", "info", {"c": c})
        except ReentrantCallError:
            self.stats["reentries_refused"] += 1
            self.refused_reentries.add(c)  # committed() fails the schedule if it lands
            if in_main and self.rng2.random() < 0.5:
                self.stats["reentries_let_go"] += 1
                proc.signals += 1
                raise
            return
        except WalchannelError:
            self.refused_reentries.add(c)  # refused for its own reason: nothing logged either
            return
        if not proc.alive or proc.detached:
            return
        proc.handed[seq] = c
        st = self.disk.states[-1]
        held = st.rows.get(seq)
        if held is None and self.group_commit is not None and seq > max(st.rows, default=0):
            proc.uncommitted[seq] = c
        elif held != c:
            self.violation(
                f"a signal handler's send returned seq {seq} for {_name(c)}, but the committed "
                f"log holds {'no row' if held is None else _name(held)} there"
            )

    def check_escaped(self, proc: Proc) -> None:
        """A KeyboardInterrupt raised in a task of the channel must leave the event loop."""
        if self.kbd_proc is proc and proc.alive and not proc.ending:
            self.violation(
                "a KeyboardInterrupt raised in a task of the channel never left the event "
                f"loop ({RUNDOWN_MS:.0f} ms): something swallowed it"
            )
            self.kbd_proc = None

    def process_ends(self, proc: Proc, why: str) -> None:
        """An exception left the process's event loop (asyncio.run): its tasks end, it exits."""
        if not proc.alive or proc.ending:
            return
        proc.ending = True
        if self.kbd_proc is proc:
            self.kbd_proc = None
        self.stats["loop_escapes"] += 1
        self.tr("the %s's process ends: %s; its tasks are cancelled", proc.role, why)
        self.loop.create_task(self._end_process(proc), context=contextvars.Context())

    async def _end_process(self, proc: Proc) -> None:
        await self.run_down(proc)
        self.exit(proc, "interrupted")

    async def run_down(self, proc: Proc) -> None:
        """asyncio.run's end: cancel the process's tasks and wait for them (bounded)."""
        me = asyncio.current_task()
        tasks = [t for t in proc.tasks if not t.done() and t is not me]
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=RUNDOWN_MS / 1000)
            if pending and proc.alive:
                self.violation(
                    f"{len(pending)} task(s) of the {proc.role} still run {RUNDOWN_MS:.0f} ms "
                    "after they were cancelled: the process cannot end"
                )
        for task in proc.tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the process is over

    def fault_cancel_task(self) -> None:
        """The harness's supervisor cancels its task (a CI job cancelled, a timeout around it)."""
        proc = self.proc
        task = proc.main_task if proc is not None else None
        if (
            proc is None
            or task is None
            or task.done()
            or not proc.alive
            or proc.ending
            or proc.role != "harness"
            or proc.cancel_at is not None
            or not self.chaos
        ):
            return
        self.stats["task_cancels"] += 1
        proc.cancel_at = self.now
        proc.cancel_call = proc.in_call
        self.tr("the harness's task is cancelled%s", " (in a call)" if proc.in_call else "")
        task.cancel()

    # -- a lying engine ----------------------------------------------------------------------

    def fault_lie(self, kind: str) -> None:
        """The engine will break its duties (SPEC "Engine duties"): at its next ack or answers."""
        if not self.chaos:
            return
        if kind == "answer":
            if self.acks_hs:
                # Every answer for a while is impossible: past SQLite's range, or a
                # shift that would carry a row past 2**63 - 1.
                self.lie_answers_until = self.now + 200.0 + self.rng2.random() * 8_000.0
            return
        if kind in ("ahead", "within"):
            if self.acks_hs:
                # Every answer for a while is above the engine's truth (issue 53): long
                # enough for a "within" one to meet a verification, which stores it.
                span = 8_000.0 if kind == "ahead" else 60_000.0
                self.false_answers_until = self.now + 200.0 + self.rng2.random() * span
                self.false_answer_kind = kind
            return
        self.lies_armed.append(kind)

    def tell_lie(self, s: Link, heartbeat: bool) -> bool:
        """As the engine acks on ``s``: tell an armed lie there; True when it replaced the ack."""
        armed = self.lies_armed
        if not self.chaos or not s.link or not s.e_open or not s.proc.alive or s.proc.ending:
            return False
        if s.proc.role == SECOND:
            return False  # made from the first harness's log: impossible only for its streams
        if self.acks_hs and not s.answered:
            return False  # before the answer, an ack would be taken for it: not a lie then
        kinds = [k for k in armed if (k == "heartbeat") == heartbeat]
        if not kinds:
            return False
        kind = kinds[0]
        armed.remove(kind)
        r2 = self.rng2
        if kind == "heartbeat":
            self.send_down(s, ("lie", "heartbeat"))
            return True
        if kind == "ack":
            self.send_down(s, ("lie", "ack"))
        elif kind == "flood":
            self.stats["ack_floods"] += 1
            h = len(self.applied)
            for _ in range(r2.randint(10, 60)):
                self.send_down(s, ("ack", h))
        elif kind == "backwards":
            self.stats["backward_acks"] += 1
            h = len(self.applied)
            for k in sorted((r2.randint(0, h) for _ in range(r2.randint(1, 6))), reverse=True):
                self.send_down(s, ("ack", k))
        elif kind == "down_big":
            limit = self.config.max_receive_message_bytes
            size = limit + 1 + r2.randrange(1 << 20)
            self.stats["down_too_large"] += 1
            self.tr("the engine sends #%d a %d-byte down message", s.sid, size)
            # The client's gRPC refuses it and ends the call; the engine sees it cancelled.
            self.engine_drop(s)
            self.send_down(
                s,
                (
                    "end",
                    "RESOURCE_EXHAUSTED",
                    f"CLIENT: Received message larger than max ({size} vs. {limit})",
                ),
            )
        else:
            self.stats["control_details"] += 1
            code = r2.choice(("UNAVAILABLE", "INTERNAL", "UNKNOWN"))
            self.tr("the engine ends #%d with control characters in its status", s.sid)
            self.engine_end(
                s, code, "going away\x1b[2J\x00\r\nERROR forged line\u202e\x07\x9b31m\tend"
            )
        return False

    def false_answer(self, s: Link) -> None:
        """Answer ``s``'s handshake above the engine's truth ``h`` (issue 53).

        ``ahead``: above anything the log holds (its high-water), so above
        anything it wrote. ``within``: above ``h`` but within what the channel
        wrote, with rows of the log above it still to send (so the stream's
        next row meets the engine's "expected seq h + 1"), and no ``Done`` at
        or below it. Either way it is as if the engine lost rows: the run may
        end engine-behind; the rows a stored lie deleted were never applied.
        Told only where it is one: otherwise the truth.
        """
        h = len(self.applied)
        st = self.disk.states[-1] if self.disk.exists else None
        proc = s.proc
        ch = proc.channel
        value: int | None = None
        if st is not None and proc.alive and ch is not None:
            top = max(max(st.rows, default=0), st.last_acked)
            r2 = self.rng2
            if self.false_answer_kind == "ahead":
                # Only where the log knows what it wrote (verified, same boot, no
                # restore): elsewhere an answer above is an honest engine's word
                # (the verification path), and no client could tell the lie.
                bound = driver_of(ch).written_bound
                if bound is not None:
                    value = max(h, top, bound) + r2.choice((1, 2, 50))
            else:
                above = sorted(q for q in st.rows if q > h)
                done = self.pos_of.get(DONE)
                room = [q for q in above[:-1] if q <= proc.max_written]
                if room and (done is None or done > room[-1]):
                    value = r2.choice(room)
        if value is None:
            self.send_down(s, ("ack", h))
            return
        kind = self.false_answer_kind
        self.stats[f"{kind}_lies"] += 1
        self.answer_lied = True
        self.engine_lost = True  # (a lie the log believes is a loss to it)
        proc.lied_to = True
        if value > self.peak:
            self.peak = value
        if st is not None:
            self.lost_by_engine.update(c for q, c in st.rows.items() if h < q <= value)
        self.tr("the engine answers #%d Ack(%d), above its %d: %s", s.sid, value, h, kind)
        # Above what the log wrote, it is impossible to the client (refused, the
        # stream ended: checked as any impossible answer); within, it is taken.
        self.send_down(s, ("ahead", value) if kind == "ahead" else ("ack", value))

    def impossible_answer(self) -> int:
        """A handshake answer no engine can give: >= 2**63, or a shift past 2**63 - 1."""
        r2 = self.rng2
        r = r2.random()
        if r < 0.25:
            return I64_MAX + 1
        if r < 0.45:
            return U64_MAX
        if r < 0.6:
            return r2.randint(I64_MAX + 1, U64_MAX)
        st = self.disk.states[-1] if self.disk.exists else None
        if st is None:
            return U64_MAX
        u = st.unverified
        top = max(st.rows, default=st.last_acked)
        if u is not None and top >= u:
            # The unverified rows u..top would move to h+1.., the last to 2**63 - 1
            # or past it, leaving no seq for the next row (SPEC "Dial").
            return I64_MAX - r2.randrange(top - u + 2)
        # Any other answer in range could be the engine's word (one above the
        # high-water on a verified log is a protocol error whose stream goes on):
        # only one past the range is impossible here.
        return I64_MAX + 1 + r2.randrange(1_000)

    def read_mark(self, s: Link, mark: tuple[Any, str, Any]) -> Any:
        """The client reads a down message the checker follows: an ack, an answer, a lie.

        What the channel learnt from it (a decision, an ack covering Done) is
        dated from when it reached the transport: the channel's own delay in
        reading it counts against the channel's liveness. A message never read
        (behind undecodable bytes, its stream ended first) taught it nothing.
        """
        msg, what, value = mark
        proc = s.proc
        done_seq = self.done_seq
        covers_done = done_seq is not None and what in ("ack", "answer") and value >= done_seq
        if covers_done and proc.done_acked_at is None:
            proc.done_acked_at = proc.done_arrived_at
        if what == "decision":
            rid, reached = value
            proc.decisions_seen.setdefault(rid, reached)
            return msg
        if what == "ack":
            proc.ack_t.append(self.now)
            proc.ack_v.append(value)
            if value > proc.max_truth:
                proc.max_truth = value
            if proc.role == "harness" and value > self.acked_to_log:
                self.acked_to_log = value
            return msg
        if what == "ahead":
            # An answer above anything the log wrote: a protocol error, the stream ended.
            proc.lies_read += 1
            self.at(self.now + REDIAL_BOUND_MS, self.check_ended, s, f"the impossible Ack({value})")
            return msg
        if what == "garbage":
            # It does not parse: a protocol error, the stream ended (SPEC "Down messages").
            proc.lies_read += 1
            proc.garbage_read += 1
            self.at(
                self.now + REDIAL_BOUND_MS,
                self.check_ended,
                s,
                f"the undecodable {value}-byte down message",
            )
            return msg
        if what == "bad point":
            # Nothing of the answer is applied; the stream ends (SPEC "The engine
            # keeps the resume point").
            proc.lies_read += 1
            self.stats["bad_points"] += 1
            self.at(self.now + REDIAL_BOUND_MS, self.check_ended, s, "the impossible resume point")
            return msg
        if what == "answer":
            s.answer_h = value
            stored = self.disk.states[-1].last_acked if self.disk.exists else 0
            if proc.ack_v and stored <= value < max(proc.ack_v):
                self.stats["forgot_answers"] += 1  # below acks it gave, not stored yet
            if value > proc.max_truth:
                proc.max_truth = value
            return msg
        # A lie, made now from what this channel wrote: impossible when read.
        if value == "answer":
            seq = self.impossible_answer()
            self.stats["answer_lies"] += 1
        else:
            # Beyond every seq this channel wrote and the stream's answer (SPEC
            # "Acks"); without answers the high-water bounds acks, so beyond it.
            base = max(s.answer_h or 0, proc.max_written)
            if not self.acks_hs and self.disk.exists:
                st = self.disk.states[-1]
                base = max(base, st.last_acked, max(st.rows, default=0))
            r2 = self.rng2
            seq = r2.choice((1, 1, 2, 20, 1_000, I64_MAX, I64_MAX + 1, U64_MAX))
            seq = seq if seq > I64_MAX // 2 and seq > base else base + seq
            self.stats["heartbeat_lies" if value == "heartbeat" else "ack_lies"] += 1
        proc.lies_read += 1
        self.tr("the engine lies on #%d: Ack(%d) (%s)", s.sid, seq, value)
        self.at(self.now + REDIAL_BOUND_MS, self.check_ended, s, f"the impossible Ack({seq})")
        if value == "answer":
            return self.answer_ack(seq)
        return pb.DownMessage(ack=pb.Ack(seq=seq))

    def check_ended(self, s: Link, what: str) -> None:
        """``what`` the client read on ``s`` ended the stream (a fresh handshake re-syncs).

        An impossible answer, or a down message that does not parse (the
        engine re-sends its Stop and decisions after the next handshake).
        """
        proc = s.proc
        ended = s.end is not None or s.end_t is not None
        if not ended and proc.alive and not proc.ending and proc.closing is None:
            self.violation(
                f"{what} on #{s.sid} did not end the stream within {REDIAL_BOUND_MS:.0f} ms"
            )

    def cut_text(self, down: Any) -> Any:
        """``down`` as this schedule's engine sends it: its last text cut mid-character.

        The text is the message's last field, so its bytes end the encoding
        (the caller put :data:`CUT_PLACE` there when :attr:`bad_text`): they
        become the first two bytes of a three-byte character instead
        (protobuf #4970). An engine with a sound encoder sends the message.
        """
        if not self.bad_text:
            return down
        data = down.SerializeToString()
        assert data.endswith(CUT_PLACE.encode())
        self.stats["bad_text"] += 1
        return data[: -len(CUT_PLACE)] + CUT_BYTES

    @property
    def cut_place(self) -> str:
        """What ends a text that :meth:`cut_text` will cut ("" for a sound encoder)."""
        return CUT_PLACE if self.bad_text else ""

    # -- an engine that forgets what it acked ----------------------------------------------

    def arm_forget(self) -> None:
        if self.chaos and not self.completed:
            self.forget_armed = True

    def fault_forget(self, acked: int) -> None:
        """The engine acked rows its store had not kept, and dies: its next answer is lower.

        The channel got the acks but the disk just filled, so it could not
        store them: the answer comes below the acks it received, at or above
        the stored cursor (the engine-forgot path, SPEC "Dial"), and the rows
        are still in the log to be sent again.
        """
        applied = self.applied
        stored = self.disk.states[-1].last_acked if self.disk.exists else 0
        if not self.chaos or self.completed or acked <= stored or len(applied) < acked:
            return
        r2 = self.rng2
        self.stats["disk_full"] += 1
        self.disk.full = True
        self.tr("disk full")
        self.at(self.now + 1_500.0 + r2.random() * 2_500.0, self.disk_space)
        # It keeps fewer rows than it acked (``acked``), and no fewer than are stored.
        k = len(applied) - r2.randint(stored, acked - 1)
        # Acked: the log may delete them before its next handshake says "forgot"
        # or "behind" (final_checks: the engine's loss only if the log lost them).
        # Every ack delivered by now counts, not only the one that armed the fault:
        # the engine kept acking in the ms before it died (seed 65424).
        self.lost_by_engine.update(applied[len(applied) - k : max(acked, self.acked_sent)])
        del applied[-k:]
        self.forget_markers()
        self.stats["engine_losses"] += 1
        self.stats["engine_forgets"] += 1
        self.engine_lost = True
        self.tr("the engine dies and forgets the last %d rows it acked (h=%d)", k, len(applied))
        for inst in self.insts:
            self.kill_engine(inst)
        self.at(self.now + r2.random() * 300.0, self.replace_engine)

    def end_chaos(self) -> None:
        proc = self.proc
        if proc is not None and proc.client_closed:
            # Its discovery stays dead (the harness's bug): once the engine
            # moved, inspect shows the run stuck and the operator restarts it.
            self.tr("the operator restarts the %s (its http client is closed)", proc.role)
            self.kill(proc)
            self.at(self.now + self.restart_delay(), self.restart, True)
        self.chaos = False
        self.next_crash = -1
        self.crash_points = []
        if self.disk.full:
            self.disk_space()
        self.flaky_until = -1.0
        self.p_proxy_limit = 0.0
        if not any(i.alive for i in self.insts):
            self.new_engine(0.0)

    def fault_crash(self) -> None:
        if self.proc is not None and self.chaos:
            self.crash(timed=True)

    def kill(self, proc: Proc) -> None:
        """SIGKILL: nothing of the process reaches the world any more; its tasks go."""
        proc.alive = False
        if self.proc is proc:
            self.proc = None
        lost = len(proc.uncommitted)
        if lost:
            # SPEC "Group commit": a crash costs the pending group, under its cap.
            self.stats["group_rows_lost"] += lost
            caps = self.group_commit
            if caps is None or lost >= caps.max_rows:
                self.violation(
                    f"the process died with {lost} row(s) handed out and never committed "
                    f"(seqs {sorted(proc.uncommitted)}); the cap is "
                    f"{None if caps is None else caps.max_rows}"
                )
        for s in proc.links:
            if s.link:
                self.client_die(s)
        for task in proc.tasks:
            task.cancel()

    def crash(self, *, timed: bool) -> None:
        proc = self.proc
        if proc is None:
            return
        rng = self.rng
        self.stats["crashes"] += 1
        self.kill(proc)
        d = self.disk
        what = "crash"
        if d.exists and rng.random() < self.p_power:
            self.stats["power_losses"] += 1
            self.clock.reboot()
            what = "power loss"
            unsynced = len(d.states) - 1 - d.synced
            if unsynced > 0:
                k = rng.randint(1, unsynced)
                self.rollback(len(d.states) - k)
                what += f" (rolled back {k} commits)"
        lost = d.exists and rng.random() < self.p_lost
        if not lost and d.exists and self.p_lost_unanswered:
            lost = self.rng3.random() < self.p_lost_unanswered
        if not lost and d.exists and self.exact_takeover:
            lost = self.rng_resume.random() < P_LOST_EXACT
        if lost:
            # A new log under a new writer id: the channel refuses it (WriterFencedError)
            # until the operator takes over; its duplicates are no exemption.
            self.stats["lost_logs"] += 1
            for st in d.states:
                self.lost_contents.update(st.touched)
            d.exists = False
            d.states = []
            self.lock_file = LockFile()
            self.tombstone_at = None
            self.pos_of = {}
            what += ", log lost"
        elif d.exists and len(d.states) > 1 and rng.random() < self.p_restore:
            self.stats["restores"] += 1
            keep = rng.randrange(1, len(d.states))
            self.rollback(keep)
            # As `walchannel restore` leaves it: no boot id, so its high-water
            # bounds nothing it wrote (the engine may hold more).
            d.synced = len(d.states) - 1
            what += f", older copy restored ({keep} commits)"
        self.tr("%s of the %s (%s)", what, proc.role, "timed" if timed else "at a crash point")
        self.at(self.now + self.restart_delay(), self.restart, True)

    def restart_delay(self) -> float:
        rng = self.rng
        return 10.0 + rng.random() * (RESTART_MAX_MS - 10.0 if rng.random() < 0.2 else 2_000.0)

    def rollback(self, keep: int) -> None:
        d = self.disk
        gone = d.states[keep:]
        del d.states[keep:]
        self.stats["rolled_back_commits"] += len(gone)
        for st in gone:
            self.affected.update(st.touched)
        if d.synced >= keep:
            d.synced = keep - 1
        if not d.states[-1].completed:
            # The tombstone was rolled back: the next one is stored anew.
            self.tombstone_at = None
        self.pos_of = {c: q for q, c in d.states[-1].rows.items()}

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
            self.at(self.now + rng.random() * ENGINE_SLOW_MS, self.kill_engine, inst)

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
        # Rows the engine acked to this log may be deleted from it, and then
        # cannot be sent again: the engine-behind loss of SPEC, whichever way
        # the run ends after it (final_checks: only if the log no longer holds them).
        acked = max(self.acked_to_log, self.disk.states[-1].last_acked if self.disk.exists else 0)
        first = len(applied) - k + 1
        self.lost_by_engine.update(applied[first - 1 : min(acked, len(applied))])
        del applied[-k:]
        self.forget_markers()
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
        r = self.rng.random()
        reject = self.rng.random() * (3_000.0 if r < 0.15 else ENGINE_SLOW_MS) if r < 0.2 else 0.0
        self.new_engine(reject)

    def new_engine(self, reject_ms: float) -> None:
        gen = len(self.insts)
        addr = f"e{gen}.sim:1" if self.discovery else "e0.sim:1"
        self.insts.append(Inst(gen, addr, self.now + reject_ms))
        if gen:
            self.tr("engine %s (#%d) up", addr, gen)

    def fault_cut(self, kind: str) -> None:
        proc = self.proc
        s = self.client_link(proc)
        if s is None or not s.link or not self.chaos or proc is None:
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
            d = rng.choice((200.0, 3_000.0, 15_000.0, STALL_MAX_MS, STALL_MAX_MS))
            s.stalled_until = self.now + d
            # gRPC's transport keepalive (the world's, not walchannel's) ends it.
            detect = KEEPALIVE_TIMEOUT_MS + rng.random() * s.keepalive
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
        self.disk_full_until = self.now

    def fault_stop(self) -> None:
        """The engine issues the run's Stop: stored, sent now, re-sent after every handshake."""
        if self.completed:
            return
        self.stop_issued = True
        self.stats["stops"] += 1
        self.tr("the engine issues Stop")
        if self.live is not None:
            self.send_down(self.live, ("stop", "operator"))

    def fault_clock_step(self) -> None:
        """NTP steps the wall clock an hour either way (durations and ages must not care)."""
        step = self.rng.choice((-3_600.0, 3_600.0))
        self.clock.wall_step_s += step
        self.stats["clock_steps"] += 1
        self.tr("the wall clock steps %+.0f s", step)

    def fault_close_client(self) -> None:
        """The harness closes the discovery client it passed; its channel must go on."""
        proc = self.proc
        if proc is not None and proc.alive and self.discovery and self.chaos:
            proc.client_closed = True
            self.tr("the harness closes its http client")

    def fault_remove_files(self) -> None:
        """``rm -rf $WALCHANNEL_DIR``: the log's files go while the harness has them open.

        Its connection goes on committing into the unlinked file, which no
        disk holds: to the world the log is lost (a new one starts from
        nothing, under a new writer id). The product's watch (the storage
        seam's ``watch``) says so after its next commit: no seq of that commit
        is returned, and the run fails with ``WalRemovedError``.
        """
        proc = self.proc
        d = self.disk
        if proc is None or not proc.alive or proc.ending or not self.chaos or not d.exists:
            return
        self.stats["files_removed"] += 1
        proc.detached = True
        self.lock_file = LockFile()  # (the process keeps writing to its old one)
        for st in d.states:
            self.lost_contents.update(st.touched)
        d.exists = False
        d.states = []
        self.tombstone_at = None
        self.pos_of = {}
        self.tr("the log's files are removed while the %s has them open", proc.role)

    def fault_garbage(self, data: bytes) -> None:
        """The engine sends bytes that are no DownMessage: the stream must end, counted."""
        if self.chaos and self.live is not None:
            self.send_down(self.live, ("garbage", data))

    def fault_budget(self) -> None:
        s = self.live
        if s is not None:
            self.stats["budgets"] += 1
            self.send_down(s, ("budget", "budget at 80%"))
            if self.rng.random() < 0.5:
                self.send_down(s, ("unknown",))

    # -- the disk ---------------------------------------------------------------------------

    def open_log(self, proc: Proc) -> RunLog:
        """A process opens the log: the real ``RunLog`` on the disk's last committed image.

        Raises:
            WalWriteError: the open's claim could not commit (disk full).
        """
        d = self.disk
        conn = sqlite3.connect(":memory:", isolation_level=None, factory=SimConnection)
        proc.conn = conn
        if self.next_interrupt > 0:
            conn.world, conn.proc = self, proc
        if not d.exists:
            # Created with synchronous=FULL and renamed into place: synced at once.
            conn.deserialize(fresh_image())
            # Its creation transaction gave it a random writer id, epoch 0.
            conn.execute("UPDATE meta SET writer_id = ? WHERE id = 1", (_writer_id(),))
            d.exists = True
            d.states = [read_snap(conn)]
            d.synced = 0
        else:
            conn.deserialize(d.states[-1].image)
        try:
            log = RunLog.on_connection(
                conn,
                run_id=RUN_ID,
                correlation_id=CORRELATION_ID,
                commit_hook=DiskHook(self, conn, proc),
                clock=self.clock,
                # The storage seam's "are the files still there": gone once removed.
                watch=lambda: "the log file :memory: is gone" if proc.detached else None,
                written_store=self.lock_file,
            )
        except WalWriteError:
            conn.close()
            raise
        if proc.alive:
            self.check_recovered(log)
        return log

    def check_recovered(self, log: RunLog) -> None:
        """After a recovery (an open): the log's reading of itself is the disk's.

        The rows it yields (what a replay reads, page by page) are exactly the
        rows on disk above the stored cursor, in seq order; its high-water is
        at or above every row (FoundationDB checks the state on disk after
        recovery, not only the answers). The failed mark is checked at every
        commit (:meth:`committed`).
        """
        st = self.disk.states[-1]
        if log.last_acked_seq != st.last_acked:
            self.violation(
                f"the log opened with cursor {log.last_acked_seq}, the disk holds {st.last_acked}"
            )
        on_disk = sorted(q for q in st.rows if q > st.last_acked)
        if on_disk and log.high_water < on_disk[-1]:
            self.violation(
                f"the log opened with high-water {log.high_water}, below row seq {on_disk[-1]}"
            )
        if log.completed:
            return
        yielded = [row.seq for row in log.unacked()]
        self.stats["recoveries"] += 1
        if len(on_disk) > _product_log._BATCH:
            self.stats["recoveries_past_a_page"] += 1
        if yielded != on_disk:
            self.violation(
                f"the log yields rows {_seqs(yielded)} on open, the disk holds {_seqs(on_disk)} "
                f"above the cursor {st.last_acked} (pages of {_product_log._BATCH} rows)"
            )

    def committed(self, conn: sqlite3.Connection, kind: str, proc: Proc) -> None:
        """A transaction of the real log committed: keep its image and check it."""
        d = self.disk
        prev = d.states[-1]
        st = read_snap(conn)
        old, new = prev.rows.items(), st.rows.items()
        # Most commits (meta, claim) leave the rows alone: compare before diffing.
        # Done is a content too: a rolled-back Done is re-logged under a new seq.
        touched = [] if prev.rows == st.rows else [c for _, c in old ^ new if c != ROW_LOST]
        if prev.rows != st.rows:
            pos = self.pos_of
            waiting = proc.uncommitted
            for q, c in new - old:
                if c in self.refused_reentries:
                    self.violation(f"a refused send logged its row: {_name(c)} at seq {q}")
                pos[c] = q  # where the row of content c lives now
                self.ever_committed.add((q, c))
                if q in waiting and kind == "append":
                    handed = waiting.pop(q)
                    if not waiting:
                        proc.marker_only = 0  # the group is in: a new one begins
                    if handed != c:
                        self.violation(
                            f"seq {q} was handed out for {_name(handed)}, but its group "
                            f"committed {_name(c)} there"
                        )
        if prev.unverified is not None and st.unverified is None:
            # The verification rule declares every unverified row (re)placed.
            touched.extend(c for q, c in old if q >= prev.unverified and c != ROW_LOST)
            if prev.rows != st.rows:
                self.stats["shifts"] += 1
        if touched:
            st = st._replace(touched=tuple(touched))
        if prev.completed and (kind == "append" or st.last_acked > prev.last_acked):
            self.violation(f"a completed run was written to ({kind})")
        if st.last_acked > self.peak:
            self.violation(
                f"stored cursor {st.last_acked} exceeds what the engine has ({self.peak})"
            )
        # The log's physical state, after every commit (an ack's above all): every
        # row an ack covered is gone from the file, and a failed mark is whole.
        if st.last_acked > prev.last_acked:
            self.stats["stored_acks"] += 1
        if st.rows and min(st.rows) <= st.last_acked:
            self.violation(
                f"row seq {min(st.rows)} is still on disk at or below the stored cursor "
                f"{st.last_acked} (after the commit of {kind})"
            )
        if st.stale_reason:
            self.violation(
                f"the log stores a failed_reason without failed_at (after the commit of {kind}): "
                "a cleared failed mark left its reason behind"
            )
        if kind == "verify":
            self.tr("db after verify: cursor %d, rows %s", st.last_acked, sorted(st.rows))
        if kind == "set_aside":
            for c in set(st.quarantined) - set(prev.quarantined):
                self.stats["set_aside"] += 1
                self.tr("%s set aside", _name(c))
                if c not in self.refused:
                    self.violation(f"{_name(c)} set aside, but the engine never refused it")
                proc.set_aside_at = self.now
        d.states.append(st)
        self.stats["commits"] += 1
        if st.completed and self.tombstone_at is None:
            self.tombstone_at = self.now
        if kind == "append":
            proc.marker_set = UNSET  # a group commits whole, its marker with it
            self.note_unwritten(proc, sorted(q for q, _ in new - old))
            logged = self.logged
            for _, c in new - old:
                if c < 0:
                    continue
                rid = self.approval_rids.get(c)
                proc = self.proc
                if rid is not None and proc is not None:
                    seen = proc.decisions_seen.get(rid)
                    if seen is not None and self.now > seen:
                        self.violation(
                            f"approval {rid} logged again, though its decision reached "
                            "this channel before"
                        )
                if SKIP_BASE <= c < APPROVAL_BASE:
                    # The runner skipped a finding refused at send time: only a big one.
                    if c - SKIP_BASE not in self.big:
                        self.violation(f"the runner skipped finding {c - SKIP_BASE}, which fits")
                    self.refused_at_send.add(c - SKIP_BASE)
                    self.stats["runner_findings_skipped"] += 1
                if c < EVENT_BASE:
                    logged[c] += 1
                else:
                    self.events_logged.append(c)
                if self.completed:
                    self.post_completion.add(c)
        if self.rng.random() < self.p_sync:
            d.synced = len(d.states) - 1

    def note_unwritten(self, proc: Proc, seqs: list[int]) -> None:
        """Rows ``seqs`` committed: on a streaming channel each must go out within a bound.

        The bound (:data:`WRITE_BOUND_MS`, plus :attr:`write_ms` for every row
        the log holds, which a replay may write first) is far below the
        shortest heartbeat (1 s): a writer that only its heartbeat timer
        wakes is caught (docs/reliability.md "Liveness").
        """
        ch = proc.channel
        s = self.client_link(proc)
        if (
            not seqs
            or proc.detached
            or ch is None
            or s is None
            or s.up_at is None
            or proc.closing is not None
            or ch.state.value != "streaming"
        ):
            return
        bound = WRITE_BOUND_MS + self.write_ms * len(self.disk.states[-1].rows)
        self.stats["write_bounds"] += len(seqs)
        for q in seqs:
            proc.unwritten[q] = self.now
            self.at(self.now + bound, self.check_written, proc, s, q, self.now, bound)

    def check_written(self, proc: Proc, s: Link, seq: int, t0: float, bound: float) -> None:
        """Liveness: row ``seq``, committed at ``t0`` on streaming ``s``, went out by now."""
        if proc.unwritten.get(seq) != t0:
            return  # written (or committed again since)
        del proc.unwritten[seq]
        ch = proc.channel
        st = self.disk.states[-1] if self.disk.exists else None
        if (
            not proc.alive
            or proc.ending
            or proc.closing is not None
            or ch is None
            or ch.state.value != "streaming"
            or self.client_link(proc) is not s
            or not s.link
            # Flow control held the writer meanwhile (a write made in a stall
            # returns at that stall's end, even if a later, shorter one replaced it).
            or max(s.stalled_until, s.blocked_until) > t0
            or st is None
            or seq not in st.rows
        ):
            return
        self.violation(
            f"row seq {seq}, committed at {t0:.3f} ms while #{s.sid} streamed, was not written "
            f"within {bound:.0f} ms (the stream is still up and never stalled)"
        )

    def sync(self) -> None:
        if self.disk.exists:
            self.disk.synced = len(self.disk.states) - 1

    # -- the network ----------------------------------------------------------------------

    def client_link(self, proc: Proc | None) -> Link | None:
        """The process's newest link that is still its stream."""
        if proc is None or not proc.links:
            return None
        s = proc.links[-1]
        return s if s.end is None else None

    def net_dial(self, proc: Proc, addr: str, keepalive_ms: int) -> Link:
        self.sid += 1
        inst = None
        for i in reversed(self.insts):
            if i.alive and i.addr == addr:
                inst = i
                break
        s = Link(self.sid, proc, inst, float(keepalive_ms))
        proc.links.append(s)
        if len(proc.links) > 8:
            del proc.links[0]
        if not proc.alive:
            s.link = False
            return s
        self.note_dial(proc)
        self.tr("dial #%d to %s", s.sid, addr)
        if inst is not None:
            self.at(self.now + self.lat(), self.connected, s)
        elif self.rng.random() < 0.7:
            self.at(self.now + self.lat(), self.deliver_end, s, "UNAVAILABLE", "connection refused")
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
        inst.streams.append(s)
        wait, s.connect_wait = s.connect_wait, None
        if wait is not None and not wait.done():
            wait.set_result(None)

    async def discover(self, timeout_s: float) -> str:
        rng = self.rng
        r = rng.random()
        if self.chaos and r < 0.1:
            self.stats["discovery_failures"] += 1
            raise DiscoveryError("https://discovery.sim/grpc-address answered HTTP 503")
        if self.chaos and r < 0.13:
            self.stats["discovery_hangs"] += 1
            await asyncio.sleep(timeout_s * 2)  # the channel's timeout ends the wait
        if self.chaos and r < 0.3:
            return rng.choice(self.insts).addr  # stale
        live = [i for i in self.insts if i.alive]
        return (live[-1] if live else self.insts[-1]).addr

    def send_up(self, s: Link, msg: Up) -> None:
        if msg.kind == "data":
            # The checker's notes: the first row written on the stream; cut points.
            if s.first_written is None:
                s.first_written = msg.seq
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

    def stalled(self, s: Link) -> bool:
        """Is ``s``'s path stalled now? Times within the loop's 1 µs tick are the same
        instant: the loop's clock is quantized, a stall's end is a float, and an
        event re-queued for "the end" at the end would spin forever (seed 12950)."""
        return s.stalled_until > self.now + 1e-3

    def write(self, s: Link, msg: Up) -> float:
        """The client writes ``msg``: when does its write return (flow control)?

        On a stalled path the windows fill and the write blocks until the
        stall ends (or the stream does); otherwise it returns at once.
        """
        self.send_up(s, msg)
        if s.link and self.stalled(s):
            return s.stalled_until
        return self.now

    def wake_writer(self, s: Link) -> None:
        wait, s.write_wait = s.write_wait, None
        if wait is not None and not wait.done():
            wait.set_result(None)

    def deliver_up(self, s: Link) -> None:
        if not s.upq:
            return
        if self.stalled(s):
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
        if self.stalled(s):
            self.at(s.stalled_until, self.deliver_down, s)
            return
        msg = s.downq.popleft()
        if not s.proc.alive or s.end is not None:
            return
        what = msg[0]
        if what == "end":
            self.deliver_end(s, msg[1], msg[2])
            return
        if what == "ack":
            if (
                self.done_seq is not None
                and msg[1] >= self.done_seq
                and s.proc.done_arrived_at is None
            ):
                s.proc.done_arrived_at = self.now
            if s.first_written is not None and msg[1] >= s.first_written:
                s.productive = True  # the checker's note: progress on this stream
            if s.up_at is None:
                s.up_at = self.now
            # The checker reads it as the client does: the answer, or a data ack.
            answer = self.acks_hs and not s.answered
            mark = "answer" if answer else "ack"
            if answer:
                down = self.answer_ack(msg[1])
                if self.now < self.bad_point_until and down.ack.HasField("resume"):
                    # Its resume point above its h: impossible, a protocol error.
                    down.ack.resume.seq = msg[1] + 1 + self.rng_points.randrange(50)
                    mark = "bad point"
            else:
                down = pb.DownMessage(ack=pb.Ack(seq=msg[1]))
            s.answered = True
            s.marks.append((down, mark, msg[1]))
            if s.proc.role == "harness" and msg[1] > self.acked_sent:
                self.acked_sent = msg[1]
            if self.forget_armed and not answer and s.proc is self.proc:
                stored = self.disk.states[-1].last_acked if self.disk.exists else 0
                if msg[1] > stored:
                    self.forget_armed = False
                    self.at(self.now + self.rng2.random() * 40.0, self.fault_forget, msg[1])
        elif what == "lie":
            if msg[1] == "answer":
                s.answered = True
            down = _Lie()
            s.marks.append((down, "lie", msg[1]))
        elif what == "ahead":
            s.answered = True
            down = self.answer_ack(msg[1])
            s.marks.append((down, "ahead", msg[1]))
        elif what == "stop":
            down = self.cut_text(pb.DownMessage(stop=pb.Stop(reason=msg[1] + self.cut_place)))
        elif what == "decision":
            rid, approved, reason = msg[1]
            # Only the reason is cut: a mangled id would name another request.
            down = self.cut_text(
                pb.DownMessage(
                    approval_decision=pb.ApprovalDecision(
                        request_id=rid, approved=approved, reason=reason + self.cut_place
                    )
                )
            )
            s.marks.append((down, "decision", (rid, self.now)))
        elif what == "budget":
            down = self.cut_text(
                pb.DownMessage(budget_update=pb.BudgetUpdate(message=msg[1] + self.cut_place))
            )
        elif what == "garbage":
            down = msg[1]
            self.stats["undecodable"] += 1
            self.tr("the engine sends #%d %d bytes that are no DownMessage", s.sid, len(down))
            s.marks.append((down, "garbage", len(down)))
        else:
            down = pb.DownMessage()  # a body this client does not know
        reader, s.reader = s.reader, None
        if reader is not None and not reader.done():
            reader.set_result(down)
        else:
            s.inbox.append(down)

    def deliver_end(self, s: Link, code: str | None, details: str) -> None:
        """The client learns that its call ended with this status."""
        if s.contradiction is not None and "expected seq" in details:
            self.stats["contradictions"] += 1
            s.proc.contradicted = s.contradiction  # it must not dial again
        s.link = False
        if code is not None:
            s.status = (code, details)
            self.end_client(s, StreamEnded(f"{code}: {details}", code, details))
        else:
            s.status = ("OK", "")
            self.end_client(s, StreamEnded("the engine ended the stream (status OK)"))

    def end_client(self, s: Link, end: StreamEnded) -> None:
        if s.end is None:
            s.end = end
        # A blocked write fails first, without the status (grpc.aio raises it
        # from the write; the status comes with the call's final state).
        for name in ("write_wait", "connect_wait", "reader"):
            wait = getattr(s, name)
            setattr(s, name, None)
            if wait is not None and not wait.done():
                wait.set_exception(s.end if name == "reader" else StreamEnded("the call is over"))
                wait.exception()

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
        self.at(self.now + self.lat(), self.deliver_end_late, s, code, details)

    def deliver_end_late(self, s: Link, code: str, details: str) -> None:
        if s.end is None and s.proc.alive:
            self.deliver_end(s, code, details)

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
        if s.inst is not None and s in s.inst.streams:
            s.inst.streams.remove(s)
        if self.live is s:
            self.live = None

    def engine_end(self, s: Link, code: str | None, details: str) -> None:
        """The engine ends a stream with a status (sent after what it already sent)."""
        if not s.e_open:
            return
        self.engine_drop(s)
        self.send_down(s, ("end", code, details))

    def engine_up(self, s: Link, msg: Up) -> None:
        if self.limit is not None and msg.size > self.limit:
            self.stats["refusals"] += 1
            if msg.kind == "data":
                s.size_refused = True
                self.refused.add(msg.content)
                self.refused_rows[msg.seq] = (msg.content, msg.rk, msg.size, self.limit)
                if msg.content == DONE:
                    self.stats["done_refused"] += 1
            self.tr("engine refuses seq %d (%d bytes) for its size", msg.seq, msg.size)
            self.engine_end(
                s,
                "RESOURCE_EXHAUSTED",
                f"SERVER: Received message larger than max ({msg.size} vs. {self.limit})",
            )
            return
        if self.chaos and self.p_proxy_limit and self.rng.random() < self.p_proxy_limit:
            # A proxy's own limit: a size the client cannot match to a row.
            self.stats["unproven_refusals"] += 1
            self.engine_end(
                s, "RESOURCE_EXHAUSTED", "Received message larger than max (999999 vs. 65536)"
            )
            return
        if msg.kind == "data":
            self.engine_row(s, msg)
        elif msg.kind == "handshake":
            self.engine_handshake(s, msg.body)
        elif self.lost_the_run(s):
            return  # a writer that lost the run: every message of it is refused
        elif msg.kind == "heartbeat":
            if s.epoch == self.epoch and not (self.lies_armed and self.tell_lie(s, True)):
                self.engine_ack(s)
        else:  # the client half-closed
            if s.unacked:
                self.engine_ack(s)
            self.engine_end(s, None, "")

    def lost_the_run(self, s: Link) -> bool:
        """Is ``s`` a stream of a writer that no longer owns the run? Then it is ended, fenced."""
        owner, writer = self.owner, s.writer
        if owner is None or writer is None or (writer[0] == owner[0] and writer[1] >= owner[1]):
            return False
        self.engine_end(
            s,
            "FAILED_PRECONDITION",
            f"{WRITER_FENCED}: writer {writer[0]} (epoch {writer[1]}) no longer owns run "
            f"{RUN_ID}; writer {owner[0]} (epoch {owner[1]}) does",
        )
        return True

    def admit(self, s: Link, hello: tuple[str, int, bool]) -> bool:
        """The engine's duty (SPEC "Engine duties"): may this writer's handshake be answered?

        As ``EngineStore.admit``: the owner at an equal or higher epoch is
        accepted (the epoch follows), at a lower one refused "writer
        fenced"; another writer is refused "owned by another writer" unless
        it asks to take the run over, which makes it the owner. A refused
        handshake ends its own stream only.
        """
        wid, epoch, take_over = hello
        owner = self.owner
        same = owner is not None and wid == owner[0]
        if owner is None or (same and (take_over or epoch >= owner[1])):
            if wid:
                self.owner = (wid, epoch)
        elif same or not take_over or not wid:
            self.stats["writer_refusals"] += 1
            assert owner is not None
            if same:
                text = (
                    f"{WRITER_FENCED}: writer {wid} (epoch {epoch}) of run {RUN_ID} is below the "
                    f"run's epoch {owner[1]} (a restored copy of its log superseded it)"
                )
            else:
                text = (
                    f"{OWNED_BY_ANOTHER_WRITER}: run {RUN_ID} is owned by writer {owner[0]} "
                    f"(epoch {owner[1]}); writer {wid} (epoch {epoch}) did not ask to take it over"
                )
            self.tr("engine refuses the handshake of writer %s: %s", wid, text.split(":")[0])
            self.engine_end(s, "FAILED_PRECONDITION", text)
            return False
        else:
            self.tr("engine: writer %s takes the run over from writer %s", wid, owner[0])
            self.owner = (wid, epoch)
        s.writer = (wid, epoch)
        return True

    def engine_handshake(self, s: Link, hello: tuple[str, int, bool]) -> None:
        inst = s.inst
        assert inst is not None
        if self.now < inst.reject_until:
            self.engine_end(s, "UNAUTHENTICATED", "unknown run or invalid token")
            return
        # (A completed run answers "run completed" naming its writer, whoever dials.)
        if self.completed:
            s.writer = (hello[0], hello[1])
        elif not self.admit(s, hello):
            return
        # One live stream per run: the newer ends the older, which applies nothing more.
        self.epoch += 1
        s.epoch = self.epoch
        old = self.live
        self.live = s
        if old is not None and old is not s:
            if old.writer is not None and old.writer != s.writer and not self.completed:
                # Another writer (a takeover) or a newer epoch has the run: the old one is fenced.
                self.engine_end(
                    old,
                    "FAILED_PRECONDITION",
                    f"{WRITER_FENCED}: writer {hello[0]} has run {RUN_ID} now; writer "
                    f"{old.writer[0]} no longer writes it",
                )
            else:
                self.engine_end(old, "ABORTED", "superseded by a newer stream for the run")
        if self.completed:
            by = f" by writer {self.completed_by}" if self.completed_by else ""
            self.engine_end(s, "FAILED_PRECONDITION", f"run completed{by}")
            return
        delay = self.ack_delay
        if self.acks_hs:
            if self.chaos and self.rng.random() < self.p_late:
                self.stats["late_answers"] += 1
                delay += self.rng.random() * 15_000.0
            # (The lies are made from the first harness's log: told to its streams only.)
            if self.now < self.lie_answers_until and s.proc.role != SECOND:
                self.at(self.now + delay, self.send_down, s, ("lie", "answer"))
            elif self.now < self.false_answers_until and s.proc.role != SECOND:
                self.at(self.now + delay, self.false_answer, s)
            else:
                self.at(self.now + delay, self.send_down, s, ("ack", len(self.applied)))
        # After every handshake: the run's Stop and every decision again.
        if self.stop_issued:
            self.at(self.now + delay, self.send_down, s, ("stop", "operator"))
        for rid, (approved, reason) in self.decided.items():
            self.at(self.now + delay, self.send_down, s, ("decision", (rid, approved, reason)))
        if self.flaky_from <= self.now < self.flaky_until:
            self.at(
                self.now + self.ack_delay + 1.0,
                self.engine_end,
                s,
                "UNAVAILABLE",
                "engine dropped the stream",
            )

    def engine_row(self, s: Link, msg: Up) -> None:
        if s.epoch != self.epoch:
            return  # fenced: a newer stream owns the run
        seq, content = msg.seq, msg.content
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
            if not self.answer_lied:
                self.violation(f"gap: the engine expected seq {h + 1}, got {seq}")
            stored = self.disk.states[-1].last_acked if self.disk.exists else 0
            if h < stored and s.proc is self.proc:
                # It contradicts the cursor its own word made the log store: once
                # the client reads it, it fails as engine behind (issue 53).
                s.contradiction = (h + 1, stored)
            self.engine_end(s, "FAILED_PRECONDITION", f"expected seq {h + 1}, got seq {seq}")
            return
        elif self.completed:
            self.violation(f"{_name(content)} at seq {seq} after the run's Done")
            self.engine_end(s, "FAILED_PRECONDITION", "run completed")
            return
        else:
            applied.append(content)
            self.applied_writer.append(s.writer[0] if s.writer else "")
            self.applied_data.append(msg.data)
            if seq > self.peak:
                self.peak = seq
            held = self.ever_at.get(seq)
            if held is None:
                self.ever_at[seq] = {content}
            else:
                held.add(content)
            self.tr("engine applies seq %d = %s", seq, _name(content))
            # The run's resume point, in the same step: the rows of its transaction
            # begin after a progress row, or at the row that carries it.
            writer = self.applied_writer[-1]
            if content == PROGRESS:
                self.marker_at[seq] = (*msg.body, seq, writer, 0)
            elif msg.point is not None:
                self.marker_at[seq] = (*msg.point, seq - 1, writer, 1)  # the carrier: 1 row
            if content == ROW_LOST:
                self.check_row_lost(msg.body)
            if content == DONE:
                self.completed = True
                self.completed_by = s.writer[0] if s.writer else None
                self.done_seq = seq
                self.done_body = msg.body
                self.engine_ack(s)
                return
            if content >= APPROVAL_BASE:
                self.engine_approval(s, msg.body)
        s.unacked += 1
        if s.unacked >= self.ack_every:
            self.engine_ack(s)
        else:
            s.idle_gen += 1
            self.at(self.now + ENGINE_ACK_IDLE_MS, self.engine_idle, s, s.idle_gen)

    def fault_bad_point(self) -> None:
        """For a while the engine answers handshakes with a resume point above its ``h``."""
        self.bad_point_until = self.now + 200.0 + self.rng_points.random() * 8_000.0

    def forget_markers(self) -> None:
        """The engine lost its last rows: the resume point goes back with them."""
        h = len(self.applied)
        for q in [q for q in self.marker_at if q > h]:
            del self.marker_at[q]
        del self.applied_writer[h:]
        del self.applied_data[h:]

    def answer_ack(self, seq: int) -> pb.DownMessage:
        """A handshake's answer ``Ack(seq)``: with the run's resume point if the engine keeps it.

        The point is the last progress row applied at or below ``seq`` (a
        lying answer's too: the lie is about ``h``, not the point).
        """
        down = pb.DownMessage(ack=pb.Ack(seq=seq))
        if self.keeps_resume and not self.older_from <= self.now < self.older_until:
            point = down.ack.resume
            point.SetInParent()
            at = [q for q in self.marker_at if q <= min(seq, len(self.applied))]
            if at:
                marker, digests, point.seq, writer, first = self.marker_at[max(at)]
                point.marker.update(marker)
                point.row_digests.extend(digests)
                # Its transaction's rows: those after it that its writer wrote and
                # that are the transaction's next by content, up to the first that
                # is not (a takeover's row, or a renumbered log's own).
                top = min(seq, len(self.applied))
                rows = first
                for q in range(point.seq + first, top):
                    if (
                        rows == len(digests)
                        or self.applied_writer[q] != writer
                        or not _continues(self.applied_data[q], digests[rows])
                    ):
                        break
                    rows += 1
                point.rows = rows
                if point.rows < len(digests) and self.taken_over:
                    self.stats["partial_points"] += 1  # an item applied in part, taken over
        return down

    def engine_approval(self, s: Link, rid: str) -> None:
        """An approval request: a stored decision goes back at once, else one is made later."""
        if rid in self.decided:
            self.send_down(s, ("decision", (rid, *self.decided[rid])))
            return
        self.at(self.now + self.rng.random() * 500.0, self.engine_decide, rid)

    def engine_decide(self, rid: str) -> None:
        if rid in self.decided:
            return
        decision = (self.rng.random() < 0.7, f"decided at {self.now:.0f}")
        self.decided[rid] = decision
        self.stats["decisions"] += 1
        self.tr("engine decides %s: %s", rid, decision[0])
        if self.live is not None:
            self.send_down(self.live, ("decision", (rid, *decision)))

    def engine_idle(self, s: Link, gen: int) -> None:
        if s.idle_gen == gen and s.unacked and s.e_open:
            self.engine_ack(s)

    def engine_ack(self, s: Link) -> None:
        s.unacked = 0
        s.idle_gen += 1
        if self.ack_delay:
            self.at(self.now + self.ack_delay, self.send_down, s, ("ack", len(self.applied)))
        else:
            self.send_down(s, ("ack", len(self.applied)))
        if self.lies_armed:
            self.tell_lie(s, False)

    # -- the checker's online notes ----------------------------------------------------------

    def check_row_lost(self, payload: dict[str, Any]) -> None:
        """A row_lost event replaces only a row the engine refused for its size."""
        size, limit = payload.get("size"), payload.get("limit")
        if limit not in self.limits_in_force or size is None or size <= limit:
            self.violation(f"a row_lost event for a row the engine never refused: {payload}")

    def note_redial(self, proc: Proc) -> None:
        """The channel dials or asks discovery: after a row set aside, at the first step.

        Setting a refused row aside proves the engine healthy: the backoff
        starts again (``Driver.on_set_aside``), so the next attempt comes
        within the first step (``initial_ms`` plus the jitter).
        """
        at, proc.set_aside_at = proc.set_aside_at, None
        if at is None:
            return
        b = self.backoff
        bound = b.initial_ms + b.jitter_ms + 1.0
        if self.now - at > bound:
            self.violation(
                f"a refused row was set aside, yet the next dial came {self.now - at:.0f} ms "
                f"later (at most {bound:.0f} ms: the backoff starts again)"
            )

    def note_dial(self, proc: Proc) -> None:
        self.stats["dials"] += 1
        if proc.contradicted is not None:
            expected, stored = proc.contradicted
            self.violation(
                f"dialed again after the engine said it expects seq {expected}, below the "
                f"cursor {stored} the log stored from its word: engine behind, not a retry"
            )
            proc.contradicted = None
        dq = proc.dials
        dq.append(self.now)
        while self.now - dq[0] > 1000.0:
            dq.popleft()
        n = len(dq)
        if n > self.max_dials_per_s:
            self.max_dials_per_s = n
        if n > 3:
            self.violation(f"tight loop: {n} dials within one virtual second")
        last = proc.last_end_ms
        if last is not None:
            # The backoff: at least min(max_ms, initial * multiplier ** attempt),
            # the attempt counting streams that ended without progress (SPEC "Reconnect").
            b = self.backoff
            floor = min(b.max_ms, b.initial_ms * b.multiplier**proc.exp_attempt)
            if self.now - last < floor - 1e-3:
                self.violation(
                    f"backoff reset without progress: a dial {self.now - last:.0f} ms after "
                    f"the last stream ended, {proc.exp_attempt} unproductive streams "
                    f"(at least {floor:.0f} ms)"
                )
            proc.exp_attempt += 1
            proc.last_end_ms = None

    def note_stream_end(self, s: Link) -> None:
        """The client tore a stream down: the checker's model of progress on it."""
        proc = s.proc
        # (A few seconds of slack: the channel measures from its own moment.)
        up_long = s.up_at is not None and self.now - s.up_at >= STABLE_STREAM_MS - 5_000.0
        if s.productive or up_long or s.size_refused:
            proc.exp_attempt = 0
        proc.last_end_ms = self.now

    # -- the harness, flush and the operator ---------------------------------------------------

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

    def exit(self, proc: Proc, why: str) -> None:
        if self.proc is not proc or not proc.alive:
            return
        proc.alive = False
        self.proc = None
        self.tr("%s exits: %s", proc.role, why)
        if proc.stops > 1:
            self.violation(f"on_stop fired {proc.stops} times in one channel")
        if why in ("completed", "refused"):
            if not self.completed:
                self.violation(f"the {proc.role} exited '{why}' but the engine lacks Done")
            if why == "refused":
                # RunCompletedError: rows the log still holds are undeliverable,
                # kept there for export (SPEC "Reconnect"): named, not lost.
                self.refused_stop = True
            if self.recheck:
                self.recheck = False
                self.at(self.now + self.rng.random() * 1_000.0, self.restart, False)
            else:
                self.finish()
            return
        if why == "engine behind":
            # The run cannot complete: its acked rows are gone from both sides.
            if not self.engine_lost:
                self.violation("engine behind declared, but the engine never lost rows")
            self.behind = True
            self.stats["engine_behind"] += 1
            self.finish()
            return
        if why == "expired":
            self.expired = True
            self.stats["expired"] += 1
            self.finish()
            return
        if why == "fenced":
            # The named error (WriterFencedError): the operator stops, or takes the
            # run over (walchannel takeover) and starts the harness again.
            # Without handshake answers a taken-over log cannot renumber past the
            # engine's rows (SPEC "Dial"): there the operator only stops.
            # After the second harness took the run over, the first is stopped: two
            # operators taking it over in turn would fence each other for ever.
            sec = self.second
            free = self.exact_takeover and sec is None  # the engine's point: nothing twice
            if (
                not self.acks_hs
                or (sec is not None and sec.took_over)
                or (not free and self.rng3.random() < 0.5)
            ):
                self.tr("the operator stops: the run stays another writer's")
                self.stats["fenced_stops"] += 1
                self.fenced_stop = True
                self.finish()
            else:
                self.at(self.now + self.restart_delay(), self.take_over)
            return
        if why == "done refused":
            # The operator raises the engine's limit; the next start delivers Done.
            self.limit = None
            self.at(self.now + self.restart_delay(), self.start_harness)
            return
        if why == "gave up":
            self.at(self.now + self.restart_delay(), self.start_flush)
            return
        self.at(self.now + self.restart_delay(), self.restart, why != "flushed")

    def take_over(self) -> None:
        """``walchannel takeover LOG``, then the harness again (SPEC "Operating tools")."""
        if self.proc is not None or self.finished:
            return
        proc = self.new_proc("takeover")
        retry = False
        try:
            log = self.open_log(proc)
        except WalWriteError:
            log, retry = None, True
        try:
            if log is not None:
                writer = log.mark_takeover()
                self.stats["takeovers"] += 1
                self.taken_over = True
                self.tr("the operator takes the run over: the log's writer is %s now", writer.id)
        except WalWriteError:
            retry = True
        except RunCompletedError:
            self.tr("takeover refused: the log is a tombstone")
        except INTERRUPTS as exc:
            # A signal's exception inside the command's commit: `walchannel
            # takeover` dies; the operator runs it again (the log must allow it).
            if self.kbd_proc is proc:
                self.kbd_proc = None
            name = type(exc).__name__
            self.tr("the takeover is interrupted (%s); the operator runs it again", name)
            retry = True
        finally:
            if log is not None and not log.closed:
                log.close()
            proc.alive = False
            if self.proc is proc:
                self.proc = None
        if retry:
            self.at(self.now + 100.0 + self.rng3.random() * 2_000.0, self.take_over)
        else:
            self.at(self.now + self.restart_delay(), self.start_harness)

    # -- the second harness on the run ------------------------------------------------------

    def start_second(self) -> None:
        sec = self.second
        if sec is None or sec.over.is_set() or sec.proc is not None:
            return
        self.stats["second_runs"] += 1
        proc = sec.proc = Proc(self, SECOND)
        self.spawn(proc, self.second_harness(proc, sec))

    def open_second_log(self, sec: Second) -> RunLog:
        """The second harness's log: new (a writer id of its own), or its last image."""
        conn = sqlite3.connect(":memory:", isolation_level=None)
        if sec.image is None:
            conn.deserialize(fresh_image())
            conn.execute("UPDATE meta SET writer_id = ? WHERE id = 1", (_writer_id(),))
        else:
            conn.deserialize(sec.image)
        return RunLog.on_connection(
            conn,
            run_id=RUN_ID,
            correlation_id=CORRELATION_ID,
            commit_hook=SecondHook(sec, conn),
            clock=self.clock,
        )

    def second_channel(self, proc: Proc, sec: Second) -> GrpcEngineChannel:
        """The second harness opens its own log (new, or its last image) and its channel."""
        log = self.open_second_log(sec)
        ch = open_channel(
            self.config,
            rng=random.Random(self.rng4.getrandbits(32)),
            log=log,
            transport=SimTransport(self, proc),
            clock=self.clock,
        )
        proc.channel = ch
        proc.max_truth = log.last_acked_seq
        ch.on_stop(lambda reason: self.on_stop(proc))
        return ch

    async def second_harness(self, proc: Proc, sec: Second) -> None:
        """Another pod's harness on the same run: resume from progress, scan, Done, close."""
        ch = self.second_channel(proc, sec)
        wid = ch.log.writer.id
        sec.writers.add(wid)
        marker = ch.progress()
        nxt = 0 if marker is None else int(marker["n"])
        self.tr("the second harness starts as writer %s (progress=%s)", wid, marker)
        why = "gave up"
        try:
            with contextlib.suppress(EngineUnavailableError):  # the channel keeps dialing
                await ch.handshake(*HARNESS)
            while nxt < self.nf:
                await asyncio.sleep(self.rng4.random() * self.think / 1000)
                seq = ch.send_finding(self.finding(nxt), progress={"n": nxt + 1})
                self.tr("the second harness logs %s at seq %d", _name(nxt), seq)
                sec.logged.add(nxt)
                nxt += 1
            acked = await ch.send_done("completed", self.nf, ["/scan"], "")
            if acked:
                why = "completed"
                if self.completed_by != wid or self.done_body != ("completed", self.nf):
                    self.violation(
                        f"the second harness's send_done returned True, but the engine applied "
                        f"Done {self.done_body} of writer {self.completed_by}, not its own ({wid})"
                    )
        except WriterFencedError as exc:
            self.check_fenced(proc, exc)
            sec.named = True
            why = "fenced"
        except RunCompletedError:
            why = "refused"
        except EngineBehindError:
            why = "engine behind"
        await ch.close()
        self.second_exits(proc, sec, why)

    def second_exits(self, proc: Proc, sec: Second, why: str) -> None:
        """The second harness exited: its operator restarts, stops, or takes the run over."""
        proc.alive = False
        sec.proc = None
        self.tr("the second harness exits: %s", why)
        if why == "gave up":
            self.at(self.now + self.restart_delay(), self.start_second)
            return
        if why in ("completed", "refused") and not self.completed:
            self.violation(f"the second harness exited '{why}' but the engine lacks Done")
        elif why == "engine behind":
            if not self.engine_lost:
                self.violation("engine behind declared, but the engine never lost rows")
            self.behind = True
        elif why == "fenced":
            self.stats["second_fenced"] += 1
            if self.acks_hs and not self.taken_over and self.rng4.random() < 0.4:
                # `walchannel takeover` on its log, then it starts again (the first is fenced).
                self.at(self.now + self.restart_delay(), self.second_takes_over)
                return
            self.tr("the operator stops the second harness: the run stays another writer's")
        if why == "completed":
            self.stats["second_completed"] += 1
        sec.over.set()

    def second_takes_over(self) -> None:
        sec = self.second
        if sec is None or sec.image is None:
            return
        log = self.open_second_log(sec)
        try:
            writer = log.mark_takeover()
        finally:
            log.close()
        self.stats["second_takeovers"] += 1
        sec.took_over = self.taken_over = True
        self.tr("the operator takes the run over for the second harness: writer %s", writer.id)
        self.start_second()

    def check_fenced(self, proc: Proc, error: WriterFencedError) -> None:
        """A ``WriterFencedError`` has a cause in the world (SPEC "The channel").

        The engine's owner is another writer (or this one at a higher epoch),
        another writer completed the run, or the log never had an answered
        handshake and the engine holds rows (the log's own evidence).
        """
        ch = proc.channel
        if ch is None or not proc.alive:
            return
        writer = ch.log.writer
        owner = self.owner
        if owner is not None and (owner[0] != writer.id or owner[1] > writer.epoch):
            return
        if self.completed_by is not None and self.completed_by != writer.id:
            return
        # (The rule is the checker's own, on the fields as stored: not the product's predicate.)
        unanswered = not (writer.answered or writer.take_over or writer.epoch > 0)
        if unanswered and self.peak > 0:
            return  # (raised again from the stored refusal on a restart: still unanswered)
        self.violation(
            f"the {proc.role} got WriterFencedError ({error}), yet the run's owner is "
            f"{owner}, it was completed by {self.completed_by}, and its log's writer is {writer}"
        )

    def new_proc(self, role: str) -> Proc:
        proc = Proc(self, role)
        self.proc = proc
        return proc

    def channel(self, proc: Proc) -> GrpcEngineChannel:
        """The process opens the log and builds the product's channel on the world's seams."""
        log = self.open_log(proc)
        try:
            ch = open_channel(
                self.config,
                rng=random.Random(self.rng.getrandbits(32)),
                log=log,
                transport=SimTransport(self, proc),
                clock=self.clock,
            )
        except BaseException:
            if not log.closed:
                log.close()
            raise
        proc.channel = ch
        proc.max_truth = self.disk.states[-1].last_acked  # the cursor it starts from
        ch.on_stop(lambda reason: self.on_stop(proc))
        ch.on_budget_update(lambda message, details: self.on_budget(proc))
        return ch

    def on_stop(self, proc: Proc) -> None:
        proc.stops += 1
        if not self.stop_issued:
            self.violation("on_stop fired, but the engine issued no Stop")

    def on_budget(self, proc: Proc) -> None:
        proc.budgets += 1
        if self.raising_callbacks:
            raise RuntimeError("a harness callback with a bug")  # logged, never fatal

    def start_harness(self) -> None:
        if self.proc is not None or self.finished:
            return
        self.stats["harness_runs"] += 1
        proc = self.new_proc("harness")
        self.spawn(proc, self.runner_harness(proc) if self.runner else self.harness(proc))

    def start_flush(self) -> None:
        if self.proc is not None or self.finished:
            return
        self.stats["flushes"] += 1
        proc = self.new_proc("flush")
        self.spawn(proc, self.flush(proc))

    def check_stats(self, proc: Proc, ch: GrpcEngineChannel) -> None:
        """What the channel says of itself agrees with the world (its public ``stats()``)."""
        if not proc.alive or proc.detached:
            return
        st = ch.stats()
        if ch.config.run_id != RUN_ID or (ch.last_acked_seq, ch.unacked_count, ch.state) != (
            st.acked,
            st.unacked_count,
            st.state,
        ):
            self.violation(f"stats() disagrees with the channel's read-outs: {st} vs {ch!r}")
        if st.protocol_errors > proc.lies_read:
            # Only an impossible answer of the engine is a protocol error.
            self.violation(
                f"{st.protocol_errors} protocol errors counted, but the engine told this channel "
                f"{proc.lies_read} impossible answers: {st.last_error}"
            )
        if st.protocol_errors < proc.garbage_read:
            self.violation(
                f"the channel read {proc.garbage_read} down messages that do not parse, but "
                f"counted {st.protocol_errors} protocol errors: one went unsaid"
            )
        if st.acked > self.peak:
            self.violation(f"received cursor {st.acked} beyond the engine's {self.peak}")
        if st.acked > proc.max_truth:
            self.violation(
                f"received cursor {st.acked} above every ack and answer the engine gave this "
                f"channel ({proc.max_truth}): an impossible answer was applied"
            )
        missing = ("is not in the log", "is missing")
        if st.last_error and any(text in st.last_error for text in missing):
            self.violation(f"the writer asked for a row the log does not hold: {st.last_error}")
        age = st.oldest_unacked_age_s
        # Every row of a schedule that never rebooted was written in this
        # boot: its age is boot time, whatever the wall clock's steps.
        if age is not None and self.clock.boot == 0 and age > self.clock.boot_s() + 1e-6:
            self.violation(
                f"oldest_unacked_age_s {age:.3f} s is older than the boot "
                f"({self.clock.boot_s():.3f} s): an age read off a stepped wall clock"
            )
        # unacked_count: the log's rows above the received cursor, as committed.
        above = sum(1 for q in self.disk.states[-1].rows if q > st.acked)
        if st.unacked_count != above:
            self.violation(
                f"stats().unacked_count is {st.unacked_count}, but the log holds {above} rows "
                f"above the received cursor {st.acked}"
            )
        counters = (st.sent, st.replayed, st.reconnects)
        if any(now < before for now, before in zip(counters, proc.counters, strict=True)):
            self.violation(
                f"stats() sent, replayed, reconnects went back: {proc.counters} -> {counters}"
            )
        proc.counters = counters

    def check_progress(self, proc: Proc, ch: GrpcEngineChannel) -> None:
        """``progress()`` is the marker of the last committed transaction (or, under
        group commit, the marker last set, while its group waits)."""
        if not proc.alive or proc.detached or ch.log.closed:
            return
        self.note_group_lost(proc, ch)
        if self.runner and self.group_commit is not None:
            return  # the runner's sends and their pending markers are its own, unseen here
        marker = ch.progress()
        stored = self.disk.states[-1].progress
        if proc.marker_set is not UNSET:
            if marker != proc.marker_set:
                self.violation(
                    f"progress() says {marker}, but the marker last set, its group still "
                    f"pending, is {proc.marker_set}"
                )
        elif marker != stored:
            self.violation(
                f"progress() says {marker}, but the last committed transaction stored {stored}"
            )

    def note_group_lost(self, proc: Proc, ch: GrpcEngineChannel) -> None:
        """A group the disk refused on every try: the channel failed, naming its seqs."""
        if not proc.uncommitted and proc.marker_set is UNSET:
            return
        failure = driver_of(ch).failure
        if not isinstance(failure, GroupCommitError):
            return
        lost = sorted(proc.uncommitted)
        named = (failure.first_seq, failure.last_seq)
        # A marker sent alone to an engine that keeps the resume point takes a seq of
        # its own (a progress row) that no send returns: the named range may hold such
        # seqs too, never one a send returned as content, and must cover every lost one.
        span = set() if named[0] is None else set(range(named[0], named[1] + 1))
        extra = span.difference(lost)
        if not set(lost) <= span or extra & set(proc.handed) or len(extra) > proc.marker_only:
            self.violation(f"the channel gave up a group of seqs {lost}, but names {named}")
        proc.marker_only = 0
        self.stats["groups_given_up"] += 1
        self.stats["group_rows_given_up"] += len(lost)
        proc.uncommitted.clear()
        proc.marker_set = UNSET

    def sent(
        self,
        proc: Proc,
        ch: GrpcEngineChannel,
        contents: tuple[int, ...],
        marker: Any,
        call: Callable[[], list[int]],
    ) -> list[int]:
        """Log ``contents`` (with ``marker``) by ``call``; its answer is checked as it is given.

        A seq returned is in the committed image, holding that content; the
        marker is then ``progress()``. A call that raised logged all of it or
        nothing (checked where the harness catches a signal's exception).
        """
        # The markers the log may hold if the call logged nothing: the stored one,
        # or, under group commit, the pending group's, which the call may commit first.
        before = [self.disk.states[-1].progress if self.disk.exists else None]
        if proc.marker_set is not UNSET:
            before.append(proc.marker_set)
        proc.pending = (contents, marker, before)
        state, done_sent, closed = ch.state.value, driver_of(ch).done_sent, driver_of(ch).closed
        try:
            seqs = call()
        except INTERRUPTS:
            self.check_progress(proc, ch)
            raise  # the harness checks the rows against the marker (check_interrupted)
        except BaseException:
            proc.pending = None
            self.check_progress(proc, ch)
            raise
        proc.pending = None
        if not proc.alive:
            return seqs
        grouped = self.group_commit is not None
        if grouped and not contents and not seqs:
            # Counted before the detached return: a marker sent alone after the
            # files were removed takes its progress row's seq all the same (seed 1041755).
            proc.marker_only += 1
        if proc.detached:
            if seqs and not grouped:
                # SPEC "The log": committed only into a file no path names: never returned.
                self.violation(
                    f"a send returned seqs {seqs} after the log's files were removed: only "
                    "the unlinked file holds them"
                )
            proc.uncommitted.update(zip(seqs, contents, strict=False))
            return seqs
        if state in ("failed", "expired", "closed") or done_sent or closed:
            # SPEC "Buffer first": such a send raises, it logs nothing.
            self.violation(
                f"a send returned seqs {seqs} while the channel was {state}"
                f"{', send_done called' if done_sent else ''}{', closed' if closed else ''}"
            )
        st = self.disk.states[-1]
        rows = st.rows
        if len(seqs) != len(contents):
            self.violation(f"a send of {len(contents)} rows returned {len(seqs)} seqs: {seqs}")
        for seq, c in zip(seqs, contents, strict=False):
            proc.handed[seq] = c
            held = rows.get(seq)
            if held is None and grouped and seq > max(max(rows, default=0), st.last_acked):
                # SPEC "Group commit": handed out, committed at a quiet turn or a cap.
                proc.uncommitted[seq] = c
            elif held != c:
                self.violation(
                    f"a send returned seq {seq} for {_name(c)}, but the committed log holds "
                    f"{'no row' if held is None else _name(held)} there"
                )
        if grouped and marker is not None and st.progress != marker:
            proc.marker_set = marker
        self.check_progress(proc, ch)
        return seqs

    def check_interrupted(self, proc: Proc, ch: GrpcEngineChannel, exc: BaseException) -> None:
        """After a signal's exception in a call: the log usable, the call's rows all or none."""
        if not proc.alive or proc.detached:
            return
        if _in_transaction(proc.conn):
            self.violation(
                f"after {type(exc).__name__} inside a transaction of the log, its connection "
                "is still in the transaction (never rolled back)"
            )
        self.check_progress(proc, ch)
        pending, proc.pending = proc.pending, None
        if pending is None:
            return
        contents, marker, before = pending
        st = self.disk.states[-1]
        there = set(st.rows.values())
        landed = [c in there for c in contents]
        if any(landed) and not all(landed):
            kept = [_name(c) for c, ok in zip(contents, landed, strict=True) if ok]
            self.violation(f"an interrupted send committed only part of its rows: {kept}")
        elif contents and all(landed):
            if marker is not None and st.progress != marker:
                self.violation(
                    f"an interrupted send committed its rows without its marker {marker} "
                    f"(stored: {st.progress})"
                )
        elif contents and st.progress not in before:
            self.violation(
                f"an interrupted send committed its marker {st.progress} without its rows"
            )

    def cancel_delay(self) -> float | None:
        """When the world cancels the next public coroutine (ms after it starts), or None."""
        r2 = self.rng2
        if not self.chaos or r2.random() >= self.p_cancel:
            return None
        return r2.choice((0.0, r2.random() * 5.0, r2.random() * 300.0, r2.random() * 3_000.0))

    async def api(
        self, proc: Proc, ch: GrpcEngineChannel, name: str, call: Callable[[], Awaitable[_T]]
    ) -> _T:
        """Await a public coroutine of the channel; the world may cancel it.

        With ``asyncio.timeout`` around it (``Cancelled`` then), or by
        cancelling the harness's task (World.fault_cancel_task). Either way the
        call must raise within :data:`CANCEL_BOUND_MS`: a result after the
        cancel, or another exception instead of it, swallowed it.
        """
        proc.calls += 1
        me = proc.in_call = proc.calls
        delay = self.cancel_delay() if self.p_cancel else None
        t0 = self.now
        scope: asyncio.Timeout | None = None
        try:
            if delay is None:
                result = await call()
            else:
                try:
                    async with asyncio.timeout(delay / 1000) as scope:
                        result = await call()
                except TimeoutError:
                    if scope is None or not scope.expired():
                        raise
                    self.stats["cancels"] += 1
                    self.cancel_landed(proc, ch, name, t0 + delay, "asyncio.timeout")
                    raise Cancelled(name) from None
        except asyncio.CancelledError:
            if proc.alive and proc.cancel_call == me and proc.cancel_at is not None:
                self.cancel_landed(proc, ch, name, proc.cancel_at, "its task cancelled")
            raise
        except Cancelled:
            raise
        except BaseException as exc:
            cancelled = (scope is not None and scope.expired()) or proc.cancel_call == me
            if cancelled and proc.alive and not isinstance(exc, INTERRUPTS):
                self.violation(
                    f"{name}() was cancelled, but raised {type(exc).__name__} instead: {exc}"
                )
            raise
        finally:
            proc.in_call = 0
        if proc.alive:
            if scope is not None and scope.expired():
                self.violation(
                    f"{name}() returned {result!r} though asyncio.timeout cancelled it "
                    f"{self.now - t0 - (delay or 0.0):.0f} ms before: the cancel was swallowed"
                )
            elif proc.cancel_call == me:
                self.violation(
                    f"{name}() returned {result!r} though its task was cancelled "
                    f"{self.now - (proc.cancel_at or 0.0):.0f} ms before: the cancellation was "
                    "swallowed"
                )
        return result

    def cancel_landed(
        self, proc: Proc, ch: GrpcEngineChannel, name: str, at: float, how: str
    ) -> None:
        """A cancelled call raised: in time, the log usable (closed, for ``close()``)."""
        if not proc.alive:
            return
        late = self.now - at
        if late > CANCEL_BOUND_MS:
            self.violation(f"{name}() was cancelled ({how}), but raised only {late:.0f} ms later")
        if name == "close" and not ch.log.closed:
            self.violation("close() was cancelled, and the log is still open (its lock held)")
        if _in_transaction(proc.conn):
            self.violation(f"{name}() was cancelled inside a transaction of the log, left open")

    async def close(self, proc: Proc, ch: GrpcEngineChannel, why: str) -> None:
        self.check_stats(proc, ch)
        proc.closing = why
        t0 = self.now
        try:
            await self.api(proc, ch, "close", ch.close)
            self.check_closed(proc, ch, t0)
        except Cancelled:
            # A cancelled close: the process ends, and its tasks with it.
            await self.run_down(proc)
        except INTERRUPTS as exc:
            self.check_interrupted(proc, ch, exc)
            if proc.alive and not ch.log.closed:
                self.violation(f"close() raised {type(exc).__name__}, and the log is still open")
            await self.run_down(proc)
        if proc.alive and ch.log.closed:
            self.sync()  # closing the last connection checkpoints the WAL
        self.stats["protocol_errors"] += ch.stats().protocol_errors
        self.exit(proc, why)

    def check_closed(self, proc: Proc, ch: GrpcEngineChannel, t0: float) -> None:
        """A clean ``close()`` (begun at ``t0``) stored the last ack its channel received."""
        if not proc.alive or proc.detached or not self.disk.exists:
            return
        st = self.disk.states[-1]
        received = ch.last_acked_seq
        self.stats["clean_closes"] += 1
        if st.completed or st.last_acked >= received:
            return
        if self.disk.full or self.disk_full_until >= t0:
            return  # the store failed on a full disk: the rows stay, re-sent (harmless)
        self.violation(
            f"a clean close() left the received ack {received} unstored "
            f"(the log's cursor: {st.last_acked})"
        )

    def ended_by(self, proc: Proc, ch: GrpcEngineChannel, error: BaseException) -> str:
        """Why a process exits on ``error`` (a violation when it should never come)."""
        if isinstance(error, RunCompletedError):
            return "refused"
        if isinstance(error, EngineBehindError):
            return "engine behind"
        if isinstance(error, RunExpiredError):
            # SPEC "States": the deadline moves the channel to EXPIRED, and it stays so.
            if ch.state.value != "expired":
                self.violation(f"RunExpiredError raised, but the channel is {ch.state.value}")
            return "expired"
        if isinstance(error, GroupCommitError):
            # The disk refused a group on every try: a new channel resumes (SPEC "Group commit").
            self.note_group_lost(proc, ch)
            if ch.state.value != "failed":
                self.violation(f"GroupCommitError raised, but the channel is {ch.state.value}")
            return "group lost"
        if isinstance(error, WalRemovedError):
            # SPEC "The log": its files removed while open; the run fails, named.
            if not proc.detached:
                self.violation(f"WalRemovedError raised, but the log's files are there: {error}")
            elif ch.state.value != "failed":
                self.violation(f"WalRemovedError raised, but the channel is {ch.state.value}")
            self.stats["removals_named"] += 1
            return "log removed"
        if isinstance(error, WriterFencedError):
            self.stats["fenced_errors"] += 1
            self.check_fenced(proc, error)
            return "fenced"
        # The engine refused the logged Done, or the harness's own bound
        # (max_message_bytes, the engine's limit) refused it at send time.
        if isinstance(error, RowRefusedError) and error.kind == "done":
            self.check_refused(proc, error)
            return "done refused"
        if isinstance(error, PayloadError) and error.path == "done":
            return "done refused"
        self.violation(f"{proc.role} got {type(error).__name__}: {error}")
        return "error"

    def check_refused(self, proc: Proc, error: RowRefusedError) -> None:
        """``RowRefusedError`` names a row the engine refused for its size, with its kind."""
        if not proc.alive:
            return
        found = self.refused_rows.get(error.seq)
        if found is None:
            self.violation(
                f"RowRefusedError names seq {error.seq} ({error.kind}), which the engine never "
                "refused"
            )
            return
        content, kind, size, limit = found
        if (kind, size, limit) != (error.kind, error.size, error.limit):
            self.violation(
                f"RowRefusedError names seq {error.seq} a {error.kind} of {error.size} bytes "
                f"(limit {error.limit}); the engine refused {_name(content)}, a {kind} of "
                f"{size} bytes (limit {limit}) there"
            )

    async def failed(self, proc: Proc, ch: GrpcEngineChannel, error: BaseException) -> None:
        await self.close(proc, ch, self.ended_by(proc, ch, error))

    def new_event(self) -> int:
        self.next_event += 1
        return self.next_event

    def finding(self, i: int) -> dict[str, Any]:
        if i in self.big:
            return {"i": i, "pad": "x" * (2 * (self.limit or 0))}
        return {"i": i}

    async def open_channel(self, proc: Proc) -> GrpcEngineChannel | None:
        """Open the log and the channel; None when the process exits instead."""
        try:
            return self.channel(proc)
        except WalWriteError:
            self.tr("%s cannot open the log (disk full)", proc.role)
            if proc.alive:
                proc.alive = False
                self.proc = None
                self.at(self.now + 100.0 + self.rng.random() * 2_000.0, self.start_harness)
            return None
        except RunCompletedError:
            self.tr("%s: the log is a tombstone; exits", proc.role)
            if proc.alive:
                if not self.completed:
                    self.violation("a tombstone while the engine lacks Done")
                proc.alive = False
                self.proc = None
                self.finish()
            return None

    async def harness(self, proc: Proc) -> None:
        """A scan harness (README): resume from progress, send findings, Done, close."""
        ch = await self.open_channel(proc)
        if ch is None or not proc.alive:
            return
        self.tr(
            "harness starts %s (progress=%s, acked=%d, next_seq=%d, unverified=%s)",
            repr(ch),
            ch.log.progress,
            ch.log.last_acked_seq,
            ch.log.next_seq,
            ch.log.unverified_from,
        )
        self.check_progress(proc, ch)
        marker = ch.progress()
        life = Life(0 if marker is None else int(marker["n"]))
        try:
            await self.scan(proc, ch, life)
        except asyncio.CancelledError:
            if not proc.alive or proc.cancel_at is None or proc.ending:
                raise
            # Its supervisor cancelled it: `async with channel` closes the channel
            # on the way out (or its close was what the cancel hit); the process ends.
            if proc.closing is None:
                await self.close(proc, ch, "cancelled")
            else:
                await self.run_down(proc)
                self.exit(proc, proc.closing)

    async def runner_harness(self, proc: Proc) -> None:
        """The harness as the runner runs it (SPEC "The runner"), its exit code judged."""
        self.stats["runner_runs"] += 1
        self.runner_fails.clear()  # a new life: the scanner's lasting failures are gone
        self.runner_tries.clear()
        grace = GracePeriod(25.0, clock=self.clock)
        proc.grace = grace
        deadline = (
            datetime(2100, 1, 1, tzinfo=UTC)
            if self.deadline_ms is None
            else datetime.fromtimestamp(EPOCH_S + self.deadline_ms / 1000, UTC)
        )
        manifest = Manifest(RUN_ID, CORRELATION_ID, TOKEN, deadline, "e0.sim:1")
        opened: list[GrpcEngineChannel] = []

        def runner_channel(config: GrpcChannelConfig) -> GrpcEngineChannel:
            ch = self.channel(proc)
            opened.append(ch)
            return ch

        scan = SimScan(self, proc)
        try:
            code = await run_harness_async(
                scan,
                manifest,
                concurrency=self.runner_concurrency,
                retries=1,
                retry_backoff_s=0.05,
                on_scan_error="exit",
                first_answer_s=120.0,
                deadline_margin_s=5.0,
                drain_timeout_s=30.0,
                grace_s=25.0,
                progress_every_s=0,
                _seams=Seams(open_channel=runner_channel, clock=self.clock, grace=grace),
            )
        except asyncio.CancelledError:
            if not proc.alive or proc.cancel_at is None or proc.ending:
                raise
            # Its supervisor cancelled it: the runner closed the channel on the way out.
            self.exit(proc, "cancelled")
            return
        if proc.alive:
            if scan.changed and code == ExitCode.USAGE:
                # Refused (scanning it was judged in the scan): the operator gives
                # it the right list again. (A tombstone, a full disk: as ever.)
                self.stats["runner_lists_refused"] += 1
                self.exit(proc, "usage")
                return
            self.runner_exit(proc, ExitCode(code), opened[0] if opened else None)

    def runner_exit(self, proc: Proc, code: ExitCode, ch: GrpcEngineChannel | None) -> None:
        """Judge the runner's exit code against the world's truth, then exit as it says."""
        self.stats["runner_exits"] += 1
        self.tr("the runner exits %d (%s)", code, code.name)
        status = {ExitCode.DONE: "completed", ExitCode.STOPPED: "stopped"}
        status[ExitCode.DEADLINE] = "deadline"
        if code in status:
            if not self.completed:
                self.violation(f"the runner exited {code.name}, but the engine lacks Done")
            elif self.done_body[0] != status[code] and not (
                code == ExitCode.DONE and ch is None  # a tombstone: it says how it ended
            ):
                self.violation(
                    f"the runner exited {code.name}, but the engine applied Done {self.done_body}"
                )
            whole = ("completed", self.nf - len(self.refused_at_send))
            if code == ExitCode.DONE and self.done_body != whole:
                self.violation(f"the runner exited DONE, but the engine applied {self.done_body}")
            if code == ExitCode.STOPPED:
                if not self.stop_issued:
                    self.violation("the runner exited STOPPED, but the engine issued no Stop")
                self.stats["runner_stopped"] += 1
            if code != ExitCode.DONE:
                self.runner_ended = status[code]
            self.exit(proc, "completed")
            return
        if code == ExitCode.COMPLETED_ELSEWHERE:
            self.exit(proc, "refused")
            return
        if code in (ExitCode.SIGTERM, ExitCode.ROWS_LEFT):
            if not proc.grace.stopping:
                self.violation(f"the runner exited {code.name}, but no SIGTERM came")
            self.exit(proc, "sigterm")
            return
        if code == ExitCode.SCAN_EXIT:
            if max(self.runner_tries.values(), default=0) < 2:  # (retries=1: two tries)
                self.violation("the runner exited SCAN_EXIT, but no item failed every try")
            self.exit(proc, "scan exit")
            return
        if code == ExitCode.DONE_NOT_ACKED:
            self.exit(proc, "gave up")
            return
        if code in (ExitCode.NO_ENGINE, ExitCode.REFUSED):
            # The operator starts the job again once the engine (or the run's
            # registration) is there.
            self.exit(proc, "no engine" if code == ExitCode.NO_ENGINE else "run refused")
            return
        failure = None if ch is None else driver_of(ch).failure
        if code == ExitCode.FENCED:
            why = "fenced"
            self.stats["fenced_errors"] += 1
        elif code == ExitCode.EXPIRED:
            why = "expired"
        elif code == ExitCode.RUN_FAILED and isinstance(failure, EngineBehindError):
            why = "engine behind"
        elif code == ExitCode.LOG_BROKEN and proc.detached:
            why = "log removed"
            self.stats["removals_named"] += 1
        elif code == ExitCode.LOG_BROKEN and isinstance(failure, GroupCommitError):
            why = "group lost"
        elif code == ExitCode.LOG_WRITE_FAILED:
            if not self.disk.full and self.disk_full_until < self.now - 1_000.0:
                self.violation("the runner exited LOG_WRITE_FAILED, but the disk had room")
            why = "cannot write"  # started again later, when the disk has room
        else:
            self.violation(f"the runner exited {code.name} ({failure!r})")
            why = "error"
        self.exit(proc, why)

    def fault_sigterm(self) -> None:
        """The platform stops the runner's process: SIGTERM, its grace period."""
        proc = self.proc
        if proc is None or not proc.alive or proc.role != "harness" or proc.grace is None:
            return
        self.stats["runner_sigterms"] += 1
        self.tr("SIGTERM to the runner")
        proc.grace.request_stop()

    async def scan(self, proc: Proc, ch: GrpcEngineChannel, life: Life) -> None:
        """The harness's scan, from its resume point; it exits through close()."""
        rng = self.rng
        r2 = self.rng2
        nf = self.nf
        early = rng.random() < 0.3 and ch.log.done_seq is None
        if early:
            # Sends before handshake() are logged and delivered once connected
            # (SPEC "Buffer first"): an announcement, and maybe a stretch of the scan.
            try:
                life.first = self.send_event(proc, ch)
                if life.nxt < nf and rng.random() < 0.5:
                    items = list(range(life.nxt, min(nf, life.nxt + rng.randint(1, 12))))
                    life.nxt = await self.send_findings(proc, ch, items)
            except (WalWriteError, BacklogFullError):
                pass
            except ENDINGS as exc:
                await self.failed(proc, ch, exc)
                return
            except INTERRUPTS as exc:
                if not await self.interrupted(proc, ch, life, exc):
                    return
            await self.wait_acked(proc, ch, None, 0.0)  # nothing is sent before handshake()
        while True:
            try:
                await self.api(proc, ch, "handshake", lambda: ch.handshake(*HARNESS))
            except RunRefusedError:
                self.check_run_refused(ch)  # the channel keeps dialing; carry on
            except (EngineUnavailableError, Cancelled):
                pass  # the channel keeps dialing; carry on (README)
            except WalWriteError:
                await self.close(proc, ch, "error")
                return
            except ENDINGS as exc:
                await self.failed(proc, ch, exc)
                return
            except INTERRUPTS as exc:
                if await self.interrupted(proc, ch, life, exc):
                    continue  # its own commit was interrupted: the handshake again
                return
            break
        if life.first is not None and self.seq_waits:
            # The first seq it was handed, provisional until the answer: the
            # wait follows the row wherever the verification rule moved it.
            await self.wait_acked(proc, ch, life.first, r2.choice((0.0, 300.0, 3_000.0)))
        if ch.log.done_seq is None and not early:
            # A real harness announces itself: the seq -> content map differs per life.
            try:
                self.send_event(proc, ch)
            except (WalWriteError, BacklogFullError):
                pass
            except ENDINGS as exc:
                await self.failed(proc, ch, exc)
                return
            except INTERRUPTS as exc:
                if not await self.interrupted(proc, ch, life, exc):
                    return
        asked = False
        while proc.alive:
            pause = rng.random() * self.think
            if rng.random() < 0.05:
                pause += 200.0 + rng.random() * (LONG_PAUSE_MS - 200.0)
            if life.nxt == self.slow_file and self.chaos:
                self.slow_file = None
                pause += SLOW_FILE_MS
            await asyncio.sleep(pause / 1000)
            if rng.random() < 0.03:
                ch.replay_unacked()
            if rng.random() < 0.05:
                self.check_stats(proc, ch)
            if self.seq_waits and proc.handed and r2.random() < 0.08:
                seq = r2.choice(list(proc.handed))
                await self.wait_acked(proc, ch, seq, r2.choice((0.0, 200.0, 2_000.0)))
            nxt = life.nxt
            try:
                if nxt < nf:
                    if nxt == self.approval_at and not asked:
                        if not await self.approval(proc, ch, nxt):
                            continue
                        asked = True
                    if rng.random() < 0.15:
                        # A progress event between findings (no marker: it changes no position).
                        self.send_event(proc, ch)
                        continue
                    if rng.random() < 0.05:
                        # A stretch of the scan with nothing to report: the marker alone.
                        self.sent(
                            proc,
                            ch,
                            (),
                            {"n": nxt},
                            partial(ch.send_findings, [], progress={"n": nxt}),
                        )
                    items = list(range(nxt, min(nf, nxt + rng.randint(1, 3))))
                    life.nxt = await self.send_findings(proc, ch, items)
                    continue
                coverage = ["x" * (3 * (self.limit or 0))] if self.done_big else ["/scan"]
                t0 = self.now
                acked = await self.api(
                    proc, ch, "send_done", partial(ch.send_done, "completed", nf, coverage, "")
                )
                self.check_send_done(proc, acked, t0)
            except WalWriteError:
                await asyncio.sleep((50.0 + rng.random() * 500.0) / 1000)
                continue
            except BacklogFullError:
                self.stats["backlog_full"] += 1
                await self.wait_acked(proc, ch, None, 1_000.0)
                continue
            except Cancelled:
                acked = False  # send_done cancelled: as if no ack came in time
            except (
                RunCompletedError,
                EngineBehindError,
                GroupCommitError,
                ChannelClosedError,
                RunExpiredError,
                RowRefusedError,
                PayloadError,
                WriterFencedError,
                WalRemovedError,
            ) as exc:
                await self.failed(proc, ch, exc)
                return
            except INTERRUPTS as exc:
                if not await self.interrupted(proc, ch, life, exc):
                    return
                continue
            if acked:
                await self.close(proc, ch, "completed")
            elif (
                self.deadline_ms is not None
                and self.clock.wall_s() >= EPOCH_S + self.deadline_ms / 1000
            ):
                await self.close(proc, ch, "expired")
            else:
                await self.close(proc, ch, "gave up")
            return

    def check_run_refused(self, ch: GrpcEngineChannel) -> None:
        """``RunRefusedError`` only for a log that never had an answer, every dial refused."""
        self.stats["runs_refused"] += 1
        if ch.log.meta().answered_at is not None:
            self.violation("RunRefusedError for a log that had an answer: it is only unavailable")
        inst = self.insts[-1]
        window = CONNECT_TIMEOUT_MS + REDIAL_BOUND_MS
        if inst.reject_until < self.now - window:
            self.violation(
                "RunRefusedError, but the engine stopped refusing the run "
                f"{self.now - inst.reject_until:.0f} ms ago: a dial within the timeout was answered"
            )

    async def interrupted(
        self, proc: Proc, ch: GrpcEngineChannel, life: Life, exc: BaseException
    ) -> bool:
        """The harness caught a signal's ``exc`` from a call: True to go on, else it exited.

        It goes on from what ``progress()`` says was committed; or, on Ctrl-C,
        closes the channel and exits; or lets the exception end its process.
        """
        self.check_interrupted(proc, ch, exc)
        if not proc.alive:
            return False
        r = self.rng2.random()
        if isinstance(exc, KeyboardInterrupt):
            if r < 0.4:
                await self.close(proc, ch, "interrupted")
                return False
            if r < 0.7:
                raise exc
        elif r < 0.15:
            raise exc
        marker = ch.progress()
        life.nxt = 0 if marker is None else int(marker["n"])
        self.tr("the harness goes on from %s", marker)
        return True

    def check_send_done(self, proc: Proc, acked: bool, t0: float) -> None:
        """``send_done`` is True once, and as soon as, its ack and the tombstone are stored."""
        if not proc.alive:
            return
        done_at = self.tombstone_at
        wid = proc.channel.log.writer.id if proc.channel is not None else None
        if acked and not self.completed:
            self.violation("send_done returned True, but the engine never applied Done")
        elif acked and self.completed_by != wid:
            self.violation(
                f"send_done returned True, but the engine applied the Done of writer "
                f"{self.completed_by}, not this one's ({wid})"
            )
        elif acked and self.done_body != ("completed", self.nf):
            self.violation(
                f"send_done returned True, but the engine applied Done {self.done_body}, "
                f"not the one sent ({('completed', self.nf)})"
            )
        if acked and done_at is not None and self.now - max(t0, done_at) > 1_000.0:
            self.violation(
                f"send_done returned {self.now - max(t0, done_at):.0f} ms after the tombstone "
                "was stored: its waiter was not woken"
            )
        elif not acked and done_at is not None:
            self.violation("send_done returned False, yet the log is a tombstone")
        elif not acked and proc.done_acked_at is not None:
            stored_in_time = self.now - proc.done_acked_at > 1.0
            if stored_in_time and not self.disk.full and self.disk_full_until < proc.done_acked_at:
                self.violation(
                    "send_done returned False, though an ack covering Done reached the "
                    f"channel {self.now - proc.done_acked_at:.0f} ms before and the disk had room"
                )

    def send_beside(self, proc: Proc) -> None:
        """A task of the harness beside its scan logs an event (its errors are its own)."""
        ch = proc.channel
        if ch is None or self.proc is not proc or not proc.alive or proc.closing is not None:
            return
        with contextlib.suppress(WalchannelError):
            self.send_event(proc, ch)

    def send_event(self, proc: Proc, ch: GrpcEngineChannel) -> int:
        """Log an event with a content of its own; return its seq."""
        c = self.new_event()
        seqs = self.sent(proc, ch, (c,), None, lambda: [ch.send_event("sim", "info", {"c": c})])
        return seqs[0]

    async def send_findings(self, proc: Proc, ch: GrpcEngineChannel, items: list[int]) -> int:
        """Send findings ``items`` with the marker after them; return the next index.

        A finding over ``max_message_bytes`` is refused at send time (nothing
        logged): the harness reports it elsewhere and goes on without it.
        """
        marker = {"n": items[-1] + 1}
        # The batch's own events, committed with it (before its findings), as the
        # runner commits an item's events with its findings.
        events = [self.new_event() for _ in range(self.rng_events.choice((0, 0, 0, 1, 2)))]
        self.stats["batch_events"] += len(events)
        try:
            single = len(items) == 1 and self.rng.random() < 0.5  # (the draws as before)
            if single and not events:
                i = items[0]
                self.sent(
                    proc,
                    ch,
                    (i,),
                    marker,
                    lambda: [ch.send_finding(self.finding(i), progress=marker)],
                )
            else:
                self.sent(
                    proc,
                    ch,
                    (*events, *items),
                    marker,
                    lambda: ch.send_findings(
                        [self.finding(i) for i in items],
                        events=[("sim", "info", {"c": c}) for c in events],
                        progress=marker,
                    ),
                )
        except PayloadError as exc:
            # send_finding names "finding"; a batch names "findings[i]" (PayloadError.index).
            refused_path = exc.path == "finding" or exc.path.startswith("findings[")
            if not refused_path or not self.big.intersection(items):
                raise
            self.refused_at_send.update(self.big.intersection(items))
            kept = [i for i in items if i not in self.big]
            self.sent(
                proc,
                ch,
                (*events, *kept),
                marker,
                lambda: ch.send_findings(
                    [self.finding(i) for i in kept],
                    events=[("sim", "info", {"c": c}) for c in events],
                    progress=marker,
                ),
            )
        return items[-1] + 1

    def newest(self, proc: Proc) -> int | None:
        """The content of the newest row handed out (what ``wait_acked()`` waits for):
        the log's newest, or, under group commit, the newest of its pending group."""
        if proc.uncommitted:
            return proc.uncommitted[max(proc.uncommitted)]
        if proc.detached:
            return None
        rows = self.disk.states[-1].rows
        if not rows:
            return None
        c = rows[max(rows)]
        return None if c == ROW_LOST else c

    async def wait_acked(
        self, proc: Proc, ch: GrpcEngineChannel, seq: int | None, timeout_ms: float | None
    ) -> bool:
        """``wait_acked(seq)``, its answer checked as it is given (False when cancelled)."""
        if seq is not None:
            self.stats["seq_waits"] += 1
        t0 = self.now
        c = proc.handed.get(seq) if seq is not None else self.newest(proc)
        try:
            ok = await self.api(
                proc, ch, "wait_acked", lambda: ch.wait_acked(seq, timeout_ms=timeout_ms)
            )
        except Cancelled:
            return False
        self.check_waited(proc, ch, seq, c, timeout_ms, t0, ok)
        return ok

    def check_waited(
        self,
        proc: Proc,
        ch: GrpcEngineChannel,
        seq: int | None,
        c: int | None,
        timeout_ms: float | None,
        t0: float,
        ok: bool,
    ) -> None:
        """``wait_acked``: True when the engine holds the row; False early only once final."""
        if not proc.alive or proc.detached:
            return
        what = f"wait_acked({'' if seq is None else seq})"
        pos = None if c is None else self.pos_of.get(c)
        if ok and c is not None and pos is None and c in proc.uncommitted.values():
            self.violation(f"{what} returned True, but the row of {_name(c)} is not committed")
        if ok and c is not None and pos is not None and not proc.lied_to:
            held = self.ever_at.get(pos, ())
            # A power loss under "process" rolled back a commit of it: the engine may
            # hold it under an earlier seq (SPEC "Durability": by content).
            moved = c in self.affected and c in self.applied
            if c not in held and not (ROW_LOST in held and c in self.refused) and not moved:
                self.violation(
                    f"{what} returned True, but the engine never applied {_name(c)} at seq {pos} "
                    "(where its row lives)"
                )
        final = ch.state.value in ("closed", "failed", "expired")
        if not ok and pos is not None and driver_of(ch).completed:
            self.violation(
                f"{what} returned False on a tombstone: the engine applied this run's Done, "
                f"and so {_name(c)} at seq {pos}"
            )
        if not ok and not final and (timeout_ms is None or self.now - t0 < timeout_ms - 1.0):
            self.violation(
                f"{what} returned False after {self.now - t0:.0f} ms of its {timeout_ms} ms, "
                f"while the channel is {ch.state.value}"
            )
        # Under group commit the newest row may be a marker's progress row still in
        # the pending group, which no send returned: the checker cannot see it.
        hidden = seq is None and self.keeps_resume and ch.config.group_commit is not None
        if pos is not None and (ok or not final) and not hidden and c == DONE:
            # The Done counts as acked once its tombstone is stored, not at its ack
            # (SPEC "Shutdown order"): an ack the disk refused wakes no one.
            done_at = self.tombstone_at
            if done_at is not None and self.now - max(t0, done_at) > WAKE_SLACK_MS:
                self.violation(
                    f"{what} returned {ok} {self.now - max(t0, done_at):.0f} ms after the "
                    "tombstone was stored: its waiter was not woken"
                )
        elif pos is not None and (ok or not final) and not hidden:
            i = bisect.bisect_left(proc.ack_t, t0)
            for t, v in zip(proc.ack_t[i:], proc.ack_v[i:], strict=True):
                if v >= pos:
                    if self.now - t > WAKE_SLACK_MS:
                        self.violation(
                            f"{what} returned {ok} {self.now - t:.0f} ms after an ack covering "
                            f"its row (seq {pos}) reached the channel: its waiter was not woken"
                        )
                    break

    async def approval(self, proc: Proc, ch: GrpcEngineChannel, index: int) -> bool:
        """Ask the engine before finding ``index``; True once decided (or given up on)."""
        self.stats["approvals"] += 1
        self.next_approval += 1
        rid = f"ap-{index}" if self.stable_approval_id else None
        if rid is not None:
            self.approval_rids[self.next_approval] = rid
        details: dict[str, Any] = {"c": self.next_approval}
        if self.limit is not None and self.rng.random() < 0.2:
            details["pad"] = "x" * (2 * self.limit)  # refused by the engine, set aside
            self.big_contents.add(self.next_approval)
            proc.padded = True
        timeout_ms = None if self.rng.random() < 0.3 else APPROVAL_TIMEOUT_MS
        try:
            decision = await self.api(
                proc,
                ch,
                "request_approval",
                lambda: ch.request_approval(
                    "deep-scan", details, request_id=rid, timeout_ms=timeout_ms
                ),
            )
        except ApprovalTimeoutError:
            self.stats["approval_timeouts"] += 1
            seen = None if rid is None else proc.decisions_seen.get(rid)
            if seen is not None and proc.alive and self.now - seen > WAKE_SLACK_MS:
                # Liveness: a wait that only its timeout ended, though its answer came.
                self.violation(
                    f"request_approval({rid}) timed out, though the engine's decision reached "
                    f"the channel {self.now - seen:.0f} ms before"
                )
            return not self.stable_approval_id  # a stable id is asked again
        except Cancelled:
            return not self.stable_approval_id  # as a timeout
        except RowRefusedError as exc:
            # A request still waiting (asked again with its id) is the first one.
            if exc.kind == "approval_request" and proc.padded:
                self.check_refused(proc, exc)
                return True  # set aside: never decided; the harness goes on without it
            await self.failed(proc, ch, exc)
            return False
        except PayloadError as exc:
            if exc.path == "approval_request" and proc.padded:
                return True  # over max_message_bytes: refused before it was logged
            await self.failed(proc, ch, exc)
            return False
        except ENDINGS as exc:
            await self.failed(proc, ch, exc)
            return False
        if not proc.alive:
            return False
        expected = self.decided.get(decision.request_id)
        if expected is not None and self.bad_text:
            # The cut character at the reason's end reads as one replacement character.
            expected = (expected[0], expected[1] + "\ufffd")
        if expected != (decision.approved, decision.reason):
            self.violation(
                f"approval {decision.request_id}: the channel says {decision}, "
                f"the engine decided {expected}"
            )
        return True

    async def flush(self, proc: Proc) -> None:
        """``walchannel flush``: the stored handshake, then wait until all is acked."""
        ch = await self.open_channel(proc)
        if ch is None or not proc.alive:
            return
        if self.p_cancel:
            # Its close may be cancelled too: closed explicitly, through api().
            why = await self.deliver(proc, ch)
            await self.close(proc, ch, why)
            return
        async with ch:  # closed however the delivery ends
            why = await self.deliver(proc, ch)
            self.check_stats(proc, ch)
            proc.closing = why
            t0 = self.now
        self.check_closed(proc, ch, t0)
        if proc.alive:
            self.sync()  # closing the last connection checkpoints the WAL
        self.stats["protocol_errors"] += ch.stats().protocol_errors
        self.exit(proc, why)

    async def deliver(self, proc: Proc, ch: GrpcEngineChannel) -> str:
        """Deliver what the log holds (``walchannel flush``'s loop); return why it ends."""
        t0 = self.now
        meta = ch.log.meta()
        if meta.harness_name is None:
            self.tr("flush refuses: no stored handshake")
            return "flush refused"
        self.tr(
            "flush starts (acked=%d, next_seq=%d, unverified=%s)",
            ch.log.last_acked_seq,
            ch.log.next_seq,
            ch.log.unverified_from,
        )
        try:
            await self.api(
                proc,
                ch,
                "handshake",
                lambda: ch.handshake(
                    meta.connector_version or "",
                    meta.harness_name or "",
                    meta.harness_version or "",
                ),
            )
        except (EngineUnavailableError, Cancelled):
            pass
        except WalWriteError:
            return "error"
        except ENDINGS as exc:
            return self.ended_by(proc, ch, exc)
        while proc.alive:
            remaining = FLUSH_TIMEOUT_MS - (self.now - t0)
            if remaining < 1.0:  # (a float's remainder is no time to wait)
                break
            if await self.wait_acked(proc, ch, None, min(remaining, 500.0)):
                return "flushed"
            if ch.stats().state.value in ("failed", "expired", "closed"):
                break
        failure = driver_of(ch).failure
        if failure is not None:
            return self.ended_by(proc, ch, failure)
        return "flush timed out"

    # -- the end ----------------------------------------------------------------------------------

    def final_checks(self) -> None:
        self.stats["events_logged"] = len(self.events_logged)
        if self.behind or self.expired:
            # The engine lost rows the log had deleted, or the token expired:
            # nothing more can be delivered; what it applied was checked online.
            return
        d = self.disk
        if (
            self.completed
            and d.exists
            and not d.states[-1].completed
            and DONE in d.states[-1].rows.values()
            and not self.complete_failed
            and not self.fenced_stop  # another writer's Done: its harness got the named error
        ):
            self.violation("the engine applied Done, but the log holding it is no tombstone")
        applied = self.applied
        # The engine lost them after acking them, and the log no longer holds them.
        held = set(d.states[-1].rows.values()) if d.exists else set()
        behind = self.lost_by_engine - held
        counts = [0] * self.nf
        others: dict[int, int] = {}
        # The runner ended the run early (Stop, the deadline): its exit code says
        # so, or, when it was killed after, the Done the engine applied does.
        ended_early = self.runner_ended is not None or (
            self.runner and self.done_body is not None and self.done_body[0] != "completed"
        )
        if self.runner and self.done_body is not None:
            status = self.done_body[0]
            if (status == "stopped" and not self.stop_issued) or (
                status == "deadline" and self.deadline_ms is None
            ):
                self.violation(
                    f"the engine applied Done {self.done_body}, which the world never asked for"
                )
        # A lost log taken over under the runner, from an engine that keeps the resume
        # point, costs nothing twice (SPEC "The engine keeps the resume point"); a
        # log with progress of its own (the second harness's takeover) costs as before.
        sec = self.second
        # (Not when an older engine had the run for a while: the markers logged then
        # never reached a point, and such a takeover costs what it costs without one.)
        # Nor when the second harness (not the runner) logged rows of the run: its point
        # is not the runner's, which then scans from the first item (SPEC "The runner").
        exact = self.exact_takeover and (sec is None or (not sec.took_over and not sec.logged))
        if exact and self.taken_over:
            self.stats["exact_takeovers"] += 1
        dones = 0
        for c in applied:
            if c == DONE:
                dones += 1
            elif c >= EVENT_BASE:
                others[c] = others.get(c, 0) + 1
            elif c >= 0:
                counts[c] += 1
        for e in self.events_logged:
            n = others.get(e, 0)
            if e in self.big_contents:
                if n > 1 and e not in self.affected:
                    self.violation(f"{_name(e)} (over the limit) applied {n} times")
            elif e in self.affected or e in self.post_completion:
                if n > 1:
                    self.stats["dup_by_content"] += n - 1
            elif self.taken_over and n > 1 and not exact:
                self.stats["takeover_dups"] += n - 1  # the takeover's cost (SPEC)
            elif n == 0 and (
                self.fenced_stop
                or e in self.lost_contents
                or e in behind
                or (self.refused_stop and e in held)
            ):
                pass  # its harness got the named error; it went with a lost log; or the
                # engine lost it after the log deleted it (a takeover kept "behind" unsaid)
            elif n != 1:
                self.violation(f"{_name(e)} applied {n} times")
        quarantined = set(d.states[-1].quarantined) if d.exists else set()
        for i, n in enumerate(counts):
            if i in self.refused_at_send and not self.logged[i]:
                if n:
                    self.violation(f"{_name(i)} was refused at send time, yet applied")
            elif i in self.big:
                # Over the engine's limit: set aside (kept in the quarantine),
                # or delivered once the operator raised the limit.
                if n > 1 and i not in self.affected:
                    self.violation(f"{_name(i)} (over the limit) applied {n} times")
                if (
                    n == 0
                    and self.logged[i]
                    and i not in quarantined
                    and i not in self.affected
                    and i not in self.lost_contents
                    and not self.fenced_stop
                    # Still in the log of a harness told "run completed" (another
                    # writer's Done, or a restored copy's): the named error, as
                    # for any row held so (seed 728438).
                    and not (self.refused_stop and i in held)
                ):
                    self.violation(f"{_name(i)} was refused, yet it is not in the quarantine")
            elif n == 0:
                named = self.fenced_stop or (self.refused_stop and i in held)
                # The runner ended the run early (Stop, the deadline): what it never
                # logged is not owed; what it logged is.
                early = ended_early and (
                    not self.logged[i]
                    or i in self.affected  # a rolled-back commit's
                    or i in self.lost_contents  # a lost log's
                )
                if not named and not early and i not in behind:
                    self.violation(f"{_name(i)} never applied by the engine")
            elif n > 1:
                if i in self.affected:
                    self.stats["dup_by_content"] += n - 1
                elif self.taken_over and not exact:
                    self.stats["takeover_dups"] += n - 1
                elif self.taken_over:
                    self.violation(
                        f"{_name(i)} applied {n} times after a takeover, though the engine"
                        " keeps the resume point"
                    )
                else:
                    self.violation(f"{_name(i)} applied {n} times (no rolled-back commit of it)")
        sec = self.second
        if sec is not None and not sec.named:
            for i in sorted(sec.logged):
                if counts[i] == 0:
                    self.violation(
                        f"{_name(i)}, logged by the second harness, never applied, and that "
                        "harness got no named error"
                    )
        if dones == 0 and self.fenced_stop:
            pass  # the run stays unfinished: its harness got the named error
        elif dones != 1:
            self.violation(f"Done applied {dones} times")
        elif applied[-1] != DONE:
            self.violation("Done is not the last message applied")
        # The second harness completed the run: the first one's scan may stop anywhere.
        second_done = sec is not None and self.completed_by in sec.writers
        for i, n in enumerate(self.logged):
            if n == 0 and i not in self.refused_at_send:
                if not self.fenced_stop and not second_done and not ended_early:
                    self.violation(f"the harness never logged {_name(i)}")
            elif n > 1 and i not in self.affected and i not in self.lost_contents:
                self.violation(f"the harness logged {_name(i)} {n} times")
        if d.exists and not d.states[-1].completed:
            self.stats["done_ack_lost"] += 1

    def report(self) -> str:
        lines = [f"seed {self.seed}: {len(self.violations)} violation(s)"]
        lines += [f"  - {v}" for v in self.violations[:5]]
        lines.append(
            f"  profile: findings={self.nf} durability={self.durability} "
            f"acks_handshake={self.acks_hs} discovery={self.discovery} ack_every={self.ack_every} "
            f"limit={self.limit} big={sorted(self.big)} done_big={self.done_big}"
        )
        lines.append("  last events:")
        for t, fmt, args in self.trace:
            lines.append(f"    {t:12.3f}  {fmt % args}")
        return "\n".join(lines)


# -- sweeps ----------------------------------------------------------------------------------------


def run_schedule(
    seed: int,
    durability: str = "both",
    *,
    verbose: bool = False,
    rollback_without_answer: bool = False,
    group: str = "share",
) -> World:
    """Run one schedule; the returned world holds ``violations``, ``stats`` and ``events``.

    Args:
        seed: the schedule; the same seed plays the same schedule.
        durability: ``"process"``, ``"power"`` or ``"both"`` (by the seed's parity).
        verbose: print every traced event as it happens, and the product's log lines.
        rollback_without_answer: also play rollbacks when the engine does not
            answer handshakes (outside the guarantee: shows the degradation).
        group: group commit in ``"share"`` of the schedules (:data:`P_GROUP_COMMIT`,
            drawn from the seed), ``"on"`` in every one, or ``"off"``.
    """
    return World(
        seed,
        durability,
        verbose=verbose,
        rollback_without_answer=rollback_without_answer,
        group=group,
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
        self.failing_seeds: list[int] = []  # all of them: a report is kept for the first 20

    def add(self, w: World) -> None:
        self.schedules += 1
        self.events += w.events
        for k, v in w.stats.items():
            self.stats[k] = self.stats.get(k, 0) + v
        self.max_dials_per_s = max(self.max_dials_per_s, w.max_dials_per_s)
        if w.violations:
            self.failing += 1
            self.failing_seeds.append(w.seed)
            if len(self.violations) < 20:
                self.violations.append((w.seed, w.report()))

    def merge(self, other: Totals) -> None:
        self.schedules += other.schedules
        self.events += other.events
        for k, v in other.stats.items():
            self.stats[k] = self.stats.get(k, 0) + v
        self.max_dials_per_s = max(self.max_dials_per_s, other.max_dials_per_s)
        self.failing += other.failing
        self.failing_seeds.extend(other.failing_seeds)
        self.violations.extend(other.violations[: max(0, 20 - len(self.violations))])


def sweep(
    seeds: Iterable[int],
    durability: str = "both",
    *,
    rollback_without_answer: bool = False,
    stop_at_first: bool = False,
    group: str = "share",
) -> Totals:
    """Run many schedules in this process (see :func:`run_schedule`)."""
    totals = Totals()
    with _quiet_product():
        for seed in seeds:
            w = run_schedule(
                seed, durability, rollback_without_answer=rollback_without_answer, group=group
            )
            totals.add(w)
            if stop_at_first and w.violations:
                break
    return totals


@contextlib.contextmanager
def _quiet_product() -> Iterator[None]:
    # The product logs every reconnect and refusal: in a sweep of thousands of
    # schedules that is noise (and time); a replay shows them. The level is
    # given back: a test that sweeps in-process shares the logger with others.
    # A process ended by a signal's exception leaves tasks whose errors nobody
    # reads: asyncio's logger is quiet too.
    loggers = [logging.getLogger(name) for name in ("walchannel", "asyncio")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


class _TraceHandler(logging.Handler):
    """A replay prints the product's own log lines among the world's events."""

    def __init__(self, w: World) -> None:
        super().__init__(logging.DEBUG)
        self.w = w

    def emit(self, record: logging.LogRecord) -> None:
        self.w.tr("  [%s %s] %s", record.levelname, record.name, record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            # An unexpected exception: where it was raised, to read the replay by.
            tb = traceback.extract_tb(record.exc_info[1].__traceback__)[-3:]
            for frame in tb:
                self.w.tr("      at %s:%s %s", frame.filename, frame.lineno, frame.name)


def _chunk(args: tuple[int, int, str, bool, str]) -> Totals:
    start, count, durability, unsafe, group = args
    return sweep(
        range(start, start + count), durability, rollback_without_answer=unsafe, group=group
    )


def replay(
    seed: int, durability: str, *, rollback_without_answer: bool = False, group: str = "share"
) -> World:
    """Play one schedule verbosely: every world event and every product log line."""
    w = World(
        seed,
        durability,
        verbose=True,
        rollback_without_answer=rollback_without_answer,
        group=group,
    )
    handler = _TraceHandler(w)
    product = logging.getLogger("walchannel")
    product.addHandler(handler)
    product.setLevel(logging.INFO)
    product.propagate = False
    try:
        return w.run()
    finally:
        product.removeHandler(handler)
        product.propagate = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/sim.py",
        description="Deterministic simulation of walchannel: the real channel, a simulated world.",
        epilog="example: python tools/sim.py --seeds 100000 --jobs 2; "
        "python tools/sim.py --replay 4711",
    )
    parser.add_argument("--seeds", type=int, default=10_000, help="schedules to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--replay", type=int, default=None, help="re-run one seed verbosely")
    parser.add_argument(
        "--seed-list",
        default=None,
        help="run exactly these seeds (comma-separated, or @FILE with one per line)",
    )
    parser.add_argument(
        "--durability", choices=("process", "power", "both"), default="both", help="log durability"
    )
    parser.add_argument(
        "--group-commit",
        choices=("share", "on", "off"),
        default="share",
        # (argparse formats help with %: a literal one is %%)
        help=f"group commit in its share of schedules ({P_GROUP_COMMIT * 100:.0f}%%), in all, "
        "or in none",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    parser.add_argument(
        "--stop-at-first", action="store_true", help="stop at the first failing schedule"
    )
    parser.add_argument(
        "--rollback-without-answer",
        action="store_true",
        help="also roll logs back when the engine does not answer handshakes "
        "(outside the guarantee: shows what engine_acks_handshake=False costs)",
    )
    args = parser.parse_args(argv)
    unsafe = bool(args.rollback_without_answer)

    if args.replay is not None:
        w = replay(
            args.replay, args.durability, rollback_without_answer=unsafe, group=args.group_commit
        )
        print(w.report() if w.violations else f"seed {args.replay}: no violation")
        print(f"events={w.events} " + " ".join(f"{k}={v}" for k, v in w.stats.items() if v))
        return 1 if w.violations else 0

    t0 = time.monotonic()
    totals = Totals()
    if args.seed_list is not None:
        text = args.seed_list
        if text.startswith("@"):
            with open(text[1:]) as file:
                text = ",".join(line.strip() for line in file if line.strip())
        seeds = [int(x) for x in text.split(",") if x]
        totals = sweep(
            seeds, args.durability, rollback_without_answer=unsafe, group=args.group_commit
        )
    elif args.stop_at_first:
        totals = sweep(
            range(args.start, args.start + args.seeds),
            args.durability,
            rollback_without_answer=unsafe,
            stop_at_first=True,
            group=args.group_commit,
        )
    else:
        chunk = 500
        tasks = [
            (s, min(chunk, args.start + args.seeds - s), args.durability, unsafe, args.group_commit)
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
        f"jobs={args.jobs}, durability={args.durability}, "
        + (
            "the listed seeds"
            if args.seed_list is not None
            else f"seeds {args.start}..{args.start + args.seeds - 1}"
        )
    )
    for seed, text in totals.violations[:5]:
        print(text)
        print(
            f"  replay: python tools/sim.py --replay {seed} --durability {args.durability} "
            f"--group-commit {args.group_commit}"
        )
    if totals.failing_seeds:
        seeds = ",".join(map(str, sorted(totals.failing_seeds)))
        print(f"failing seeds (run them: --seed-list {seeds})")
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
