"""The deterministic simulator (tools/sim.py): a short sweep, and it bites.

The long sweep is ``make sim`` / ``python tools/sim.py --seeds 1000000``
(docs/reliability.md). Here: a few seconds of schedules must find nothing;
each planted bug, a realistic mistake in the code the channel runs, must be
found within a bounded number of seeds; the simulated disk must agree with
the real ``RunLog`` transaction by transaction.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import random
import sqlite3
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from walchannel import log_state
from walchannel import protocol as P
from walchannel import session as S
from walchannel.log import RunLog
from walchannel.log_state import AckPlan, LogState

ROOT = Path(__file__).resolve().parent.parent


def _load_sim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("walchannel_sim", ROOT / "tools" / "sim.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sim = _load_sim()

#: Schedules in the clean sweep (about 10 s on one idle core: the real RunLog on SQLite).
SWEEP = 3_000
#: Every planted bug must be found within this many seeds.
BOUND = 1_000


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
        "engine_losses",
        "engine_behind",
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


def _finding_of(row: Any) -> int:
    return sim.DONE if row.kind == "done" else int(row.body["fields"]["i"])


@pytest.mark.parametrize("seed", range(12))
def test_runlog_on_a_connection_is_the_file_log(tmp_path: Path, seed: int) -> None:
    """The seam the simulator uses: the same transactions on ``:memory:`` and on the file."""
    rng = random.Random(seed)
    conn = sqlite3.connect(":memory:", isolation_level=None)
    image = b""

    def open_memory() -> RunLog:
        nonlocal conn
        conn = sqlite3.connect(":memory:", isolation_level=None)
        if image:
            conn.deserialize(image)
        return RunLog.on_connection(conn, run_id="run", correlation_id="c", create=not image)

    real = RunLog.open(tmp_path, "run", correlation_id="c")
    mem = open_memory()
    found = 0
    try:
        for _ in range(40):
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
                marker = {"n": found} if rng.random() < 0.7 else None
                assert real.append_many(bodies, progress=marker) == mem.append_many(
                    bodies, progress=marker
                )
            elif r < 0.7 and real.high_water > 0:
                seq = rng.randint(0, real.high_water)
                assert real.ack(seq) == mem.ack(seq)
            elif r < 0.85 and real.unverified_from is not None:
                h = real.last_acked_seq + rng.choice((0, 0, 1, 3, 10, 40))
                assert real.verify(h) == mem.verify(h)
            else:
                real.close()
                image = conn.serialize()  # the simulator's crash: the committed image
                mem.close()
                real = RunLog.open(tmp_path, "run", correlation_id="c")
                mem = open_memory()
            assert real.state == mem.state
            assert real.progress == mem.progress
            rows = [(row.seq, _finding_of(row)) for row in real.unacked()]
            assert rows == [(row.seq, _finding_of(row)) for row in mem.unacked()]
            a, b = real.meta(), mem.meta()
            assert (a.last_acked_seq, a.high_water, a.unverified_from) == (
                b.last_acked_seq,
                b.high_water,
                b.unverified_from,
            )
            assert (a.completed_at is None) == (b.completed_at is None)
    finally:
        real.close()
        mem.close()


def test_next_seq_at_open_is_what_runlog_does(tmp_path: Path) -> None:
    with RunLog.open(tmp_path, "run", correlation_id="c") as wal:
        wal.append_many([("finding", {"fields": {}})] * 3)
        wal.ack(3)  # every row gone: MAX(seq)+1 would say 1
    with RunLog.open(tmp_path, "run", correlation_id="c") as wal:
        meta = wal.meta()
        assert wal.next_seq == P.next_seq_at_open(meta.high_water, None, meta.last_acked_seq) == 4


# -- it bites: mutations planted in walchannel/ itself --------------------------------
#
# Each plant replaces a function or method of the product (walchannel.log_state,
# walchannel.protocol, walchannel.session) with a mutated copy, through
# monkeypatch: the simulator's RunLog, Cursor and SimDriver then run the mutated
# code, as GrpcEngineChannel would. The log's mutations come first, then the
# channel's decisions.

_at_open = LogState.at_open.__func__  # type: ignore[attr-defined]
_ack = LogState.ack
_verify = LogState.verify
_store = LogState._store
_read_after = LogState.read_after
_ack_to_store = P.Cursor.ack_to_store
_on_stream_up = P.ReconnectPolicy.on_stream_up
_plan_answer = S.plan_answer
_plan_end = S.plan_end


def _next_seq_restarts(cls: type[LogState], run_id: str, **kw: Any) -> LogState:
    # The next seq from the rows alone: after an all-acked reopen it restarts.
    state = _at_open(cls, run_id, **kw)
    top = kw["top_seq"]
    return state._replace(next_seq=(top or 0) + 1)


def _ack_deletes_one_more(self: LogState, seq: int) -> AckPlan | None:
    # Off by one in the delete: the first unacked row goes too.
    plan = _ack(self, seq)
    return None if plan is None else dataclasses.replace(plan, delete_through=seq + 1)


def _renumber_start_late(self: LogState, engine_high: int) -> AckPlan:
    # The log renumbers from one row later than the cursor (and the state) say.
    plan = _verify(self, engine_high)
    if plan.shift_from is None:
        return plan
    return dataclasses.replace(plan, shift_from=plan.shift_from + 1)


def _no_renumber(self: LogState, engine_high: int) -> AckPlan:
    # The state says the rows moved; the log moves none.
    return dataclasses.replace(_verify(self, engine_high), shift_from=None)


def _shift_one_short(unverified_from: int | None, engine_high: int) -> int:
    if unverified_from is None or engine_high < unverified_from:
        return 0
    return engine_high - unverified_from


def _no_verification(unverified_from: int | None, engine_high: int) -> int:
    return 0


def _tombstone_one_early(self: LogState, seq: int, shift: int, *, verify: bool) -> AckPlan:
    # Completed when the row before Done is acked, not Done itself.
    plan = _store(self, seq, shift, verify=verify)
    done = plan.state.done_seq
    if done is None or plan.delete_through < done - 1:
        return plan
    state = plan.state._replace(done_seq=None, completed=True)
    return dataclasses.replace(plan, state=state, completed=True)


def _read_one_late(self: LogState, after_seq: int) -> int:
    return max(after_seq, self.last_acked) + 1


def _store_done_once_written(self: P.Cursor, now_ms: float, *, force: bool = False) -> int | None:
    # "The engine acks Done at once": store (tombstone) it as soon as it is written.
    done = self.done_seq
    if done is not None and self.stored < done < self.write_pos:
        return done
    return _ack_to_store(self, now_ms, force=force)


def _reset_on_answer(self: P.ReconnectPolicy, now_ms: float) -> None:
    # The handshake answer taken as progress: reset the attempt counter.
    _on_stream_up(self, now_ms)
    self.attempt = 0


def _verify_taken_as_resume(
    cursor: P.Cursor, engine_high: int | None, *, failed_mark: bool
) -> S.AnswerPlan:
    # An answer above the received ack taken as an ordinary resume: no verification.
    plan = _plan_answer(cursor, engine_high, failed_mark=failed_mark)
    if plan.step is S.AnswerStep.VERIFY and engine_high is not None and engine_high > cursor.acked:
        cursor.verifying = None
        return S.AnswerPlan(S.AnswerStep.ACK, engine_high + 1, plan.clear_failed_mark)
    return plan


def _verify_replay_skips_a_row(
    cursor: P.Cursor, engine_high: int | None, *, failed_mark: bool
) -> S.AnswerPlan:
    # The replay after a verification starts one row late.
    plan = _plan_answer(cursor, engine_high, failed_mark=failed_mark)
    if plan.step is S.AnswerStep.VERIFY and plan.replay_from is not None:
        return dataclasses.replace(plan, replay_from=plan.replay_from + 1)
    return plan


def _run_completed_reconnects(code: str | None, details: str, debug: str, *, final: bool) -> Any:
    # "run completed" read as one more cut: back off and dial again.
    plan = _plan_end(code, details, debug, final=final)
    if plan.outcome is S.EndOutcome.RUN_COMPLETED:
        return S.EndPlan(S.EndOutcome.RECONNECT, plan.double_keepalive)
    return plan


def _run_completed_keeps_done(state: LogState) -> S.RunCompletedPlan:
    # "run completed" never completes the log, even when it holds our Done.
    return S.RunCompletedPlan(tombstone=False, mark_undeliverable=state.unacked_count > 0)


def _reset_on_any_ack(self: P.ReconnectPolicy, seq: int) -> None:
    # Any ack (the handshake's answer too) taken as progress.
    self.attempt = 0


def _store_one_above_received(self: P.Cursor, now_ms: float, *, force: bool = False) -> int | None:
    # Coalescing stores one more than was received (never above the high-water).
    seq = _ack_to_store(self, now_ms, force=force)
    return None if seq is None else min(seq + 1, self.high_water)


def _behind_one_below_accepted(self: P.Cursor, engine_high: int) -> P.Answer:
    # Cursor.on_answer with the engine-behind rule off by one: h = stored - 1 passes.
    if engine_high < self.stored - 1:
        return P.Answer(P.AnswerKind.BEHIND, 0)
    unverified = self.unverified_from
    if unverified is not None:
        self.verifying = (unverified, self.high_water + 1)
        return P.Answer(P.AnswerKind.VERIFY, engine_high + 1)
    if engine_high > self.high_water:
        return P.Answer(P.AnswerKind.AHEAD, self.acked + 1)
    if engine_high < self.acked:
        return P.Answer(P.AnswerKind.FORGOT, engine_high + 1)
    return P.Answer(P.AnswerKind.RESUME, engine_high + 1)


# name -> (owner, attribute, mutated value, symptoms one of which the report names)
PLANTED: dict[str, tuple[Any, str, Any, tuple[str, ...]]] = {
    "next_seq_restarts_after_all_acked_reopen": (
        LogState,
        "at_open",
        classmethod(_next_seq_restarts),
        ("two contents", "never applied", "applied 0 times", "above", "exceeds"),
    ),
    "ack_deletes_one_unacked_row": (
        LogState,
        "ack",
        _ack_deletes_one_more,
        ("not in the log", "never applied", "applied 0 times"),
    ),
    "renumber_start_off_by_one": (
        LogState,
        "verify",
        _renumber_start_late,
        ("not in the log", "two contents", "never applied", "applied 0 times"),
    ),
    "no_renumber": (
        LogState,
        "verify",
        _no_renumber,
        ("not in the log", "two contents", "never applied", "applied 0 times"),
    ),
    "verification_shift_off_by_one": (
        log_state,
        "verification_shift",
        _shift_one_short,
        ("two contents", "never applied", "applied 0 times", "not in the log"),
    ),
    "skip_verification": (
        log_state,
        "verification_shift",
        _no_verification,
        ("two contents", "never applied", "applied 0 times"),
    ),
    "tombstone_before_done_ack": (
        LogState,
        "_store",
        _tombstone_one_early,
        ("lacks Done", "never applied", "Done applied 0 times", "stuck"),
    ),
    "replay_read_one_late": (
        LogState,
        "read_after",
        _read_one_late,
        ("not in the log", "never applied", "stuck"),
    ),
    "ack_stored_before_done_acked": (
        P.Cursor,
        "ack_to_store",
        _store_done_once_written,
        ("exceeds what the engine has", "lacks Done"),
    ),
    "backoff_reset_on_answer": (
        P.ReconnectPolicy,
        "on_stream_up",
        _reset_on_answer,
        ("backoff reset without progress", "tight loop"),
    ),
    "backoff_reset_on_any_ack": (
        P.ReconnectPolicy,
        "on_ack",
        _reset_on_any_ack,
        ("backoff reset without progress", "tight loop"),
    ),
    "ack_stored_above_received": (
        P.Cursor,
        "ack_to_store",
        _store_one_above_received,
        ("exceeds what the engine has", "lacks Done", "never applied"),
    ),
    "engine_behind_one_below_stored_accepted": (
        P.Cursor,
        "on_answer",
        _behind_one_below_accepted,
        ("gap", "exception", "not in the log", "never applied"),
    ),
    "answer_above_cursor_resumes_instead_of_verifying": (
        S,
        "plan_answer",
        _verify_taken_as_resume,
        ("protocol error", "two contents", "never applied", "exception", "gap"),
    ),
    "replay_after_verification_skips_a_row": (
        S,
        "plan_answer",
        _verify_replay_skips_a_row,
        ("gap", "never applied"),
    ),
    "run_completed_reconnects": (
        S,
        "plan_end",
        _run_completed_reconnects,
        ("stuck", "tight loop", "lacks Done"),
    ),
    "run_completed_keeps_a_logged_done": (
        S,
        "plan_run_completed",
        _run_completed_keeps_done,
        ("no tombstone",),
    ),
}


def _first_failing() -> Any:
    for seed in range(BOUND):
        w = sim.run_schedule(seed)
        if w.violations:
            return w
    return None


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_bug_is_found(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    owner, attribute, mutant, symptoms = PLANTED[name]
    monkeypatch.setattr(owner, attribute, mutant)
    found = _first_failing()
    assert found is not None, f"{name}: no violation within {BOUND} seeds"
    assert any(s in v for v in found.violations for s in symptoms), found.report()
    assert f"seed {found.seed}" in found.report()


def test_correct_core_is_restored_after_planting() -> None:
    # The monkeypatches above are undone: the same seeds are clean again.
    assert sim.sweep(range(40), "both").failing == 0
