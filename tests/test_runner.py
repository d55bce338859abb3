"""The harness runner against the local engine (SPEC "The runner", issue 54).

Each run is ``run_harness_async`` on a real gRPC stream to a real engine
and a real log; the engine's store is the judge of what was applied.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from conftest import eventually, new_run
from walchannel import EngineUnavailableError, GrpcEngineChannel, PayloadError, RunRefusedError
from walchannel.cli.inspection import inspect_log
from walchannel.log.files import log_path
from walchannel.runner import (
    AsyncItemContext,
    ExitCode,
    ItemContext,
    Manifest,
    run_harness_async,
)
from walchannel.runner.run import ScanErrorPolicy
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config

FAST: dict[str, Any] = {
    "connect_timeout_ms": 3_000,
    "done_ack_timeout_ms": 5_000,
    "close_timeout_ms": 1_000,
    "allowed_hosts": ["127.0.0.1"],
    "progress_every_s": 0,
    "retry_backoff_s": 0.01,
    "drain_timeout_s": 20,
}


def write_manifest(
    path: Path,
    engine: LocalEngine,
    run_id: str,
    token: str,
    *,
    deadline: datetime | None = None,
    **extra: Any,
) -> Path:
    deadline = deadline or datetime.now(UTC) + timedelta(hours=1)
    data = {
        "runId": run_id,
        "correlationId": f"corr-{run_id}",
        "runToken": token,
        "hardDeadline": deadline.isoformat().replace("+00:00", "Z"),
        "grpcAddr": engine.grpc_addr,
        "httpAddr": engine.http_addr,
        **extra,
    }
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    return path


class Files:
    """A harness over numbered items; item ``i`` gives ``i % 4`` findings."""

    name = "files"
    version = "1"

    def __init__(self, count: int = 30, *, fail: set[int] | None = None) -> None:
        self.count = count
        self.fail = fail or set()
        self.scanned: Counter[str] = Counter()
        self.lock = threading.Lock()

    def work(self) -> list[str]:
        return [f"f{i:03}" for i in range(self.count)]

    def scan(self, item: str, ctx: ItemContext) -> list[dict[str, Any]]:
        with self.lock:
            self.scanned[item] += 1
        assert threading.current_thread() is not threading.main_thread()
        i = int(item[1:])
        if i in self.fail:
            raise OSError(f"cannot read {item}")
        ctx.event("scan.file", {"item": item})
        return [{"item": item, "n": n} for n in range(i % 4)]

    def coverage(self) -> list[str]:
        return ["f*"]


def applied(
    engine: LocalEngine, run_id: str
) -> tuple[Counter[tuple[str, int]], list[dict[str, Any]]]:
    """The findings the engine applied, counted by content, and its events."""
    findings: Counter[tuple[str, int]] = Counter()
    events = []
    for message in engine.bodies(run_id):
        body = message["body"]
        if message["kind"] == "finding":
            fields = body["fields"]
            findings[(fields["item"], int(fields["n"]))] += 1
        elif message["kind"] == "event":
            events.append(body)
    return findings, events


def expected(harness: Files, skip: set[int] = frozenset()) -> Counter[tuple[str, int]]:  # type: ignore[assignment]
    return Counter(
        {(f"f{i:03}", n): 1 for i in range(harness.count) if i not in skip for n in range(i % 4)}
    )


@pytest.mark.asyncio
async def test_a_harness_runs_to_done_every_finding_once(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    harness = Files(30)
    code = await run_harness_async(harness, str(manifest), wal_dir=tmp_path / "wal", **FAST)
    assert code == ExitCode.DONE
    findings, events = applied(local_engine, run_id)
    assert findings == expected(harness)
    assert sum(1 for e in events if e["type"] == "scan.file") == 30
    done = local_engine.done(run_id)
    assert done is not None and done["status"] == "completed"
    assert done["findings"] == sum(expected(harness).values())
    # Started again on the finished run: nothing scanned, the same code.
    again = Files(30)
    code = await run_harness_async(again, str(manifest), wal_dir=tmp_path / "wal", **FAST)
    assert code == ExitCode.DONE and not again.scanned


@pytest.mark.asyncio
async def test_concurrent_items_are_committed_in_work_order(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)

    class Jittery(Files):
        def scan(self, item: str, ctx: ItemContext) -> list[dict[str, Any]]:
            # Later items finish first: the commit order must still be the work's.
            import time

            time.sleep(0.002 * (7 - int(item[1:]) % 8))
            return super().scan(item, ctx)

    harness = Jittery(40)
    code = await run_harness_async(
        harness, str(manifest), wal_dir=tmp_path / "wal", concurrency=4, **FAST
    )
    assert code == ExitCode.DONE
    _, events = applied(local_engine, run_id)
    order = [e["payload"]["item"] for e in events if e["type"] == "scan.file"]
    assert order == harness.work()
    assert applied(local_engine, run_id)[0] == expected(harness)


class Blocked(Files):
    """Item 0 waits for ``release``; the others finish at once, each with a 100 kB finding."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.release = threading.Event()
        self.begun: list[int] = []

    def scan(self, item: str, ctx: ItemContext) -> list[dict[str, Any]]:
        i = int(item[1:])
        with self.lock:
            self.begun.append(i)
        if i == 0:
            assert self.release.wait(30)
        return [{"item": item, "n": 0, "blob": "x" * 100_000}]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("concurrency", "waiting_bytes", "most_begun"),
    [
        # A slow first item holds the commit, not the scanning: the slots refill
        # as items finish, until `concurrency` finished items wait behind it ...
        (2, 64 * 1024 * 1024, 3),
        (4, 64 * 1024 * 1024, 5),
        # ... or until the finished ones hold max_waiting_bytes (250 kB: three of them).
        (4, 250_000, 4),
    ],
)
async def test_a_slow_item_holds_at_most_the_window_of_finished_ones_behind_it(
    local_engine: LocalEngine,
    tmp_path: Path,
    concurrency: int,
    waiting_bytes: int,
    most_begun: int,
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    harness = Blocked(12)
    run = asyncio.ensure_future(
        run_harness_async(
            harness,
            str(manifest),
            wal_dir=tmp_path / "wal",
            concurrency=concurrency,
            max_waiting_bytes=waiting_bytes,
            **FAST,
        )
    )
    # Everything that may begin behind the blocked item has begun ...
    await eventually(lambda: len(harness.begun) >= most_begun, timeout=20)
    # ... and nothing more begins while it stays blocked: the window is full.
    for _ in range(20):
        await asyncio.sleep(0.01)
        assert len(harness.begun) == most_begun, harness.begun
    harness.release.set()
    assert await run == ExitCode.DONE
    assert sorted(harness.begun) == list(range(12))
    findings, _ = applied(local_engine, run_id)
    assert findings == Counter({(f"f{i:03}", 0): 1 for i in range(12)})


@pytest.mark.asyncio
async def test_a_coroutine_scan_runs_on_the_loop(local_engine: LocalEngine, tmp_path: Path) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)

    class Async(Files):
        async def scan(self, item: str, ctx: AsyncItemContext) -> list[dict[str, Any]]:  # type: ignore[override]
            await asyncio.sleep(0)
            ctx.event("scan.file", {"item": item})
            i = int(item[1:])
            return [{"item": item, "n": n} for n in range(i % 4)]

    harness = Async(12)
    code = await run_harness_async(
        harness, str(manifest), wal_dir=tmp_path / "wal", concurrency=3, **FAST
    )
    assert code == ExitCode.DONE
    assert applied(local_engine, run_id)[0] == expected(harness)


