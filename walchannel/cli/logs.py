"""``walchannel inspect``, ``export``, ``prune`` and ``takeover``: the log commands without network.

Their options (``add_inspect`` ... ``add_takeover``, which :mod:`walchannel.cli`
assembles) and their code (:func:`inspect_command`, :func:`export_command`,
:func:`prune_command`, :func:`takeover_command`). SPEC "Operating
tools"; docs/operations.md says what to do about each state.

- inspect: one row per run, most urgent first, its detail and next step
  wrapped under it to fit 120 columns (``--wide``: one line per run; or
  ``--json``); read-only, never takes the owner lock
  (:mod:`walchannel.log.reader`), ``--watch`` refreshes (:mod:`walchannel.cli.watch`).
- export: the unacked rows (or ``--quarantined``, the quarantine) as JSON
  lines; read-only. It salvages a damaged log: a damaged meta field blocks
  no row, a damaged row is written as its ``row_lost`` event; each is named
  and the exit code is 1.
- prune: remove old tombstones and their sidecars, holding the owner lock
  while it removes them (``--dry-run``: only list them).
- takeover: mark one log, under its owner lock, to take its run over from
  whichever writer has it at its next handshake (one shot).

Also :func:`err`, the one way every command prints an error line. This
module imports neither grpc nor httpx, nor anything that does.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

from walchannel.cli.common import (
    RAW,
    non_negative_float,
    non_negative_int,
    positive_float,
)
from walchannel.cli.inspection import (
    ALERT_STATES,
    COLUMN_DAMAGED,
    DEFAULT_STUCK_AFTER_S,
    PathError,
    RunReport,
    inspect_log,
    list_logs,
)
from walchannel.errors import (
    RunCompletedError,
    WalCorruptError,
    WalLockedError,
    WalWriteError,
)
from walchannel.formatting import (
    TABLE_WIDTH,
    align_table,
    escape_text,
    format_age,
    format_size,
    note_lines,
)
from walchannel.log import files
from walchannel.log.format import ROW_LOST_TYPE, MetaDamagedError, Row
from walchannel.log.lock import OwnerLock, probe_owner
from walchannel.log.reader import LogReader, LogUnreadableError, run_id_from_name
from walchannel.log.state import completed_by_another
from walchannel.log.writer import RunLog

if TYPE_CHECKING:
    from walchannel.log.format import RunMeta

__all__ = [
    "err",
    "export_command",
    "inspect_command",
    "prune_command",
    "say",
    "table_lines",
    "takeover_command",
]

# Characters of a row body shown on one line by ``inspect --show --wide``
# (without --wide: what is left of TABLE_WIDTH, at least _MIN_BODY_WIDTH).
_BODY_WIDTH: Final = 100
_MIN_BODY_WIDTH: Final = 20
_SECONDS_PER_DAY: Final = 86_400.0


# -- formatting ----------------------------------------------------------------


def _one_line(body: object, width: int = _BODY_WIDTH) -> str:
    # JSON escapes C0 controls but not DEL, C1 or bidi controls: escape them all.
    text = escape_text(
        json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=_json_default)
    )
    return text if len(text) <= width else text[: width - 1] + "…"


def _json_default(value: object) -> object:
    # msgpack hands back bytes for binary values; JSON has no bytes.
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return repr(value)


def err(command: str | None, message: str) -> None:
    """Print ``walchannel COMMAND: message`` on standard error, its controls escaped."""
    prefix = f"walchannel {command}" if command else "walchannel"
    print(escape_text(f"{prefix}: {message}"), file=sys.stderr)


def say(line: str, *, flush: bool = False) -> None:
    """Print one line of a command's human output, its controls escaped.

    Paths, run ids and texts read from a log come from outside: shown, never
    acted on by the terminal (SPEC "The channel", "Text from outside").
    """
    print(escape_text(line), flush=flush)


def _logs_at(command: str, path: str | None) -> tuple[Path, list[Path]] | None:
    """The folder (default: the default log folder) and its logs, or None after an error.

    The default folder not existing yet means no run has logged on this
    machine: no logs, not an error. A PATH given and missing is an error, as
    is a ``$WALCHANNEL_DIR`` that names no folder (it was set on purpose).
    """
    folder = files.expand_user(Path(path), "PATH") if path else files.default_wal_dir()
    if not path and not os.path.lexists(folder):
        explicit = os.environ.get("WALCHANNEL_DIR")
        if explicit:
            # Set on purpose, like PATH: a typo must not read as "no runs".
            err(command, f"WALCHANNEL_DIR={explicit}: no such folder")
            return None
        return folder, []
    try:
        return folder, list_logs(folder)
    except PathError as exc:
        err(command, str(exc))
        return None


# -- inspect -----------------------------------------------------------------------


_COLUMNS: Final = (
    # header, right-aligned
    ("STATE", False),
    ("RUN", False),
    ("UNACKED", True),
    ("BYTES", True),
    ("OLDEST", True),
    ("LAST ACK", True),
    ("OWNER", False),
    ("DISK", True),
)
#: The free-text notes of a run: (``--wide`` column header, label under the row).
_NOTES: Final = (("DETAIL", "detail"), ("NEXT STEP", "next step"))
_LABEL_WIDTH: Final = max(len(label) for _, label in _NOTES)


def _table_row(report: RunReport, now: float) -> tuple[str, ...]:
    return (
        report.state,
        report.run_id or Path(report.file).name,
        "-" if report.unacked_count is None else str(report.unacked_count),
        format_size(report.unacked_bytes),
        format_age(report.oldest_unacked_age_s),
        report.last_ack_text(),
        report.owner_text(),
        format_size(report.file_bytes),
    )


def table_lines(reports: Sequence[RunReport], now: float, *, wide: bool = False) -> list[str]:
    """Return the lines ``inspect`` prints for ``reports`` (in their order).

    By default one aligned row per run, then its DETAIL and NEXT STEP on
    indented lines under it, wrapped to fit :data:`TABLE_WIDTH` (120)
    columns (a line of its own only when there is something: no detail
    line without a detail, no next-step line when it is "nothing"), then
    the rows ``--show`` decoded, cut to fit. With ``wide``, DETAIL and NEXT
    STEP are the row's last columns, one line per run however long.
    SPEC "Operating tools"; docs/operations.md "walchannel inspect".

    Args:
        reports: the runs, most urgent first.
        now: the wall clock (unix seconds) the last error's age is read from.
        wide: one line per run instead of fitting 120 columns.
    """
    # Escaped before alignment, so a control character never moves a column.
    rows = [tuple(escape_text(cell) for cell in _table_row(r, now)) for r in reports]
    if wide:
        columns = (*_COLUMNS, *((header, False) for header, _ in _NOTES))
        notes = [(escape_text(r.detail(now)), escape_text(r.next_step)) for r in reports]
        header, *lines = align_table(
            columns, [(*row, *n) for row, n in zip(rows, notes, strict=True)]
        )
    else:
        header, *lines = align_table(_COLUMNS, rows, last_free=False)
    out = [header]
    for report, line in zip(reports, lines, strict=True):
        out.append(line)
        if not wide:
            texts = (report.detail(now), "" if report.next_step == "nothing" else report.next_step)
            for (_, label), text in zip(_NOTES, texts, strict=True):
                if text:
                    out.extend(note_lines(label, escape_text(text), label_width=_LABEL_WIDTH))
        out.extend(_shown_lines(report, wide=wide))
    return out


def _shown_lines(report: RunReport, *, wide: bool) -> list[str]:
    """The ``--show`` rows of a run: one line each, the body cut to fit."""
    out = []
    for shown in report.shown:
        head = (
            f"    seq {shown.seq:<8} {escape_text(shown.kind):<16} {format_age(shown.age_s):>7}"
            f"  {format_size(shown.size):>9}  "
        )
        if shown.column_damage:
            head += f"[{shown.column_damage}] "
        body = f"[{shown.damage}]" if shown.damage else _one_line(shown.body, _fit(head, wide))
        out.append(head + body)
    for q in report.shown_quarantined:
        head = (
            f"    quarantined seq {q.seq:<8} {escape_text(q.kind or '?'):<16} "
            f"{format_size(q.size):>9}  [{escape_text(q.reason)}]  "
        )
        held = _one_line(q.body, _fit(head, wide)) if q.body is not None else "[does not decode]"
        out.append(head + held)
    return out


def _fit(head: str, wide: bool) -> int:
    """How many characters of a body follow ``head`` on one line."""
    return _BODY_WIDTH if wide else max(_MIN_BODY_WIDTH, TABLE_WIDTH - len(head))


def inspect_command(args: argparse.Namespace) -> int:
    """Run ``walchannel inspect`` with the parsed ``args``; return the exit code."""
    if args.json and args.show:
        err("inspect", "--show is for the human output; use 'walchannel export LOG' for JSON rows")
        return 2
    if args.watch_count is not None and (args.watch is None or args.watch_count < 1):
        err("inspect", "--watch-count N needs --watch and N >= 1")
        return 2
    if args.watch is not None and (args.json or args.show):
        err("inspect", "--watch is a view for people: not with --json or --show")
        return 2
    found = _logs_at("inspect", args.path)
    if found is None:
        return 2
    folder, logs = found
    if args.watch is not None:
        return _watch_inspect(args, folder)
    now = time.time()
    reports = sorted(
        (
            inspect_log(log, stuck_after_s=args.stuck_after, verify=args.verify, show=args.show)
            for log in logs
        ),
        key=lambda r: r.sort_key,
    )
    if args.json:
        print(json.dumps([r.to_json() for r in reports], indent=2, ensure_ascii=False))
    elif reports:
        print("\n".join(table_lines(reports, now, wide=args.wide)))
    elif folder.exists():
        say(f"no run logs in {folder}")
    else:
        say(f"no run logs: {folder} does not exist yet (the default log folder)")
    return 1 if any(r.state in ALERT_STATES for r in reports) else 0


def _watch_inspect(args: argparse.Namespace, folder: Path) -> int:
    from walchannel.cli.watch import watch

    def find() -> list[Path]:
        if not args.path and not os.path.lexists(folder):
            return []
        return list_logs(folder)

    return watch(
        find,
        where=str(folder),
        interval_s=args.watch,
        out=sys.stdout,
        clear=sys.stdout.isatty(),
        count=args.watch_count,
        stuck_after_s=args.stuck_after,
        verify=args.verify,
        wide=args.wide,
    )


# -- export ------------------------------------------------------------------------


@contextlib.contextmanager
def _output(name: str | None) -> Iterator[TextIO]:
    if name is None or name == "-":
        yield sys.stdout
        return
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with open(fd, "w", encoding="utf-8") as out:
        yield out


def _is_the_logs_file(output: Path, log: Path) -> bool:
    """Whether writing ``output`` would write the log or one of its files (a link included)."""
    target = output.resolve()
    for own in (log, Path(f"{log}-journal"), *_sidecars(log)):
        if target == own.resolve():
            return True
        with contextlib.suppress(OSError):
            if os.path.samefile(output, own):
                return True
    return False


def export_command(args: argparse.Namespace) -> int:
    """Run ``walchannel export`` with the parsed ``args``; return the exit code.

    0: the rows written, the log sound; 1: salvaged: every row that reads
    written, and the damage (a meta field, rows) named on standard error; 2:
    the log cannot be read, or the output cannot be written. SPEC
    "Operating tools".
    """
    path = files.expand_user(Path(args.log), "LOG")
    if args.output not in (None, "-") and _is_the_logs_file(
        files.expand_user(Path(args.output), "--output", log=False), path
    ):
        # Opening the output truncates it: that would destroy the rows to export.
        err(
            "export",
            f"{args.output}: is the log {path} or one of its files; refusing to "
            "write over it (choose another -o)",
        )
        return 2
    damaged_rows: list[tuple[int, str]] = []
    salvaged = False
    try:
        with LogReader(path, run_id_from_name(path)) as reader:
            after = 0
            if not args.quarantined:
                # Before the output is opened: a log that cannot be read truncates nothing.
                after, note = _export_after(reader)
                if note is not None:
                    err("export", note)
                    salvaged = True
            with _output(args.output) as out:
                records: Iterator[dict[str, Any]]
                if args.quarantined:
                    records = (
                        {
                            "seq": q.seq,
                            "kind": q.kind,
                            "body": q.body,
                            "body_hex": q.raw.hex() if q.raw is not None else None,
                            "appended_at": q.appended_at,
                            "reason": q.reason,
                            "quarantined_at": q.quarantined_at,
                        }
                        for q in reader.quarantined()
                    )
                else:
                    records = (
                        {
                            "seq": row.seq,
                            "kind": row.kind,
                            "body": row.body,
                            "appended_at": row.appended_at,
                        }
                        for row in _noting_damage(reader.rows(after), damaged_rows)
                    )
                for record in records:
                    out.write(
                        json.dumps(
                            record,
                            separators=(",", ":"),
                            ensure_ascii=False,
                            default=_json_default,
                        )
                        + "\n"
                    )
    except (WalCorruptError, LogUnreadableError) as exc:
        err("export", str(exc))
        return 2
    except BrokenPipeError:
        raise
    except OSError as exc:
        err("export", f"{args.output}: cannot write: {exc.strerror or exc}")
        return 2
    run = f"run {run_id_from_name(path) or '?'}"
    for seq, why in damaged_rows[:_DAMAGED_ROWS_NAMED]:
        written = (
            "written with appended_at null (its body is intact)"
            if why == _TIME_DAMAGED
            else f"written as its {ROW_LOST_TYPE} event"
        )
        err("export", f"{path}: {run}: row seq {seq} is damaged ({why}): {written}")
    if len(damaged_rows) > _DAMAGED_ROWS_NAMED:
        err("export", f"{path}: and {len(damaged_rows) - _DAMAGED_ROWS_NAMED} more damaged row(s)")
    return 1 if salvaged or damaged_rows else 0


# Damaged rows export names one line each, up to this many.
_DAMAGED_ROWS_NAMED: Final = 20
# How export says a row's damaged time (the row itself is written).
_TIME_DAMAGED: Final = COLUMN_DAMAGED.format(column="appended_at")


def _export_after(reader: LogReader) -> tuple[int, str | None]:
    """The seq to export the rows above, and what to say of a damaged meta field (or None).

    A damaged field blocks no row: only the ack cursor decides which rows
    to write, and when it is damaged every row the log holds is written
    (an ack deletes the rows it covers in its own transaction, so none of
    them is acked). SPEC "Operating tools".
    """
    try:
        return reader.meta().last_acked_seq, None
    except MetaDamagedError as exc:
        acked = exc.reading.values.get("last_acked_seq")
        refused = "restart and flush refuse this log"
        if acked is None:
            return 0, (
                f"{exc}; salvaging: every row it holds is written (an ack deletes the rows "
                f"it covers, so none of them is acked); {refused}"
            )
        above = f"the rows above the ack cursor (seq {acked}) are written"
        return int(acked), f"{exc}; salvaging: {above}; {refused}"


def _noting_damage(
    rows: Iterator[tuple[Row, str | None]], damaged: list[tuple[int, str]]
) -> Iterator[Row]:
    """Yield each row (a damaged one as its ``row_lost`` event), noting the damaged ones.

    A row whose body is good but whose ``appended_at`` is damaged is yielded
    as it is (its time None) and noted too.
    """
    for row, damage in rows:
        if damage is not None:
            damaged.append((row.seq, damage))
        elif row.appended_at is None:
            damaged.append((row.seq, _TIME_DAMAGED))
        yield row


# -- prune ---------------------------------------------------------------------------


def _sidecars(log: Path) -> tuple[Path, ...]:
    return (Path(f"{log}-wal"), Path(f"{log}-shm"), files.lock_path(log))


def _remove_litestream_state(log: Path) -> None:
    """Remove Litestream's local state of a pruned log (``.<log>-litestream``); its replica stays.

    Litestream (``walchannel replicate``) stops replicating a deleted file
    but leaves this folder behind, one per run.
    """
    import shutil

    state = log.with_name(f".{log.name}-litestream")
    if state.is_dir() and not state.is_symlink():
        shutil.rmtree(state, ignore_errors=True)


class _Unreadable(Exception):
    """A log prune cannot read: it may be a tombstone it cannot remove (the message says why)."""


def _tombstone_meta(log: Path) -> RunMeta | None:
    """The meta of a tombstone, None for any other log.

    Raises:
        _Unreadable: this user cannot read the log, which may be a tombstone.
    """
    try:
        with LogReader(log, run_id_from_name(log)) as reader:
            meta = reader.meta()
    except WalCorruptError:
        return None
    except LogUnreadableError as exc:
        raise _Unreadable(exc.reason) from None
    return meta if meta.completed_at is not None else None


def _as_whom() -> str:
    return f"uid {os.geteuid()}"


def _cannot_remove_why(log: Path, lock_file: Path) -> str | None:
    """Why this user could not take the lock of ``log`` or remove its files, or None.

    Checked before the lock is taken, by a dry run and a real one alike: a
    prune opens the lock file for writing (creating it when missing) and
    unlinks the log and its sidecars from their folder. ``os.access`` with
    the effective ids (as the kernel will judge the open and the unlinks;
    a read-only mount is EROFS, also refused).
    """
    folder = log.parent
    effective = os.access in os.supports_effective_ids
    denied = os.strerror(errno.EACCES)
    if os.path.lexists(lock_file) and not os.access(
        lock_file, os.R_OK | os.W_OK, effective_ids=effective
    ):
        return f"cannot take its lock {lock_file}: {denied} (as {_as_whom()})"
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=effective):
        return f"cannot remove files from the folder {folder}: {denied} (as {_as_whom()})"
    return None


def _quarantined_count(log: Path) -> int | None:
    try:
        with LogReader(log, run_id_from_name(log)) as reader:
            return reader.snapshot().quarantined
    except (WalCorruptError, LogUnreadableError):
        return None


def _prune_one(
    log: Path,
    cutoff: float,
    now: float,
    *,
    dry_run: bool = False,
    include_quarantined: bool = False,
) -> bool | None:
    """Remove one old tombstone.

    Returns:
        True: removed (or, dry, would be); None: kept on purpose (not an old
        tombstone, or its quarantine holds rows); False: a log that is, or
        may be, an old tombstone and that this user cannot remove now (its
        lock held by a live process, permission denied, unreadable): said on
        stderr, naming the path and why, and prune exits 1 (SPEC "Operating
        tools"). A dry run returns False where the real one would.
    """
    lock_file = files.lock_path(log)
    try:
        meta = _tombstone_meta(log)
    except _Unreadable as exc:
        err("prune", f"cannot remove {log} (it may be a tombstone): cannot read it: {exc}")
        return False
    if meta is None or meta.completed_at is None or meta.completed_at > cutoff:
        return None
    try:
        owner = probe_owner(lock_file)
    except OSError as exc:
        err(
            "prune",
            f"cannot remove {log}: cannot probe its lock {lock_file}: "
            f"{exc.strerror or exc} (as {_as_whom()})",
        )
        return False
    if owner is not None:
        err(
            "prune",
            f"cannot remove {log}: its lock is held by {owner.describe()} (a harness or "
            "walchannel command still has it open); prune again once it has exited",
        )
        return False
    if not include_quarantined:
        held = _quarantined_count(log)
        if held is None or held > 0:
            # Nothing is deleted silently: those rows never reached the engine.
            err(
                "prune",
                f"kept {log}: its quarantine holds {held if held is not None else 'unknown'} "
                f"row(s) the engine never got; save them with 'walchannel export "
                f"--quarantined {log}', then prune with --include-quarantined",
            )
            return None
    # Checked first, by a dry run too: a prune that would fail touches nothing.
    why = _cannot_remove_why(log, lock_file)
    if why is not None:
        err("prune", f"cannot remove {log}: {why}; prune as the log's owner or root")
        return False
    if dry_run:
        age = format_age(now - meta.completed_at)
        say(f"would remove {log} (run {meta.run_id}, completed {age} ago)")
        return True
    # Hold the owner lock while removing, so no harness opens the log meanwhile.
    try:
        lock = OwnerLock.acquire(lock_file, log=log)
    except WalLockedError as exc:
        err("prune", f"cannot remove {log}: {exc}; prune again once it has exited")
        return False
    except OSError as exc:
        err(
            "prune",
            f"cannot remove {log}: cannot take its lock {lock_file}: {exc.strerror or exc} "
            f"(as {_as_whom()}); prune as the log's owner or root",
        )
        return False
    try:
        try:
            if _tombstone_meta(log) is None:  # changed under us: leave it
                return None
        except _Unreadable as exc:
            err("prune", f"cannot remove {log}: cannot read it: {exc}")
            return False
        try:
            # The log first: a crash after it leaves only harmless sidecars.
            for victim in (log, *_sidecars(log)):
                with contextlib.suppress(FileNotFoundError):
                    victim.unlink()
        except OSError as exc:
            err(
                "prune",
                f"cannot remove {log}: {exc.filename or log}: {exc.strerror or exc} "
                f"(as {_as_whom()})",
            )
            return False
        _remove_litestream_state(log)
    finally:
        lock.release()
    completed = meta.completed_at
    say(f"removed {log} (run {meta.run_id}, completed {format_age(now - completed)} ago)")
    return True


def prune_command(args: argparse.Namespace) -> int:
    """Run ``walchannel prune`` with the parsed ``args``; return the exit code."""
    found = _logs_at("prune", args.path)
    if found is None:
        return 2
    folder, logs = found
    now = time.time()
    cutoff = now - args.older_than * _SECONDS_PER_DAY
    outcomes = [
        _prune_one(
            log,
            cutoff,
            now,
            dry_run=args.dry_run,
            include_quarantined=args.include_quarantined,
        )
        for log in logs
    ]
    removed, failed = outcomes.count(True), outcomes.count(False)
    if failed:
        # Never "nothing to prune" while a tombstone stays for a reason to fix.
        err("prune", f"{failed} log(s) in {folder} could not be pruned (said above)")
        return 1
    if not removed:
        say(f"nothing to prune in {folder}")
    return 0


# -- takeover ------------------------------------------------------------------------


def takeover_command(args: argparse.Namespace) -> int:
    """Run ``walchannel takeover`` with the parsed ``args``; return the exit code.

    Marks an existing log, under its owner lock, to take its run over from
    whichever writer has it (:meth:`walchannel.log.writer.RunLog.mark_takeover`: a
    new writer id, the mark, a fenced failure mark cleared). The harness
    restarted on the log (or ``walchannel flush``) asks the engine to take
    the run over at its handshakes until the first answered one. 0: marked;
    2: refused (no such log, a live owner, a tombstone, a log fenced because
    another writer completed the run, a damaged log) or bad usage. SPEC
    "Operating tools".
    """
    path = files.expand_user(Path(args.log), "LOG")
    run_id = run_id_from_name(path)
    if run_id is None:
        err("takeover", f"{path}: LOG must be a run log named <run_id>{files.LOG_SUFFIX}")
        return 2
    try:
        # The stored correlation id, read without creating anything: an
        # open of a missing log would make a new one.
        with LogReader(path, run_id) as reader:
            meta = reader.meta()
        completer = completed_by_another(meta.failed_reason)
        if completer is not None:
            err(
                "takeover",
                f"refused: run {run_id} was completed by writer {completer} (the engine said "
                f"so): a takeover cannot reopen a completed run. 'walchannel export {path}' "
                "lists the rows kept here, to compare with the engine's record of the run",
            )
            return 2
        wal = RunLog.open(path.parent, run_id, correlation_id=meta.correlation_id)
    except WalLockedError as exc:
        err("takeover", f"refused: {exc} (stop that harness first: a live owner keeps its run)")
        return 2
    except (WalCorruptError, WalWriteError, LogUnreadableError) as exc:
        err("takeover", f"refused: {exc}")
        return 2
    with wal:
        before = wal.writer
        try:
            writer = wal.mark_takeover()
        except (RunCompletedError, WalWriteError) as exc:
            err("takeover", f"refused: {exc}")
            return 2
    say(
        f"run {run_id}: {path} is marked to take the run over at its next handshake "
        f"(writer {before.id} -> {writer.id}). Now restart the harness on this log (or "
        "'walchannel flush' it): the engine makes it the run's owner, ends the other "
        "writer's stream and refuses that writer from then on. Findings the other writer "
        "delivered come again, unless the harness resumes from its own record"
    )
    return 0


# -- inspect -----------------------------------------------------------------------

_INSPECT_EXAMPLES = """\
examples:
  walchannel inspect                        # every run in the default log folder
  walchannel inspect /var/lib/scan/wal --stuck-after 300
  walchannel inspect run-42.wal.sqlite3 --show 5 --verify
  walchannel inspect --wide | less -S       # one line per run, however long
  walchannel inspect --json | jq '.[] | select(.state == "orphaned") | .file'
  walchannel inspect /var/lib/scan/wal --watch 5   # live view (PATH before --watch)

states, most urgent first: corrupt, unreadable, failed, orphaned, stuck,
done-pending, active, idle, completed. Exit 0 when all is well, 1 when a run
is stuck, orphaned, failed, corrupt or unreadable (this user may not read it),
2 on bad usage or an unreadable PATH. --watch exits 0 on Ctrl-C; with
--watch-count N, as inspect would for the last refresh.

a failed run's reason names its cause: "engine behind" (the engine lost
acked rows: restore its store; export the rest), "Done refused" (raise the
engine's limit, then flush), "run completed with rows unacked here" (the
engine applied a Done and every seq before it: the rows may already be
applied; do not re-send or re-import them), "the log file is damaged" (as corrupt: --verify,
export, move it aside), "walchannel stopped the run: its own invariant broke"
(a walchannel bug: report the text; rows are kept: restart the harness or
flush). A stuck run's last error of "discovery (keeping ...)", "dialing ..."
or "callback ..." is an error raised outside walchannel (the harness's own
http client, a proxy variable, a callback): the run keeps dialing; fix the
harness or its environment. Ages are measured by the boot clock, so a
wall-clock step does not change them (docs/operations.md, clock steps).
"""


def add_inspect(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walchannel inspect`` to ``sub``: its options, examples and exit codes."""
    p = sub.add_parser(
        "inspect",
        help="show the state of every run log (read-only)",
        description=(
            "Show one row per run log, most urgent first, with its detail and next step\n"
            "on indented lines under it, wrapped to fit 120 columns (--wide: one line per\n"
            "run). Read-only: it never takes a log's owner lock, never writes or creates\n"
            "a file, and never blocks or starves a live run, whichever user runs it."
        ),
        epilog=_INSPECT_EXAMPLES,
        formatter_class=RAW,
    )
    p.add_argument(
        "path",
        nargs="?",
        metavar="PATH",
        help="a log folder (its *.wal.sqlite3 files, not recursive) or one log file "
        "(default: $WALCHANNEL_DIR, else $XDG_STATE_HOME/walchannel, "
        "else ~/.local/state/walchannel)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per run")
    p.add_argument(
        "--show",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="decode the first N unacked rows of each run (human output only; "
        "use 'walchannel export' for JSON)",
    )
    p.add_argument(
        "--stuck-after",
        type=non_negative_float,
        default=DEFAULT_STUCK_AFTER_S,
        metavar="SECONDS",
        help="an owned run whose oldest unacked row is older than this is stuck "
        f"(default: {DEFAULT_STUCK_AFTER_S:g})",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="also run PRAGMA quick_check, which reads every page (slower on big logs)",
    )
    p.add_argument(
        "--wide",
        action="store_true",
        help="one line per run, DETAIL and NEXT STEP as its last columns, however long "
        "(default: they go under each run's row, wrapped to fit 120 columns)",
    )
    p.add_argument(
        "--watch",
        type=positive_float,
        nargs="?",
        const=2.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C, with rows logged and acked "
        "per second since the last refresh; redraws on a terminal, appends blocks otherwise",
    )
    p.add_argument(
        "--watch-count",
        type=non_negative_int,
        metavar="N",
        help="with --watch: stop after N refreshes",
    )
    p.set_defaults(handler=inspect_command)


