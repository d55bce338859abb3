"""The runner as real processes: ``walchannel run`` killed, signalled and refused (issue 54).

Each harness is ``tests/helpers/runner_harness.py`` started by
``python -m walchannel run runner_harness:Harness`` against the local
engine on loopback; every exit code asserted here is produced by a real
process, and what the engine applied is audited by content.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from conftest import eventually, new_run
from walchannel.cli.inspection import inspect_log
from walchannel.runner import ExitCode
from walchannel.testing.engine import LocalEngine

HELPERS = Path(__file__).parent / "helpers"
BOUND_S = 60.0
#: The pace of a harness the test signals or stops after a few items: 30 s
#: or more from those items to its end, so it cannot end before the signal
#: however late the test reads its scans (a busy box: seen 6 s late).
SIGNALLED_PACE_S = "0.1"


def manifest_for(
    path: Path, engine: LocalEngine, run_id: str, token: str, deadline_s: float = 3600
) -> Path:
    deadline = datetime.now(UTC) + timedelta(seconds=deadline_s)
    path.write_text(
        json.dumps(
            {
                "runId": run_id,
                "correlationId": f"corr-{run_id}",
                "runToken": token,
                "hardDeadline": deadline.isoformat(),
                "grpcAddr": engine.grpc_addr,
            }
        )
    )
    path.chmod(0o600)
    return path


class Harness:
    """One ``walchannel run`` process and what it printed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.scanned: list[str] = []
        self.err = b""
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            text = line.decode().strip()
            if text.startswith("scanned "):
                self.scanned.append(text.split()[1])

    async def wait(self) -> int:
        assert self.proc.stderr is not None
        async with asyncio.timeout(BOUND_S):
            self.err = await self.proc.stderr.read()
            code = await self.proc.wait()
            await self._reader
        return code

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)


async def start(manifest: Path, wal: Path, *options: str, **env: str) -> Harness:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "walchannel",
        "run",
        "runner_harness:Harness",
        "--manifest",
        str(manifest),
        "--wal-dir",
        str(wal),
        "--progress-every",
        "0",
        *options,
        cwd=HELPERS,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return Harness(proc)


def audit(engine: LocalEngine, run_id: str, items: int) -> None:
    """Every finding of every item applied exactly once, and the Done."""
    got: Counter[tuple[str, int]] = Counter()
    for message in engine.bodies(run_id):
        if message["kind"] == "finding":
            fields: dict[str, Any] = message["body"]["fields"]
            got[(fields["item"], int(fields["n"]))] += 1
    want = Counter({(f"item-{i:04}", n): 1 for i in range(items) for n in range(i % 3)})
    assert got == want, (got - want, want - got)
    assert engine.accepted(run_id) == list(range(1, len(engine.accepted(run_id)) + 1))


@pytest.mark.asyncio
async def test_a_harness_killed_three_times_applies_every_finding_once(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token)
    wal = tmp_path / "wal"
    items = 300
    # Slow enough that no process can end before its kill, however late the
    # test sees its scans (a busy box); the last one runs at full speed.
    env = {"RUNNER_ITEMS": str(items), "RUNNER_PACE_S": "0.3"}
    for kill_after in (15, 25, 30):  # scans of each process: it resumes after the last
        harness = await start(manifest, wal, "--concurrency", "3", **env)

        def far_enough(h: Harness = harness, k: int = kill_after) -> bool:
            return len(h.scanned) >= k or h.proc.returncode is not None

        await eventually(far_enough, timeout=BOUND_S, what=f"{kill_after} items scanned")
        assert harness.proc.returncode is None, "it ended before the kill"
        harness.kill()
        assert await harness.wait() == -signal.SIGKILL
    harness = await start(manifest, wal, "--concurrency", "3", **{**env, "RUNNER_PACE_S": "0"})
    assert await harness.wait() == ExitCode.DONE, harness.err.decode()[-2000:]
    audit(local_engine, run_id, items)
    done = local_engine.done(run_id)
    assert done is not None and done["status"] == "completed"
    assert token not in harness.err.decode()
    # A retried pod on the finished run: exit 0, nothing scanned.
    again = await start(manifest, wal, **env)
    assert await again.wait() == ExitCode.DONE and not again.scanned


