"""The README's runnable examples run as written (a newcomer copies them first), and the
channel-level harness of docs/channel.md (a runner of one's own) with them."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import PYTHON, ROOT, child_env, eventually, new_run
from walchannel import (
    EXIT_ROWS_LEFT,
    EXIT_STOPPED,
    ChannelState,
    GrpcChannelConfig,
    GrpcEngineChannel,
    RunCompletedError,
)
from walchannel.cli.inspection import inspect_log
from walchannel.testing import LocalEngine


def _python_block_after(heading: str, doc: str = "README.md") -> str:
    text = (ROOT / doc).read_text()
    section = text.split(heading, 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


#: The channel-level harness: a runner of one's own (README points there).
CHANNEL_DOC = "docs/channel.md"


def test_the_local_engine_example_runs_without_a_warning(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(_python_block_after("### Trying it against the local engine"))
    proc = subprocess.run(
        [PYTHON, "-W", "error", str(script)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "[1, 2]", proc.stdout
    assert "B101" in lines[1], proc.stdout


_SCANNER = """
def scan(path: str) -> list[dict]:
    # Blocks on the last file until the engine holds earlier findings: it
    # returns at once only if the stream flows while the scanner runs. With
    # $AT_LAST set, it says it reached the last file and waits for $GO first.
    import time
    from walchannel.testing import LocalEngine

    if path == "bad.py":  # a NaN and a set: refused at send time, never logged
        return [
            {"path": path, "n": 0},
            {"path": path, "score": float("nan")},
            {"path": path, "n": 2},
            {"path": path, "tags": {"x"}},
        ]
    if path == "big.py":  # a message over max_message_bytes (4 MiB)
        return [{"path": path, "blob": "x" * (5 * 1024 * 1024)}, {"path": path, "n": 1}]
    if path != "last":
        return [{"path": path}]
    if os.environ.get("AT_LAST"):
        open(os.environ["AT_LAST"], "w").close()
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.02)
        return [{"path": path}]
    store, run = LocalEngine(store_path=os.environ["STORE"]), os.environ["RUN_ID"]
    deadline = time.monotonic() + 20
    while not store.accepted(run) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [{"path": path, "accepted_before": len(store.accepted(run))}]
"""

# The README's config, with the test's engine, folder and (shorter) waits:
# configuration, as a user would shorten them, not dropped steps.
_ADDRESS = """grpc_addr="engine:50051",
        http_addr="https://engines.internal","""
_TEST_CONFIG = """grpc_addr=os.environ["GRPC_ADDR"],
        wal_dir=os.environ["WAL"],
        connect_timeout_ms=int(os.environ.get("CONNECT_MS", "10000")),
        done_ack_timeout_ms=int(os.environ.get("DONE_ACK_MS", "5000")),"""


def async_example() -> str:
    """The README's asyncio harness, runnable here (scanner and config swapped)."""
    code = _python_block_after("## A harness on the channel", CHANNEL_DOC)
    scanner = code[code.index("def scan(") : code.index("def work_list(")]
    assert _ADDRESS in code and "return []" in scanner
    assert "DRAIN_TIMEOUT_MS = 600_000" in code
    code = code.replace(_ADDRESS, _TEST_CONFIG)
    code = code.replace(
        "DRAIN_TIMEOUT_MS = 600_000", 'DRAIN_TIMEOUT_MS = int(os.environ.get("DRAIN_MS", "600000"))'
    )
    assert "GRACE_S = 25" in code
    code = code.replace("GRACE_S = 25", 'GRACE_S = float(os.environ.get("GRACE_S", "25"))')
    return code.replace(scanner, _SCANNER + "\n\n")


def blocking_example() -> str:
    """The README's blocking harness: its ``run`` with the asyncio example's helpers."""
    helpers = async_example()
    helpers = helpers[: helpers.index("async def main(")]
    blocking = _python_block_after("The same without asyncio", CHANNEL_DOC)
    config = _TEST_CONFIG.replace("\n        ", " ")
    main = f"""
from walchannel import GrpcChannelConfig

config = GrpcChannelConfig(
    {config}
    run_id=os.environ["RUN_ID"], correlation_id=os.environ["CORR_ID"],
    run_token=os.environ["RUN_TOKEN"],
)
sys.exit(run(config, sys.argv[1:]))
"""
    return helpers + blocking + main


