"""``inspect`` says what to do, not only what is (issue 28, item 3).

Every state, and every cause of ``failed``, gets its next step, in the table
and in ``--json`` (``next_step``); an ``active`` run in an outage shows its
last error; an explicit ``$WALCHANNEL_DIR`` that names no folder is an error
like an explicit PATH.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import textwrap
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest

from conftest import PYTHON, child_env, new_run
from walchannel.cli.inspection import JSON_KEYS, inspect_log
from walchannel.log import RunLog
from walchannel.log.files import log_path
from walchannel.log.state import (
    FAILED_CORRUPT,
    FAILED_DONE_REFUSED,
    FAILED_ENGINE_BEHIND,
    FAILED_INTERNAL,
    FAILED_UNDELIVERABLE,
)
from walchannel.testing.engine import LocalEngine

FINDING = {"test_id": "B101", "n": 1}


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "walchannel", *args],
        capture_output=True,
        text=True,
        env=child_env(**env),
        timeout=60,
    )


@pytest.fixture
def owned() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def make(folder: Path, run_id: str, rows: int = 2, *, ack: bool = False) -> Path:
    with RunLog.open(folder, run_id, correlation_id="c") as wal:
        seqs = wal.append_many([("finding", FINDING)] * rows)
        if ack and seqs:
            wal.ack(seqs[-1])
    return log_path(folder, run_id)


def failed(folder: Path, run_id: str, reason: str) -> Path:
    with RunLog.open(folder, run_id, correlation_id="c") as wal:
        wal.append("finding", FINDING)
        wal.update_meta(failed_at=time.time(), failed_reason=reason, last_error="boom")
    return log_path(folder, run_id)


EXPECTED = {
    "corrupt": "move ",
    "unreadable": "shorter path",
    "failed-behind": "restore its store",
    "failed-done": "raise the engine's receive limit, then 'walchannel flush",
    "failed-undeliverable": "may already be applied (this log may be an older copy); do not",
    "failed-undeliverable-older": "do not re-send or re-import them",
    "failed-damaged": "aside and keep it",
    "failed-internal": "a walchannel bug: report",
    "orphaned": "restart the harness for run-orphaned",
    "stuck": "fix what the last error names",
    "done-pending": "wait (usually seconds)",
    "active-outage": "the engine is not answering",
    "active": "nothing",
    "idle": "restart the harness to finish it",
    "completed": "'walchannel prune --older-than DAYS",
}


class TenMinutesAgo:
    """A ``walchannel.clock.Clock`` ten minutes behind, on an unknown boot."""

    def monotonic_ms(self) -> float:
        return time.monotonic() * 1000

    def wall_s(self) -> float:
        return time.time() - 600

    def boot_s(self) -> float:
        return time.monotonic()

    def boot_id(self) -> str | None:
        return None


def build_every_state(folder: Path, owned: ExitStack) -> dict[str, Path]:
    logs: dict[str, Path] = {}
    folder.mkdir()
    logs["corrupt"] = folder / "run-corrupt.wal.sqlite3"
    logs["corrupt"].write_bytes(b"not a database at all" * 100)
    logs["failed-behind"] = failed(folder, "run-f1", FAILED_ENGINE_BEHIND)
    logs["failed-done"] = failed(folder, "run-f2", f"{FAILED_DONE_REFUSED}: seq 9")
    logs["failed-undeliverable"] = failed(folder, "run-f3", FAILED_UNDELIVERABLE)
    # The text an older walchannel stored for the same cause.
    older = (
        "run completed with undeliverable rows: the engine says the run is completed while "
        "this log still holds unacked rows (walchannel export saves them)"
    )
    logs["failed-undeliverable-older"] = failed(folder, "run-f6", older)
    logs["failed-damaged"] = failed(folder, "run-f4", FAILED_CORRUPT)
    logs["failed-internal"] = failed(folder, "run-f5", f"{FAILED_INTERNAL}: KeyError: 'x'")
    logs["orphaned"] = make(folder, "run-orphaned")
    logs["idle"] = make(folder, "run-idle", ack=True)
    done = owned.enter_context(RunLog.open(folder, "run-completed", correlation_id="c"))
    done.append("done", {"status": "completed", "findings": 0, "coverage": [], "summary": ""})
    done.complete_by_engine()
    done.close()
    logs["completed"] = done.path
    # Owned by this process (a live owner): stuck, done-pending, active.
    # Its row appended ten minutes ago, by a boot it cannot tell (the wall clock decides).
    stuck = owned.enter_context(
        RunLog.open(folder, "run-stuck", correlation_id="c", clock=TenMinutesAgo())
    )
    stuck.append("finding", FINDING)
    stuck.update_meta(last_error="10.0.0.1:50051: UNAVAILABLE", last_error_at=time.time() - 500)
    logs["stuck"] = stuck.path
    pending = owned.enter_context(RunLog.open(folder, "run-pending", correlation_id="c"))
    pending.append("done", {"status": "completed", "findings": 0, "coverage": [], "summary": ""})
    logs["done-pending"] = pending.path
    outage = owned.enter_context(RunLog.open(folder, "run-outage", correlation_id="c"))
    outage.append("finding", FINDING)
    outage.update_meta(last_error="engine: Connection refused", last_error_at=time.time())
    logs["active-outage"] = outage.path
    fine = owned.enter_context(RunLog.open(folder, "run-active", correlation_id="c"))
    fine.append("finding", FINDING)
    logs["active"] = fine.path
    return logs


def test_every_state_and_every_failed_cause_has_its_next_step(
    tmp_path: Path, owned: ExitStack
) -> None:
    logs = build_every_state(tmp_path / "wal", owned)
    for name, path in logs.items():
        report = inspect_log(path, stuck_after_s=120)
        want_state = name.split("-")[0] if name != "done-pending" else name
        assert report.state == want_state, (name, report)
        assert EXPECTED[name] in report.next_step, (name, report.next_step)
        if "'walchannel " in EXPECTED[name] or name == "corrupt":
            assert str(path.parent) in report.next_step  # commands name the file
    outage = inspect_log(logs["active-outage"])
    assert "Connection refused" in outage.detail(time.time())  # an outage shows its error
    assert "Connection refused" not in inspect_log(logs["active"]).detail(time.time())

    # --json carries next_step; the table has it under each run (--wide: a column).
    listed = cli("inspect", str(tmp_path / "wal"), "--json")
    assert listed.returncode == 1, listed.stderr
    objects = json.loads(listed.stdout)
    assert all(tuple(o) == JSON_KEYS and o["next_step"] for o in objects)
    by_run = {o["run_id"]: o for o in objects}
    assert "restore its store" in by_run["run-f1"]["next_step"]
    table = cli("inspect", str(tmp_path / "wal"))
    assert sum(line.startswith("    next step: ") for line in table.stdout.splitlines()) == len(
        [o for o in objects if o["next_step"] != "nothing"]
    )
    assert "restart the harness for run-orphaned" in table.stdout
    wide = cli("inspect", str(tmp_path / "wal"), "--wide")
    assert wide.stdout.splitlines()[0].rstrip().endswith("NEXT STEP")


def test_an_unreadable_log_names_the_fix(tmp_path: Path) -> None:
    short = tmp_path / "s"
    make(short, "run-long")
    deep = tmp_path.joinpath(*["d" * 200] * 2, "e" * 100)
    deep.parent.mkdir(parents=True)
    short.rename(deep)
    report = inspect_log(log_path(deep, "run-long"))
    assert report.state == "unreadable"
    assert EXPECTED["unreadable"] in report.next_step


def test_an_explicit_walchannel_dir_that_is_missing_is_an_error(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    for args in (("inspect",), ("inspect", "--json"), ("prune", "--older-than", "7", "--dry-run")):
        result = cli(*args, WALCHANNEL_DIR=str(typo))
        assert result.returncode == 2, (args, result)
        assert f"WALCHANNEL_DIR={typo}: no such folder" in result.stderr
    # The same typo as PATH was already an error.
    assert cli("inspect", str(typo)).returncode == 2
    # Only the default folder may be missing quietly (no run logged here yet).
    quiet = cli("inspect", WALCHANNEL_DIR="", XDG_STATE_HOME=str(tmp_path / "state"))
    assert quiet.returncode == 0 and "does not exist yet" in quiet.stdout


# -- the orphan's flush step, run as printed (the operator's day, item 2) ----------------------

# A harness: handshakes, logs 3 findings and waits for their acks, says
# "acked", then on a line of stdin logs 4 more (its engine is dead by then),
# says "ready" and waits to be killed. argv: WAL_DIR RUN_ID GRPC_ADDR
# HTTP_ADDR (or "-"); the token in $HARNESS_TOKEN.
_HARNESS = textwrap.dedent(
    """
    import asyncio, os, sys, warnings
    from walchannel import Backoff, GrpcChannelConfig, GrpcEngineChannel

    async def main():
        wal_dir, run_id, grpc_addr, http_addr = sys.argv[1:5]
        warnings.simplefilter("ignore")  # plaintext discovery on loopback
        config = GrpcChannelConfig(
            grpc_addr=grpc_addr, http_addr=None if http_addr == "-" else http_addr,
            run_id=run_id, correlation_id="corr-" + run_id,
            run_token=os.environ["HARNESS_TOKEN"], wal_dir=wal_dir, connect_timeout_ms=2000,
            backoff=Backoff(initial_ms=100, max_ms=200, jitter_ms=0))
        channel = GrpcEngineChannel(config)
        await channel.handshake("1.2", "next-step-test", "0.1")
        for i in range(3):
            channel.send_finding({"n": i})
        assert await channel.wait_acked(timeout_ms=20_000)
        while channel.log.last_acked_seq < 3:  # acks are stored within ~100 ms
            await asyncio.sleep(0.02)
        print("acked", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        for i in range(3, 7):
            channel.send_finding({"n": i})
        print("ready", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


async def _run(*argv: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.DEVNULL, stdout=PIPE, stderr=PIPE, env=env
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _orphan(
    wal_dir: Path, run_id: str, token: str, grpc_addr: str, http_addr: str, kill_engine: Any
) -> str:
    """Run the harness until 3 rows are acked, kill its engine, log 4 more, SIGKILL it.

    Returns what the harness wrote on stderr (to look for the token in).
    """
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-c",
        _HARNESS,
        str(wal_dir),
        run_id,
        grpc_addr,
        http_addr,
        stdin=PIPE,
        stdout=PIPE,
        stderr=PIPE,
        env=child_env(HARNESS_TOKEN=token),
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"acked\n"
        await kill_engine()
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"ready\n"
    finally:
        proc.kill()
        _, err = await proc.communicate()
    return err.decode()


def _printed_flush(step: str) -> list[str]:
    """The ``walchannel flush …`` command a NEXT STEP prints, as argv (shell rules)."""
    found = re.search(r"'(walchannel flush [^']*)'", step)
    assert found, step
    argv = shlex.split(found.group(1))
    return [PYTHON, "-m", *argv]  # `walchannel` is `python -m walchannel`


@pytest.mark.asyncio
async def test_the_orphans_flush_step_names_discovery_and_runs_as_printed(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    """The harness's engine is dead: the step asks discovery (stored by handshake())."""
    run_id, token = new_run(local_engine)
    wal_dir = tmp_path / "wal"
    outputs = [
        await _orphan(
            wal_dir,
            run_id,
            token,
            local_engine.grpc_addr,
            local_engine.http_addr,
            local_engine.kill,
        )
    ]
    await local_engine.replace()  # a new engine behind the same discovery URL
    rc, out, err = await _run(
        PYTHON, "-m", "walchannel", "inspect", str(wal_dir), "--json", env=child_env()
    )
    outputs += [out, err]
    [item] = json.loads(out)
    assert item["state"] == "orphaned" and item["unacked_count"] == 4, item
    step = item["next_step"]
    # Where the token will go, and where it comes from, are in the step itself.
    assert f"--http-addr {local_engine.http_addr}" in step, step
    assert "--token-env WALCHANNEL_RUN_TOKEN" in step, step

    # Plaintext discovery: the host its answer may send the token to (issue 58).
    assert "--allowed-host 127.0.0.1" in step, step

    rc, out, err = await _run(*_printed_flush(step), env=child_env(WALCHANNEL_RUN_TOKEN=token))
    outputs += [out, err]
    assert rc == 0, err
    assert "plaintext" not in err, err  # run as printed, it has nothing to warn of
    # (8: the log's marker, repeated for the engine that keeps the resume point.)
    assert local_engine.accepted(run_id)[:7] == list(range(1, 8))
    assert local_engine.duplicates(run_id) == 0
    assert all(token not in text for text in outputs)


@pytest.mark.asyncio
async def test_the_orphans_flush_step_names_the_last_engine_without_discovery(
    tmp_path: Path,
) -> None:
    """Without discovery the step names the last engine; one stands in at that address."""
    store = tmp_path / "engine.sqlite3"
    first = LocalEngine(store, http_port=None)
    await first.start()
    run_id, token = new_run(first)
    addr = first.grpc_addr
    wal_dir = tmp_path / "wal"
    try:
        outputs = [await _orphan(wal_dir, run_id, token, addr, "-", first.stop)]
    finally:
        await first.stop()
    report = inspect_log(log_path(wal_dir, run_id))
    assert report.state == "orphaned" and report.unacked_count == 4
    assert f"--grpc-addr {addr}" in report.next_step, report.next_step
    assert "--token-env WALCHANNEL_RUN_TOKEN" in report.next_step
    second = LocalEngine(store, grpc_port=int(addr.rsplit(":", 1)[1]), http_port=None)
    await second.start()
    try:
        argv = _printed_flush(report.next_step)
        # flush applies --allowed-host to an address read from a log: outside, never dialled.
        rc, out, err = await _run(
            *argv, "--allowed-host", "10.0.0.0/8", env=child_env(WALCHANNEL_RUN_TOKEN=token)
        )
        outputs += [out, err]
        assert rc == 2, err
        assert f"{addr}" in err and "--allowed-host" in err, err
        assert second.accepted(run_id) == [1, 2, 3]
        rc, out, err = await _run(*argv, env=child_env(WALCHANNEL_RUN_TOKEN=token))
        outputs += [out, err]
        assert rc == 0, err
        assert second.accepted(run_id) == list(range(1, 8))
        assert second.duplicates(run_id) == 0
    finally:
        await second.stop()
    assert all(token not in text for text in outputs)


@pytest.mark.parametrize(
    ("state", "error", "noted"),
    [
        ("orphaned", "127.0.0.1:9: UNAUTHENTICATED: unknown run or invalid token", True),
        ("failed", "127.0.0.1:9: UNAUTHENTICATED: unknown run or invalid token", True),
        ("orphaned", "127.0.0.1:9: UNAVAILABLE: connection refused", False),
    ],
)
def test_a_flush_step_after_unauthenticated_says_when_to_replace_the_token(
    tmp_path: Path, state: str, error: str, noted: bool
) -> None:
    run_id = "run-unauth"
    with RunLog.open(tmp_path, run_id, correlation_id="c") as wal:
        wal.append("finding", FINDING)
        fields: dict[str, Any] = {"last_error": error, "last_engine_addr": "127.0.0.1:9"}
        if state == "failed":
            fields.update(failed_at=time.time(), failed_reason="stopped: reasons of its own")
        wal.update_meta(**fields)
    report = inspect_log(log_path(tmp_path, run_id))
    assert report.state == state
    step = report.next_step
    assert "'walchannel flush " in step
    # Conditional: a replacement engine that does not know the run yet says the same.
    assert ("--replace-token" in step) is noted, step
    if noted:
        assert "may be a replacement that does not know the run yet" in step