@pytest.mark.asyncio
async def test_sigterm_finishes_the_item_in_hand_drains_and_exits_143(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token)
    env = {"RUNNER_ITEMS": "400", "RUNNER_PACE_S": SIGNALLED_PACE_S}
    harness = await start(manifest, tmp_path / "wal", **env)
    await eventually(lambda: len(harness.scanned) >= 10, timeout=BOUND_S, what="10 items")
    harness.proc.send_signal(signal.SIGTERM)
    assert await harness.wait() == ExitCode.SIGTERM, harness.err.decode()[-2000:]
    assert local_engine.done(run_id) is None
    # Everything committed was delivered; the next start resumes after it.
    applied = {
        m["body"]["payload"]["item"] for m in local_engine.bodies(run_id) if m["kind"] == "event"
    }
    assert len(applied) < 400 and applied
    rest = await start(manifest, tmp_path / "wal", **{**env, "RUNNER_PACE_S": "0"})
    assert await rest.wait() == ExitCode.DONE
    assert rest.scanned[0] == f"item-{len(applied):04}"
    audit(local_engine, run_id, 400)


@pytest.mark.asyncio
async def test_ctrl_c_exits_130_and_the_next_start_resumes(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token)
    env = {"RUNNER_ITEMS": "300", "RUNNER_PACE_S": SIGNALLED_PACE_S}
    with sigint_not_ignored():
        harness = await start(manifest, tmp_path / "wal", **env)
    await eventually(lambda: len(harness.scanned) >= 10, timeout=BOUND_S, what="10 items")
    harness.proc.send_signal(signal.SIGINT)
    text = await ended(harness, ExitCode.INTERRUPTED)
    assert "Traceback" not in text and token not in text
    assert local_engine.done(run_id) is None
    rest = await start(manifest, tmp_path / "wal", **{**env, "RUNNER_PACE_S": "0"})
    assert await rest.wait() == ExitCode.DONE, rest.err.decode()[-2000:]
    assert rest.scanned and rest.scanned[0] != "item-0000"
    audit(local_engine, run_id, 300)


@pytest.mark.asyncio
async def test_a_run_found_by_discovery_says_so_without_httpxs_request_lines(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token)
    data = json.loads(manifest.read_text())
    # The manifest's gRPC address is stale: only discovery finds the engine.
    data["grpcAddr"] = "127.0.0.1:1"
    data["httpAddr"] = local_engine.http_addr
    manifest.write_text(json.dumps(data))
    env = {"RUNNER_ITEMS": "20", "RUNNER_PACE_S": "0"}
    harness = await start(manifest, tmp_path / "wal", "--allowed-host", "127.0.0.1", **env)
    text = await ended(harness, ExitCode.DONE)
    assert "HTTP Request" not in text, text[-3000:]
    audit(local_engine, run_id, 20)