@pytest.mark.asyncio
async def test_a_finding_that_cannot_travel_is_skipped_and_said(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)

    class Bad(Files):
        def scan(self, item: str, ctx: ItemContext) -> list[dict[str, Any]]:
            found = super().scan(item, ctx)
            if item == "f003":
                found.insert(1, {"item": item, "n": float("nan")})
            if item == "f007":
                found.append({"item": item, "n": {"SECRET-VALUE"}})
                found.insert(0, {"item": item, "n": float("inf")})  # two: places kept
            return found

    harness = Bad(10)
    code = await run_harness_async(harness, str(manifest), wal_dir=tmp_path / "wal", **FAST)
    assert code == ExitCode.DONE
    findings, events = applied(local_engine, run_id)
    assert findings == expected(harness)  # the item's other findings went
    skipped = [e["payload"] for e in events if e["type"] == "runner.finding_skipped"]
    assert [(s["item"], s["finding"]) for s in skipped] == [("f003", 1), ("f007", 0), ("f007", 4)]
    assert [s["path"] for s in skipped] == ["findings[1].n", "findings[0].n", "findings[4].n"]
    # Where and why, never the value.
    assert skipped[0]["path"] == "findings[1].n" and "finite" in skipped[0]["reason"]
    assert "SECRET-VALUE" not in json.dumps(local_engine.bodies(run_id))
    done = local_engine.done(run_id)
    assert done is not None and "3 findings" in done["exit_reason"]


