"""Where the client's time goes against the fast engine, by taking steps out.

``python -m tools.bench.attribute [--ack-every N] [--n N] [--reps R]``

Runs the walchannel arm and the bare arm of the ``fast`` rows
(:mod:`tools.bench.fast_engine`) in this process, interleaved, first as
shipped and then with one step of the send path replaced by nothing: the
payload check (``messages.plain_payload``), the row's commit (the SQL of
``RunLog.append``; acks are still stored), both, the ``stat`` after each
commit (``RunLog._files_moved``), the unpacking of the committed bytes the
writer writes from (the tail's ``msgpack.unpackb``), all four, and the
writer cut to its least (``lean writer``: the row, its two driver events
and the write; what trimming the writer could save at most). Prints
the client CPU per message of each variant and its difference to the bare
stream, and the floor: the bare stream with a raw SQLite commit before each
write, in one loop (:func:`tools.bench.limit.bare_arm`). A variant
is a measurement, never a product setting: without the commit nothing is
durable, and without the unpacking a harness that changes its dict after a
send would see the change written.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any
from unittest.mock import patch

from tools.bench.cases import Context, bare_e2e, wal_e2e
from tools.bench.cli import pin_cpus
from tools.bench.common import Sizes, finding_pool
from tools.bench.engine import Engines
from tools.bench.limit import bare_arm
from walchannel.channel import row_source
from walchannel.channel.row_source import RowSource
from walchannel.channel.stream import Stream
from walchannel.core.events import Writing, Written
from walchannel.log.writer import RunLog
from walchannel.wire import messages


def _without_check() -> AbstractContextManager[Any]:
    return patch.object(messages, "plain_payload", lambda value, path, **_: value)


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

    # Rows not committed cannot be read back: the writer must find every one
    # in the tail, however far behind it falls.
    with patch.object(RunLog, "_commit", commit), patch.object(row_source, "TAIL_BYTES", 1 << 40):
        yield


@contextmanager
def _both() -> Iterator[None]:
    with _without_check(), _without_commit():
        yield


def _without_files_check() -> AbstractContextManager[Any]:
    # The stat after every commit (SPEC "The log": its files removed while open).
    return patch.object(RunLog, "_files_moved", lambda self: None)


@contextmanager
def _without_unpack() -> Iterator[None]:
    # The writer takes the body the send checked instead of unpacking the
    # committed bytes (unsafe: the harness may change its dict after the send).
    prepare = RowSource.prepare
    bodies: dict[int, Any] = {}

    def remember(self: RowSource, kind: str, body: dict[str, Any]) -> tuple[str, bytes]:
        item = prepare(self, kind, body)
        bodies[id(item[1])] = body
        return item

    class _Unpack:
        @staticmethod
        def unpackb(blob: bytes, **_: Any) -> Any:
            return bodies.pop(id(blob))

    with patch.object(RowSource, "prepare", remember), patch.object(row_source, "msgpack", _Unpack):
        yield


async def _lean_write_loop(self: Stream) -> None:
    # The least a writer does: a row, its two driver events, the write; no
    # heartbeat, no watchdog bookkeeping, no written bound kept, the bare
    # grpc.aio call (an upper bound of what trimming the writer could save).
    call = getattr(self.call, "_call", self.call)
    driver, row_bytes, wakeup = self._driver, self._rows.row_bytes, self._wakeup
    handle, next_to_write = driver.handle, driver.next_to_write
    while True:
        seq = next_to_write()
        if seq is None:
            wakeup.clear()
            if next_to_write() is None:
                if driver.final:
                    return
                await wakeup.wait()
            continue
        data = row_bytes(seq)
        handle(Writing(seq))
        await call.write(data)
        handle(Written(seq))


def _lean_writer() -> AbstractContextManager[Any]:
    return patch.object(Stream, "_write_loop", _lean_write_loop)


@contextmanager
def _all_of_them() -> Iterator[None]:
    with _without_check(), _without_commit(), _without_files_check(), _without_unpack():
        yield


VARIANTS: dict[str, Callable[[], Any]] = {
    "as shipped": nullcontext,
    "no payload check": _without_check,
    "no commit": _without_commit,
    "no check, no commit": _both,
    "no stat after commit": _without_files_check,
    "no unpack of the tail": _without_unpack,
    "none of these four": _all_of_them,
    "lean writer": _lean_writer,
}


async def _run(ctx: Context, engine: Any, n: int, reps: int) -> None:
    print(f"client CPU per message (µs, median of {reps}), {n} send_finding, fast engine")
    await wal_e2e(ctx, engine, 1000, 1, "process")  # warm up both ends
    await bare_e2e(ctx, engine, 1000)
    wal: dict[str, list[float]] = {name: [] for name in VARIANTS}
    bare: dict[str, list[float]] = {name: [] for name in VARIANTS}
    floor: dict[str, list[float]] = {"bare": [], "both": []}
    for _ in range(reps):  # the variants interleaved, so a load change hits them all
        floor["both"].append(
            (await bare_arm(ctx, engine, n, commit=True, hand_off=False))["cpu_us"]
        )
        floor["bare"].append((await bare_e2e(ctx, engine, n))["cpu_us"])
        for name, variant in VARIANTS.items():
            with variant():
                wal[name].append((await wal_e2e(ctx, engine, n, 1, "process"))["cpu_us"])
                bare[name].append((await bare_e2e(ctx, engine, n))["cpu_us"])
    for name in VARIANTS:
        w, b = statistics.median(wal[name]), statistics.median(bare[name])
        print(f"  {name:<22} walchannel {w:6.1f}  bare {b:6.1f}  difference {w - b:+6.1f}")
    b, c = statistics.median(floor["bare"]), statistics.median(floor["both"])
    print(
        f"  {'bare + raw commit':<22} one loop   {c:6.1f}  bare {b:6.1f}  difference {c - b:+6.1f}"
    )


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