@pytest.mark.asyncio
async def test_the_engines_stop_ends_the_run_with_exit_8(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token)
    harness = await start(
        manifest, tmp_path / "wal", RUNNER_ITEMS="400", RUNNER_PACE_S=SIGNALLED_PACE_S
    )
    await eventually(lambda: len(harness.scanned) >= 5, timeout=BOUND_S, what="5 items")
    assert await local_engine.send_stop(run_id, "the operator cancelled it")
    assert await harness.wait() == ExitCode.STOPPED, harness.err.decode()[-2000:]
    done = local_engine.done(run_id)
    assert done is not None and done["status"] == "stopped"
    assert len(harness.scanned) < 400


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("done", ExitCode.DONE),
        ("scan failed", ExitCode.SCAN_FAILED),
        ("scan exit", ExitCode.SCAN_EXIT),
        ("wrong token", ExitCode.REFUSED),
        ("no manifest key", ExitCode.USAGE),
        ("no such module", ExitCode.USAGE),
        ("deadline near", ExitCode.DEADLINE),
        ("deadline passed", ExitCode.EXPIRED),
    ],
)
async def test_each_outcome_exits_with_its_code(
    local_engine: LocalEngine, tmp_path: Path, case: str, code: int
) -> None:
    run_id, token = new_run(local_engine)
    manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token)
    options: list[str] = []
    env = {"RUNNER_ITEMS": "12"}
    if case in ("scan failed", "scan exit"):
        env["RUNNER_FAIL"] = "4"
        options += ["--retries", "1", "--on-scan-error", case.split()[1]]
        options[-1] = {"failed": "fail", "exit": "exit"}[case.split()[1]]
    elif case == "wrong token":
        manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, "tok-wrong-one")
    elif case == "no manifest key":
        data = json.loads(manifest.read_text())
        del data["grpcAddr"]
        manifest.write_text(json.dumps(data))
    elif case == "deadline near":
        manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token, deadline_s=30)
    elif case == "deadline passed":
        manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token, deadline_s=-5)
    harness = await start(manifest, tmp_path / "wal", *options, **env)
    if case == "no such module":
        harness.proc.kill()
        await harness.wait()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "walchannel",
            "run",
            "no_such_scanner:Harness",
            "--manifest",
            str(manifest),
            cwd=HELPERS,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        assert proc.returncode == code and b"no_such_scanner" in err
        return
    got = await harness.wait()
    text = harness.err.decode()
    assert got == code, text[-2000:]
    assert token not in text
    if code in (ExitCode.REFUSED, ExitCode.USAGE, ExitCode.DEADLINE, ExitCode.EXPIRED):
        assert not harness.scanned
        done = local_engine.done(run_id)
        # Only a deadline still says how the run ended: its marker (the local engine
        # keeps the resume point) and its Done, and nothing else.
        assert local_engine.accepted(run_id) == ([1, 2] if code == ExitCode.DEADLINE else [])
        assert [m["kind"] for m in local_engine.bodies(run_id)][:1] == (
            ["progress"] if code == ExitCode.DEADLINE else []
        )
        assert (done or {}).get("status") == ("deadline" if code == ExitCode.DEADLINE else None)
    assert f"exit {int(code)} ({ExitCode(code).name}" in text


def test_the_exit_code_tables_and_the_deployment_examples_agree() -> None:
    """SPEC's table is ExitCode, and the Job's and the unit's lists are its non-retriable codes."""
    import re

    from conftest import ROOT
    from walchannel.runner import NOT_RETRIABLE

    spec = (ROOT / "SPEC.md").read_text().split("**Exit codes**", 1)[1].split("\n\n", 2)[1]
    rows = re.findall(r"^\| (\d+) \| (\w+) \| [^|]+ \| (yes|no) \|$", spec, re.M)
    assert [(int(c), n, r == "yes") for c, n, r in rows] == sorted(
        (int(code), code.name, code.retriable) for code in ExitCode
    )
    fatal = sorted(int(code) for code in NOT_RETRIABLE if code)  # 0 is the job's success
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    job = re.search(r"operator: In\n\s+values: \[([\d, ]+)\]", deployment)
    unit = re.search(r"^RestartPreventExitStatus=([\d ]+)$", deployment, re.M)
    assert job is not None and unit is not None
    assert [int(v) for v in job.group(1).split(",")] == fatal
    assert [int(v) for v in unit.group(1).split()] == fatal
    # The command's --help lists the same codes, retriable ones marked.
    from walchannel.cli import build_parser

    help_text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()  # type: ignore[union-attr]
    for code in ExitCode:
        mark = "*" if code.retriable else ""
        assert re.search(rf"\b{int(code)}{re.escape(mark)} ", help_text), (code, help_text)


# -- the other outcomes, each from a real process ----------------------------------------


