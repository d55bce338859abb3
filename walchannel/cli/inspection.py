"""What ``walchannel inspect`` says about run logs: their states, as :class:`RunReport`.

:func:`inspect_log` looks at one log without disturbing it, through
:class:`~walchannel.log.reader.LogReader` (read-only: no write, no file
created, the owner lock never taken; see :mod:`walchannel.log.reader`), and
picks the first state that applies (SPEC "Operating tools"):
:data:`STATES`, most urgent first. :func:`list_logs` finds the logs a PATH
names.

This module imports neither grpc nor httpx.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from walchannel.clock import SYSTEM_CLOCK, Clock, age_s
from walchannel.core.engine_refusals import receive_limit_in
from walchannel.errors import WalCorruptError
from walchannel.formatting import escape_text, format_age
from walchannel.log import files
from walchannel.log.format import MetaDamagedError, Row, engine_resume
from walchannel.log.lock import LockOwner, probe_owner
from walchannel.log.reader import (
    LogReader,
    LogUnreadableError,
    QuarantinedRow,
    Snapshot,
    run_id_from_name,
)
from walchannel.log.state import (
    FAILED_CORRUPT,
    FAILED_DONE_REFUSED,
    FAILED_ENGINE_BEHIND,
    FAILED_FENCED,
    FAILED_INTERNAL,
    completed_by_another,
    next_seq_after,
)
from walchannel.wire.address import parse_host_port

__all__ = [
    "ALERT_STATES",
    "DEFAULT_STUCK_AFTER_S",
    "FLUSH_TOKEN_ENV",
    "JSON_KEYS",
    "PathError",
    "RunReport",
    "STATES",
    "ShownRow",
    "flush_command",
    "inspect_log",
    "list_logs",
]

#: Every state, most urgent first: a run gets the first that applies.
STATES: Final = (
    "corrupt",
    "unreadable",
    "failed",
    "orphaned",
    "stuck",
    "done-pending",
    "active",
    "idle",
    "completed",
)
#: States that make ``inspect`` exit 1.
ALERT_STATES: Final = frozenset({"corrupt", "unreadable", "failed", "orphaned", "stuck"})
# States whose DETAIL shows the last error.
_ERROR_STATES: Final = frozenset({"failed", "orphaned", "stuck", "done-pending"})
# How FAILED_UNDELIVERABLE begins, in this walchannel's text and in older logs'.
_RUN_COMPLETED_WITH: Final = "run completed with "
#: ``--stuck-after`` default (seconds).
DEFAULT_STUCK_AFTER_S: Final = 120.0
_MiB: Final = 1024 * 1024
#: The variable ``walchannel flush`` reads the run token from without
#: ``--token-env`` (when it is set), and that the NEXT STEP's command names.
FLUSH_TOKEN_ENV: Final = "WALCHANNEL_RUN_TOKEN"  # noqa: S105 - a variable's name, not a token
#: The keys of one ``inspect --json`` object, in order (SPEC "Operating tools").
JSON_KEYS: Final = (
    "run_id",
    "file",
    "state",
    "reason",
    "next_seq",
    "last_acked_seq",
    "unacked_count",
    "unacked_bytes",
    "oldest_unacked_age_s",
    "last_ack_at",
    "last_engine_addr",
    "last_error",
    "last_error_at",
    "locked_by",
    "quarantined",
    "file_bytes",
    "writer_id",
    "writer_epoch",
    "takeover",
    "group_commit",
    "resume_point",
    "next_step",
)


class PathError(Exception):
    """The PATH given to ``inspect``/``prune`` cannot be read (the CLI exits 2)."""


def list_logs(path: Path) -> list[Path]:
    """Return the logs to look at: ``path`` itself, or the logs directly in the folder.

    A folder is not searched recursively; only names ending in
    ``.wal.sqlite3`` count, and hidden names (the ``.<run_id>.~*``
    temporaries of a log being built, and anything else starting with a
    dot) are skipped. A file is returned as it is, whatever its name.

    Args:
        path: a log folder or one log file.

    Returns:
        The paths, sorted by name.

    Raises:
        PathError: ``path`` does not exist or cannot be listed (names it).
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        raise PathError(f"{path}: no such file or folder") from None
    except OSError as exc:
        raise PathError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        return [path]
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise PathError(f"{path}: cannot list the folder: {exc.strerror or exc}") from None
    return [
        path / name
        for name in names
        if name.endswith(files.LOG_SUFFIX) and not name.startswith(".")
    ]


