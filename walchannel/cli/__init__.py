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

This module assembles the parser and holds ``main``. Each command family
lives beside it, its options, examples, exit codes and code together:
:mod:`~walchannel.cli.logs` (inspect, export, prune, takeover: no network;
views in :mod:`~walchannel.cli.inspection` and :mod:`~walchannel.cli.watch`),
:mod:`~walchannel.cli.flush`, :mod:`~walchannel.cli.replication`
(replicate, restore), :mod:`~walchannel.cli.run` (run, engine),
:mod:`~walchannel.cli.conformance`; :mod:`~walchannel.cli.common` holds
what their parsers share.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final

from walchannel._version import __version__
from walchannel.cli.common import RAW, Handler
from walchannel.cli.conformance import add_conformance
from walchannel.cli.flush import add_flush
from walchannel.cli.logs import add_export, add_inspect, add_prune, add_takeover, err
from walchannel.cli.replication import add_replicate, add_restore
from walchannel.cli.run import add_engine, add_run, load_target
from walchannel.errors import WalchannelError

__all__ = ["build_parser", "load_target", "main"]


_SUBCOMMANDS: Final[tuple[Callable[[argparse._SubParsersAction[Any]], None], ...]] = (
    add_run,
    add_engine,
    add_conformance,
    add_inspect,
    add_flush,
    add_export,
    add_prune,
    add_takeover,
    add_replicate,
    add_restore,
)

_MAIN_EXAMPLES = """\
examples:
  walchannel run myscanner:harness --manifest m.json   # run a harness (the runner)
  walchannel inspect                 # what state is every run in?
  walchannel export run-42.wal.sqlite3 > unacked.jsonl
  walchannel flush run-42.wal.sqlite3 --grpc-addr engine:50051 --token-env RUN_TOKEN
  walchannel prune --older-than 7
  walchannel takeover run-42.wal.sqlite3   # this log takes its run over from another writer
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
        description="Run harnesses and operate walchannel run logs: inspect, flush, export, prune.",
        epilog=_MAIN_EXAMPLES,
        formatter_class=RAW,
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
