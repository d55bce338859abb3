"""The deterministic simulator (tools/sim.py): a short sweep, and it bites.

The long sweep is ``make sim`` / ``python tools/sim.py --seeds 1000000``
(docs/reliability.md). Here: a few seconds of schedules must find nothing;
each planted bug, a realistic mistake in the code the channel runs, must be
found within a bounded number of seeds; the simulated disk must agree with
the real ``RunLog`` transaction by transaction.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from walchannel import protocol as P
from walchannel.log import RunLog

ROOT = Path(__file__).resolve().parent.parent


def _load_sim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("walchannel_sim", ROOT / "tools" / "sim.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sim = _load_sim()

#: Schedules in the clean sweep (about 3 s on one core).
SWEEP = 6_000
#: Every planted bug must be found within this many seeds.
BOUND = 3_000


def test_short_sweep_finds_no_violation() -> None:
    totals = sim.sweep(range(SWEEP), "both")
    assert totals.schedules == SWEEP
    assert totals.failing == 0, "\n\n".join(text for _, text in totals.violations[:3])
    st = totals.stats
    # The sweep exercised what it claims to.
    for key in (
        "crashes",
        "power_losses",
        "lost_logs",
        "restores",
        "engine_replacements",
        "cuts",
        "goaways",
        "stalls",
        "late_answers",
        "disk_full",
        "flushes",
        "shifts",
        "dup_by_content",
    ):
        assert st[key] > 0, key
    assert totals.max_dials_per_s <= 3


def test_a_schedule_is_a_pure_function_of_its_seed() -> None:
    for seed in (3, 164, 4711):
        a = sim.run_schedule(seed)
        b = sim.run_schedule(seed)
        assert (a.events, a.stats, a.applied, list(a.trace)) == (
            b.events,
            b.stats,
            b.applied,
            list(b.trace),
        )
        assert a.now == b.now


def test_cli_sweep_and_replay(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["--seeds", "300", "--jobs", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "schedules=300" in out
    assert "violations=0" in out
    assert sim.main(["--replay", "164"]) == 0
    out = capsys.readouterr().out
    assert "verify h=" in out
    assert "seed 164: no violation" in out


# -- the simulated disk is RunLog ---------------------------------------------------


def _quiet_world(seed: int) -> Any:
    w = sim.World(seed)
    w.next_crash = -1
    w.crash_points = []
    w.applied = [0] * 100_000  # the engine "has" everything: no cursor check here
    w.logged = [0] * 10_000
    return w


def _finding_of(row: Any) -> int:
    return sim.DONE if row.kind == "done" else int(row.body["fields"]["i"])


@pytest.mark.parametrize("seed", range(40))
def test_simlog_mirrors_runlog(tmp_path: Path, seed: int) -> None:
    """Random appends, acks, verifications and reopens: same seqs, cursor, rows and meta."""
    rng = random.Random(seed)
    w = _quiet_world(seed)
    real = RunLog.open(tmp_path, "run", correlation_id="c")
    mirror = sim.SimLog(w)
    found = 0
    try:
        for _ in range(50):
            if real.completed:
                break
            r = rng.random()
            if r < 0.45 and real.done_seq is None:
                items = list(range(found, found + rng.randint(1, 3)))
                found += len(items)
                bodies: list[tuple[str, dict[str, Any]]] = [
                    ("finding", {"fields": {"i": i}}) for i in items
                ]
                if rng.random() < 0.08:
                    bodies.append(("done", {"status": "completed"}))
                    items.append(sim.DONE)
                marker = found if rng.random() < 0.7 else None
                got = real.append_many(bodies, progress=None if marker is None else {"n": marker})
                assert got == list(mirror.append_many(items, marker))
            elif r < 0.7 and real.high_water > 0:
                seq = rng.randint(0, real.high_water)
                assert real.ack(seq) == mirror.ack(seq)
            elif r < 0.85 and real.unverified_from is not None:
                h = real.last_acked_seq + rng.choice((0, 0, 1, 3, 10, 40))
                assert real.verify(h) == mirror.verify(h)
            else:
                real.close()
                mirror.close()
                real = RunLog.open(tmp_path, "run", correlation_id="c")
                mirror = sim.SimLog(w)
            progress = None if real.progress is None else real.progress["n"]
            assert (
                real.next_seq,
                real.last_acked_seq,
                real.unverified_from,
                real.done_seq,
                real.completed,
                progress,
            ) == (
                mirror.next_seq,
                mirror.last_acked,
                mirror.unverified,
                mirror.done_seq,
                mirror.completed,
                mirror.progress,
            )
            disk = w.disk.states[-1]
            assert [(row.seq, _finding_of(row)) for row in real.unacked()] == sorted(
                (q, c) for q, c in disk.rows.items() if q > mirror.last_acked
            )
            meta = real.meta()
            assert (
                meta.last_acked_seq,
                meta.high_water,
                meta.unverified_from,
                meta.completed_at is not None,
            ) == (disk.last_acked, disk.high_water, disk.unverified, disk.completed)
    finally:
        real.close()


def test_next_seq_at_open_is_what_runlog_does(tmp_path: Path) -> None:
    with RunLog.open(tmp_path, "run", correlation_id="c") as wal:
        wal.append_many([("finding", {"fields": {}})] * 3)
        wal.ack(3)  # every row gone: MAX(seq)+1 would say 1
    with RunLog.open(tmp_path, "run", correlation_id="c") as wal:
        meta = wal.meta()
        assert wal.next_seq == P.next_seq_at_open(meta.high_water, None, meta.last_acked_seq) == 4


# -- it bites: planted bugs ------------------------------------------------------------


def _max_seq_plus_one(high_water: int, top_seq: int | None, last_acked_seq: int) -> int:
    # (1) the next seq from the rows alone, ignoring the stored cursor and high-water.
    return (top_seq or 0) + 1


_original_ack_to_store = P.Cursor.ack_to_store


def _store_done_once_written(self: P.Cursor, now_ms: float, *, force: bool = False) -> int | None:
    # (3) "the engine acks Done at once": store (tombstone) it as soon as it is written.
    if self.done_seq is not None and self.stored < self.done_seq < self.write_pos:
        return self.done_seq
    return _original_ack_to_store(self, now_ms, force=force)


def _no_verification(unverified_from: int | None, engine_high: int) -> int:
    # (4) the verification rule skipped: never move the unverified rows.
    return 0


_original_on_stream_up = P.ReconnectPolicy.on_stream_up


def _reset_on_answer(self: P.ReconnectPolicy, now_ms: float) -> None:
    # (5) the handshake answer taken as progress: reset the attempt counter.
    _original_on_stream_up(self, now_ms)
    self.attempt = 0


Plant = Callable[[pytest.MonkeyPatch], dict[str, bool]]


def _plant_1(mp: pytest.MonkeyPatch) -> dict[str, bool]:
    mp.setattr(P, "next_seq_at_open", _max_seq_plus_one)
    return {}


def _plant_2(mp: pytest.MonkeyPatch) -> dict[str, bool]:
    # (2) the row handed to the writer before its commit (the order lives in the driver).
    return {"write_before_commit": True}


def _plant_3(mp: pytest.MonkeyPatch) -> dict[str, bool]:
    mp.setattr(P.Cursor, "ack_to_store", _store_done_once_written)
    return {}


def _plant_4(mp: pytest.MonkeyPatch) -> dict[str, bool]:
    mp.setattr(P, "verification_shift", _no_verification)
    return {}


def _plant_5(mp: pytest.MonkeyPatch) -> dict[str, bool]:
    mp.setattr(P.ReconnectPolicy, "on_stream_up", _reset_on_answer)
    return {}


PLANTED: dict[str, tuple[Plant, tuple[str, ...]]] = {
    "next_seq_from_max_row": (_plant_1, ("never applied", "applied 0 times", "stuck", "above")),
    "write_before_commit": (_plant_2, ("above the high-water", "applied 2 times", "two contents")),
    "tombstone_before_done_ack": (_plant_3, ("exceeds what the engine has", "lacks Done")),
    "skip_verification": (_plant_4, ("applied 0 times", "two contents", "never applied")),
    "backoff_reset_on_answer": (_plant_5, ("backoff reset without progress", "tight loop")),
}


def _first_failing(options: dict[str, bool]) -> Iterator[Any]:
    for seed in range(BOUND):
        w = sim.run_schedule(seed, **options)
        if w.violations:
            yield w
            return


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_bug_is_found(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plant, symptoms = PLANTED[name]
    options = plant(monkeypatch)
    found = next(_first_failing(options), None)
    assert found is not None, f"{name}: no violation within {BOUND} seeds"
    assert any(s in v for v in found.violations for s in symptoms), found.report()
    assert f"seed {found.seed}" in found.report()


def test_correct_core_is_restored_after_planting() -> None:
    # The monkeypatches above are undone: the same seeds are clean again.
    assert sim.sweep(range(40), "both").failing == 0