# -- export ------------------------------------------------------------------------

_EXPORT_EXAMPLES = """\
examples:
  walchannel export ~/.local/state/walchannel/run-42.wal.sqlite3
  walchannel export run-42.wal.sqlite3 -o run-42-unacked.jsonl
  walchannel export run-42.wal.sqlite3 | jq -c 'select(.kind == "finding") | .body'

  walchannel export run-42.wal.sqlite3 --quarantined -o run-42-quarantine.jsonl

Each line is {"seq", "kind", "body", "appended_at"} (unix seconds). A damaged
row comes out as the walchannel.row_lost event the channel would send in its
place. With --quarantined, the quarantine instead: the original rows that
went out as walchannel.row_lost events (damaged, or refused by the engine
for their size), one {"seq", "kind", "body", "body_hex", "appended_at",
"reason", "quarantined_at"} per line; body is null and body_hex holds the
stored bytes when a row does not decode. A damaged meta field (the progress
marker, the stored handshake, ...) blocks no row: every row is written and
the field named on stderr; restart and flush refuse such a log. Exit 0; 1
when it salvaged a damaged log (a meta field or rows, named on stderr); 2 if
LOG cannot be read.
"""


def add_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walchannel export`` to ``sub``: its options, examples and exit codes."""
    p = sub.add_parser(
        "export",
        help="print a log's unacked rows as JSON lines (read-only)",
        description="Print the unacked rows of one run log as JSON lines. Read-only.",
        epilog=_EXPORT_EXAMPLES,
        formatter_class=RAW,
    )
    p.add_argument("log", metavar="LOG", help="the log file, <run_id>.wal.sqlite3")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE (created with mode 0600: rows hold findings) instead of stdout",
    )
    p.add_argument(
        "--quarantined",
        action="store_true",
        help="export the quarantine (rows sent as walchannel.row_lost) instead of the unacked rows",
    )
    p.set_defaults(handler=export_command)


# -- prune ---------------------------------------------------------------------------

_PRUNE_EXAMPLES = """\
examples:
  walchannel prune --older-than 7           # tombstones completed over a week ago
  walchannel prune /var/lib/scan/wal --older-than 0.5
  walchannel prune --older-than 7 --dry-run # only list what would be removed
  walchannel prune --older-than 7 --include-quarantined   # after exporting them