@pytest.mark.asyncio
@pytest.mark.parametrize("first_answer_s", [0.5, 1.5])
async def test_first_answer_bounds_the_wait_not_whole_connect_timeouts(
    local_engine: LocalEngine, tmp_path: Path, first_answer_s: float
) -> None:
    # A new user's report: --first-answer was rounded up to whole connect
    # timeouts (1 s asked, 10 s waited).
    import socket
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: every dial is refused
        port = sock.getsockname()[1]
        run_id, token = new_run(local_engine)
        manifest = write_manifest(
            tmp_path / "m.json", local_engine, run_id, token, grpcAddr=f"127.0.0.1:{port}"
        )
        data = json.loads(manifest.read_text())
        del data["httpAddr"]  # no discovery to find the real engine
        manifest.write_text(json.dumps(data))
        harness = Files(3)
        started = time.monotonic()
        got = await run_harness_async(
            harness,
            str(manifest),
            wal_dir=tmp_path / "wal",
            first_answer_s=first_answer_s,
            **{**FAST, "connect_timeout_ms": 10_000},
        )
        took = time.monotonic() - started
    assert got == ExitCode.NO_ENGINE
    assert not harness.scanned
    assert first_answer_s <= took < first_answer_s + 2.5, took


@pytest.mark.asyncio
@pytest.mark.parametrize("items", [1, 7])
async def test_skip_with_every_item_failing_ends_failed_not_done(
    local_engine: LocalEngine, tmp_path: Path, items: int
) -> None:
    # A new user's report: on_scan_error="skip" and every item failing exited 0,
    # Done "completed" for a scan that scanned nothing.
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    harness = Files(items, fail=set(range(items)))
    got = await run_harness_async(
        harness, str(manifest), wal_dir=tmp_path / "wal", retries=0, on_scan_error="skip", **FAST
    )
    assert got == ExitCode.SCAN_FAILED
    done = local_engine.done(run_id)
    assert done is not None and done["status"] == "failed", done
    assert f"every item failed ({items} skipped)" in done["exit_reason"], done
    _, events = applied(local_engine, run_id)
    assert len([e for e in events if e["type"] == "runner.item_skipped"]) == items
    # inspect: over (a tombstone), but never shown as if it had ended well.
    report = inspect_log(log_path(tmp_path / "wal", run_id))
    assert report.state == "completed", report
    assert report.reason is not None and 'Done(status="failed")' in report.reason, report
    assert f"{items} items, {items} skipped, 0 findings" in report.reason, report


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("policy", "code", "status"),
    [
        ("fail", ExitCode.SCAN_FAILED, "failed"),
        ("skip", ExitCode.DONE, "completed"),
        ("exit", ExitCode.SCAN_EXIT, None),
    ],
)
async def test_a_scan_that_keeps_failing_ends_as_the_policy_says(
    local_engine: LocalEngine,
    tmp_path: Path,
    policy: ScanErrorPolicy,
    code: int,
    status: str | None,
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    harness = Files(12, fail={5})
    got = await run_harness_async(
        harness,
        str(manifest),
        wal_dir=tmp_path / "wal",
        retries=2,
        on_scan_error=policy,
        **FAST,
    )
    assert got == code
    assert harness.scanned["f005"] == 3  # tried, then two retries
    done = local_engine.done(run_id)
    assert (done or {}).get("status") == status
    findings, events = applied(local_engine, run_id)
    if policy == "skip":
        assert findings == expected(harness, skip={5})
        (event,) = [e for e in events if e["type"] == "runner.item_skipped"]
        assert (
            event["payload"]["item"] == "f005" and "cannot read f005" in event["payload"]["error"]
        )
    else:
        # Nothing at or past the failed item was applied.
        assert {item for item, _ in findings} <= {f"f{i:03}" for i in range(5)}
    # Started again: a failed run keeps its code; an exit scans the item again.
    again = Files(12, fail={5})
    code2 = await run_harness_async(
        again, str(manifest), wal_dir=tmp_path / "wal", on_scan_error=policy, **FAST
    )
    assert code2 == code
    if policy == "exit":
        assert min(again.scanned) == "f005"
    else:
        assert not again.scanned


@pytest.mark.asyncio
async def test_a_changed_work_list_is_refused_not_rescanned(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    first = Files(20, fail={8})
    code = await run_harness_async(
        first, str(manifest), wal_dir=tmp_path / "wal", on_scan_error="exit", retries=0, **FAST
    )
    assert code == ExitCode.SCAN_EXIT
    for changed in (Files(21), Files(19)):
        with caplog.at_level(logging.ERROR, logger="walchannel.runner"):
            code = await run_harness_async(changed, str(manifest), wal_dir=tmp_path / "wal", **FAST)
        assert code == ExitCode.USAGE
        assert not changed.scanned
        said = caplog.text
        assert f"({changed.count} items now, 20 then;" in said
        assert "resuming at item 8 would skip or repeat items" in said
        caplog.clear()

    class Reordered(Files):
        def work(self) -> list[str]:
            return list(reversed(super().work()))

    reordered = Reordered(20)
    code = await run_harness_async(reordered, str(manifest), wal_dir=tmp_path / "wal", **FAST)
    assert code == ExitCode.USAGE and not reordered.scanned
    # The same list resumes at the item that failed.
    same = Files(20)
    code = await run_harness_async(same, str(manifest), wal_dir=tmp_path / "wal", **FAST)
    assert code == ExitCode.DONE
    assert min(same.scanned) == "f008"
    assert applied(local_engine, run_id)[0] == expected(same)


@pytest.mark.asyncio
async def test_stop_from_the_engine_ends_the_run_stopped(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    started = threading.Event()
    release = threading.Event()

    class Slow(Files):
        def scan(self, item: str, ctx: ItemContext) -> list[dict[str, Any]]:
            if item == "f004":
                started.set()
                release.wait(10)
            return super().scan(item, ctx)

    harness = Slow(30)
    run = asyncio.create_task(
        run_harness_async(harness, str(manifest), wal_dir=tmp_path / "wal", **FAST)
    )
    await eventually(started.is_set, what="item 4 in hand")
    with caplog.at_level(logging.WARNING, logger="walchannel.runner"):
        assert await local_engine.send_stop(run_id, "operator cancelled the scan")
        await eventually(lambda: "asks to stop" in caplog.text, what="the Stop reached the runner")
    release.set()
    code = await run
    assert code == ExitCode.STOPPED
    done = local_engine.done(run_id)
    assert done is not None and done["status"] == "stopped"
    assert "operator cancelled" in done["exit_reason"]
    # The item in hand finished and went; none after it was begun.
    assert max(harness.scanned) == "f004"
    _, events = applied(local_engine, run_id)
    assert [e["payload"]["item"] for e in events if e["type"] == "scan.file"][-1] == "f004"


@pytest.mark.asyncio
async def test_a_near_deadline_ends_the_run_before_it(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    deadline = datetime.now(UTC) + timedelta(seconds=90)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token, deadline=deadline)
    harness = Files(10)
    code = await run_harness_async(
        harness, str(manifest), wal_dir=tmp_path / "wal", deadline_margin_s=120, **FAST
    )
    assert code == ExitCode.DEADLINE
    assert not harness.scanned
    done = local_engine.done(run_id)
    assert done is not None and done["status"] == "deadline"


@pytest.mark.asyncio
@pytest.mark.parametrize("refused", ["a wrong token", "an unknown run"])
async def test_a_refused_new_run_exits_at_once_scanning_nothing(
    local_engine: LocalEngine, tmp_path: Path, refused: str
) -> None:
    run_id, token = new_run(local_engine)
    if refused == "a wrong token":
        token = "tok-not-the-one"
    else:
        run_id = run_id + "-unknown"
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    harness = Files(5)
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(30):  # (first_answer_s is 600 s: a failure ends here)
        code = await run_harness_async(
            harness,
            str(manifest),
            wal_dir=tmp_path / "wal",
            **{**FAST, "connect_timeout_ms": 1_500},
        )
    assert code == ExitCode.REFUSED
    # Within one connect_timeout_ms (and the close), not first_answer_s (600 s).
    assert asyncio.get_running_loop().time() - started < 10
    assert not harness.scanned
    assert local_engine.accepted(run_id) == []


@pytest.mark.asyncio
async def test_a_log_that_had_an_answer_is_not_refused_but_keeps_dialing(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
    # The same log, a token the engine no longer takes (a replacement engine
    # that does not know the run yet answers so too).
    refused = local_channel_config(
        local_engine, tmp_path / "wal", run_id, "tok-other", connect_timeout_ms=1_000
    )
    async with GrpcEngineChannel(refused) as ch:
        with pytest.raises(EngineUnavailableError) as info:
            await ch.handshake("1", "h", "1")
        assert not isinstance(info.value, RunRefusedError)
        text = str(info.value)
        assert f"run {run_id}: the engine refused this run's token" in text, text
        assert "UNAUTHENTICATED" in text and "tok-other" not in text


def test_the_manifest_gives_the_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "m.json"
    path.write_text(
        json.dumps(
            {
                "runId": "run-1",
                "correlationId": "c",
                "runToken": "tok-secret-value",
                "hardDeadline": "2030-01-02T03:04:05+01:00",
                "grpcAddr": "127.0.0.1:1",
                "httpAdr": "http://x",
            }
        )
    )
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        manifest = Manifest.load(path)
    assert manifest.hard_deadline == datetime(2030, 1, 2, 2, 4, 5, tzinfo=UTC)
    assert manifest.http_addr is None
    text = caplog.text
    assert "'httpAdr'" in text and "did you mean 'httpAddr'" in text
    assert "chmod 600" in text and str(path) in text
    assert "tok-secret-value" not in text + repr(manifest)


@pytest.mark.asyncio
async def test_an_items_events_and_findings_are_one_transaction(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    async with GrpcEngineChannel(config) as ch:
        good = ("scan.file", "info", {"item": "a"})
        with pytest.raises(PayloadError) as bad_finding:
            ch.send_findings([{"x": 1}, {"x": float("inf")}], events=[good], progress={"i": 1})
        assert bad_finding.value.index == 1
        with pytest.raises(PayloadError) as bad_event:
            ch.send_findings([{"x": 1}], events=[good, ("t", "info", {"v": {1, 2}})])
        assert bad_event.value.path == "events[1].payload.v" and bad_event.value.index is None
        assert ch.log.high_water == 0 and ch.progress() is None  # nothing of either
        seqs = ch.send_findings([{"x": 1}], events=[good, good], progress={"i": 2})
        assert seqs == [1, 2, 3] and ch.progress() == {"i": 2}
        kinds = [row.kind for row in ch.log.unacked()]
        assert kinds == ["event", "event", "finding"]


@pytest.mark.asyncio
async def test_a_rescanned_item_gets_the_decision_already_made(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    asked: list[str] = []

    class Asking(Files):
        def __init__(self, count: int, *, crash: bool) -> None:
            super().__init__(count)
            self.crash = crash
            self.decisions: list[tuple[str, bool]] = []

        def scan(self, item: str, ctx: ItemContext) -> list[dict[str, Any]]:
            if item == "f002":
                decision = ctx.request_approval("exploit", {"item": item}, timeout_s=20)
                self.decisions.append((decision.request_id, decision.approved))
                if self.crash:
                    raise RuntimeError("the scanner died after asking")
            return super().scan(item, ctx)

    async def decide() -> None:
        # The operator decides whatever the engine was asked, once.
        while True:
            for message in local_engine.bodies(run_id):
                if message["kind"] == "approval_request":
                    rid = message["body"]["request_id"]
                    if rid not in asked:
                        asked.append(rid)
                        await local_engine.decide_approval(run_id, rid, True, "go")
            await asyncio.sleep(0.02)

    operator = asyncio.create_task(decide())
    try:
        first = Asking(6, crash=True)
        code = await run_harness_async(
            first,
            str(manifest),
            wal_dir=tmp_path / "wal",
            retries=0,
            on_scan_error="exit",
            **FAST,
        )
        assert code == ExitCode.SCAN_EXIT
        again = Asking(6, crash=False)
        code = await run_harness_async(again, str(manifest), wal_dir=tmp_path / "wal", **FAST)
        assert code == ExitCode.DONE
    finally:
        operator.cancel()
    # One request, decided once: the rescan got the same id and the stored decision.
    assert len(asked) == 1 and asked[0].endswith("-2-1")
    assert first.decisions == again.decisions == [(asked[0], True)]


@pytest.mark.asyncio
async def test_an_item_past_its_timeout_is_given_up_and_its_thread_told(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    told: list[BaseException] = []

    class Hanging(Files):
        def scan(self, item: str, ctx: ItemContext) -> list[dict[str, Any]]:
            if item == "f003":
                import time

                time.sleep(0.5)  # past item_timeout_s
                try:
                    ctx.event("late", {"item": item})
                except TimeoutError as exc:
                    told.append(exc)
                    raise
            return super().scan(item, ctx)

    harness = Hanging(8)
    code = await run_harness_async(
        harness,
        str(manifest),
        wal_dir=tmp_path / "wal",
        retries=0,
        on_scan_error="skip",
        item_timeout_s=0.2,
        **FAST,
    )
    assert code == ExitCode.DONE
    findings, events = applied(local_engine, run_id)
    assert findings == expected(harness, skip={3})
    (skip,) = [e["payload"] for e in events if e["type"] == "runner.item_skipped"]
    assert skip["item"] == "f003" and "item_timeout_s=0.2" in skip["error"]
    await eventually(lambda: bool(told), what="the timed-out thread told at its next event")
    assert not [e for e in events if e["type"] == "late"]


@pytest.mark.asyncio
async def test_a_full_backlog_makes_the_runner_wait_not_fail(tmp_path: Path) -> None:
    async with LocalEngine(ack_delay_ms=100) as engine:
        engine.register_run("run-backlog", "tok-backlog-1")
        manifest = write_manifest(tmp_path / "m.json", engine, "run-backlog", "tok-backlog-1")
        harness = Files(40)
        code = await run_harness_async(
            harness, str(manifest), wal_dir=tmp_path / "wal", max_unacked_bytes=600, **FAST
        )
        assert code == ExitCode.DONE
        assert applied(engine, "run-backlog")[0] == expected(harness)


@pytest.mark.asyncio
async def test_the_progress_line_comes_while_it_scans_and_at_the_end(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)

    class Slow(Files):
        def scan(self, item: str, ctx: ItemContext) -> list[dict[str, Any]]:
            import time

            time.sleep(0.02)
            return super().scan(item, ctx)

    with caplog.at_level(logging.INFO, logger="walchannel.runner"):
        code = await run_harness_async(
            Slow(20),
            str(manifest),
            wal_dir=tmp_path / "wal",
            **{**FAST, "progress_every_s": 0.1},
        )
    assert code == ExitCode.DONE
    lines = [r.getMessage() for r in caplog.records if "items/s" in r.getMessage()]
    assert len(lines) >= 2, lines  # during the scan, and the last one
    assert lines[-1].startswith(f"run {run_id}: items 20/20, findings 30, unacked ")


@pytest.mark.asyncio
async def test_a_runner_off_the_main_thread_runs_and_says_sigterm_is_not_handled(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from walchannel import run_harness

    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    harness = Files(6)
    with caplog.at_level(logging.WARNING, logger="walchannel.runner"):
        code = await asyncio.to_thread(
            run_harness, harness, str(manifest), wal_dir=tmp_path / "wal", **FAST
        )
    assert code == ExitCode.DONE
    assert "SIGTERM not handled" in caplog.text
    assert applied(local_engine, run_id)[0] == expected(harness)


@pytest.mark.asyncio
async def test_a_generator_scan_runs_in_its_thread_under_the_item_timeout(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    threads: list[str] = []

    class Gen(Files):
        def scan(self, item: str, ctx: ItemContext) -> Any:  # a generator function
            threads.append(threading.current_thread().name)
            if item == "f002":
                import time

                time.sleep(0.6)  # its body runs as it is iterated: in the thread
            i = int(item[1:])
            for n in range(i % 4):
                yield {"item": item, "n": n}

    harness = Gen(6)
    code = await run_harness_async(
        harness, str(manifest), wal_dir=tmp_path / "wal", retries=0, on_scan_error="skip",
        item_timeout_s=0.3, **FAST,
    )  # fmt: skip
    assert code == ExitCode.DONE
    assert all(name.startswith("walchannel-scan-") for name in threads), threads
    assert applied(local_engine, run_id)[0] == expected(harness, skip={2})


@pytest.mark.asyncio
async def test_a_scans_own_timeout_keeps_its_message(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)

    class Net(Files):
        def scan(self, item: str, ctx: ItemContext) -> list[dict[str, Any]]:
            if item == "f001":
                raise TimeoutError("connect to scanner-db:5432 timed out")
            return super().scan(item, ctx)

    code = await run_harness_async(
        Net(4), str(manifest), wal_dir=tmp_path / "wal", retries=0, on_scan_error="skip",
        item_timeout_s=30, **FAST,
    )  # fmt: skip
    assert code == ExitCode.DONE
    (skip,) = [e["payload"] for e in applied(local_engine, run_id)[1] if "error" in e["payload"]]
    assert "scanner-db:5432 timed out" in skip["error"] and "item_timeout_s" not in skip["error"]


class _Shaped(Files):
    """A harness with one bug at a time (``bug``), fixed by passing ``bug=None``."""

    def __init__(self, bug: str | None) -> None:
        super().__init__(6)
        self.bug = bug

    def work(self) -> list[str]:
        items = super().work()
        if self.bug == "work raises":
            raise OSError("the repository is not checked out")
        return [*items, items[0]] if self.bug == "an item twice" else items

    def scan(self, item: str, ctx: ItemContext) -> Any:
        found = super().scan(item, ctx)
        if self.bug == "scan returns a dict" and item == "f003":
            return {"item": item, "n": 0}
        return found

    def coverage(self) -> Any:
        if self.bug == "coverage is a str":
            return "src"
        if self.bug == "coverage raises":
            raise KeyError("root")
        return ["f*"]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("bug", "says"),
    [
        ("work raises", "harness.work() raised OSError"),
        ("an item twice", "holds 'f000' twice"),
        ("scan returns a dict", "scan('f003') returned 'dict'"),
        ("coverage is a str", "harness.coverage() returned 'str'"),
        ("coverage raises", "harness.coverage() raised KeyError"),
    ],
)
async def test_a_harness_bug_exits_2_and_the_fixed_harness_finishes_the_run(
    local_engine: LocalEngine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    bug: str,
    says: str,
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)
    with caplog.at_level(logging.ERROR, logger="walchannel.runner"):
        code = await run_harness_async(
            _Shaped(bug), str(manifest), wal_dir=tmp_path / "wal", **FAST
        )
    assert code == ExitCode.USAGE and says in caplog.text, caplog.text
    assert local_engine.done(run_id) is None  # no Done: nothing decided for the run
    fixed = _Shaped(None)
    code = await run_harness_async(fixed, str(manifest), wal_dir=tmp_path / "wal", **FAST)
    assert code == ExitCode.DONE
    assert applied(local_engine, run_id)[0] == expected(fixed)


@pytest.mark.asyncio
async def test_a_scans_exception_holding_the_token_is_said_with_the_token_masked(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id, token = new_run(local_engine)
    manifest = write_manifest(tmp_path / "m.json", local_engine, run_id, token)

    class Leaky(Files):
        def scan(self, item: str, ctx: ItemContext) -> list[dict[str, Any]]:
            if item == "f002":
                raise PermissionError(f"GET https://api/x?token={token} refused")
            return super().scan(item, ctx)

    with caplog.at_level(logging.DEBUG):
        code = await run_harness_async(
            Leaky(4), str(manifest), wal_dir=tmp_path / "wal", retries=1,
            on_scan_error="skip", **FAST,
        )  # fmt: skip
    assert code == ExitCode.DONE
    assert token not in caplog.text and "token=*** refused" in caplog.text
    assert token not in json.dumps(local_engine.bodies(run_id))
