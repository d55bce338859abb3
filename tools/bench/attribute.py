"""Where the client's time goes against the fast engine, by taking steps out.

``python -m tools.bench.attribute [--ack-every N] [--n N] [--reps R]``

Runs the walchannel arm and the bare arm of the ``fast`` rows
(:mod:`tools.bench.fast_engine`) in this process, interleaved, first as
shipped and then with one step of the send path replaced by nothing: the
payload check (``messages.plain_payload``), the row's commit (the SQL of
``RunLog.append``; acks are still stored), and both. Prints the client CPU
per message of each variant and its difference to the bare stream. A
variant is a measurement, never a product setting: without the commit
nothing is durable.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tools.bench.cases import Context, bare_e2e, wal_e2e
from tools.bench.cli import pin_cpus
from tools.bench.common import Sizes, finding_pool
from tools.bench.engine import Engines
from walchannel.log.writer import RunLog
from walchannel.wire import messages


@contextmanager
def _without_check() -> Iterator[None]:
    original = messages.plain_payload
    messages.plain_payload = lambda value, path, **_: value  # type: ignore[assignment]
    try:
        yield
    finally:
        messages.plain_payload = original


@contextmanager
def _without_commit() -> Iterator[None]:
    original = RunLog._commit

    def commit(
        self: RunLog, label: str, what: str, work: Any, *, single: bool = False, then: Any = None
    ) -> Any:
        if label == "append":
            if then is not None:
                then(None)  # the log's memory follows as if the rows had landed
            return None
        return original(self, label, what, work, single=single, then=then)

    RunLog._commit = commit  # type: ignore[method-assign]
    try:
        yield
    finally:
        RunLog._commit = original  # type: ignore[method-assign]


@contextmanager
def _both() -> Iterator[None]:
    with _without_check(), _without_commit():
        yield


@contextmanager
def _as_shipped() -> Iterator[None]:
    yield


VARIANTS: dict[str, Callable[[], Any]] = {
    "as shipped": _as_shipped,
    "no payload check": _without_check,
    "no commit": _without_commit,
    "no check, no commit": _both,
}


async def _run(ctx: Context, engine: Any, n: int, reps: int) -> None:
    print(f"client CPU per message (µs, median of {reps}), {n} send_finding, fast engine")
    await wal_e2e(ctx, engine, 1000, 1, "process")  # warm up both ends
    await bare_e2e(ctx, engine, 1000)
    wal: dict[str, list[float]] = {name: [] for name in VARIANTS}
    bare: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(reps):  # the variants interleaved, so a load change hits them all
        for name, variant in VARIANTS.items():
            with variant():
                wal[name].append((await wal_e2e(ctx, engine, n, 1, "process"))["cpu_us"])
                bare[name].append((await bare_e2e(ctx, engine, n))["cpu_us"])
    for name in VARIANTS:
        w, b = statistics.median(wal[name]), statistics.median(bare[name])
        print(f"  {name:<22} walchannel {w:6.1f}  bare {b:6.1f}  difference {w - b:+6.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ack-every", type=int, default=50)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="walchannel-attribute-"))
    pinning = pin_cpus(enabled=True)
    engines = Engines(folder, pinning[1] if pinning else None)
    ctx = Context(
        sizes=Sizes.full(), folder=folder, engines=engines, pool=finding_pool(), say=lambda _: None
    )
    try:
        print(f"ack every {args.ack_every}")
        asyncio.run(_run(ctx, engines.fast(args.ack_every), args.n, args.reps))
    finally:
        engines.close()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