Only tombstones (completed runs) are removed, with their -wal, -shm and
.lock sidecars; a log whose owner lock is held, or that is not a
tombstone, is never touched. A tombstone whose quarantine holds rows (sent
as walchannel.row_lost: the engine never got them) is kept unless
--include-quarantined is given; save them first with 'walchannel export
--quarantined LOG'. --dry-run reads like inspect and removes nothing, and
makes the same checks. Exit 0, 1 if a tombstone could not be removed (its
lock held by a live process, permission denied, unreadable: each named on
stderr), 2 on bad usage or an unreadable PATH.
"""


def add_prune(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walchannel prune`` to ``sub``: its options, examples and exit codes."""
    p = sub.add_parser(
        "prune",
        help="remove tombstones of completed runs",
        description="Remove the tombstones of runs completed more than DAYS days ago.",
        epilog=_PRUNE_EXAMPLES,
        formatter_class=RAW,
    )
    p.add_argument(
        "path",
        nargs="?",
        metavar="PATH",
        help="a log folder (not recursive) or one log file (default: the default log folder)",
    )
    p.add_argument(
        "--older-than",
        type=non_negative_float,
        required=True,
        metavar="DAYS",
        help="remove tombstones whose run completed more than DAYS days ago (0: all)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list the tombstones that would be removed; remove nothing, take no lock",
    )
    p.add_argument(
        "--include-quarantined",
        action="store_true",
        help="also remove tombstones whose quarantine holds rows (export them first)",
    )
    p.set_defaults(handler=prune_command)