@dataclass(frozen=True, slots=True)
class ShownRow:
    """One unacked row as ``inspect --show`` prints it.

    Attributes:
        seq: its seq.
        kind: the stored kind.
        age_s: how long ago it was committed (seconds; None when its
            ``appended_at`` is damaged, named in ``damage``).
        size: its msgpack body size (bytes).
        body: the decoded body (the ``row_lost`` substitute's when damaged).
        damage: why the row does not check out, or None.
    """

    seq: int
    kind: str
    age_s: float | None
    size: int
    body: dict[str, Any]
    damage: str | None
    # The body is good but this cell is damaged (the row is kept).
    column_damage: str | None = None


@dataclass(frozen=True, slots=True)
class RunReport:
    """What ``inspect`` says about one log. Times are unix seconds, sizes bytes.

    The attributes named in :data:`JSON_KEYS` are exactly the ``--json``
    keys (SPEC "Operating tools"); ``next_step`` says what to do (every
    state has one); ``locked_by`` is the live owner or None.
    ``shown`` holds the rows ``--show N`` decoded and ``shown_quarantined``
    the quarantined rows it lists (human output only). A damaged meta field
    is named in ``reason`` and listed in ``damaged_fields``; the JSON values
    read from it are null (never guessed).
    """

    run_id: str | None
    file: str
    state: str
    reason: str | None
    next_seq: int | None = None
    last_acked_seq: int | None = None
    unacked_count: int | None = None
    unacked_bytes: int | None = None
    oldest_unacked_age_s: float | None = None
    last_ack_at: float | None = None
    last_engine_addr: str | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    locked_by: LockOwner | None = None
    quarantined: int | None = None
    file_bytes: int = 0
    #: The log's writer identity (SPEC "The log"): its id (None in a log from
    #: before it, until its owner's next open), epoch, and whether it is
    #: marked to take the run over at its next handshake.
    writer_id: str | None = None
    writer_epoch: int | None = None
    takeover: bool | None = None
    #: The last owner's ``GroupCommit`` setting (SPEC "Group commit"):
    #: ``{"max_rows", "max_bytes", "max_delay_ms"}``, or None (off, or a log
    #: from before it).
    group_commit: dict[str, Any] | None = None
    #: The engine's resume point from its last answer (SPEC "The engine keeps
    #: the resume point"): ``{"marker", "seq", "applied", "takeover"}``, or
    #: None while the engine announced none (or a log from before it).
    resume_point: dict[str, Any] | None = None
    shown: tuple[ShownRow, ...] = field(default=())
    shown_quarantined: tuple[QuarantinedRow, ...] = field(default=())
    #: What the operator does next (SPEC "Operating tools"; a ``--json`` key).
    next_step: str = ""
    #: How long ago the last ack was stored (s; None: never), across
    #: wall-clock steps when the log's boot times allow (``last_ack_at`` is
    #: the JSON's).
    last_ack_age_s: float | None = None
    #: The discovery URL the harness's last handshake stored (not a JSON key:
    #: ``next_step``'s flush command names it).
    http_addr: str | None = None
    #: For a ``corrupt`` log: the rows ``walchannel export`` was seen to
    #: read from it (None: they cannot be read, so export is no next step).
    salvage: int | None = None
    #: The meta fields that are damaged (named in ``reason``).
    damaged_fields: tuple[str, ...] = ()

    @property
    def urgency(self) -> int:
        """The state's rank: 0 is the most urgent."""
        return STATES.index(self.state)

    @property
    def sort_key(self) -> tuple[int, float, str]:
        """Most urgent state first; within a state, the oldest backlog first."""
        return (self.urgency, -(self.oldest_unacked_age_s or 0.0), self.file)

    def last_ack_text(self) -> str:
        """The LAST ACK cell: ``"3m05s ago"``, ``"never"``, ``"-"`` when unread, or damaged."""
        if "last_ack_at" in self.damaged_fields:
            return "damaged: last_ack_at"
        if self.last_ack_age_s is not None:
            return f"{format_age(self.last_ack_age_s)} ago"
        meta_read = self.last_acked_seq is not None or bool(self.damaged_fields)
        return "-" if self.state in ("corrupt", "unreadable") and not meta_read else "never"

    def owner_text(self) -> str:
        """The OWNER cell: ``"pid 4242"``, ``"pid 4242@host"`` for another host, or ``"-"``."""
        owner = self.locked_by
        if owner is None:
            return "-"
        pid = "pid ?" if owner.pid is None else f"pid {owner.pid}"
        if owner.host and owner.host != socket.gethostname():
            return f"{pid}@{owner.host}"
        return pid

    @property
    def current_error(self) -> bool:
        """True when the last error came after the last ack: the channel is not past it."""
        if self.last_error is None:
            return False
        if self.last_ack_at is None or self.last_error_at is None:
            return True
        return self.last_error_at >= self.last_ack_at

    def detail(self, now: float) -> str:
        """The DETAIL cell: ``reason``, plus the last error where the state calls for it.

        The last error is added for a run that needs attention (an alert
        state, or ``done-pending``), and for an ``active`` run whose error
        came after its last ack (an outage shorter than ``--stuck-after``),
        with its age, and says so when rows were acked after it (an error
        the channel got past), so an old error is not read as the current one.

        Args:
            now: the time to measure from (unix seconds).
        """
        detail = self.reason or ""
        error = self.last_error
        shown = self.state in _ERROR_STATES or (self.state == "active" and self.current_error)
        # A fenced run's reason is whole: its last error says the same, longer.
        if not error or not shown or error in detail or detail.startswith(FAILED_FENCED):
            return detail
        when = ""
        if self.last_error_at is not None:
            when = f" {format_age(now - self.last_error_at)} ago"
            if self.last_ack_at is not None and self.last_ack_at > self.last_error_at:
                when += ", rows acked since"
        text = f"last error ({when.strip()}): {error}" if when else f"last error: {error}"
        return f"{detail}; {text}" if detail else text

    def to_json(self) -> dict[str, Any]:
        """Return the ``inspect --json`` object: exactly :data:`JSON_KEYS`."""
        out: dict[str, Any] = {}
        for key in JSON_KEYS:
            value = getattr(self, key)
            if key == "locked_by" and value is not None:
                value = {"pid": value.pid, "host": value.host}
            out[key] = value
        return out


