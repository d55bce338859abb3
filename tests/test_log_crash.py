"""SIGKILL a child in the middle of appends and acks; the reopened log must agree with it."""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import HELPERS, PYTHON, child_env
from walchannel.log import RunLog

CHILD = str(HELPERS / "log_child.py")
POINTS = ("before_commit", "after_commit", "before_ack", "after_ack", "after_open")


class Record:
    """What the children reported, across restarts."""

    def __init__(self) -> None:
        self.committed: set[int] = set()
        self.acked = 0
        self.marker: Any = None  # last committed progress marker
        self.pending: tuple[int, Any] | None = None  # (n, marker) begun, not reported

    def feed(self, lines: list[str]) -> None:
        self.pending = None
        for line in lines:
            word, _, rest = line.partition(" ")
            if word == "begin":
                n, marker = rest.split(" ", 1)
                self.pending = (int(n), json.loads(marker))
            elif word == "commit":
                first, last, marker = rest.split(" ", 2)
                self.committed.update(range(int(first), int(last) + 1))
                if json.loads(marker) is not None:
                    self.marker = json.loads(marker)
                self.pending = None
            elif word == "acked":
                self.acked = max(self.acked, int(rest))


def check(wal_dir: Path, record: Record) -> None:
    with RunLog.open(wal_dir, "crash", correlation_id="c") as wal:
        on_disk = {r.seq for r in wal.unacked()}
        cursor = wal.last_acked_seq
        top = max(record.committed, default=0)
        assert cursor >= record.acked
        for seq in record.committed:
            assert seq in on_disk or seq <= cursor, f"committed seq {seq} lost"
        assert wal.next_seq > top
        extra = sorted(s for s in on_disk if s > top)
        if record.pending is None:
            assert extra == [] and wal.progress == record.marker
        else:
            n, marker = record.pending
            # The in-flight transaction landed whole, or not at all.
            assert extra in ([], list(range(top + 1, top + n + 1))), extra
            if marker is not None and extra:
                assert wal.progress == marker
            else:
                assert wal.progress == record.marker
            if extra:
                record.committed.update(extra)
                if marker is not None:
                    record.marker = marker
            record.pending = None
        assert on_disk == set(range(cursor + 1, wal.next_seq)) or not on_disk


def run_child(wal_dir: Path, seed: int, extra: list[str], kill_after: float | None) -> list[str]:
    child = subprocess.Popen(
        [PYTHON, CHILD, str(wal_dir), "crash", str(seed), *extra],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert child.stdout is not None
    if kill_after is not None:
        first = child.stdout.readline()  # opened
        time.sleep(kill_after)
        child.kill()
        rest = child.stdout.read()
        child.wait()
        return [line for line in (first + rest).splitlines() if line]
    out, _ = child.communicate(timeout=60)
    assert child.returncode == -9, child.returncode
    return [line for line in out.splitlines() if line]


@pytest.mark.parametrize("point", POINTS)
def test_kill_at_named_points(wal_dir: Path, point: str) -> None:
    rng = random.Random(point)
    record = Record()
    for i in range(4):
        lines = run_child(wal_dir, rng.randrange(10**6), [point, str(rng.randint(1, 40))], None)
        record.feed(lines)
        check(wal_dir, record)
        assert i == 0 or lines[0].startswith("opened")


def test_kill_at_random_moments(wal_dir: Path) -> None:
    rng = random.Random(7)
    record = Record()
    for _ in range(15):
        record.feed(run_child(wal_dir, rng.randrange(10**6), [], rng.uniform(0.0, 0.15)))
        check(wal_dir, record)
    assert len(record.committed) > 50