async def scanned_some(harness: Harness, count: int) -> None:
    def far_enough() -> bool:
        return len(harness.scanned) >= count or harness.proc.returncode is not None

    await eventually(far_enough, timeout=BOUND_S, what=f"{count} items scanned")
    assert harness.proc.returncode is None, harness.err.decode()[-2000:]


@contextlib.contextmanager
def sigint_not_ignored() -> Iterator[None]:
    """Start children that act on SIGINT, whatever this process does with it.

    A process started in the background by a shell without job control (CI's
    ``make test &``, ``nohup``) ignores SIGINT, and a child inherits an ignored
    signal, Python too: its Ctrl-C would then do nothing (seen: the harness
    ran to its end, exit 0). A handler of ours is not inherited: the child
    starts with SIGINT at its default.
    """
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


async def ended(harness: Harness, code: int) -> str:
    got = await harness.wait()
    text = harness.err.decode()
    assert got == code, text[-3000:]
    assert f"exit {int(code)} ({ExitCode(code).name}" in text
    return text


@pytest.mark.asyncio
async def test_a_second_harness_on_the_same_log_exits_5_and_the_first_goes_on(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token)
    env = {"RUNNER_ITEMS": "60", "RUNNER_PACE_S": "0.25"}  # the first goes on 15 s
    first = await start(manifest, tmp_path / "wal", **env)
    await scanned_some(first, 3)
    second = await start(manifest, tmp_path / "wal", **env)
    text = await ended(second, ExitCode.LOCKED)
    assert "pid" in text and not second.scanned
    assert await first.wait() == ExitCode.DONE
    audit(local_engine, run_id, 60)


@pytest.mark.asyncio
@pytest.mark.parametrize("first_ends", ["killed mid-scan", "completed"])
async def test_a_new_log_on_a_run_another_log_wrote_scans_nothing(
    local_engine: LocalEngine, tmp_path: Path, first_ends: str
) -> None:
    # A lost or misplaced log (a WALCHANNEL_DIR typo, a volume gone): the
    # engine holds the run's rows from another log.
    run_id, token = new_run(local_engine)
    manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token)
    pace = "0.5" if first_ends == "killed mid-scan" else "0.02"  # killed: 30 s to go
    env = {"RUNNER_ITEMS": "60", "RUNNER_PACE_S": pace}
    first = await start(manifest, tmp_path / "wal-a", **env)
    if first_ends == "completed":
        assert await first.wait() == ExitCode.DONE
    else:
        await scanned_some(first, 10)
        await eventually(lambda: len(local_engine.accepted(run_id)) > 3, what="rows applied")
        first.kill()
        await first.wait()
    applied = len(local_engine.accepted(run_id))
    other = await start(manifest, tmp_path / "wal-b", **env)
    code = ExitCode.COMPLETED_ELSEWHERE if first_ends == "completed" else ExitCode.FENCED
    await ended(other, code)
    assert not other.scanned and len(local_engine.accepted(run_id)) == applied
    if first_ends == "completed":
        # The log this open made is a tombstone, not "idle … the run has no Done"
        # (as after `prune` and a restart, issue 58); a retry needs no engine.
        report = inspect_log(tmp_path / "wal-b" / f"{run_id}.wal.sqlite3")
        assert report.state == "completed", report
        again = await start(manifest, tmp_path / "wal-b", **env)
        await ended(again, ExitCode.COMPLETED_ELSEWHERE)
        assert not again.scanned