def _unread(
    path: Path,
    run_id: str | None,
    exc: WalCorruptError | LogUnreadableError,
    owner: LockOwner | None,
) -> RunReport:
    """The report of a log that could not be read: ``corrupt`` for damage, else ``unreadable``."""
    return RunReport(
        run_id=run_id,
        file=str(path),
        state="corrupt" if isinstance(exc, WalCorruptError) else "unreadable",
        reason=exc.reason,
        locked_by=owner,
        file_bytes=files.disk_bytes(path),
    )


def flush_command(report: RunReport) -> str:
    """The ``walchannel flush`` command for ``report``'s log, to run as printed.

    It names where the token will go — the discovery URL the harness's last
    handshake stored (``--http-addr``), else the last engine it streamed to
    (``--grpc-addr``), else a placeholder to fill in; for plaintext
    discovery, ``--allowed-host`` with the last engine's host — and the
    variable it is read from (``--token-env`` :data:`FLUSH_TOKEN_ENV`); when the last
    error is a down message over the receive limit, ``--max-receive-message-bytes``
    with its size rounded up to whole MiB. Shell-quoted.
    """
    if report.http_addr:
        where = f"--http-addr {shlex.quote(report.http_addr)}"
        engine = report.last_engine_addr
        if report.http_addr.startswith("http://") and engine:
            # Plaintext discovery: name the host its answer may send the token to,
            # as the harness's allowed_hosts did (flush warns without it).
            with contextlib.suppress(ValueError):
                host = parse_host_port(engine)[0]
                where += f" --allowed-host {shlex.quote(host)}"
    elif report.last_engine_addr:
        where = f"--grpc-addr {shlex.quote(report.last_engine_addr)}"
    else:
        where = "--grpc-addr ENGINE_HOST:PORT"
    limit = ""
    too_large = receive_limit_in(report.last_error)
    if too_large is not None:
        # Its streams ended on a down message over the receive limit: without
        # the flag, flush's would too. The message's size in whole MiB above.
        size = too_large.received or (too_large.limit or 0) + 1
        limit = f" --max-receive-message-bytes {-(-size // _MiB) * _MiB}"
    return (
        f"walchannel flush {shlex.quote(report.file)} {where} --token-env {FLUSH_TOKEN_ENV}{limit}"
    )


