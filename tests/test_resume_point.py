"""The engine keeps the resume point (issue 55): a lost log taken over costs nothing twice.

Real processes: ``walchannel run`` (``tests/helpers/runner_harness.py``)
against the local engine on loopback, SIGKILLed mid-scan; its log folder is
deleted; the next start is fenced; ``walchannel takeover`` marks the new log;
the restarted runner resumes from the engine's resume point. Every finding is
audited by content, and the ``Done`` count. With an engine that does not keep
the point, the same steps show the documented cost: what the old writer
delivered comes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import shutil
import signal
import sqlite3
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_runner_processes import BOUND_S, Harness, manifest_for, start

from conftest import child_env, eventually, log_on_connection, new_run
from helpers.rogue import RogueEngine, RogueStream
from walchannel import GrpcEngineChannel, PayloadError
from walchannel._proto import engine_channel_pb2 as pb
from walchannel.channel.seams import log_of, open_channel
from walchannel.log import RunLog
from walchannel.runner import ExitCode
from walchannel.testing.engine import LocalEngine
from walchannel.wire.protobuf import row_digest

ITEMS = 400
EACH = 5  # findings per item: 2,000 in all


def applied(engine: LocalEngine, run_id: str) -> Counter[tuple[str, int]]:
    got: Counter[tuple[str, int]] = Counter()
    for message in engine.bodies(run_id):
        if message["kind"] == "finding":
            fields: dict[str, Any] = message["body"]["fields"]
            got[(fields["item"], int(fields["n"]))] += 1
    return got


async def takeover(log: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "walchannel",
        "takeover",
        str(log),
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, (out + err).decode()


async def lose_the_log(engine: LocalEngine, tmp_path: Path) -> tuple[str, Counter[Any], str]:
    """Scan a quarter of the items, SIGKILL, delete the log folder, get fenced, take over, finish.

    Returns the run id, what the engine applied before the takeover, and
    the finishing harness's stderr.
    """
    run_id, token = new_run(engine)
    manifest = manifest_for(tmp_path / "m.json", engine, run_id, token)
    wal = tmp_path / "wal"
    env = {"RUNNER_ITEMS": str(ITEMS), "RUNNER_FINDINGS": str(EACH), "RUNNER_PACE_S": "0"}
    # 30 items a second: 10 s left at the kill, however late a busy box reads the scans.
    first = await start(manifest, wal, "--concurrency", "3", **{**env, "RUNNER_PACE_S": "0.1"})

    def quarter(h: Harness = first) -> bool:
        return len(h.scanned) >= ITEMS // 4 or h.proc.returncode is not None

    await eventually(quarter, timeout=BOUND_S, what="a quarter of the items scanned")
    assert first.proc.returncode is None, "it ended before the kill"
    first.kill()
    assert await first.wait() == -signal.SIGKILL
    before = applied(engine, run_id)
    assert 0 < sum(before.values()) < ITEMS * EACH
    shutil.rmtree(wal)  # a container recreated without its volume

    fenced = await start(manifest, wal, **env)
    assert await fenced.wait() == ExitCode.FENCED, fenced.err.decode()[-2000:]
    assert not fenced.scanned
    (log,) = wal.glob("*.wal.sqlite3")
    await takeover(log)

    last = await start(manifest, wal, **env)
    assert await last.wait() == ExitCode.DONE, last.err.decode()[-3000:]
    assert token not in last.err.decode() + fenced.err.decode()
    return run_id, before, last.err.decode()


@pytest.mark.asyncio
async def test_a_lost_log_taken_over_applies_every_finding_once(tmp_path: Path) -> None:
    async with running() as engine:
        run_id, _, err = await lose_the_log(engine, tmp_path)
        got = applied(engine, run_id)
        want = Counter({(f"item-{i:04}", n): 1 for i in range(ITEMS) for n in range(EACH)})
        assert got == want, (sorted(got - want)[:10], sorted(want - got)[:10])
        done = engine.done(run_id)
        assert done is not None and done["status"] == "completed"
        assert done["findings"] == ITEMS * EACH
        assert "resuming from the engine's resume point" in err, err
        assert engine.accepted(run_id) == list(range(1, len(engine.accepted(run_id)) + 1))


@pytest.mark.asyncio
async def test_without_the_engines_point_a_takeover_costs_what_the_old_writer_delivered(
    tmp_path: Path,
) -> None:
    async with running(resume_points=False) as engine:
        run_id, before, err = await lose_the_log(engine, tmp_path)
        got = applied(engine, run_id)
        # Every finding at least once; those the old writer delivered, twice.
        assert set(got) == {(f"item-{i:04}", n) for i in range(ITEMS) for n in range(EACH)}
        assert Counter({k: 2 for k in before}) == Counter({k: v for k, v in got.items() if v > 1})
        assert "resume point" not in err


# -- the channel: in-process, against the local engine and a scripted one ---------------------


@contextlib.asynccontextmanager
async def running(**options: Any) -> AsyncIterator[LocalEngine]:
    """A started LocalEngine with ``options``, stopped on the way out."""
    engine = LocalEngine(**options)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


def _config(engine: LocalEngine, wal: Path, run_id: str, token: str) -> Any:
    from walchannel.testing.plugin import local_channel_config

    return local_channel_config(engine, wal, run_id, token)


@pytest.mark.asyncio
async def test_markers_travel_as_rows_only_to_an_engine_that_announced_the_point(
    tmp_path: Path,
) -> None:
    for keeps in (True, False):
        async with running(resume_points=keeps) as engine:
            run_id, token = new_run(engine)
            wal = tmp_path / f"wal-{keeps}"
            async with GrpcEngineChannel(_config(engine, wal, run_id, token)) as ch:
                await ch.handshake("1", "resume", "1")
                assert ch.send_findings([{"n": 1}, {"n": 2}], progress={"next": 1}) == [1, 2]
                assert ch.send_findings([], progress={"next": 2, "at": "b"}) == []
                assert await ch.wait_acked(timeout_ms=10_000)
                assert ch.takeover_point() is None  # no takeover
                stored = ch.log.meta().engine_resume
            kinds = [m["kind"] for m in engine.bodies(run_id)]
            if keeps:
                # The first row carried the first marker; the second had no row.
                assert kinds == ["finding", "finding", "progress"]
                assert "progress" not in engine.bodies(run_id)[0]["body"]  # content only
                assert stored is not None and json.loads(stored)["takeover"] is False
                state = engine.store.run_state(run_id)
                assert state is not None and state.resume_seq == 3
                assert state.resume_marker == {"next": 2, "at": "b"}
            else:
                assert kinds == ["finding", "finding"]
                assert stored is None


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "marker",
    [{"next": 1.5}, {"items": [1, {"x": 0.25}]}, {"deep": {"f": float(2**60)}}],
    ids=["top", "in-a-list", "big"],
)
async def test_a_marker_holding_a_float_is_refused_at_send_naming_its_path(
    local_engine: LocalEngine, tmp_path: Path, marker: dict[str, Any]
) -> None:
    run_id, token = new_run(local_engine)
    async with GrpcEngineChannel(_config(local_engine, tmp_path / "wal", run_id, token)) as ch:
        await ch.handshake("1", "resume", "1")
        with pytest.raises(PayloadError, match=r"progress\.\S+: the float") as caught:
            ch.send_findings([{"n": 1}], progress=marker)
        assert caught.value.path.startswith("progress.")
        assert log_of(ch).state.next_seq == 1  # nothing logged
        assert ch.progress() is None


def _point_ack(
    h: int, seq: int, marker: dict[str, Any] | None, rows: int = 0, digests: int = 0
) -> pb.DownMessage:
    ack = pb.Ack(seq=h)
    ack.resume.SetInParent()
    ack.resume.seq = seq
    ack.resume.rows = rows
    ack.resume.row_digests.extend(range(1, digests + 1))
    if marker is not None:
        ack.resume.marker.update(marker)
    return pb.DownMessage(ack=ack)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (_point_ack(5, 9, {"next": 3}), "a resume point at seq 9, above the Ack(5)"),
        (_point_ack(5, 2, {"next": 2.5}), "marker.next is 2.5, not an integer"),
        (_point_ack(5, 3, {"a": [{"n": 0.5}]}), "marker.a[0].n is 0.5, not an integer"),
        (_point_ack(5, 2, {"next": 1}, 3, 2), "3 rows applied of 2 after seq 2"),
        (_point_ack(5, 4, {"next": 1}, 2, 3), "2 rows applied of 3 after seq 4, in an Ack(5)"),
    ],
    ids=["above-h", "a-fraction", "nested-fraction", "rows-past-digests", "rows-past-h"],
)
async def test_an_impossible_resume_point_is_a_protocol_error_never_stored(
    tmp_path: Path, answer: pb.DownMessage, said: str
) -> None:
    answers = [answer, _point_ack(0, 0, None)]

    async def script(stream: RogueStream) -> None:
        await stream.read()
        stream.send(answers.pop(0) if len(answers) > 1 else answers[0])
        while (msg := await stream.read()) is not None:
            if msg.seq:
                stream.ack(msg.seq)

    engine = RogueEngine(script)
    await engine.start()
    try:
        wal = tmp_path / "wal"
        async with GrpcEngineChannel(engine.channel_config(wal, "rp-run")) as ch:
            await ch.handshake("1", "resume", "1")
            assert ch.stats().protocol_errors == 1
            assert ch.stats().last_error is not None and said in ch.stats().last_error
            assert len(engine.streams) == 2  # ended, dialed again, the next answer taken
            stored = ch.log.meta().engine_resume
            assert stored is not None
            want = {"marker": None, "seq": 0, "applied": 0, "digests": [], "rows": 0}
            want["takeover"] = False
            assert json.loads(stored) == want
            assert ch.send_finding({"n": 1}) == 1
            assert await ch.wait_acked(timeout_ms=10_000)
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_a_takeovers_point_outlives_a_kill_after_the_answer_until_the_log_has_progress(
    tmp_path: Path,
) -> None:
    async with running() as engine:
        run_id, token = new_run(engine)
        old, new = tmp_path / "old", tmp_path / "new"
        async with GrpcEngineChannel(_config(engine, old, run_id, token)) as ch:
            await ch.handshake("1", "resume", "1")
            ch.send_findings([{"n": 1}, {"n": 2}], progress={"next": 1})
            ch.send_findings([{"n": 3}], progress={"next": 2})
            assert await ch.wait_acked(timeout_ms=10_000)
        shutil.rmtree(old)  # lost; the engine holds 1..3 (markers carried by 1 and 3)
        with RunLog.open(new, run_id, correlation_id=f"corr-{run_id}") as log:
            log.mark_takeover()
        ch = GrpcEngineChannel(_config(engine, new, run_id, token))
        await ch.handshake("1", "resume", "1")
        point = ch.takeover_point()
        assert point is not None and point.marker == {"next": 2} and point.seq == 2
        assert point.applied == 3 and point.complete and len(point.digests) == 1
        assert point.rows == 1
        log_of(ch).close()  # as a kill: nothing more of this channel reaches the disk
        await ch.close()
        async with GrpcEngineChannel(_config(engine, new, run_id, token)) as ch:
            await ch.handshake("1", "resume", "1")  # the mark is gone; the point stays
            again = ch.takeover_point()
            assert again is not None and again.marker == {"next": 2}
            assert ch.send_findings([{"n": 4}], progress={"next": 3}) == [4]
            assert ch.takeover_point() is None  # the log's own progress now
            assert await ch.wait_acked(timeout_ms=10_000)
        assert engine.store.run_state(run_id).resume_marker == {"next": 3}  # type: ignore[union-attr]


@pytest.mark.asyncio
@pytest.mark.parametrize("marker", [{"n": 2}, {"next": 2, "runner": "someone else's"}])
async def test_a_takeover_whose_point_another_kind_of_harness_wrote_scans_from_the_start(
    tmp_path: Path, marker: dict[str, Any]
) -> None:
    # Found by the simulator (seed 408603): a harness of one's own had the run, the
    # runner took it over, and exited 2 for ever on a point it cannot read.
    async with running() as engine:
        run_id, token = new_run(engine)
        async with GrpcEngineChannel(_config(engine, tmp_path / "own", run_id, token)) as ch:
            await ch.handshake("1", "own", "1")
            ch.send_findings([{"own": 1}], progress=marker)
            assert await ch.wait_acked(timeout_ms=10_000)
        manifest = manifest_for(tmp_path / "m.json", engine, run_id, token)
        wal = tmp_path / "wal"
        env = {"RUNNER_ITEMS": "5", "RUNNER_FINDINGS": "2"}
        fenced = await start(manifest, wal, **env)
        assert await fenced.wait() == ExitCode.FENCED, fenced.err.decode()[-2000:]
        (log,) = wal.glob("*.wal.sqlite3")
        await takeover(log)
        last = await start(manifest, wal, **env)
        assert await last.wait() == ExitCode.DONE, last.err.decode()[-3000:]
        said = last.err.decode()
        assert "not written by the runner" in said and "scanning from the first item" in said
        got = Counter(
            (m["body"]["fields"]["item"], int(m["body"]["fields"]["n"]))
            for m in engine.bodies(run_id)
            if m["kind"] == "finding" and "item" in m["body"]["fields"]
        )
        assert len(got) == 10 and set(got.values()) == {1}, got  # every item's, once each


# -- what a rescan leaves out: by content, never by count ---------------------------------


def test_a_rescan_leaves_out_only_rows_whose_content_the_engine_applied() -> None:
    from walchannel.runner.run import _not_applied

    events = [("scan.item", "info", {"item": "a"})]
    findings: list[dict[str, Any]] = [{"n": 0}, {"n": 1}, {"n": 2}]
    rows = [("event", {"type": "scan.item", "severity": "info", "payload": {"item": "a"}})]
    rows += [("finding", {"fields": f}) for f in findings]
    digests = [row_digest(kind, body) for kind, body in rows]
    # The engine applied the event and the first finding (an event's ts is not content).
    applied = Counter(digests[:2])
    assert _not_applied(events, findings, applied) == ([], [1, 2])  # positions in findings
    # A scan that does not repeat itself: no event this time, the findings in another
    # order, one new. Only what the engine holds is left out; nothing is lost.
    again: list[dict[str, Any]] = [{"n": 2}, {"n": 0}, {"n": 3}, {"n": 1}]
    assert _not_applied([], again, applied) == ([], [0, 2, 3])  # {"n": 2}, {"n": 3}, {"n": 1}
    # The same finding twice in one item: each applied row matches one of them.
    twice: list[dict[str, Any]] = [{"n": 0}, {"n": 0}]
    assert _not_applied([], twice, applied) == ([], [1])
    assert applied == Counter(digests[:2])  # the caller's counts are left as they were


def test_a_digest_is_of_the_content_not_its_stamp_key_order_or_carried_marker() -> None:
    payload = {"x": 1, "y": [1, 2]}
    a = {"type": "t", "severity": "info", "payload": payload, "ts": "2026-01-01T00:00:00Z"}
    b = {"ts": "2027-01-01T00:00:00Z", "payload": {"y": [1, 2], "x": 1}}
    b.update(severity="info", type="t")
    assert row_digest("event", a) == row_digest("event", b)
    one, two = {"fields": {"n": 1}}, {"fields": {"n": 2}}
    carried = {**one, "progress": {"marker": {"next": 1}, "digests": [1]}}
    assert row_digest("finding", carried) == row_digest("finding", one)
    assert row_digest("finding", one) != row_digest("finding", two)
    assert row_digest("finding", one) != row_digest("event", one)
    assert 0 <= row_digest("finding", {"fields": {}}) < 2**64


@pytest.mark.asyncio
async def test_a_first_announcement_repeats_the_logs_marker_and_a_full_disk_there_loses_nothing(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Rows and a marker logged before any answer carry no marker for the engine: the
    # first answer that announces a point is followed by a progress row repeating it.
    # Where the disk refuses that row (SQLite's authorizer denies the INSERT, as a
    # full disk would fail it), the channel says so and goes on: nothing is lost.
    caplog.set_level(logging.WARNING, logger="walchannel")
    for refused in (False, True):
        run_id, token = new_run(local_engine)
        config = _config(local_engine, tmp_path / f"wal-{refused}", run_id, token)
        with RunLog.open(config.wal_dir, run_id, correlation_id=config.correlation_id) as made:
            made.append_many([("finding", {"fields": {"n": 0}})], progress={"next": 1})
            path = made.path
        conn = sqlite3.connect(path, isolation_level=None)
        deny = [refused]

        def authorizer(action: int, table: str | None, *_: object, deny: list[bool] = deny) -> int:
            if deny[0] and action == sqlite3.SQLITE_INSERT and table == "rows":
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK

        conn.set_authorizer(authorizer)
        log = RunLog.on_connection(conn, run_id=run_id, correlation_id=config.correlation_id)
        async with open_channel(config, log=log) as ch:
            await ch.handshake("1", "resume", "1")
            deny[0] = False
            assert ch.send_finding({"n": 1}) == (2 if refused else 3)
            assert await ch.wait_acked(timeout_ms=10_000)
        kinds = [m["kind"] for m in local_engine.bodies(run_id)]
        said = [r for r in caplog.records if "cannot log the marker" in r.getMessage()]
        if refused:
            assert kinds == ["finding", "finding"] and len(said) == 1
        else:
            assert kinds == ["finding", "progress", "finding"] and not said
            state = local_engine.store.run_state(run_id)
            assert state is not None and state.resume_marker == {"next": 1}
        caplog.clear()


# -- a kill at every point of the item transaction ------------------------------------------


@pytest.mark.asyncio
async def test_an_interrupt_at_every_point_of_a_marked_transaction_keeps_point_and_rows_together(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    """Each statement of a send with its marker, interrupted before and after it.

    Whatever lands is all of the transaction or none of it: the engine's
    point then names the marker with the rows it applied, never one whose
    rows it lacks (the point cannot run ahead), and never an older marker
    with the new rows applied behind it beyond its digests.
    """
    from test_log_interrupts import InterruptingConnection

    points = 0
    for n in range(1, 6):
        for when in ("before", "after"):
            run_id, token = new_run(local_engine)
            config = _config(local_engine, tmp_path / f"wal-{n}-{when}", run_id, token)
            conn, log = log_on_connection(config, InterruptingConnection)
            async with open_channel(config, log=log) as ch:
                await ch.handshake("1", "resume", "1")
                ch.send_findings([{"n": 0}], progress={"next": 1})
                conn.arm((n, when, KeyboardInterrupt))
                landed = True
                try:
                    ch.send_findings([{"n": 1}, {"n": 2}], progress={"next": 2})
                except KeyboardInterrupt:
                    landed = ch.progress() == {"next": 2}
                reached = conn.plan is None
                statements = list(conn.seen)
                conn.arm(None)
                assert await ch.wait_acked(timeout_ms=10_000)
            found = [m["body"]["fields"]["n"] for m in local_engine.bodies(run_id)]
            state = local_engine.store.run_state(run_id)
            assert state is not None
            if landed:
                assert found == [0.0, 1.0, 2.0], (n, when)
                assert state.resume_marker == {"next": 2} and state.resume_seq == 1
                assert len(state.resume_digests) == 2 and state.resume_rows == 2
            else:
                assert found == [0.0], (n, when)  # none of it: rows and marker together
                assert state.resume_marker == {"next": 1} and state.resume_seq == 0
            points += reached
            if n == 5:
                assert not reached, statements  # past the transaction: nothing interrupted
            else:
                assert reached and len(statements) >= n, statements
    # BEGIN, INSERT, UPDATE meta, COMMIT: each interrupted before and after it.
    assert points == 8


@pytest.mark.asyncio
@pytest.mark.parametrize("first", ["finding", "event", "second"])
async def test_a_carrier_the_engine_refuses_for_its_size_leaves_the_marker_in_its_place(
    tmp_path: Path, first: str
) -> None:
    # The transaction's first row carries the marker; the engine refuses it for its
    # size, the channel sets it aside and sends a walchannel.row_lost event in its
    # place: that event carries the marker on, so the engine's point moves. The
    # event names the row's digest, so the engine counts it as that row, the
    # carrier or ("second") a later one.
    async with running(max_receive_message_bytes=2_000) as engine:
        run_id, token = new_run(engine)
        async with GrpcEngineChannel(_config(engine, tmp_path / "wal", run_id, token)) as ch:
            await ch.handshake("1", "resume", "1")
            big = {"blob": "x" * 3_000}
            if first == "finding":
                ch.send_findings([big, {"n": 1}], progress={"next": 1})
            elif first == "second":
                ch.send_findings([{"n": 1}, big], progress={"next": 1})
            else:
                ch.send_findings([{"n": 1}], events=[("big", "info", big)], progress={"next": 1})
            assert await ch.wait_acked(timeout_ms=10_000)
            assert ch.stats().quarantined == 1
        kinds = [(m["kind"], m["body"].get("type")) for m in engine.bodies(run_id)]
        assert kinds[1 if first == "second" else 0] == ("event", "walchannel.row_lost")
        state = engine.store.run_state(run_id)
        assert state is not None and state.resume_marker == {"next": 1}
        assert state.resume_seq == 0 and len(state.resume_digests) == 2
        assert state.resume_rows == 2


def _lost(digest: str | None) -> dict[str, object]:
    payload: dict[str, object] = {"seq": 2.0, "reason": "refused by the engine for its size"}
    if digest is not None:
        payload["digest"] = digest
    return {"type": "walchannel.row_lost", "severity": "error", "payload": payload, "ts": "t"}


@pytest.mark.parametrize(
    ("second", "third", "rows"),
    [
        # The transaction's rows, in order, by its writer: all three count (the
        # client logged ints, the engine decodes the Struct's doubles).
        (("a", "finding", {"fields": {"n": 1.0}}), ("a", "finding", {"fields": {"n": 2.0}}), 3),
        # A row of another writer (a taken-over log's own) ends the count.
        (("b", "finding", {"fields": {"n": 1.0}}), ("a", "finding", {"fields": {"n": 2.0}}), 1),
        # Its own writer's row that is not the next (seed 776480: the log lost the
        # transaction's commit and was renumbered to follow the engine) ends it too:
        # the transaction's next row after it is none of its rows any more.
        (("a", "finding", {"fields": {"n": 9.0}}), ("a", "finding", {"fields": {"n": 2.0}}), 1),
        (
            ("a", "event", {"type": "x", "severity": "info", "payload": {"c": 7.0}, "ts": "t"}),
            ("a", "finding", {"fields": {"n": 1.0}}),
            1,
        ),
        # The row_lost event that took the next row's seq counts as it when it names
        # that row's digest; without it, or naming another, it ends the count.
        (("a", "event", _lost("next")), ("a", "finding", {"fields": {"n": 2.0}}), 3),
        (("a", "event", _lost(None)), ("a", "finding", {"fields": {"n": 2.0}}), 1),
        (("a", "event", _lost("other")), ("a", "finding", {"fields": {"n": 2.0}}), 1),
        # A harness's own event of that type, when it is the transaction's next row
        # (by its own digest), counts like any row.
        (("a", "event", _lost("own")), ("a", "finding", {"fields": {"n": 2.0}}), 3),
    ],
)
def test_the_engine_counts_only_its_transactions_next_rows_by_writer_and_content(
    second: tuple[str, str, dict[str, Any]], third: tuple[str, str, dict[str, Any]], rows: int
) -> None:
    # The local engine's duty, on its real store: after a carrier of 3 rows, a row
    # counts when the carrier's writer wrote it and it is the transaction's next
    # by content; the first that is not ends the count for good.
    from walchannel.testing.store import EngineStore, Writer

    second, third = copy.deepcopy((second, third))  # (the parameters are shared)
    writers = {"a": Writer("aaaa", 0), "b": Writer("bbbb", 0)}
    bodies = [{"n": 0}, {"n": 1}, {"n": 2}]
    digests = [row_digest("finding", {"fields": b}) for b in bodies]
    if second[2].get("payload", {}).get("digest") == "own":
        # The harness logged this event as the transaction's second row.
        del second[2]["payload"]["digest"]
        digests[1] = row_digest("event", {**second[2], "payload": {"seq": 2, "reason": "mine"}})
        second[2]["payload"]["reason"] = "mine"
    point = {"marker": {"next": 1}, "digests": digests}
    store = EngineStore()
    store.register_run("r", "tok")
    store.accept("r", 1, "finding", {"fields": {"n": 0.0}, "progress": point}, writer=writers["a"])
    for seq, (who, kind, body) in ((2, second), (3, third)):
        if kind == "event" and body["type"] == "walchannel.row_lost":
            named = body["payload"].get("digest")
            if named is not None:
                body["payload"]["digest"] = f"{digests[1]:016x}" if named == "next" else "0" * 16
        store.accept("r", seq, kind, body, writer=writers[who])
    store.accept("r", 4, "finding", {"fields": {"n": 3.0}}, writer=writers["a"])  # past its 3
    state = store.run_state("r")
    assert state is not None and state.resume_seq == 0 and state.resume_digests == tuple(digests)
    assert state.resume_rows == rows
    store.close()