@pytest.mark.asyncio
@pytest.mark.parametrize("damage", ["not a database", "another program's database"])
async def test_a_damaged_log_exits_6_naming_it(
    local_engine: LocalEngine, tmp_path: Path, damage: str
) -> None:
    run_id, token = new_run(local_engine)
    manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token)
    env = {"RUNNER_ITEMS": "30"}
    first = await start(
        manifest,
        tmp_path / "wal",
        "--on-scan-error",
        "exit",
        "--retries",
        "0",
        RUNNER_FAIL="20",
        **env,
    )
    await ended(first, ExitCode.SCAN_EXIT)
    log = tmp_path / "wal" / f"{run_id}.wal.sqlite3"
    if damage == "not a database":
        data = bytearray(log.read_bytes())
        data[:16] = b"this is no db!!\0"
        log.write_bytes(bytes(data))
    else:
        import sqlite3

        log.unlink()
        with contextlib.closing(sqlite3.connect(log)) as other:
            other.execute("CREATE TABLE notes (text TEXT)")
            other.commit()
    again = await start(manifest, tmp_path / "wal", **env)
    text = await ended(again, ExitCode.LOG_BROKEN)
    assert str(log) in text and not again.scanned


@pytest.mark.asyncio
async def test_an_engine_that_lost_acked_rows_ends_the_run_7(tmp_path: Path) -> None:
    from walchannel.testing.engine import LocalEngine as Engine

    run_id, token = "run-behind", "tok-behind-1"
    env = {"RUNNER_ITEMS": "200", "RUNNER_PACE_S": "0.1"}  # 20 s: killed before its end
    async with Engine(tmp_path / "store-a.sqlite3") as engine:
        engine.register_run(run_id, token)
        manifest = manifest_for(tmp_path / "m.json", engine, run_id, token)
        first = await start(manifest, tmp_path / "wal", **env)
        await scanned_some(first, 30)
        await eventually(lambda: len(engine.accepted(run_id)) > 20, what="rows acked")
        first.kill()
        await first.wait()
    # Its replacement comes up on an empty store: the acked rows are gone.
    async with Engine(tmp_path / "store-b.sqlite3") as fresh:
        fresh.register_run(run_id, token)
        manifest = manifest_for(tmp_path / "m.json", fresh, run_id, token)
        again = await start(manifest, tmp_path / "wal", **env)
        text = await ended(again, ExitCode.RUN_FAILED)
        assert "behind" in text


@pytest.mark.asyncio
@pytest.mark.parametrize("ending", ["Done not acked", "SIGTERM with rows left"])
async def test_an_engine_gone_after_the_first_answer_leaves_the_rows_in_the_log(
    tmp_path: Path, ending: str
) -> None:
    from walchannel.testing.engine import LocalEngine as Engine

    run_id, token = "run-gone", "tok-gone-1"
    async with Engine(tmp_path / "store.sqlite3") as engine:
        engine.register_run(run_id, token)
        manifest = manifest_for(tmp_path / "m.json", engine, run_id, token)
        harness = await start(
            manifest,
            tmp_path / "wal",
            "--drain-timeout",
            "1",
            "--grace",
            "5",
            RUNNER_ITEMS="100",
            RUNNER_PACE_S="0.1",  # 10 s: signalled before its end
        )
        await scanned_some(harness, 5)
        await engine.kill()
        # It scans on (the log had an answer): its rows wait in the log.
        if ending == "SIGTERM with rows left":
            await scanned_some(harness, 15)
            harness.proc.send_signal(signal.SIGTERM)
            await ended(harness, ExitCode.ROWS_LEFT)
        else:
            await ended(harness, ExitCode.DONE_NOT_ACKED)
            assert len(harness.scanned) == 100