def _token_note(report: RunReport) -> str:
    """After a ``flush`` step: what an UNAUTHENTICATED last error may mean for it."""
    if "UNAUTHENTICATED" not in (report.last_error or ""):
        return ""
    return (
        "; the last error is UNAUTHENTICATED: if the harness had a wrong token, add"
        " --replace-token with the right one; if the token is right, the engine may be a"
        " replacement that does not know the run yet: wait, then flush as printed"
    )


def _takeover_cost(report: RunReport) -> str:
    """What a takeover of the report's run costs (SPEC "The engine keeps the resume point")."""
    if report.resume_point is not None:
        return (
            "the engine keeps the run's resume point: a new log taken over resumes from it"
            " and nothing delivered comes again"
        )
    if not report.last_acked_seq and not report.unacked_count:
        return (
            "a new log taken over resumes from the engine's resume point where the engine"
            " keeps one; with one that does not, what was delivered comes again"
        )
    return (
        "what the other writer delivered then comes again, unless the harness resumes from"
        " its own record"
    )


def next_step(report: RunReport) -> str:
    """What the operator does about a run in ``report.state`` (SPEC "Operating tools").

    Every state has one; commands name the report's file. docs/operations.md
    "States, and what to do about each" gives the reasoning.
    """
    log = shlex.quote(report.file)
    flush = flush_command(report)
    reason = report.reason or ""
    state = report.state
    if state == "corrupt":
        # Only a step that works on this file: export, if its rows were read.
        # The new log's first handshake is fenced (the run is this file's
        # writer's): say so, and what the takeover then costs.
        then = (
            "the harness then starts a new log for the run, which the engine refuses as"
            " another writer's until 'walchannel takeover' marks it"
            f" ({_takeover_cost(report)})"
        )
        if report.salvage is None:
            return f"move {log} aside and keep it (export cannot read its rows either); {then}"
        if report.salvage == 0:
            return f"move {log} aside and keep it (it holds no unacked row to export); {then}"
        return (
            f"'walchannel export {log} -o FILE' saves its {report.salvage} row(s); then "
            f"move {log} aside and keep it; {then}"
        )
    if state == "unreadable":
        if "bytes long" in reason:
            return "move the log's folder to a shorter path (a symlink does not help)"
        if "EMFILE" in reason:
            return "raise this process's open-file limit (ulimit -n) and inspect again"
        if "no shared memory" in reason:
            return (
                "with no harness running on it, move the -shm named aside (SQLite makes it"
                " again; nothing of the log is in it), or copy the log, its -wal and its lock"
                " file (not the -shm) to a local file system and inspect the copy"
                " (docs/operations.md)"
            )
        return "inspect as the log's owner or root; do not move it (nothing says it is damaged)"
    if state == "failed":
        completer = completed_by_another(reason)
        if completer is not None:
            # A takeover cannot reopen a completed run: only the rows remain to review.
            return (
                f"writer {completer} completed the run, so nothing can write it again: "
                f"'walchannel export {log}' lists the {report.unacked_count} row(s) kept here, "
                "to compare with the engine's record of the run; then the log can go"
            )
        if reason.startswith(FAILED_FENCED):
            # Never advise a restart or flush: both are refused until the operator decides.
            return (
                f"another writer has the run: 'walchannel export {log}' to review the rows kept "
                f"here; or, if this log should write the run, 'walchannel takeover {log}' and "
                f"restart the harness ({_takeover_cost(report)})"
            )
        if reason.startswith(FAILED_ENGINE_BEHIND[:13]):
            return (
                f"the engine lost acked rows: restore its store; 'walchannel export {log}' "
                "saves the rows still here"
            )
        if reason.startswith(FAILED_DONE_REFUSED[:12]):
            return f"raise the engine's receive limit, then '{flush}'"
        if reason.startswith(_RUN_COMPLETED_WITH):
            # The engine applied every seq up to its Done: never advise a re-send.
            rows = report.unacked_count
            these = "these rows" if rows is None else f"these {rows} row(s)"
            return (
                f"the engine says the run is completed: {these} may already be applied "
                "(this log may be an older copy); do not re-send or re-import them. "
                f"'walchannel export {log}' lists them to compare with the engine's record "
                "of the run; the log can go once that is done"
            )
        if reason.startswith(FAILED_CORRUPT[:25]):
            return f"move {log} aside and keep it; 'walchannel export {log}' saves what is readable"
        if reason.startswith(FAILED_INTERNAL):
            return (
                "a walchannel bug: report the reason's text; the rows are kept: restart "
                f"the harness or '{flush}'"
            )
        return f"read the last error; restart the harness or '{flush}'{_token_note(report)}"
    if state == "orphaned":
        run = report.run_id or "the run"
        unknown = ""
        if not (report.http_addr or report.last_engine_addr):
            unknown = " (no engine address is recorded in the log: put yours in)"
        return (
            f"restart the harness for {run} (it resumes from this log), or if it will "
            f"not come back, with the run's token in ${FLUSH_TOKEN_ENV}: '{flush}'{unknown}"
            f"{_token_note(report)}"
        )
    if state == "stuck":
        if report.last_error:
            return (
                "fix what the last error names (engine, discovery, proxy, token, "
                "the harness's environment); the harness delivers by itself once the engine answers"
            )
        return "check that the engine is up and reachable from the harness"
    if state == "done-pending":
        return "wait (usually seconds); if it stays, treat it as stuck"
    if state == "active":
        if report.current_error:
            return (
                "the engine is not answering (last error): the harness keeps dialing; "
                "check the engine if it lasts"
            )
        return "nothing"
    if state == "idle":
        return (
            "nothing is at risk; the run has no Done: restart the harness to finish it, "
            "or remove the log if the run is abandoned"
        )
    folder = shlex.quote(str(Path(report.file).parent))
    return f"nothing; 'walchannel prune --older-than DAYS {folder}' removes old tombstones"