async def wait_for_file(path: Path, proc: asyncio.subprocess.Process) -> None:
    deadline = asyncio.get_running_loop().time() + 60
    while not path.exists():
        assert proc.returncode is None, "the harness exited early"
        assert asyncio.get_running_loop().time() < deadline, f"no {path.name}"
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_the_harness_example_streams_while_its_blocking_scanner_runs(
    tmp_path: Path,
) -> None:
    script = tmp_path / "harness.py"
    script.write_text(async_example())
    store = tmp_path / "store.sqlite3"
    async with LocalEngine(store_path=store) as engine:
        run_id, token = new_run(engine)
        env = child_env(
            RUN_ID=run_id,
            CORR_ID="corr-readme",
            RUN_TOKEN=token,
            GRPC_ADDR=engine.grpc_addr,
            WAL=str(tmp_path / "wal"),
            STORE=str(store),
        )
        proc = await asyncio.create_subprocess_exec(
            PYTHON, str(script), "a.py", "b.py", "last", env=env, stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()[-3000:]
        assert engine.accepted(run_id) == [1, 2, 3, 4]  # three findings and the Done
        last = engine.bodies(run_id)[2]["body"]["fields"]
        assert last["path"] == "last" and last["accepted_before"] >= 1, last
        done = engine.done(run_id)
        assert done is not None and done["findings"] == 3
        # Coverage is the roots given, a bounded summary.
        assert done["coverage"] == ["a.py", "b.py", "last"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.asyncio
async def test_the_harness_example_waits_for_an_engine_that_comes_up_late(
    tmp_path: Path,
) -> None:
    # No engine for longer than connect_timeout_ms: handshake() raises
    # EngineUnavailableError; the example scans on and the late engine gets it all.
    script = tmp_path / "harness.py"
    script.write_text(async_example())
    port = free_port()
    store = tmp_path / "store.sqlite3"
    run_id, token = f"run-late-{port}", "tok-late-engine-readme"
    env = child_env(
        RUN_ID=run_id,
        CORR_ID="corr-readme",
        RUN_TOKEN=token,
        GRPC_ADDR=f"127.0.0.1:{port}",
        WAL=str(tmp_path / "wal"),
        STORE=str(store),
        CONNECT_MS="1000",
    )
    proc = await asyncio.create_subprocess_exec(
        PYTHON, str(script), "a.py", "b.py", env=env, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stderr is not None
    said = b""
    while b"scanning on; rows wait in the log" not in said:  # the channel's warnings first
        line = await asyncio.wait_for(proc.stderr.readline(), 60)
        assert line, f"the harness ended: {said.decode()[-2000:]}"
        said += line
    async with LocalEngine(store_path=store, grpc_port=port) as engine:
        engine.register_run(run_id, token)
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()[-3000:]
        assert engine.accepted(run_id) == [1, 2, 3]  # two findings and the Done, once
        assert engine.duplicates(run_id) == 0 and engine.gaps(run_id) == []


@pytest.mark.asyncio
async def test_the_blocking_example_exits_non_zero_when_done_is_not_acked(
    tmp_path: Path,
) -> None:
    script = tmp_path / "blocking.py"
    script.write_text(blocking_example())
    store = tmp_path / "store.sqlite3"
    at_last, go = tmp_path / "at-last", tmp_path / "go"
    engine = LocalEngine(store_path=store)
    await engine.start()
    try:
        run_id, token = new_run(engine)
        env = child_env(
            RUN_ID=run_id,
            CORR_ID="corr-readme",
            RUN_TOKEN=token,
            GRPC_ADDR=engine.grpc_addr,
            WAL=str(tmp_path / "wal"),
            STORE=str(store),
            AT_LAST=str(at_last),
            GO=str(go),
            DONE_ACK_MS="1000",
            DRAIN_MS="1500",
        )
        proc = await asyncio.create_subprocess_exec(
            PYTHON, str(script), "a.py", "last", env=env, stderr=asyncio.subprocess.PIPE
        )
        await wait_for_file(at_last, proc)
    finally:
        await engine.stop()  # the engine goes away just before Done
    go.touch()
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 1, err.decode()[-3000:]
    # The Done is in the log, not lost: a restart or `walchannel flush` delivers it.
    (log,) = (tmp_path / "wal").glob("*.wal.sqlite3")
    report = inspect_log(log)
    assert report.unacked_count is not None and report.unacked_count >= 1
    assert report.state == "orphaned"


# SIGTERM mid-scan (docs/deployment.md): the README's harnesses finish the
# file in hand, drain within the grace period and say in their exit code
# whether rows were left; the next start delivers what was left, once.
GRACE_S = 8.0


async def _sigterm_at_last(
    script: Path, env: dict[str, str], at_last: Path, go: Path, before_term: Any = None
) -> tuple[int, float, str]:
    """Start the harness, SIGTERM it while it scans "last", let it go on; (code, s, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        PYTHON, str(script), "a.py", "last", "z.py", env=env, stderr=asyncio.subprocess.PIPE
    )
    await wait_for_file(at_last, proc)
    if before_term is not None:
        await before_term()
    loop = asyncio.get_running_loop()
    proc.send_signal(signal.SIGTERM)
    signalled = loop.time()
    go.touch()
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, loop.time() - signalled, err.decode()


def _grace_env(tmp_path: Path, run_id: str, token: str, grpc_addr: str) -> dict[str, str]:
    return child_env(
        RUN_ID=run_id,
        CORR_ID="corr-readme",
        RUN_TOKEN=token,
        GRPC_ADDR=grpc_addr,
        WAL=str(tmp_path / "wal"),
        STORE=str(tmp_path / "store.sqlite3"),
        AT_LAST=str(tmp_path / "at-last"),
        GO=str(tmp_path / "go"),
        GRACE_S=str(GRACE_S),
    )


async def _wait_for_stored_ack(wal: Path, seq: int, engine: LocalEngine, run_id: str) -> None:
    """Until the harness stored an ack of ``seq`` in its log (read-only, as inspect does)."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        logs = list(wal.glob("*.wal.sqlite3"))
        if logs and inspect_log(logs[0]).last_acked_seq == seq:
            return
        assert asyncio.get_running_loop().time() < deadline, engine.accepted(run_id)
        await asyncio.sleep(0.02)


async def _restart(
    script: Path, env: dict[str, str], roots: tuple[str, ...] = ("a.py", "last", "z.py")
) -> None:
    """Start the harness again on the same roots (README: a stable work order)."""
    env = {k: v for k, v in env.items() if k not in ("AT_LAST", "GO")}
    proc = await asyncio.create_subprocess_exec(
        PYTHON, str(script), *roots, env=env, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-3000:]


@pytest.mark.asyncio
async def test_sigterm_mid_scan_with_the_engine_up_drains_and_exits_within_the_grace(
    tmp_path: Path,
) -> None:
    script = tmp_path / "harness.py"
    script.write_text(async_example())
    async with LocalEngine(store_path=tmp_path / "store.sqlite3") as engine:
        run_id, token = new_run(engine)
        env = _grace_env(tmp_path, run_id, token, engine.grpc_addr)
        code, took_s, err = await _sigterm_at_last(
            script, env, tmp_path / "at-last", tmp_path / "go"
        )
        assert code == EXIT_STOPPED == 143, err[-3000:]
        assert took_s < GRACE_S, (took_s, err[-3000:])
        # The file in hand was finished and acked; the next one was not taken.
        assert engine.accepted(run_id) == [1, 2]
        assert [b["body"]["fields"]["path"] for b in engine.bodies(run_id)] == ["a.py", "last"]
        assert engine.done(run_id) is None
        (log,) = (tmp_path / "wal").glob("*.wal.sqlite3")
        report = inspect_log(log)
        assert report.unacked_count == 0 and report.state == "idle", report
        await _restart(script, env)
        assert engine.accepted(run_id) == [1, 2, 3, 4]  # z.py and the Done, once
        assert engine.duplicates(run_id) == 0 and engine.gaps(run_id) == []
        assert [b["body"]["fields"]["path"] for b in engine.bodies(run_id)[:3]] == [
            "a.py",
            "last",
            "z.py",
        ]


@pytest.mark.asyncio
async def test_sigterm_with_the_engine_gone_exits_75_within_the_grace_and_the_next_start_delivers(
    tmp_path: Path,
) -> None:
    script = tmp_path / "blocking.py"
    script.write_text(blocking_example())
    store = tmp_path / "store.sqlite3"
    port = free_port()
    engine = LocalEngine(store_path=store, grpc_port=port)
    await engine.start()
    try:
        run_id, token = new_run(engine)
        env = _grace_env(tmp_path, run_id, token, engine.grpc_addr)

        async def engine_goes() -> None:
            # Once the harness stored a.py's ack: one row is left, not two.
            await _wait_for_stored_ack(tmp_path / "wal", 1, engine, run_id)
            await engine.stop()

        code, took_s, err = await _sigterm_at_last(
            script, env, tmp_path / "at-last", tmp_path / "go", before_term=engine_goes
        )
    finally:
        await engine.stop()
    assert code == EXIT_ROWS_LEFT == 75, err[-3000:]
    assert took_s < GRACE_S, (took_s, err[-3000:])
    assert "SIGTERM: closed with 1 row(s) unacked in the log" in err, err[-3000:]
    (log,) = (tmp_path / "wal").glob("*.wal.sqlite3")
    report = inspect_log(log)
    assert report.unacked_count == 1 and report.state == "orphaned", report
    async with LocalEngine(store_path=store, grpc_port=port) as engine:
        await _restart(script, env)
        assert engine.accepted(run_id) == [1, 2, 3, 4]  # last's finding, z.py, the Done
        assert engine.duplicates(run_id) == 0 and engine.gaps(run_id) == []
        paths = [b["body"]["fields"]["path"] for b in engine.bodies(run_id)[:3]]
        assert paths == ["a.py", "last", "z.py"]


@pytest.mark.asyncio
async def test_the_stats_table_holds_across_a_restart_and_after_done(tmp_path: Path) -> None:
    # README "Reading stats()": acked is the run's, sent this channel's;
    # state stays STREAMING once Done is acked.
    async with LocalEngine(store_path=tmp_path / "store.sqlite3") as engine:
        run_id, token = new_run(engine)
        config = GrpcChannelConfig(
            grpc_addr=engine.grpc_addr,
            wal_dir=tmp_path / "wal",
            run_id=run_id,
            correlation_id="corr",
            run_token=token,
        )
        async with GrpcEngineChannel(config) as channel:
            await channel.handshake("1.0", "stats", "1")
            for i in range(40):
                channel.send_finding({"i": i})
            assert await channel.wait_acked(timeout_ms=30_000)
            assert channel.stats().sent == 40
        async with GrpcEngineChannel(config) as channel:
            stats = channel.stats()
            assert (stats.state, stats.sent, stats.acked) == (ChannelState.IDLE, 0, 40)
            await channel.handshake("1.0", "stats", "1")
            assert await channel.send_done("completed", 40, ["."], "")
            assert channel.stats().state is ChannelState.STREAMING
        with pytest.raises(RunCompletedError):
            GrpcEngineChannel(config)


@pytest.mark.asyncio
@pytest.mark.parametrize("example", ["asyncio", "blocking"])
async def test_sigterm_while_waiting_for_the_done_ack_exits_75_within_the_grace(
    tmp_path: Path, example: str
) -> None:
    # The scan is over and Done is logged, but the engine is gone: the
    # example waits up to DRAIN_TIMEOUT_MS (ten minutes) for its ack. A
    # SIGTERM then ends the wait and the harness drains within the period.
    script = tmp_path / "harness.py"
    script.write_text(async_example() if example == "asyncio" else blocking_example())
    store = tmp_path / "store.sqlite3"
    port = free_port()
    engine = LocalEngine(store_path=store, grpc_port=port)
    await engine.start()
    try:
        run_id, token = new_run(engine)
        env = _grace_env(tmp_path, run_id, token, engine.grpc_addr)
        env["DONE_ACK_MS"] = "1000"
        proc = await asyncio.create_subprocess_exec(
            PYTHON, str(script), "a.py", "last", env=env, stderr=asyncio.subprocess.PIPE
        )
        await wait_for_file(tmp_path / "at-last", proc)
        await _wait_for_stored_ack(tmp_path / "wal", 1, engine, run_id)
    finally:
        await engine.stop()
    (tmp_path / "go").touch()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:  # "last"'s finding and the Done are logged, unacked
        logs = list((tmp_path / "wal").glob("*.wal.sqlite3"))
        if logs and inspect_log(logs[0]).unacked_count == 2:
            break
        assert loop.time() < deadline and proc.returncode is None
        await asyncio.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    signalled = loop.time()
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    took_s = loop.time() - signalled
    assert proc.returncode == EXIT_ROWS_LEFT, err.decode()[-3000:]
    assert took_s < GRACE_S, (took_s, err.decode()[-3000:])
    async with LocalEngine(store_path=store, grpc_port=port) as engine:
        await _restart(script, env, ("a.py", "last"))
        assert engine.accepted(run_id) == [1, 2, 3]  # the Done waiting in the log, once
        assert engine.duplicates(run_id) == 0 and engine.gaps(run_id) == []


@pytest.mark.asyncio
@pytest.mark.parametrize("example", ["asyncio", "blocking"])
async def test_a_finding_that_can_never_travel_is_reported_and_skipped_and_a_restart_moves_on(
    tmp_path: Path, example: str
) -> None:
    # bad.py yields a NaN and a set among good findings, big.py one over
    # max_message_bytes: the harness reports each with its file, logs the
    # file's other findings with the marker, and goes on. Killed later, it
    # resumes after them: no crash, no crash loop on the same file.
    script = tmp_path / "harness.py"
    script.write_text(async_example() if example == "asyncio" else blocking_example())
    roots = ("a.py", "bad.py", "big.py", "last", "z.py")
    async with LocalEngine(store_path=tmp_path / "store.sqlite3") as engine:
        run_id, token = new_run(engine)
        env = _grace_env(tmp_path, run_id, token, engine.grpc_addr)
        proc = await asyncio.create_subprocess_exec(
            PYTHON, str(script), *roots, env=env, stderr=asyncio.subprocess.PIPE
        )
        await wait_for_file(tmp_path / "at-last", proc)  # past bad.py and big.py
        proc.kill()
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        said = err.decode()
        assert "bad.py" in said and "nan is not a finite number" in said, said[-3000:]
        assert "set is not JSON-like" in said, said[-3000:]
        assert "big.py" in said and "max_message_bytes" in said, said[-3000:]
        restart = {k: v for k, v in env.items() if k not in ("AT_LAST", "GO")}
        proc = await asyncio.create_subprocess_exec(
            PYTHON, str(script), *roots, env=restart, stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()[-3000:]
        assert "bad.py" not in err.decode() and "big.py" not in err.decode(), err.decode()
        fields = [b["body"]["fields"] for b in engine.bodies(run_id) if b["kind"] == "finding"]
        got = [(f["path"], f.get("n")) for f in fields]
        assert got == [
            ("a.py", None),
            ("bad.py", 0.0),
            ("bad.py", 2.0),
            ("big.py", 1.0),
            ("last", None),
            ("z.py", None),
        ], got
        assert engine.duplicates(run_id) == 0 and engine.gaps(run_id) == []
        done = engine.done(run_id)
        assert done is not None and done["findings"] == 6, done


# -- the runner harness of "Use it in your harness" -----------------------------------


def _readme_manifest(path: Path, engine: LocalEngine, run_id: str, token: str) -> Path:
    """The README's manifest, with the test's run and engine."""
    shown = (ROOT / "README.md").read_text().split("cat > manifest.json <<'JSON'\n", 1)[1]
    data = json.loads(shown.split("JSON\n", 1)[0])
    assert set(data) == {
        "runId",
        "correlationId",
        "runToken",
        "hardDeadline",
        "grpcAddr",
        "httpAddr",
    }
    data.update(
        runId=run_id,
        correlationId=f"corr-{run_id}",
        runToken=token,
        grpcAddr=engine.grpc_addr,
        httpAddr=engine.http_addr,
    )
    data["hardDeadline"] = "2099-01-01T00:00:00Z"
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    return path


@pytest.mark.asyncio
async def test_the_readme_runner_harness_killed_twice_applies_every_finding_once(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    (tmp_path / "scanner.py").write_text(_python_block_after("## Use it in your harness"))
    command = (ROOT / "README.md").read_text().split("walchannel run scanner:Scanner", 1)[1]
    options = command.split("\n", 1)[0].split()
    assert options[:2] == ["--manifest", "manifest.json"], options
    want: set[tuple[str, int]] = set()
    for i in range(600):
        folder = tmp_path / "src" / f"pkg{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        lines = [f"x = {n}  # TODO {n}" if n % (i % 5 + 2) == 0 else "pass" for n in range(12)]
        (folder / f"m{i:04}.py").write_text("\n".join(lines) + "\n")
        want |= {
            (str(Path("src") / f"pkg{i % 7}" / f"m{i:04}.py"), n + 1)
            for n, line in enumerate(lines)
            if "TODO" in line
        }
    run_id, token = new_run(local_engine)
    _readme_manifest(tmp_path / "manifest.json", local_engine, run_id, token)
    argv = [
        PYTHON,
        "-m",
        "walchannel",
        "run",
        "scanner:Scanner",
        *options,
        "--wal-dir",
        str(tmp_path / "wal"),
        "--progress-every",
        "0",
    ]

    def findings() -> int:
        return sum(1 for m in local_engine.bodies(run_id) if m["kind"] == "finding")

    for at in (len(want) // 5, len(want) // 2):
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=tmp_path, env=child_env(), stderr=asyncio.subprocess.DEVNULL
        )
        await eventually(
            lambda a=at, p=proc: findings() >= a or p.returncode is not None,
            timeout=60,
            what=f"{at} findings applied",
        )
        assert proc.returncode is None, "the scan ended before the kill"
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=tmp_path, env=child_env(), stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-3000:]
    got = [
        (m["body"]["fields"]["path"], int(m["body"]["fields"]["line"]))
        for m in local_engine.bodies(run_id)
        if m["kind"] == "finding"
    ]
    assert len(got) == len(set(got)) and set(got) == want  # once each, none lost
    done = local_engine.done(run_id)
    assert done is not None and done["status"] == "completed" and done["coverage"] == ["src"]
    assert token not in err.decode()


@pytest.mark.asyncio
async def test_the_readme_local_engine_command_runs_as_printed(tmp_path: Path) -> None:
    # Issue 58, item 8: one command starts an engine with discovery and a run,
    # and the command it prints runs the README's harness to the end.
    block = (ROOT / "README.md").read_text().split("To try it now", 1)[1]
    engine_line, run_line = block.split("```sh", 1)[1].split("```", 1)[0].strip().splitlines()
    assert engine_line == "walchannel engine --manifest manifest.json"
    (tmp_path / "scanner.py").write_text(_python_block_after("## Use it in your harness"))
    for i in range(5):
        (tmp_path / "src").mkdir(exist_ok=True)
        (tmp_path / "src" / f"m{i}.py").write_text("x = 1  # TODO\npass\n# TODO again\n")
    engine = await asyncio.create_subprocess_exec(
        PYTHON, "-m", *engine_line.split(), cwd=tmp_path, env=child_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        said: list[str] = []
        assert engine.stdout is not None
        while not said or not said[-1].startswith("Ctrl-C"):
            line = await asyncio.wait_for(engine.stdout.readline(), 30)
            assert line, (said, await engine.stderr.read() if engine.stderr else b"")
            said.append(line.decode().rstrip())
        printed = next(s.strip() for s in said if s.strip().startswith("walchannel run"))
        assert printed == run_line.replace("scanner:Scanner", "MODULE:ATTR"), said
        manifest = json.loads((tmp_path / "manifest.json").read_text())
        assert (tmp_path / "manifest.json").stat().st_mode & 0o077 == 0
        assert manifest["runToken"] not in "\n".join(said)  # the token only in the file
        run = await asyncio.create_subprocess_exec(
            PYTHON, "-m", *run_line.split(), "--wal-dir", str(tmp_path / "wal"),
            cwd=tmp_path, env=child_env(), stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(run.communicate(), 60)
        assert run.returncode == 0, err.decode()[-3000:]
        assert "plaintext" not in err.decode()  # --allowed-host as printed
        assert manifest["runToken"] not in err.decode()
        # A second engine on the same manifest path refuses, and writes nothing.
        second = subprocess.run(
            [PYTHON, "-m", *engine_line.split()], cwd=tmp_path, env=child_env(),
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert second.returncode == 2 and "manifest.json exists" in second.stdout, second
        assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    finally:
        engine.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(engine.wait(), 30) == 0
    assert not (tmp_path / "manifest.json").exists()  # its addresses died with the engine


@pytest.mark.asyncio
@pytest.mark.parametrize("second", ["async", "blocking"])
async def test_a_second_harness_on_the_same_log_exits_5_naming_the_first(
    tmp_path: Path, second: str
) -> None:
    # Issue 58, item 7: the example left WalLockedError as a traceback.
    first_script, second_script = tmp_path / "first.py", tmp_path / "second.py"
    first_script.write_text(async_example())
    second_script.write_text(async_example() if second == "async" else blocking_example())
    store = tmp_path / "store.sqlite3"
    async with LocalEngine(store_path=store) as engine:
        run_id, token = new_run(engine)
        env = child_env(
            RUN_ID=run_id, CORR_ID="corr-readme", RUN_TOKEN=token, GRPC_ADDR=engine.grpc_addr,
            WAL=str(tmp_path / "wal"), STORE=str(store),
            AT_LAST=str(tmp_path / "at-last"), GO=str(tmp_path / "go"),
        )  # fmt: skip
        first = await asyncio.create_subprocess_exec(
            PYTHON, str(first_script), "a.py", "last", env=env, stderr=asyncio.subprocess.PIPE
        )
        await wait_for_file(tmp_path / "at-last", first)  # it holds the log now
        other = await asyncio.create_subprocess_exec(
            PYTHON, str(second_script), "a.py", "last", env=env, stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(other.communicate(), 60)
        text = err.decode()
        assert other.returncode == 5, text[-3000:]
        assert "not scanning" in text and f"pid {first.pid}" in text, text
        assert "Traceback" not in text and token not in text, text
        (tmp_path / "go").touch()
        _, err = await asyncio.wait_for(first.communicate(), 120)
        assert first.returncode == 0, err.decode()[-3000:]
        assert engine.accepted(run_id) == [1, 2, 3]  # the first's two findings and its Done


def test_the_readme_first_screen_reaches_a_harness_within_40_lines() -> None:
    # Issue 58, item 8: the two commands, then a harness a reader can copy, before
    # any figure; the first code block after the commands starts within 40 lines.
    lines = (ROOT / "README.md").read_text().splitlines()
    commands = next(i for i, line in enumerate(lines) if line.startswith("make demo"))
    fences = [i for i, line in enumerate(lines) if line.startswith("```")]
    closing = next(i for i in fences if i > commands)  # of the commands' block
    first = next(i for i in fences if i > closing)
    assert first < 40 and lines[first] == "```python", (first, lines[first])
