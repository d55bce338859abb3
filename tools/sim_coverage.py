#!/usr/bin/env python3
"""What the simulator executes of the channel: every line, but for an allowlist with reasons.

``tools/sim.py`` runs the real :class:`walchannel.GrpcEngineChannel`; this
measures, with coverage.py, which lines of ``walchannel/channel/*.py`` and
``walchannel/channel/row_source.py`` its schedules execute — the grpc.aio and httpx
adapters (``transport/grpc.py``, ``channel/replica.py``) aside, as
the simulator replaces them with its world. Every line it does not execute
must be in :data:`ALLOWED` with the reason the simulated world cannot reach
it (and the test that does); an allowlist entry that no longer matches a
missed line is an error too, so the list stays honest.

Usage::

    python tools/sim_coverage.py --seeds 3000          # a sweep from seed 0
    python tools/sim_coverage.py --corpus              # the seeds of tools/sim_corpus.txt
    python tools/sim_coverage.py --find-corpus 4000    # pick a small corpus, write it

Exit 0 when every missed line is allowed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The channel's code the simulator must execute (the adapters aside).
MEASURED = (
    "walchannel/channel/grpc_channel.py",
    "walchannel/channel/connection.py",
    "walchannel/channel/group_commit.py",
    "walchannel/channel/reclaim.py",
    "walchannel/channel/refused_rows.py",
    "walchannel/channel/reporting.py",
    "walchannel/channel/stream.py",
    "walchannel/channel/waiters.py",
    "walchannel/channel/row_source.py",
)
CORPUS = ROOT / "tools" / "sim_corpus.txt"

_LOOP = "one event loop per schedule: the channel is never used from another loop or after it"
_MISUSE = "a wrong argument or call from the harness: tests/test_channel.py tries each"
_ADAPTER = "the production transport and sidecars, which the simulator replaces with its world"
_METRICS = "metrics are off in the simulator; tests/test_metrics.py covers the hooks"
_NO_FILE = (
    "the simulated log has no file of its own: a checkpoint gives nothing back and is done "
    "at once; tests/test_log.py and tests/test_disk.py cover retries and the size bound"
)
_READ_FAILS = (
    "SQLite on the simulated disk never fails a read; tests/test_channel.py and "
    "tests/test_catalogue.py corrupt real files"
)
_BUG = "only a bug in walchannel reaches it (the planted bugs of tests/plants.py do)"
_GAP = (
    "a row the writer wants missing from the log: acked meanwhile (a race the writer's "
    "own ack handling prevents) or a gap in a damaged file, which the simulated disk never "
    "has; only a bug reaches it (tests/plants.py's), tests/test_log_gap.py damages real files"
)
_TRANSPORT_CLOSE = (
    "closing the production transport (its discovery client) failing: the simulated "
    "transport's aclose never fails"
)
_REPLACED_TOKEN = (
    "token_hash_when='accepted' is walchannel flush --replace-token's seam; the simulated "
    "harness never replaces its token; tests/test_cli.py flushes with a replaced token"
)
_STATUS_LOST = (
    "a down message over max_receive_message_bytes whose end grpc.aio then reports as INTERNAL "
    "(grpc/grpc#36066): the simulated transport keeps every status; "
    "tests/test_receive_limit.py drives real engines"
)

#: Missed lines the simulated world cannot reach: ``file::function`` (every line
#: of it) or ``file::function::stripped line`` -> why, and what covers it instead.
ALLOWED: dict[str, str] = {
    # -- channel/group_commit.py ----------------------------------------------------------
    "walchannel/channel/group_commit.py::PendingGroup._schedule::except RuntimeError:": (
        "a send outside any running event loop: the simulated harness always runs in its "
        "loop; tests/test_group_commit.py sends outside one"
    ),
    "walchannel/channel/group_commit.py::PendingGroup._schedule::self.commit()": (
        "a send outside any running event loop (above)"
    ),
    "walchannel/channel/group_commit.py::PendingGroup._schedule::return": (
        "a send outside any running event loop (above)"
    ),
    "walchannel/channel/group_commit.py::PendingGroup.commit_or_give_up::"
    "return  # given up already, its seqs named": (
        "close() after a removal of the log's files gave the group up in the commit that "
        "found it, before the group's own turn: tests/test_log_removed.py"
    ),
    # -- channel/stream.py ----------------------------------------------------------------
    "walchannel/channel/stream.py::Stream._watchdog::logger.warning(": (
        "a process that did not run for over twice the keepalive (SIGSTOP): the simulated "
        "processes share one loop in virtual time, none is frozen alone; "
        "tests/test_frozen.py stops a real harness"
    ),
    "walchannel/channel/stream.py::Stream._watchdog::self.last_down_ms = now_ms()": (
        "a frozen process (above)"
    ),
    "walchannel/channel/stream.py::Stream._watchdog::self.heartbeats_since_down = 0": (
        "a frozen process (above)"
    ),
    "walchannel/channel/stream.py::Stream._watchdog::if self.write_since_ms is not None:": (
        "a frozen process (above)"
    ),
    "walchannel/channel/stream.py::Stream._watchdog::self.write_since_ms = self.last_down_ms": (
        "a frozen process (above)"
    ),
    "walchannel/channel/stream.py::Stream._watchdog::continue": ("a frozen process (above)"),
    # -- channel/connection.py ------------------------------------------------------------
    "walchannel/channel/connection.py::ConnectionLoop._resync_marker::"
    'logger.warning("run %s: cannot log the marker for the engine: %s", self._run_id, exc)': (
        "the disk refusing the one commit after an answer that first announces a resume "
        "point: rare in the world's disk-full periods; "
        "tests/test_resume_point.py::test_a_first_announcement_repeats_the_logs_marker_and_a_"
        "full_disk_there_loses_nothing refuses it"
    ),
    "walchannel/channel/connection.py::ConnectionLoop._resync_marker::return": (
        "the disk refusing the marker after a first announcement (above)"
    ),
    "walchannel/channel/connection.py::ConnectionLoop._do_clear_failed_mark::"
    "except WalchannelError as exc:": (
        "the disk refusing to clear a failed mark at a healthy answer: since a channel left "
        "open no longer fails its run, the world's failed runs (engine behind, a refused "
        "Done) rarely meet a disk-full period at their next answer; "
        "tests/test_meta_write_failures.py refuses it"
    ),
    "walchannel/channel/connection.py::ConnectionLoop._do_clear_failed_mark::"
    'logger.warning("run %s: cannot clear the failed mark: %s", self._run_id, exc)': (
        "the disk refusing to clear a failed mark (above)"
    ),
    "walchannel/channel/connection.py::ConnectionLoop._do_mark_completed::"
    "except WalchannelError as exc:": (
        'the disk refusing the tombstone of a log holding nothing unacked at "run '
        'completed": a restart after the run ended meeting a disk-full period in its first '
        "exchange; tests/test_meta_write_failures.py refuses it"
    ),
    "walchannel/channel/connection.py::ConnectionLoop._do_mark_completed::"
    'logger.warning("run %s: cannot mark the log completed: %s", self._run_id, exc)': (
        "the disk refusing that tombstone (above)"
    ),
    # -- channel/__init__.py --------------------------------------------------------------
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.send_done::return False": (
        "send_done called after hard_deadline passed: the simulated harnesses stop at the "
        "RunExpiredError of a send before it, and the runner stops scanning before the "
        "deadline (no seed of 0..15,000 reaches it since issue 57's faults); "
        "tests/test_clock_steps.py calls send_done on an expired run"
    ),
    "walchannel/channel/grpc_channel.py::_check_timeout_ms::raise ValueError(": _MISUSE,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._start::"
    'raise TypeError("config must be a GrpcChannelConfig")': _MISUSE,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.__init__::"
    "self._start(config, ChannelSeams())": (
        "the simulator builds every channel on its seams (walchannel.channel.seams.open_channel)"
    ),
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._start::log = RunLog.open(": (
        "the simulator opens the log on its disk (RunLog.on_connection) and passes it as log="
    ),
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._start::"
    'raise ValueError(f"log= must be the open, owned log of run {config.run_id}")': _MISUSE,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._start::"
    "from walchannel.transport.grpc import GrpcTransport": _ADAPTER,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._start::"
    "from walchannel.channel.replica import ReplicaGate": _ADAPTER,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._start::"
    "transport = GrpcTransport(config)": _ADAPTER,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._start::"
    "replica = ReplicaGate(socket, log, self._reporter.note)": _ADAPTER,
    "walchannel/channel/reporting.py::Reporter.record::return": (
        "an error to record on a closed log: only once the loop is gone (_abandon)"
    ),
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.stats::self._abandon()": _LOOP,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._loop_gone": _LOOP,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._check_loop::self._abandon()": _LOOP,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._check_loop::raise self._loop_gone()": (
        _LOOP
    ),
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._bind_loop": _LOOP,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._abandon": _LOOP,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._commit_rows::"
    "self._metrics.on_commit(seqs[0])": _METRICS,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.send_event::hooks.on_send(started)": (
        _METRICS
    ),
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.send_finding::hooks.on_send(started)": (
        _METRICS
    ),
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.send_findings::hooks.on_send(started)": (
        _METRICS
    ),
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.wait_acked::"
    'raise TypeError(f"wait_acked: seq must be an int, got {type(seq).__name__} {seq!r}")': (
        _MISUSE
    ),
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.handshake::"
    'raise ChannelClosedError(f"run {self._run_id}: the channel is closed")': _MISUSE,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.handshake::return": (
        "a second handshake() while streaming: tests/test_channel.py"
    ),
    "walchannel/channel/connection.py::ConnectionLoop._do_store_ack::return": (
        "an ack to store once the log is closed: close() stores the ack before it closes the "
        "log, and an ack is handed out to store once (Driver.ack_to_store)"
    ),
    "walchannel/channel/connection.py::ConnectionLoop._run::"
    'logger.exception("run %s: the connection loop failed", self._run_id)': _BUG,
    "walchannel/channel/connection.py::ConnectionLoop._run::"
    'what = f"{type(exc).__name__}: {exc}"': _BUG,
    "walchannel/channel/connection.py::ConnectionLoop._run::"
    'error = WalchannelError(f"run {self._run_id}: connection loop failed: {what}")': _BUG,
    "walchannel/channel/connection.py::ConnectionLoop._run::"
    "self.feed(ev.Failed(error, ev.Failure.INTERNAL, what))": _BUG,
    "walchannel/channel/connection.py::ConnectionLoop._log_damaged": _READ_FAILS,
    "walchannel/channel/refused_rows.py::RefusedRows.on_refusal::"
    "except WalchannelError as exc:": _READ_FAILS,
    "walchannel/channel/refused_rows.py::RefusedRows.on_refusal::logger.error(": (_READ_FAILS),
    "walchannel/channel/refused_rows.py::RefusedRows.on_refusal::"
    'self._reporter.record(f"{addr}: {text}")': _READ_FAILS,
    "walchannel/channel/refused_rows.py::RefusedRows.on_refusal::return None": _READ_FAILS,
    "walchannel/channel/connection.py::ConnectionLoop._do_say_down_too_large::logger.info(": (
        _STATUS_LOST
    ),
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._start::"
    "pending_token_hash = token_hash": _REPLACED_TOKEN,
    "walchannel/channel/connection.py::ConnectionLoop._do_start_stream::"
    'stored["token_sha256"] = self._pending_token_hash': _REPLACED_TOKEN,
    "walchannel/channel/connection.py::ConnectionLoop._do_start_stream::"
    "self._pending_token_hash = None": _REPLACED_TOKEN,
    "walchannel/channel/connection.py::ConnectionLoop._do_start_stream::logger.warning(": (
        _REPLACED_TOKEN
    ),
    "walchannel/channel/refused_rows.py::RefusedRows._asked_again::except WalchannelError:": (
        _READ_FAILS
    ),
    "walchannel/channel/refused_rows.py::RefusedRows._asked_again::return False": _READ_FAILS,
    "walchannel/channel/connection.py::ConnectionLoop.abandon": _LOOP,
    "walchannel/channel/waiters.py::Waiters.drop": _LOOP,
    "walchannel/channel/waiters.py::Waiters.state_changed::"
    "return  # their event loop is gone: nothing of it may be touched": _LOOP,
    "walchannel/channel/waiters.py::Waiters.wake_all::return": _LOOP,
    "walchannel/channel/reclaim.py::DiskReclaim.arm::except RuntimeError:": (_LOOP),
    "walchannel/channel/reclaim.py::DiskReclaim.arm::return": _LOOP,
    "walchannel/channel/reclaim.py::DiskReclaim.arm::"
    "timer.cancel()  # a long retry wait; new acks bring it forward": _NO_FILE,
    "walchannel/channel/reclaim.py::DiskReclaim.step::return": (
        "a checkpoint of a closed log: close() cancels the timer first"
    ),
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.close::"
    "if loop.is_closed() or not loop.is_running():": _LOOP,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.close::self._abandon()": _LOOP,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.close::return": _LOOP,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel.close::"
    "await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.close(), loop))": _LOOP,
    "walchannel/channel/grpc_channel.py::GrpcEngineChannel._mark_closed::self._metrics.close()": (
        _METRICS
    ),
    "walchannel/channel/connection.py::ConnectionLoop.aclose::"
    "except Exception as exc:": _TRANSPORT_CLOSE,
    "walchannel/channel/connection.py::ConnectionLoop.aclose::"
    'logger.debug("run %s: closing the network failed: %r", self._run_id, exc)': (_TRANSPORT_CLOSE),
    "walchannel/channel/connection.py::ConnectionLoop.aclose::"
    "closers.append(self._replica.aclose)": _ADAPTER,
    "walchannel/channel/connection.py::ConnectionLoop.stop::"
    "with contextlib.suppress(Exception):": _BUG,
    "walchannel/channel/connection.py::ConnectionLoop.stop::await self._stream.teardown()": _BUG,
    # -- channel/stream.py --------------------------------------------------------------
    "walchannel/channel/stream.py::Stream._read_loop::"
    'logger.exception("run %s: reading the stream failed", self._run_id)': _BUG,
    "walchannel/channel/stream.py::Stream._read_loop::self.finish(exc)": _BUG,
    "walchannel/channel/stream.py::Stream._write_loop::await replica.wait()": _ADAPTER,
    "walchannel/channel/stream.py::Stream._write_loop::"
    'logger.error("run %s: cannot read the log to write: %s", self._run_id, exc)': _READ_FAILS,
    "walchannel/channel/stream.py::Stream._write_loop::self.finish(exc)": _READ_FAILS,
    "walchannel/channel/stream.py::Stream._write_loop::self._on_fatal(exc)": _READ_FAILS,
    "walchannel/channel/stream.py::Stream._write_loop::except Exception as exc:": _BUG,
    "walchannel/channel/stream.py::Stream._write_loop::"
    'logger.exception("run %s: writing the stream failed", self._run_id)': _BUG,
    "walchannel/channel/stream.py::Stream.teardown::logger.warning(": _BUG,
    # -- row_source.py --------------------------------------------------------------------
    "walchannel/channel/row_source.py::RowSource._read_ahead::raise self._missing(seq)": _GAP,
    "walchannel/channel/row_source.py::RowSource._missing": _GAP,
}


def _functions(path: Path) -> list[tuple[int, int, str]]:
    """``(first line, last line, qualified name)`` of every function in ``path``."""
    tree = ast.parse(path.read_text())
    found: list[tuple[int, int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                end = child.end_lineno or child.lineno
                found.append((child.lineno, end, f"{prefix}{child.name}"))
                walk(child, f"{prefix}{child.name}.<locals>.")

    walk(tree, "")
    return found


def _where(path: Path, line: int) -> str:
    """The innermost function holding ``line``, or ``<module>``."""
    best = "<module>"
    for first, last, name in _functions(path):
        if first <= line <= last:
            best = name  # later (nested) definitions are inner ones
    return best


def measure(seed_args: list[str]) -> dict[str, list[int]]:
    """Run the simulator under coverage.py; return ``{file: missed lines}``."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "coverage.data"
        out = Path(tmp) / "coverage.json"
        env = {**os.environ, "COVERAGE_FILE": str(data)}
        include = ",".join(MEASURED)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "coverage",
                "run",
                f"--include={include}",
                str(ROOT / "tools" / "sim.py"),
                "--jobs",
                "1",
                "--quiet",
                *seed_args,
            ],
            cwd=ROOT,
            env=env,
            check=False,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            [sys.executable, "-m", "coverage", "json", "-o", str(out), f"--include={include}"],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        report = json.loads(out.read_text())
    missed: dict[str, list[int]] = {}
    totals = report["totals"]
    for name, info in report["files"].items():
        missed[name] = list(info["missing_lines"])
    missed["__totals__"] = [totals["covered_lines"], totals["num_statements"]]
    return missed