def _probe(path: Path) -> LockOwner | None:
    try:
        return probe_owner(files.lock_path(path))
    except OSError:
        # Cannot tell: assume someone holds it, so nothing suggests taking
        # over a run that may be live (flush would be refused anyway).
        return LockOwner(None, None)


def _state(
    snap: Snapshot,
    owner: LockOwner | None,
    unacked: int,
    oldest_age: float | None,
    stuck_after_s: float,
) -> tuple[str, str | None]:
    """Pick the first state that applies (SPEC "Operating tools")."""
    meta = snap.meta
    if meta.failed_at is not None:
        # failed_reason names the cause; a log written before it had only
        # last_error, which a later error may have replaced.
        cause = meta.failed_reason
        if cause and cause.startswith(FAILED_FENCED):
            return "failed", cause  # the cause is whole; last_error says it again, longer
        if cause and meta.last_error and meta.last_error not in cause:
            return "failed", f"{cause}; the channel stopped: {meta.last_error}"
        if cause:
            return "failed", cause
        if meta.last_error:
            return "failed", f"the channel stopped: {meta.last_error}"
        return "failed", FAILED_ENGINE_BEHIND
    if owner is None and unacked > 0:
        return "orphaned", f"no live owner and {unacked} unacked row(s)"
    if oldest_age is not None and oldest_age > stuck_after_s:
        return "stuck", (
            f"oldest unacked row is {format_age(oldest_age)} old "
            f"(stuck after {format_age(stuck_after_s)})"
        )
    if unacked > 0 and snap.top_kind == "done":
        return "done-pending", f"Done logged at seq {snap.top_seq}, not yet acked"
    if owner is not None:
        return "active", None
    # "idle" and "completed" both have no owner and nothing unacked: a
    # tombstone is "completed", anything else "idle".
    if meta.completed_at is not None:
        return "completed", _ended_as(meta.progress)
    return "idle", None


