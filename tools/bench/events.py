"""What the driver's events cost per row: ``python -m tools.bench.events``.

Issue 60 made every input of the driver an event (``Driver.handle``): a row
written allocates ``Writing`` and ``Written``, an ack ``AckReceived``, and
each is dispatched to its handler. This times the driver's per-row path
both ways in one process, interleaved: the baseline calls the decisions the
handlers call (``_writing``, ``_written``, ``_ack`` and the ack store's
check: what the channel called before issue 60), the other goes through
``handle`` with the events. Client CPU (``time.process_time``) per row,
median of ``--reps`` alternations of ``--rows`` rows each; every row is
acked (the worst case: ``ack/1``).

    python -m tools.bench.events --rows 200000 --reps 7
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace
from typing import Any

from walchannel.config import GrpcChannelConfig
from walchannel.core import events as ev
from walchannel.core.driver import Driver
from walchannel.log.state import LogState


def _driver(rows: int) -> Driver:
    """A streaming driver over ``rows`` logged rows (a stand-in log: the state the driver reads)."""
    log: Any = SimpleNamespace(state=LogState("r", rows + 1, 0, None, None, False))
    config = GrpcChannelConfig(
        grpc_addr="127.0.0.1:1", run_id="r", correlation_id="c", run_token="t"
    )
    d = Driver(config, log, failed_mark=False, now_ms=0.0)
    d.handle(ev.LoopStarted())
    d.handle(ev.Answered(0, 0.0))
    return d


def direct(rows: int) -> float:
    """CPU seconds for ``rows`` rows through the decisions, called directly."""
    d = _driver(rows)
    writing, written, ack, store = d._writing, d._written, d._ack, d._ack_to_store
    started = time.process_time()
    for seq in range(1, rows + 1):
        writing(seq)
        written(seq)
        ack(seq, 0.0)
        store(0.0)
    return time.process_time() - started


def handled(rows: int) -> float:
    """CPU seconds for ``rows`` rows through ``Driver.handle`` and the events."""
    d = _driver(rows)
    handle, writing, written, acked = d.handle, ev.Writing, ev.Written, ev.AckReceived
    started = time.process_time()
    for seq in range(1, rows + 1):
        handle(writing(seq))
        handle(written(seq))
        handle(acked(seq, 0.0))
    return time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.events", description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args(argv)
    base: list[float] = []
    events: list[float] = []
    for _ in range(args.reps):
        base.append(direct(args.rows) / args.rows * 1e6)
        events.append(handled(args.rows) / args.rows * 1e6)
    b, e = statistics.median(base), statistics.median(events)
    print(f"rows={args.rows} reps={args.reps} (client CPU per row: written once, acked once)")
    print(f"  decisions called directly (baseline): {b:.3f} µs  {[round(x, 3) for x in base]}")
    print(f"  through handle(event):                {e:.3f} µs  {[round(x, 3) for x in events]}")
    print(f"  events cost {e - b:+.3f} µs per row; ratio {e / b:.2f}x the baseline")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