@pytest.mark.asyncio
async def test_no_engine_for_a_new_log_exits_15_scanning_nothing(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    manifest = tmp_path / "m.json"
    deadline = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    manifest.write_text(
        json.dumps(
            {
                "runId": "run-none",
                "correlationId": "c",
                "runToken": "tok-none-1",
                "hardDeadline": deadline,
                "grpcAddr": f"127.0.0.1:{port}",
            }
        )
    )
    manifest.chmod(0o600)
    harness = await start(manifest, tmp_path / "wal", "--first-answer", "1")
    await ended(harness, ExitCode.NO_ENGINE)
    assert not harness.scanned


@pytest.mark.asyncio
async def test_sigterm_during_a_long_scan_exits_within_the_grace(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token)
    # Each scan takes 20 s: the grace period (4 s) must not wait for one.
    harness = await start(
        manifest, tmp_path / "wal", "--grace", "4", RUNNER_ITEMS="5", RUNNER_PACE_S="20"
    )
    await scanned_some(harness, 1)
    signalled = asyncio.get_running_loop().time()
    harness.proc.send_signal(signal.SIGTERM)
    got = await harness.wait()
    assert asyncio.get_running_loop().time() - signalled < 4.5, harness.err.decode()[-2000:]
    assert got in (ExitCode.SIGTERM, ExitCode.ROWS_LEFT)


@pytest.mark.parametrize(
    ("source", "target", "says"),
    [
        ("raise RuntimeError('no config file')\n", "broken_a:H", "raised RuntimeError: no config"),
        ("def f(:\n", "broken_b:H", "raised SyntaxError"),
        ("class H:\n    def __init__(self, root):\n        pass\n", "broken_c:H", "H() raised"),
    ],
)
def test_a_harness_that_does_not_load_exits_2_naming_why(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
    target: str,
    says: str,
) -> None:
    from walchannel.cli import main

    (tmp_path / f"{target.split(':')[0]}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", target, "--manifest", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert target in err and says in err, err


def test_an_unreadable_tls_ca_exits_2_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from walchannel.cli import main

    monkeypatch.chdir(HELPERS)
    monkeypatch.syspath_prepend(str(HELPERS))
    missing = tmp_path / "ca.pem"
    code = main(["run", "runner_harness:Harness", "--manifest", "m.json", "--tls-ca", str(missing)])
    assert code == 2
    assert f"--tls-ca {missing}: cannot be read" in capsys.readouterr().err


@pytest.mark.asyncio
async def test_walchannel_run_over_tls_with_a_ca_file(tmp_path: Path) -> None:
    import grpc

    from helpers.certs import make_certs
    from walchannel.testing.engine import LocalEngine as Engine

    certs = make_certs("localhost")
    ca = tmp_path / "ca.pem"
    ca.write_bytes(certs["cert"])
    tls = grpc.ssl_server_credentials([(certs["key"], certs["cert"])])
    async with Engine(server_credentials=tls) as engine:
        engine.register_run("run-tls", "tok-tls-1")
        manifest = manifest_for(tmp_path / "m.json", engine, "run-tls", "tok-tls-1")
        data = json.loads(manifest.read_text())
        data["grpcAddr"] = "localhost:" + engine.grpc_addr.rsplit(":", 1)[1]
        manifest.write_text(json.dumps(data))
        harness = await start(manifest, tmp_path / "wal", "--tls-ca", str(ca), RUNNER_ITEMS="9")
        await ended(harness, ExitCode.DONE)
        audit(engine, "run-tls", 9)


@pytest.mark.asyncio
async def test_a_log_the_disk_refuses_at_open_exits_16_retriable(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    manifest = manifest_for(tmp_path / "m.json", local_engine, run_id, token)
    # Files over a few KiB cannot be written (EFBIG, SQLite's "disk is full"); set by
    # a shell that then execs (no Python between fork and exec, beside gRPC threads).
    small_files = "trap '' XFSZ; ulimit -f 8; exec \"$@\""
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", small_files, "sh",
        sys.executable, "-m", "walchannel", "run", "runner_harness:Harness",
        "--manifest", str(manifest), "--wal-dir", str(tmp_path / "wal"),
        cwd=HELPERS, env={**os.environ, "RUNNER_ITEMS": "5"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), BOUND_S)
    text = err.decode()
    assert proc.returncode == ExitCode.LOG_WRITE_FAILED, text[-3000:]
    assert "exit 16 (LOG_WRITE_FAILED, retriable" in text and b"scanned" not in out
    assert ExitCode.LOG_WRITE_FAILED.retriable
    # With room again, the next start runs the whole run.
    again = await start(manifest, tmp_path / "wal", RUNNER_ITEMS="5")
    await ended(again, ExitCode.DONE)
    audit(local_engine, run_id, 5)