def _ended_as(marker: Mapping[str, Any] | None) -> str | None:
    """For a tombstone: how the runner's marker says the run ended, unless it ended well."""
    status = marker.get("status") if marker is not None else None
    if not isinstance(status, str) or status == "completed":
        return None
    assert marker is not None
    counts = ", ".join(
        f"{marker[key]} {name}"
        for key, name in (
            ("items", "items"),
            ("skipped_items", "skipped"),
            ("findings", "findings"),
        )
        if isinstance(marker.get(key), int)
    )
    return (
        f'the run ended with Done(status="{escape_text(status[:40])}") (the runner\'s'
        f" marker{': ' + counts if counts else ''}); a start exits with that status's code"
    )


def inspect_log(
    path: Path,
    *,
    stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
    verify: bool = False,
    show: int = 0,
    clock: Clock | None = None,
) -> RunReport:
    """Look at one log without disturbing it and say what state its run is in.

    Args:
        path: the log file.
        stuck_after_s: an owned run whose oldest unacked row is older than
            this is ``stuck`` (seconds).
        verify: also run ``PRAGMA quick_check`` (reads every page).
        show: decode this many of the oldest unacked rows into ``shown``,
            and as many quarantined rows into ``shown_quarantined``.
        clock: the clocks ages are read with (default the system's): the
            oldest unacked row's age and the last ack's are measured by boot
            time within the boot that wrote them, so a wall-clock step
            changes neither (:func:`walchannel.clock.age_s`).

    Returns:
        The report; a file that cannot be read as a walchannel log is
        ``corrupt`` with the reason, one this process may not read (its
        permissions, a lock) is ``unreadable`` with the reason (never an
        exception).
    """
    report = _inspect(path, stuck_after_s, verify, show, clock or SYSTEM_CLOCK)
    return replace(report, next_step=next_step(report))


def _inspect(path: Path, stuck_after_s: float, verify: bool, show: int, clock: Clock) -> RunReport:
    now = clock.wall_s()
    named = run_id_from_name(path)
    owner = _probe(path)
    try:
        reader = LogReader(path, named)
    except (WalCorruptError, LogUnreadableError) as exc:
        return _unread(path, named, exc, owner)
    with reader:
        try:
            snap = reader.snapshot(salvage=True)
            if snap.reading.damaged:
                return _salvaged(path, named, reader, snap, owner, show, verify, clock)
            meta = snap.meta
            acked = meta.last_acked_seq
            top = snap.top_seq if snap.top_seq is not None and snap.top_seq > acked else acked
            unacked = top - acked
            size = reader.unacked_bytes(acked, top) if unacked else 0
            shown: tuple[ShownRow, ...] = ()
            if show > 0 and unacked:
                shown = tuple(_shown(row, damage, now) for row, damage in reader.rows(acked, show))
            shown_quarantined: tuple[QuarantinedRow, ...] = ()
            if show > 0 and snap.quarantined:
                shown_quarantined = tuple(reader.quarantined(show))
            complaints = reader.quick_check() if verify else []
            # Damaged pages: say export only if it can read the rows.
            readable = _read_rows(reader, acked, 0, now) if complaints else None
        except (WalCorruptError, LogUnreadableError) as exc:
            return _unread(path, named, exc, owner)
    # Ages by boot time within the boot that wrote them (a wall-clock step
    # changes nothing), else by the wall clock (walchannel.clock.age_s).
    oldest_age = _oldest_age(snap, clock, meta.boot_id)
    last_ack_age = None
    if meta.last_ack_at is not None:
        last_ack_age = age_s(
            clock, wall_at=meta.last_ack_at, boot_at=meta.last_ack_boot, boot_id=meta.boot_id
        )
    reason: str | None
    if complaints:
        more = f" (+{len(complaints) - 1} more)" if len(complaints) > 1 else ""
        state, reason = "corrupt", f"quick_check: {complaints[0]}{more}"
    else:
        state, reason = _state(snap, owner, unacked, oldest_age, stuck_after_s)
        if snap.last_quarantined is not None:
            # Never silent: whatever the state, say which row went to the quarantine.
            seq, why = snap.last_quarantined
            count = snap.quarantined
            note = (
                f"{count} row(s) in the quarantine, sent as walchannel.row_lost "
                f"(latest: seq {seq}: {why}; walchannel export --quarantined)"
            )
            reason = note if reason is None else f"{reason}; {note}"
        if (oldest := _oldest_note(snap)) is not None:
            reason = oldest if reason is None else f"{reason}; {oldest}"
        if meta.takeover_at is not None:
            note = (
                "marked to take the run over from whichever writer has it, at its next "
                "handshake (walchannel takeover)"
            )
            reason = note if reason is None else f"{reason}; {note}"
    return RunReport(
        run_id=meta.run_id,
        file=str(path),
        state=state,
        reason=reason,
        next_seq=next_seq_after(max(meta.high_water, top), acked),
        last_acked_seq=acked,
        unacked_count=unacked,
        unacked_bytes=size,
        oldest_unacked_age_s=oldest_age,
        last_ack_at=meta.last_ack_at,
        last_engine_addr=meta.last_engine_addr,
        http_addr=meta.http_addr,
        last_error=meta.last_error,
        last_error_at=meta.last_error_at,
        locked_by=owner,
        quarantined=snap.quarantined,
        file_bytes=files.disk_bytes(path),
        shown=shown,
        shown_quarantined=shown_quarantined,
        last_ack_age_s=last_ack_age,
        salvage=readable.count if readable is not None else None,
        writer_id=meta.writer_id,
        writer_epoch=meta.writer_epoch,
        takeover=meta.takeover_at is not None,
        group_commit=_group_commit(meta.group_commit),
        resume_point=engine_resume(meta.engine_resume),
    )