def check(missed: dict[str, list[int]]) -> tuple[list[str], list[str], int]:
    """Match missed lines with :data:`ALLOWED`.

    Returns:
        ``(missed lines not allowed, allowlist entries that matched nothing,
        allowed lines)``.
    """
    unexplained: list[str] = []
    used: set[str] = set()
    allowed = 0
    for name in MEASURED:
        path = ROOT / name
        lines = path.read_text().splitlines()
        for line in missed.get(name, []):
            function = _where(path, line)
            text = lines[line - 1].strip()
            for key in (f"{name}::{function}::{text}", f"{name}::{function}"):
                if key in ALLOWED:
                    used.add(key)
                    allowed += 1
                    break
            else:
                unexplained.append(f"{name}:{line} ({function}): {text}")
    stale = sorted(set(ALLOWED) - used)
    return unexplained, stale, allowed


def find_corpus(seeds: int) -> list[int]:
    """Pick few seeds of ``0 .. seeds-1`` that execute every line the sweep executes."""
    import coverage

    cov = coverage.Coverage(include=[str(ROOT / m) for m in MEASURED], data_file=None)
    cov.start()
    sys.path.insert(0, str(ROOT / "tools"))
    import sim  # measured from its import on

    per_seed: dict[int, set[tuple[str, int]]] = {}
    with sim._quiet_product():
        for seed in range(seeds):
            cov.switch_context(str(seed))
            sim.run_schedule(seed)
            # Its leftovers (coroutines and generators closed when collected)
            # run their last lines now, under this seed: not the next one's.
            gc.collect()
    cov.stop()
    data = cov.get_data()
    for file in data.measured_files():
        for line, contexts in data.contexts_by_lineno(file).items():
            for context in contexts:
                if context.isdigit():
                    per_seed.setdefault(int(context), set()).add((file, line))
    wanted = set().union(*per_seed.values()) if per_seed else set()
    chosen: list[int] = []
    covered: set[tuple[str, int]] = set()
    while covered != wanted:
        seed = max(per_seed, key=lambda s: len(per_seed[s] - covered))
        chosen.append(seed)
        covered |= per_seed.pop(seed)
    return sorted(chosen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/sim_coverage.py",
        description="Lines of the channel the simulator never executes, against an allowlist.",
        epilog="example: python tools/sim_coverage.py --corpus",
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--seeds", type=int, help="a sweep of seeds 0 .. N-1")
    group.add_argument("--corpus", action="store_true", help=f"the seeds of {CORPUS.name}")
    group.add_argument("--find-corpus", type=int, metavar="N", help="pick a corpus from N seeds")
    args = parser.parse_args(argv)
    if args.find_corpus is not None:
        chosen = find_corpus(args.find_corpus)
        CORPUS.write_text("".join(f"{s}\n" for s in chosen))
        print(f"{len(chosen)} seeds of {args.find_corpus} written to {CORPUS}")
        return 0
    seed_args = ["--seed-list", f"@{CORPUS}"] if args.corpus else ["--seeds", str(args.seeds)]
    missed = measure(seed_args)
    covered, statements = missed.pop("__totals__")
    unexplained, stale, allowed = check(missed)
    print(
        f"{covered} of {statements} statements executed ({100 * covered / statements:.1f}%); "
        f"{allowed} missed lines allowed with a reason, {len(unexplained)} not"
    )
    for line in unexplained:
        print(f"  not executed: {line}")
    for key in stale:
        print(f"  allowlist entry matches nothing missed: {key}")
    return 1 if unexplained or stale else 0


if __name__ == "__main__":
    sys.exit(main())