# -- takeover ------------------------------------------------------------------------

_TAKEOVER_EXAMPLES = """\
examples:
  walchannel takeover /var/lib/scan/wal/run-42.wal.sqlite3   # then restart the harness

One writer per run: the engine refuses a second harness on a run ("owned by
another writer"), and a log that never had an answered handshake refuses to
join an engine that already holds rows of its run (a WALCHANNEL_DIR typo, a
relative wal_dir, a volume gone). Both end with WriterFencedError, every row
kept. When this log should write the run after all, mark it: it gets a new
writer id, and the harness restarted on it (or 'walchannel flush') asks the
engine to take the run over until its first answered handshake (one shot;
no config option). The engine then ends the other writer's stream and
refuses it from then on. What the other writer delivered comes again unless
the harness resumes from its own record. Any holder of the run's token can
take a run over (docs/security.md). Exit 0 marked; 2 refused (no such log,
a live owner, a tombstone, a damaged log) or bad usage.
"""


def add_takeover(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walchannel takeover`` to ``sub``: its options, examples and exit codes."""
    p = sub.add_parser(
        "takeover",
        help="mark a log to take its run over from another writer (one shot)",
        description=(
            "Mark one run log so that its next handshakes ask the engine to make it the\n"
            "run's writer, until the first answered one."
        ),
        epilog=_TAKEOVER_EXAMPLES,
        formatter_class=RAW,
    )
    p.add_argument("log", metavar="LOG", help="the log file, <run_id>.wal.sqlite3")
    p.set_defaults(handler=takeover_command)