def _group_commit(stored: str | None) -> dict[str, Any] | None:
    """The stored ``group_commit`` setting as a mapping (None: off, or not readable JSON)."""
    if stored is None:
        return None
    try:
        value = json.loads(stored)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _shown(row: Row, damage: str | None, now: float) -> ShownRow:
    at = row.appended_at
    return ShownRow(
        row.seq,
        row.kind if damage is None else "damaged",
        None if at is None else max(0.0, now - at),
        row.size,
        row.body,
        damage,
        COLUMN_DAMAGED.format(column="appended_at") if at is None else None,
    )


#: How a row's damaged time cell is said (inspect, export): the body is intact.
COLUMN_DAMAGED: Final = "{column} damaged: not a number"


def _oldest_age(snap: Snapshot, clock: Clock, boot_id: str | None) -> float | None:
    """The oldest unacked row's age (seconds; None without rows or with its time damaged)."""
    if snap.oldest_appended_at is None:
        return None
    return age_s(
        clock,
        wall_at=snap.oldest_appended_at,
        boot_at=snap.oldest_appended_boot,
        boot_id=boot_id,
    )


def _oldest_note(snap: Snapshot) -> str | None:
    """Name the oldest unacked row's damaged time cells (its age is read from them)."""
    if not snap.oldest_damaged:
        return None
    said = "; ".join(COLUMN_DAMAGED.format(column=c) for c in snap.oldest_damaged)
    age = (
        "the run's age is unknown"
        if "appended_at" in snap.oldest_damaged
        else "its age is read by the wall clock"
    )
    return f"oldest unacked row seq {snap.oldest_seq}: {said} ({age}; its body is intact)"


@dataclass(frozen=True, slots=True)
class _RowsRead:
    """The rows above a seq, read as ``export`` reads them."""

    count: int
    # (seq, why) of each row whose CRC, msgpack or kind does not check out.
    damaged: tuple[tuple[int, str], ...]
    shown: tuple[ShownRow, ...]


def _read_rows(reader: LogReader, after: int, show: int, now: float) -> _RowsRead | None:
    """Read every row above ``after`` (None: they cannot be read); keep the first ``show``."""
    count = 0
    damaged: list[tuple[int, str]] = []
    shown: list[ShownRow] = []
    try:
        for row, damage in reader.rows(after):
            count += 1
            if damage is not None:
                damaged.append((row.seq, damage))
            if len(shown) < show:
                shown.append(_shown(row, damage, now))
    except (WalCorruptError, LogUnreadableError):
        return None
    return _RowsRead(count, tuple(damaged), tuple(shown))


def _salvaged(
    path: Path,
    named: str | None,
    reader: LogReader,
    snap: Snapshot,
    owner: LockOwner | None,
    show: int,
    verify: bool,
    clock: Clock,
) -> RunReport:
    """The report of a log whose meta has damaged fields: ``corrupt``, its rows salvaged.

    The damaged fields are named; a value read from one is null, never
    guessed (``next_seq`` needs both ``high_water`` and ``last_acked_seq``);
    every row is read as ``export`` reads it, so the next step is export only
    if that works. Restart and flush refuse such a log (SPEC "Operating tools").

    Raises:
        WalCorruptError, LogUnreadableError: as :class:`LogReader`'s reads.
    """
    now = clock.wall_s()
    reading = snap.reading
    values = reading.values
    acked: int | None = values.get("last_acked_seq")
    high_water: int | None = values.get("high_water")
    boot_id: str | None = values.get("boot_id")
    # Above the cursor, or every row if it is damaged: an ack deletes the rows
    # it covers in the same transaction, so no acked row is left to export.
    after = acked if acked is not None else 0
    rows = _read_rows(reader, after, show, now)
    top = snap.top_seq if snap.top_seq is not None and snap.top_seq > after else after
    size = reader.unacked_bytes(after, top) if top > after else 0
    shown_quarantined = tuple(reader.quarantined(show)) if show > 0 and snap.quarantined else ()
    complaints = reader.quick_check() if verify else []
    reason = MetaDamagedError(reading).reason + "; restart and flush refuse it"
    if rows is None:
        reason += "; its rows cannot be read either"
    else:
        reason += f"; export reads its {rows.count} row(s)"
        if rows.damaged:
            seqs = ", ".join(str(seq) for seq, _ in rows.damaged[:5])
            more = ", ..." if len(rows.damaged) > 5 else ""
            reason += (
                f", {len(rows.damaged)} of them damaged (seq {seqs}{more}; each is written as "
                "its walchannel.row_lost event)"
            )
    if complaints:
        reason += f"; quick_check: {complaints[0]}"
    if (note := _oldest_note(snap)) is not None:
        reason += f"; {note}"
    oldest_age = _oldest_age(snap, clock, boot_id)
    last_ack_at: float | None = values.get("last_ack_at")
    last_ack_age = None
    if last_ack_at is not None:
        last_ack_age = age_s(
            clock, wall_at=last_ack_at, boot_at=values.get("last_ack_boot"), boot_id=boot_id
        )
    next_seq = None
    if acked is not None and high_water is not None:
        next_seq = next_seq_after(max(high_water, top), acked)
    return RunReport(
        run_id=values.get("run_id") or named,
        file=str(path),
        state="corrupt",
        reason=reason,
        next_seq=next_seq,
        last_acked_seq=acked,
        unacked_count=rows.count if rows is not None else None,
        unacked_bytes=size,
        oldest_unacked_age_s=oldest_age,
        last_ack_at=last_ack_at,
        last_engine_addr=values.get("last_engine_addr"),
        last_error=values.get("last_error"),
        last_error_at=values.get("last_error_at"),
        locked_by=owner,
        quarantined=snap.quarantined,
        file_bytes=files.disk_bytes(path),
        shown=rows.shown if rows is not None else (),
        shown_quarantined=shown_quarantined,
        last_ack_age_s=last_ack_age,
        salvage=rows.count if rows is not None else None,
        damaged_fields=tuple(reading.damaged),
        writer_id=values.get("writer_id"),
        writer_epoch=values.get("writer_epoch"),
        takeover=None if "takeover_at" in reading.damaged else values["takeover_at"] is not None,
        group_commit=_group_commit(values.get("group_commit")),
        resume_point=engine_resume(values.get("engine_resume")),
    )
