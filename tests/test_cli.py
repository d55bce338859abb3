"""The operator's command, run for real: ``python -m walchannel ...`` in a subprocess.

SPEC "Operating tools": inspect (states, --json keys, --show, --verify,
read-only next to a live run), flush (delivers an orphaned run exactly once;
refuses a live owner, a wrong token, a log without handshake), export,
prune, usage errors, and the token never in any output.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from conftest import PYTHON, ROOT, child_env, eventually
from walchannel import (
    EngineBehindError,
    EngineUnavailableError,
    GrpcEngineChannel,
    RunCompletedError,
)
from walchannel.cli.inspection import JSON_KEYS
from walchannel.formatting import format_age, format_size
from walchannel.log import RunLog
from walchannel.log.format import check_header
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config

# Every token a test makes, and every output a command printed: checked after each test.
_TOKENS: list[str] = []
_OUTPUTS: list[str] = []


@pytest.fixture(autouse=True)
def _token_never_printed() -> Iterator[None]:
    _TOKENS.clear()
    _OUTPUTS.clear()
    yield
    assert _TOKENS, "the test made no token to look for"
    for token in _TOKENS:
        for output in _OUTPUTS:
            assert token not in output, "a run token appeared in the command's output"


def new_token() -> str:
    token = "tok-" + secrets.token_urlsafe(24)
    _TOKENS.append(token)
    return token


def new_run(prefix: str = "run") -> tuple[str, str]:
    return f"{prefix}-{secrets.token_hex(4)}", new_token()


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def _record(rc: int, out: str, err: str) -> Result:
    _OUTPUTS.extend((out, err))
    return Result(rc, out, err)


def cli(*args: str | Path, stdin: str = "", env: dict[str, str] | None = None) -> Result:
    """Run ``python -m walchannel ARGS`` and wait for it (for tests without an event loop)."""
    proc = subprocess.run(
        [PYTHON, "-m", "walchannel", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        env=env or child_env(),
        timeout=60,
    )
    return _record(proc.returncode, proc.stdout, proc.stderr)


async def acli(*args: str | Path, stdin: str = "", env: dict[str, str] | None = None) -> Result:
    """As :func:`cli`, without blocking the event loop (an in-process engine keeps serving)."""
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "walchannel",
        *map(str, args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env or child_env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    assert proc.returncode is not None
    return _record(proc.returncode, out.decode(), err.decode())


def by_run(result: Result) -> dict[str, dict[str, Any]]:
    return {Path(item["file"]).name: item for item in result.json()}


def log_file(wal_dir: Path, run_id: str) -> Path:
    return wal_dir / f"{run_id}.wal.sqlite3"


def dead_addr() -> str:
    """A loopback address nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def finding(i: int, pad: int = 0) -> dict[str, Any]:
    return {"n": i, "text": f"finding {i}", "pad": "x" * pad}


def make_log(wal_dir: Path, run_id: str, rows: int, *, token: str | None = None) -> Path:
    """An orphaned log written directly (no channel, no engine), with a stored handshake."""
    with RunLog.open(wal_dir, run_id, correlation_id=f"corr-{run_id}") as wal:
        wal.update_meta(connector_version="1", harness_name="h", harness_version="1")
        if token is not None:
            wal.update_meta(token_sha256=hashlib.sha256(token.encode()).hexdigest())
        for i in range(rows):
            wal.append("finding", {"fields": finding(i, pad=120)})
    return log_file(wal_dir, run_id)


# -- inspect beside a live run ------------------------------------------------------

# Calls the real main() in a tight loop on one log until told to stop, and
# reports the states and exit codes it saw.
_INSPECTOR = textwrap.dedent(
    """
    import contextlib, io, json, os, sys, time
    from walchannel.cli import main
    log, stop = sys.argv[1], sys.argv[2]
    states, codes, n = {}, {}, 0
    while not os.path.exists(stop):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["inspect", log, "--json"])
        codes[rc] = codes.get(rc, 0) + 1
        for item in json.loads(buf.getvalue()):
            states[item["state"]] = states.get(item["state"], 0) + 1
        n += 1
    print(json.dumps({"runs": n, "states": states, "codes": codes}))
    """
)


@pytest.mark.asyncio
async def test_inspect_in_a_tight_loop_never_disturbs_a_live_run(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="walchannel")
    run_id, token = new_run()
    local_engine.register_run(run_id, token)
    wal_dir = tmp_path / "wal"
    n = 4000
    config = local_channel_config(local_engine, wal_dir, run_id, token)
    async with GrpcEngineChannel(config) as ch:
        log = log_file(wal_dir, run_id)
        wal_side = Path(f"{log}-wal")
        stop = tmp_path / "stop"
        inspector = await asyncio.create_subprocess_exec(
            PYTHON,
            "-c",
            _INSPECTOR,
            str(log),
            str(stop),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
        )
        try:
            await ch.handshake("1", "cli-test", "1")
            live = await acli("inspect", log, "--json")
            assert live.rc == 0, live.err
            assert live.json()[0]["state"] == "active"
            assert live.json()[0]["locked_by"]["pid"] == os.getpid()
            biggest_wal = 0
            for i in range(n):
                # ~600-byte rows: each commit writes a 4 KiB page frame, so
                # thousands of rows pass far more than the bound below
                # through the -wal unless checkpoints keep resetting it.
                ch.send_finding(finding(i, pad=500))
                if i % 20 == 0:
                    await asyncio.sleep(0)
                    with contextlib.suppress(FileNotFoundError):
                        biggest_wal = max(biggest_wal, wal_side.stat().st_size)
            # A bound for a box with every CPU busy (4 000 rows beside a tight-loop
            # inspector took over 30 s under `make test-stress` with other load).
            assert await ch.wait_acked(timeout_ms=120_000), (
                f"not all acked in 120 s: {ch.stats()}; "
                f"the engine holds {len(local_engine.accepted(run_id))} of {n}"
            )
            during = await acli("inspect", log)
            assert during.rc == 0, during.err
            assert "active" in during.out
        finally:
            stop.touch()
            out, err = await asyncio.wait_for(inspector.communicate(), 30)
        _OUTPUTS.extend((out.decode(), err.decode()))
        assert inspector.returncode == 0, err.decode()[-2000:]
        seen = json.loads(out)
        stats = ch.stats()
    assert local_engine.accepted(run_id) == list(range(1, n + 1))
    assert local_engine.duplicates(run_id) == 0
    assert seen["runs"] >= 10, seen
    assert set(seen["states"]) == {"active"}, seen
    assert set(seen["codes"]) == {"0"}, seen
    assert stats.protocol_errors == 0
    assert "locked" not in (stats.last_error or "")
    assert not [r for r in caplog.records if "locked" in r.getMessage()]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # The owner's checkpoints kept the -wal from growing with the run: never
    # reset, its 4 000 commits would pass 4 000 page frames (16.5 MB). A reset
    # needs a moment with no reader, which the tight inspect loop and busy
    # CPUs make rare: 8.4 MB was seen under load, so the bound is 12 MiB.
    print(f"inspect ran {seen['runs']} times; largest -wal {biggest_wal} bytes")
    assert biggest_wal < 12 * 1024 * 1024, biggest_wal


# -- stuck, failed ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_run_whose_engine_is_down_is_stuck(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run()
    local_engine.register_run(run_id, token)
    await local_engine.kill()  # its address is dead from now on
    wal_dir = tmp_path / "wal"
    config = local_channel_config(local_engine, wal_dir, run_id, token, connect_timeout_ms=300)
    async with GrpcEngineChannel(config) as ch:
        with pytest.raises(EngineUnavailableError):
            await ch.handshake("1", "cli-test", "1")
        for i in range(3):
            ch.send_finding(finding(i))
        await eventually(lambda: ch.log.meta().last_error is not None, what="a stored error")
        await asyncio.sleep(0.2)
        stuck = await acli("inspect", wal_dir, "--json", "--stuck-after", "0.1")
        assert stuck.rc == 1, stuck.err
        [item] = stuck.json()
        assert item["state"] == "stuck"
        assert item["unacked_count"] == 3
        assert item["next_seq"] == 4 and item["last_acked_seq"] == 0
        assert 0.2 <= item["oldest_unacked_age_s"] < 30
        assert item["last_error"] and item["last_error_at"] is not None
        assert item["locked_by"] == {"pid": os.getpid(), "host": socket.gethostname()}
        assert "oldest unacked row" in item["reason"]
        human = await acli("inspect", wal_dir, "--stuck-after", "0.1")
        assert human.rc == 1
        assert "stuck" in human.out and "last error" in human.out
        # Under the default threshold the same run is only active.
        fine = await acli("inspect", wal_dir, "--json")
        assert fine.rc == 0 and fine.json()[0]["state"] == "active"


@pytest.mark.asyncio
async def test_an_engine_behind_the_cursor_shows_failed(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run()
    local_engine.register_run(run_id, token)
    wal_dir = tmp_path / "wal"
    async with GrpcEngineChannel(local_channel_config(local_engine, wal_dir, run_id, token)) as ch:
        await ch.handshake("1", "cli-test", "1")
        for i in range(5):
            ch.send_finding(finding(i))
        assert await ch.wait_acked(timeout_ms=10_000)
    # A fresh engine with an empty store: it knows the run but lost its rows.
    fresh = LocalEngine()
    await fresh.start()
    try:
        fresh.register_run(run_id, token)
        config = local_channel_config(fresh, wal_dir, run_id, token)
        async with GrpcEngineChannel(config) as ch:
            ch.send_finding(finding(5))  # logged before the handshake: stays unacked
            with pytest.raises(EngineBehindError):
                await ch.handshake("1", "cli-test", "1")
        failed = await acli("inspect", wal_dir, "--json")
        assert failed.rc == 1, failed.err
        [item] = failed.json()
        assert item["state"] == "failed"  # before orphaned
        assert item["unacked_count"] == 1 and item["last_acked_seq"] == 5
        assert "below the stored cursor" in item["last_error"]
        # flush cannot mend it: the engine is still behind (exit 1, not refused).
        flush = await acli(
            "flush",
            log_file(wal_dir, run_id),
            "--grpc-addr",
            fresh.grpc_addr,
            "--timeout",
            "10",
            stdin=token + "\n",
        )
        assert flush.rc == 1, flush.err
        assert "behind" in flush.err
    finally:
        await fresh.stop()


# -- orphaned and flush -------------------------------------------------------------

# A harness that opens a channel to a dead engine, sends N findings and waits
# to be killed. argv: WAL_DIR RUN_ID GRPC_ADDR N HANDSHAKE(0|1); token in $RUN_TOKEN.
_HARNESS = textwrap.dedent(
    """
    import asyncio, contextlib, os, sys
    from walchannel import Backoff, GrpcChannelConfig, GrpcEngineChannel
    from walchannel.errors import EngineUnavailableError

    async def main():
        wal_dir, run_id, addr, n, handshake = sys.argv[1:6]
        config = GrpcChannelConfig(
            grpc_addr=addr, run_id=run_id, correlation_id="corr-" + run_id,
            run_token=os.environ["RUN_TOKEN"], wal_dir=wal_dir, connect_timeout_ms=200,
            backoff=Backoff(initial_ms=100, max_ms=200, jitter_ms=0))
        channel = GrpcEngineChannel(config)
        if handshake == "1":
            with contextlib.suppress(EngineUnavailableError):
                await channel.handshake("1.2", "cli-test", "0.1")
        for i in range(int(n)):
            channel.send_finding({"n": i, "text": f"finding {i}"}, progress={"next": i + 1})
        print("ready", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


async def start_harness(
    wal_dir: Path, run_id: str, token: str, n: int, *, handshake: bool = True
) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-c",
        _HARNESS,
        str(wal_dir),
        run_id,
        dead_addr(),
        str(n),
        "1" if handshake else "0",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(RUN_TOKEN=token),
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    if line.strip() != b"ready":
        proc.kill()
        _, err = await proc.communicate()
        raise AssertionError(f"harness did not start: {err.decode()[-2000:]}")
    return proc


async def sigkill(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGKILL)
    _, err = await proc.communicate()
    _OUTPUTS.append(err.decode())


@pytest.mark.asyncio
async def test_a_sigkilled_harness_is_orphaned_and_flush_delivers_it_once(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    wal_dir = tmp_path / "wal"
    run_id, token = new_run()
    n = 25
    log = log_file(wal_dir, run_id)
    harness = await start_harness(wal_dir, run_id, token, n)
    try:
        # Owner alive: flush is refused and names it; the run is not orphaned.
        held = await acli(
            "flush",
            log,
            "--grpc-addr",
            local_engine.grpc_addr,
            "--token-env",
            "RUN_TOKEN",
            env=child_env(RUN_TOKEN=token),
        )
        assert held.rc == 2, held.err
        assert f"pid {harness.pid}" in held.err
        alive = await acli("inspect", log, "--json")
        assert alive.json()[0]["state"] == "active"
        assert alive.json()[0]["locked_by"]["pid"] == harness.pid
    finally:
        await sigkill(harness)

    orphaned = await acli("inspect", wal_dir, "--json")
    assert orphaned.rc == 1, orphaned.err
    [item] = orphaned.json()
    assert item["state"] == "orphaned"
    assert item["unacked_count"] == n and item["locked_by"] is None
    assert item["next_seq"] == n + 1

    local_engine.register_run(run_id, token)
    wrong = await acli(
        "flush", log, "--grpc-addr", local_engine.grpc_addr, stdin=new_token() + "\n"
    )
    assert wrong.rc == 2 and "token does not match" in wrong.err
    assert local_engine.accepted(run_id) == []

    # The token on standard input, the engine found through discovery.
    flushed = await acli(
        "flush", log, "--http-addr", local_engine.http_addr, "--timeout", "30", stdin=token
    )
    assert flushed.rc == 0, flushed.err
    assert f"flushed run {run_id}" in flushed.out
    # Plain http:// discovery without --allowed-host: warned in the CLI's terms,
    # not as the config's Python warning pointing into walchannel/cli/flush.py.
    assert "plaintext" in flushed.err and "--allowed-host" in flushed.err, flushed.err
    assert "InsecureDiscoveryWarning" not in flushed.err and "flush.py" not in flushed.err
    # n + 1: the log's marker again, for the engine that keeps the resume point
    # (its rows were logged before any answer announced it).
    assert local_engine.accepted(run_id) == list(range(1, n + 2))
    assert local_engine.duplicates(run_id) == 0
    bodies = [b for b in local_engine.bodies(run_id) if b["kind"] == "finding"]
    assert [b["body"]["fields"]["n"] for b in bodies] == [float(i) for i in range(n)]

    after = await acli("inspect", log, "--json")
    assert after.rc == 0 and after.json()[0]["state"] == "idle"
    assert after.json()[0]["unacked_count"] == 0 and after.json()[0]["last_acked_seq"] == n + 1
    assert after.json()[0]["resume_point"]["applied"] == 0  # flush's answer: nothing held yet
    again = await acli(
        "flush",
        log,
        "--grpc-addr",
        local_engine.grpc_addr,
        "--token-env",
        "RUN_TOKEN",
        env=child_env(RUN_TOKEN=token),
    )
    assert again.rc == 0 and "nothing to deliver" in again.out
    assert local_engine.accepted(run_id) == list(range(1, n + 2))

    # A harness killed before its handshake left nothing flush may speak for.
    silent_id, silent_token = new_run("silent")
    silent = await start_harness(wal_dir, silent_id, silent_token, 2, handshake=False)
    await sigkill(silent)
    local_engine.register_run(silent_id, silent_token)
    refused = await acli(
        "flush",
        log_file(wal_dir, silent_id),
        "--grpc-addr",
        local_engine.grpc_addr,
        stdin=silent_token,
    )
    assert refused.rc == 2 and "no stored handshake" in refused.err
    assert local_engine.accepted(silent_id) == []


@pytest.mark.asyncio
async def test_flush_delivers_a_pending_done_and_leaves_a_tombstone(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run()
    local_engine.register_run(run_id, token)
    wal_dir = tmp_path / "wal"
    config = local_channel_config(
        local_engine, wal_dir, run_id, token, done_ack_timeout_ms=200, connect_timeout_ms=300
    )
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "cli-test", "1")
        ch.send_finding(finding(0))
        assert await ch.wait_acked(timeout_ms=10_000)
        await local_engine.kill()
        assert await ch.send_done("completed", 1, ["all"], "") is False
        pending = await acli("inspect", wal_dir, "--json")
        assert pending.json()[0]["state"] == "done-pending"
    log = log_file(wal_dir, run_id)
    backup = tmp_path / "backup.sqlite3"
    shutil.copyfile(log, backup)  # closed: everything is in the main file
    await local_engine.replace()
    flush_args = ("flush", log, "--grpc-addr", local_engine.grpc_addr, "--token-env", "TOKEN")
    flushed = await acli(*flush_args, env=child_env(TOKEN=token))
    assert flushed.rc == 0, flushed.err
    assert "tombstone" in flushed.out
    assert local_engine.done(run_id) is not None
    assert local_engine.accepted(run_id) == [1, 2]
    done = await acli("inspect", wal_dir, "--json")
    assert done.rc == 0 and done.json()[0]["state"] == "completed"
    assert log.exists()  # flush never deletes a log
    tomb = await acli(*flush_args, env=child_env(TOKEN=token))
    assert tomb.rc == 0 and "nothing to flush" in tomb.out

    # The pre-flush copy restored: the engine answers "run completed" (exit 1).
    for leftover in (log, Path(f"{log}-wal"), Path(f"{log}-shm")):
        leftover.unlink(missing_ok=True)
    shutil.copyfile(backup, log)
    completed = await acli(*flush_args, "--timeout", "20", env=child_env(TOKEN=token))
    assert completed.rc == 1, completed.err
    assert "the engine says the run is completed" in completed.err
    assert local_engine.accepted(run_id) == [1, 2]


@pytest.mark.asyncio
async def test_flush_over_tls_with_a_ca_file_and_exit_1_on_timeout(tmp_path: Path) -> None:
    from helpers.certs import make_certs

    certs = make_certs("localhost")
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(certs["cert"])
    engine = LocalEngine(
        server_credentials=grpc.ssl_server_credentials([(certs["key"], certs["cert"])])
    )
    await engine.start()
    try:
        run_id, token = new_run()
        engine.register_run(run_id, token)
        log = make_log(tmp_path / "wal", run_id, 3, token=token)
        addr = "localhost:" + engine.grpc_addr.rsplit(":", 1)[1]
        # Plaintext against a TLS engine never gets an answer: exit 1 at the timeout.
        late = await acli("flush", log, "--grpc-addr", addr, "--timeout", "1.5", stdin=token)
        assert late.rc == 1, late.err
        assert "not all rows were acked within 1.5 s" in late.err
        assert engine.accepted(run_id) == []
        tls = await acli(
            "flush", log, "--grpc-addr", addr, "--ca-file", ca_file, "--timeout", "20", stdin=token
        )
        assert tls.rc == 0, tls.err
        assert engine.accepted(run_id) == [1, 2, 3]
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_flush_dials_only_allowed_hosts_that_discovery_names(
    tmp_path: Path, local_engine: LocalEngine
) -> None:
    run_id, token = new_run()
    local_engine.register_run(run_id, token)
    log = make_log(tmp_path / "wal", run_id, 3, token=token)
    http = local_engine.http_addr
    bad = await acli("flush", log, "--http-addr", http, "--allowed-host", "bad host!", stdin=token)
    assert bad.rc == 2 and "--allowed-host" in bad.err and "bad host!" in bad.err
    # Discovery answers 127.0.0.1, outside 10.0.0.0/8: never dialled, refused at once.
    fenced = await acli(
        "flush",
        log,
        "--http-addr",
        http,
        "--allowed-host",
        "10.0.0.0/8",
        "--timeout",
        "2",
        stdin=token,
    )
    assert fenced.rc == 2, fenced.err
    assert f"discovery at {http} named 127.0.0.1:" in fenced.err, fenced.err
    assert "--allowed-host allows; not dialled" in fenced.err, fenced.err
    assert local_engine.accepted(run_id) == []
    # So is a --grpc-addr outside it (an address copied from a log).
    given = await acli(
        "flush",
        log,
        "--grpc-addr",
        local_engine.grpc_addr,
        "--allowed-host",
        "engine.internal",
        stdin=token,
    )
    assert given.rc == 2, given.err
    assert f"--grpc-addr {local_engine.grpc_addr}: its host 127.0.0.1 is not" in given.err
    assert local_engine.accepted(run_id) == []
    allowed = await acli(
        "flush",
        log,
        "--http-addr",
        http,
        "--allowed-host",
        "127.0.0.0/8",
        "--timeout",
        "20",
        stdin=token,
    )
    assert allowed.rc == 0, allowed.err
    assert "set allowed_hosts" not in allowed.err
    assert local_engine.accepted(run_id) == [1, 2, 3]


def _stored_token_hash(log: Path) -> str | None:
    from walchannel.log.reader import LogReader

    with LogReader(log, log.name.removesuffix(".wal.sqlite3")) as reader:
        return reader.meta().token_sha256


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.mark.asyncio
async def test_flush_replace_token_flushes_a_log_started_with_a_wrong_token(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    """The operator's day, item 3: neither the right token nor the stored one could flush it."""
    run_id, right = new_run()
    wrong, other = new_token(), new_token()
    local_engine.register_run(run_id, right)
    wal_dir = tmp_path / "wal"
    # The harness was started with a wrong token: the engine refuses every dial.
    config = local_channel_config(local_engine, wal_dir, run_id, wrong, connect_timeout_ms=300)
    async with GrpcEngineChannel(config) as ch:
        for i in range(3):
            ch.send_finding(finding(i))
        with pytest.raises(EngineUnavailableError):
            await ch.handshake("1", "cli-test", "1")
    log = log_file(wal_dir, run_id)
    assert _stored_token_hash(log) == _sha(wrong)
    addr = ("--grpc-addr", local_engine.grpc_addr, "--token-env", "TOKEN")

    # The right token alone is refused: the refusal names the flag.
    refused = await acli("flush", log, *addr, env=child_env(TOKEN=right))
    assert refused.rc == 2, refused.err
    assert "token does not match" in refused.err and "--replace-token" in refused.err
    # The stored one: the engine refuses it; the message names the flag too.
    stored = await acli("flush", log, *addr, "--timeout", "2", env=child_env(TOKEN=wrong))
    assert stored.rc == 1, stored.err
    assert "UNAUTHENTICATED" in stored.err and "--replace-token" in stored.err, stored.err
    # A new token the engine refuses leaves the old hash.
    refused_new = await acli(
        "flush", log, *addr, "--replace-token", "--timeout", "2", env=child_env(TOKEN=other)
    )
    assert refused_new.rc == 1, refused_new.err
    assert "WARNING" in refused_new.err and "--replace-token" in refused_new.err
    assert "keeps the sha256 of the token it was started with" in refused_new.err
    assert _stored_token_hash(log) == _sha(wrong)
    assert local_engine.accepted(run_id) == []

    # The right one with the flag: a WARNING, every row delivered, the new hash stored.
    replaced = await acli(
        "flush", log, *addr, "--replace-token", "--timeout", "30", env=child_env(TOKEN=right)
    )
    assert replaced.rc == 0, replaced.err
    assert "WARNING" in replaced.err and "--replace-token: flushing" in replaced.err
    assert "accepted the replacement run token" in replaced.err, replaced.err
    assert f"flushed run {run_id}: 3 row(s) delivered" in replaced.out
    assert local_engine.accepted(run_id) == [1, 2, 3]
    assert _stored_token_hash(log) == _sha(right)
    # Now the right token flushes without the flag (nothing left to deliver).
    again = await acli("flush", log, *addr, env=child_env(TOKEN=right))
    assert again.rc == 0 and "nothing to deliver" in again.out, again.err

    # No token in any file of the log folder (outputs: the autouse check).
    for path in wal_dir.iterdir():
        data = path.read_bytes()
        for token in (right, wrong, other):
            assert token.encode() not in data, path


@pytest.mark.asyncio
async def test_flush_follows_the_proxy_policy_and_names_a_dead_proxy(
    tmp_path: Path, local_engine: LocalEngine
) -> None:
    run_id, token = new_run()
    local_engine.register_run(run_id, token)
    log = make_log(tmp_path / "wal", run_id, 2, token=token)
    dead = dead_addr()
    env = child_env(http_proxy=f"http://scan:SECRET@{dead}", https_proxy=f"http://{dead}")
    for name in ("no_proxy", "NO_PROXY", "grpc_proxy", "no_grpc_proxy", "all_proxy"):
        env.pop(name, None)
    stream = await acli(
        "flush", log, "--grpc-addr", local_engine.grpc_addr, "--timeout", "3", stdin=token, env=env
    )
    assert stream.rc == 1, stream.err
    assert f"via proxy {dead}" in stream.err and "SECRET" not in stream.err
    found = await acli(
        "flush", log, "--http-addr", local_engine.http_addr, "--timeout", "3", stdin=token, env=env
    )
    assert found.rc == 1, found.err
    assert f"discovery via proxy {dead}" in found.err
    assert local_engine.accepted(run_id) == []
    env["no_proxy"] = "127.0.0.1"
    direct = await acli(
        "flush", log, "--http-addr", local_engine.http_addr, "--timeout", "20", stdin=token, env=env
    )
    assert direct.rc == 0, direct.err
    assert local_engine.accepted(run_id) == [1, 2]


# -- corrupt files ------------------------------------------------------------------


def test_corrupt_foreign_and_empty_files_are_listed_beside_good_runs(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    run_id, _ = new_run()
    make_log(wal_dir, run_id, 3)
    (wal_dir / "junk.wal.sqlite3").write_bytes(secrets.token_bytes(8192))
    (wal_dir / "empty.wal.sqlite3").write_bytes(b"")
    with contextlib.closing(sqlite3.connect(wal_dir / "foreign.wal.sqlite3")) as other:
        other.execute("CREATE TABLE t (x)")
        other.commit()
    (wal_dir / f".{run_id}.~0001abcd").write_bytes(b"half made")
    (wal_dir / "notes.txt").write_text("not a log")
    nested = wal_dir / "nested"
    make_log(nested, "deeper", 1)

    result = cli("inspect", wal_dir, "--json")
    assert result.rc == 1, result.err
    runs = by_run(result)
    assert set(runs) == {
        f"{run_id}.wal.sqlite3",
        "junk.wal.sqlite3",
        "empty.wal.sqlite3",
        "foreign.wal.sqlite3",
    }
    assert runs[f"{run_id}.wal.sqlite3"]["state"] == "orphaned"
    assert runs[f"{run_id}.wal.sqlite3"]["unacked_count"] == 3
    assert "not a walchannel log (an empty file)" in runs["empty.wal.sqlite3"]["reason"]
    assert "not a usable SQLite database" in runs["junk.wal.sqlite3"]["reason"]
    assert "not a walchannel log" in runs["foreign.wal.sqlite3"]["reason"]
    for name in ("junk.wal.sqlite3", "empty.wal.sqlite3", "foreign.wal.sqlite3"):
        assert runs[name]["state"] == "corrupt"
        assert set(runs[name]) == set(JSON_KEYS)
    # Most urgent first: the corrupt files, then the orphaned run.
    assert [item["state"] for item in result.json()] == ["corrupt"] * 3 + ["orphaned"]

    human = cli("inspect", wal_dir)
    assert human.rc == 1
    # One row per run; its detail and next step are indented lines under it.
    lines = [line for line in human.out.splitlines() if not line.startswith("    ")]
    assert lines[0].split()[:2] == ["STATE", "RUN"]
    assert len(lines) == 5 and sum(line.startswith("corrupt") for line in lines) == 3
    # The table is aligned: every row's RUN column starts where the header's does.
    column = lines[0].index("RUN")
    assert all(line[column - 2 : column] == "  " and line[column] != " " for line in lines)

    # Export refuses what inspect calls corrupt.
    bad = cli("export", wal_dir / "junk.wal.sqlite3")
    assert bad.rc == 2 and "junk.wal.sqlite3" in bad.err


def _varint_len(data: bytearray, at: int) -> int:
    for i in range(9):
        if data[at + i] < 0x80:
            return i + 1
    return 9


def damage_a_row_in_the_middle_of_a_page(path: Path) -> None:
    """Overwrite the key of the middle cell of a middle leaf page of ``rows``.

    The cell gets its neighbour's seq: the file still opens, its header,
    schema and meta check out, and reading the backlog works, but the
    b-tree is broken ("rowid out of order"), which only a page check sees.
    """
    with contextlib.closing(sqlite3.connect(path)) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'rows'").fetchone()[0]
    data = bytearray(path.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")

    def header(page: int) -> int:
        return (page - 1) * page_size + (100 if page == 1 else 0)

    def u16(at: int) -> int:
        return int.from_bytes(data[at : at + 2], "big")

    top = header(root)
    assert data[top] == 0x05, "rows should span several pages (an interior root)"
    children = [
        int.from_bytes(data[(root - 1) * page_size + u16(top + 12 + 2 * i) :][:4], "big")
        for i in range(u16(top + 3))
    ]
    leaf = children[len(children) // 2]
    start = header(leaf)
    assert data[start] == 0x0D
    cells = u16(start + 3)
    base = (leaf - 1) * page_size

    def key_span(cell: int) -> tuple[int, int]:
        at = base + u16(start + 8 + 2 * cell)
        key = at + _varint_len(data, at)
        return key, _varint_len(data, key)

    here, size = key_span(cells // 2)
    there, size_before = key_span(cells // 2 - 1)
    assert size == size_before
    data[here : here + size] = data[there : there + size]
    path.write_bytes(bytes(data))


def test_verify_finds_damage_inside_a_page_that_the_header_checks_miss(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    run_id, _ = new_run()
    log = make_log(wal_dir, run_id, 400)  # closed: checkpointed into the main file
    assert not Path(f"{log}-wal").exists()
    damage_a_row_in_the_middle_of_a_page(log)
    with contextlib.closing(sqlite3.connect(f"{log.as_uri()}?mode=ro", uri=True)) as conn:
        check_header(conn, log, run_id)  # raises nothing: the header checks miss it

    plain = cli("inspect", log, "--json")
    assert plain.json()[0]["state"] == "orphaned"
    verified = cli("inspect", log, "--json", "--verify")
    assert verified.rc == 1
    [item] = verified.json()
    assert item["state"] == "corrupt"
    assert item["reason"].startswith("quick_check:")
    assert "out of order" in item["reason"]


# -- completed and prune ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_completed_run_shows_completed_and_prune_removes_it(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    wal_dir = tmp_path / "wal"
    tombs = []
    tokens = []
    for _ in range(2):
        run_id, token = new_run("done")
        tokens.append(token)
        local_engine.register_run(run_id, token)
        config = local_channel_config(local_engine, wal_dir, run_id, token)
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "cli-test", "1")
            ch.send_finding(finding(0))
            assert await ch.send_done("completed", 1, ["all"], "")
        tombs.append(log_file(wal_dir, run_id))
    idle_log = make_log(wal_dir, "idle-run", 0)

    listed = await acli("inspect", wal_dir, "--json")
    assert listed.rc == 0, listed.err
    states = {Path(k).name: v["state"] for k, v in by_run(listed).items()}
    assert states == {
        tombs[0].name: "completed",
        tombs[1].name: "completed",
        "idle-run.wal.sqlite3": "idle",
    }
    assert Path(f"{tombs[0]}.lock").exists()

    young = await acli("prune", wal_dir, "--older-than", "1")
    assert young.rc == 0 and "nothing to prune" in young.out
    assert all(t.exists() for t in tombs)

    with RunLog.open(wal_dir, tombs[1].name.removesuffix(".wal.sqlite3"), correlation_id="c"):
        # The second tombstone is held by a live owner (this process): prune
        # leaves it, and says so with exit 1, as its dry run does.
        dry = await acli("prune", wal_dir, "--older-than", "0", "--dry-run")
        pruned = await acli("prune", wal_dir, "--older-than", "0")
    for result in (dry, pruned):
        assert result.rc == 1, result
        assert f"cannot remove {tombs[1]}" in result.err, result.err
        assert f"held by pid {os.getpid()}" in result.err, result.err
    assert f"would remove {tombs[0]}" in dry.out and f"{tombs[1]}" not in dry.out
    assert f"removed {tombs[0]}" in pruned.out and f"{tombs[1]}" not in pruned.out
    for gone in (tombs[0], *(Path(f"{tombs[0]}{s}") for s in ("-wal", "-shm", ".lock"))):
        assert not gone.exists(), gone
    assert tombs[1].exists() and idle_log.exists()

    again = await acli("prune", wal_dir, "--older-than", "0")
    assert again.rc == 0 and f"removed {tombs[1]}" in again.out
    assert sorted(p.name for p in wal_dir.iterdir() if p.name.endswith(".wal.sqlite3")) == [
        "idle-run.wal.sqlite3"
    ]

    # A restart after prune: the engine says the run is completed; the new log
    # it made is a tombstone, not "idle … the run has no Done" (issue 58).
    run_id = tombs[0].name.removesuffix(".wal.sqlite3")
    config = local_channel_config(local_engine, wal_dir, run_id, tokens[0])
    async with GrpcEngineChannel(config) as ch:
        with pytest.raises(RunCompletedError):
            await ch.handshake("1", "cli-test", "1")
    listed = await acli("inspect", tombs[0], "--json")
    assert listed.rc == 0, listed.err
    assert [v["state"] for v in by_run(listed).values()] == ["completed"]
    with pytest.raises(RunCompletedError):
        GrpcEngineChannel(config)  # no dial needed any more


# -- the rest of the surface -------------------------------------------------------------


def test_export_refuses_to_write_over_the_log_it_reads(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    run_id, _ = new_run()
    log = make_log(wal_dir, run_id, 5)
    link = tmp_path / "link.jsonl"
    link.symlink_to(log)
    for target in (
        log,
        Path(f"{log}-wal"),
        Path(f"{log}-shm"),
        log.with_name(log.name + ".lock"),
        link,
    ):
        refused = cli("export", log, "-o", target)
        assert refused.rc == 2, (target, refused.err)
        assert str(log) in refused.err and "refusing" in refused.err, refused.err
    # Nothing was truncated or created: the five rows are all still there.
    assert not Path(f"{log}-wal").exists() or Path(f"{log}-wal").stat().st_size > 0
    [item] = cli("inspect", log, "--json").json()
    assert item["state"] == "orphaned" and item["unacked_count"] == 5
    assert len(cli("export", log).out.splitlines()) == 5


def test_a_meta_value_walchannel_never_writes_reads_as_corrupt(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    run_id, _ = new_run()
    log = make_log(wal_dir, run_id, 5)
    conn = sqlite3.connect(log)
    conn.execute("UPDATE meta SET last_acked_seq = 'abc'")
    conn.commit()
    conn.close()
    result = cli("inspect", wal_dir, "--json")
    assert result.rc == 1 and "Traceback" not in result.err, result.err
    [item] = result.json()
    assert item["state"] == "corrupt" and "last_acked_seq is 'abc'" in item["reason"], item
    # export must not answer "nothing to deliver" (it used to print nothing, exit 0):
    # it names the damaged cursor and salvages every row the log holds (exit 1).
    exported = cli("export", log)
    assert exported.rc == 1 and str(log) in exported.err and "last_acked_seq" in exported.err
    assert [json.loads(line)["seq"] for line in exported.out.splitlines()] == [1, 2, 3, 4, 5]


def test_json_keys_show_and_export(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    run_id, _ = new_run()
    log = make_log(wal_dir, run_id, 4)

    result = cli("inspect", wal_dir, "--json")
    [item] = result.json()
    assert list(item) == list(JSON_KEYS)
    assert set(JSON_KEYS) == {
        "run_id", "file", "state", "reason", "next_seq", "last_acked_seq",
        "unacked_count", "unacked_bytes", "oldest_unacked_age_s", "last_ack_at",
        "last_engine_addr", "last_error", "last_error_at", "locked_by",
        "quarantined", "file_bytes", "writer_id", "writer_epoch", "takeover", "group_commit",
        "resume_point", "next_step",
    }  # fmt: skip
    assert item["run_id"] == run_id and item["file"] == str(log)
    with RunLog.open(wal_dir, run_id, correlation_id=f"corr-{run_id}") as wal:
        writer = wal.writer
    assert (item["writer_id"], item["writer_epoch"], item["takeover"]) == (writer.id, 0, False)
    assert item["group_commit"] is None  # a log written without group commit
    assert item["resume_point"] is None  # no engine answered this log
    assert item["unacked_bytes"] > 4 * 120 and item["file_bytes"] >= log.stat().st_size
    assert item["quarantined"] == 0 and item["last_ack_at"] is None

    shown = cli("inspect", log, "--show", "2")
    lines = [line for line in shown.out.splitlines() if line.startswith("    seq ")]
    assert len(lines) == 2, shown.out
    assert lines[0].split()[:3] == ["seq", "1", "finding"]
    assert lines[1].split()[:3] == ["seq", "2", "finding"]
    assert '"text":"finding 1"' in lines[1] and lines[1].endswith("…")
    assert cli("inspect", log, "--json", "--show", "1").rc == 2

    exported = cli("export", log)
    assert exported.rc == 0, exported.err
    rows = [json.loads(line) for line in exported.out.splitlines()]
    assert [r["seq"] for r in rows] == [1, 2, 3, 4]
    assert all(set(r) == {"seq", "kind", "body", "appended_at"} for r in rows)
    assert rows[2]["kind"] == "finding" and rows[2]["body"]["fields"]["text"] == "finding 2"
    out_file = tmp_path / "rows.jsonl"
    assert cli("export", log, "-o", out_file).rc == 0
    assert out_file.read_text() == exported.out
    assert out_file.stat().st_mode & 0o777 == 0o600
    assert cli("export", tmp_path / "missing.wal.sqlite3").rc == 2


@pytest.mark.parametrize("command", ["run", "inspect", "flush", "export", "prune"])
def test_every_subcommand_help_has_an_example(command: str) -> None:
    new_token()
    result = cli(command, "--help")
    assert result.rc == 0
    assert "example" in result.out.lower()
    assert f"walchannel {command}" in result.out.split("example", 1)[1]


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["no-such-command"],
        ["inspect", "--stuck-after", "-1"],
        ["inspect", "--show", "many"],
        ["inspect", "--bogus"],
        ["flush", "x.wal.sqlite3"],  # no engine address
        ["flush", "x.wal.sqlite3", "--grpc-addr", "a:1", "--http-addr", "http://b"],
        ["flush", "x.wal.sqlite3", "--grpc-addr", "a:1", "--timeout", "0"],
        ["export"],
        ["prune"],  # --older-than is required
        ["prune", "--older-than", "-3"],
    ],
)
def test_bad_usage_exits_2(args: Sequence[str], tmp_path: Path) -> None:
    new_token()
    result = cli(*args, env=child_env(WALCHANNEL_DIR=str(tmp_path)))
    assert result.rc == 2, (result.out, result.err)
    assert result.err


@pytest.mark.parametrize("bad", ["t\u00f6k", "to\tk", "to\x7fk", "to\u00a0k"])
def test_flush_refuses_a_token_grpc_cannot_send_without_echoing_it(
    bad: str, tmp_path: Path
) -> None:
    token = new_token()
    run_id = f"run-{secrets.token_hex(4)}"
    log = make_log(tmp_path / "wal", run_id, 1, token=token)
    secret = token[:8] + bad + token[8:]
    _TOKENS.append(secret)
    for how, env, stdin in (
        ("TOKEN", child_env(TOKEN=secret), ""),
        ("standard input", None, secret + "\n"),
    ):
        args: list[str | Path] = ["flush", log, "--grpc-addr", dead_addr(), "--timeout", "5"]
        if env is not None:
            args += ["--token-env", "TOKEN"]
        result = cli(*args, env=env, stdin=stdin)
        assert result.rc == 2, result.err
        assert "run token" in result.err and how in result.err
        assert "printable ASCII" in result.err
        assert bad not in result.err and token[:8] not in result.err


def test_unreadable_paths_exit_2_naming_them(tmp_path: Path) -> None:
    new_token()
    missing = tmp_path / "nowhere"
    arg_lists: list[list[str | Path]] = [
        ["inspect", missing],
        ["prune", missing, "--older-than", "1"],
    ]
    for args in arg_lists:
        result = cli(*args)
        assert result.rc == 2 and str(missing) in result.err
    flush = cli("flush", missing / "r.wal.sqlite3", "--grpc-addr", "127.0.0.1:1", stdin="t")
    assert flush.rc == 2 and "r.wal.sqlite3" in flush.err
    assert not missing.exists()  # flush created nothing
    # The default folder comes from $WALCHANNEL_DIR.
    empty = tmp_path / "empty"
    empty.mkdir()
    listed = cli("inspect", env=child_env(WALCHANNEL_DIR=str(empty)))
    assert listed.rc == 0 and "no run logs" in listed.out
    # A fresh machine: the default folder does not exist yet. That is "no
    # runs" (exit 0, saying where it looked), not an error; nothing is created.
    # (An explicit $WALCHANNEL_DIR that is missing is an error: test_inspect_next_step.)
    fresh = tmp_path / "fresh" / "walchannel"
    for args in (["inspect"], ["inspect", "--json"], ["prune", "--older-than", "1"]):
        result = cli(*args, env=child_env(WALCHANNEL_DIR="", XDG_STATE_HOME=str(fresh.parent)))
        assert result.rc == 0, result
        assert str(fresh) in result.out or result.out.strip() == "[]", result
    assert not fresh.exists() and not fresh.parent.exists()


def test_ages_and_sizes_read_as_people_write_them() -> None:
    new_token()
    assert [format_age(s) for s in (None, -3, 0.4, 59, 192, 3599, 7512, 273_600)] == [
        "-", "0s", "0s", "59s", "3m12s", "59m59s", "2h05m", "3d04h",
    ]  # fmt: skip
    assert [format_size(b) for b in (None, 0, 512, 1229, 3 * 1024**2 + 400_000, 5 * 1024**4)] == [
        "-", "0 B", "512 B", "1.2 KiB", "3.4 MiB", "5.0 TiB",
    ]  # fmt: skip


def test_python_dash_m_walchannel_and_the_console_script_agree() -> None:
    new_token()
    result = cli("--version")
    assert result.rc == 0 and result.out.startswith("walchannel ")
    top = cli("--help")
    assert top.rc == 0
    assert all(name in top.out for name in ("inspect", "flush", "export", "prune"))
    script = Path(PYTHON).with_name("walchannel")
    if script.exists():
        proc = subprocess.run(
            [script, "--version"], capture_output=True, text=True, env=child_env(), timeout=30
        )
        assert proc.returncode == 0 and proc.stdout == result.out


def test_inspect_and_export_never_load_grpc_or_httpx(tmp_path: Path) -> None:
    new_token()
    wal_dir = tmp_path / "wal"
    log = make_log(wal_dir, "light", 2)
    code = textwrap.dedent(
        """
        import contextlib, io, sys
        import walchannel.cli
        with contextlib.redirect_stdout(io.StringIO()):
            codes = [walchannel.cli.main(["inspect", sys.argv[1], "--json", "--verify"]),
                     walchannel.cli.main(["inspect", sys.argv[1], "--show", "1"]),
                     walchannel.cli.main(["export", sys.argv[2]])]
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("grpc", "httpx"))
        print(codes, loaded)
        """
    )
    proc = subprocess.run(
        [PYTHON, "-c", code, str(wal_dir), str(log)],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=60,
    )
    _OUTPUTS.extend((proc.stdout, proc.stderr))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[1, 1, 0] []"


@pytest.mark.parametrize(
    ("typed", "nearest"), [("inpsect", "inspect"), ("flsh", "flush"), ("frobnicate", None)]
)
def test_a_mistyped_command_names_the_nearest_one(typed: str, nearest: str | None) -> None:
    # argparse's own suggestion exists only from Python 3.14 (issue 58).
    result = cli(typed, env=child_env(WALCHANNEL_RUN_TOKEN=new_token()))
    assert result.rc == 2
    assert f"{typed!r} is no command" in result.err
    assert ("did you mean" in result.err) is (nearest is not None)
    if nearest is not None:
        assert f"did you mean '{nearest}'?" in result.err
    assert "Traceback" not in result.err


@pytest.mark.parametrize(("command", "option"), [("inspect", "--jsn"), ("engine", "--fats")])
def test_an_unknown_option_is_said_with_its_commands_usage(command: str, option: str) -> None:
    result = cli(command, option, env=child_env(WALCHANNEL_RUN_TOKEN=new_token()))
    assert result.rc == 2
    assert f"usage: walchannel {command} " in result.err  # not the top-level usage
    assert f"walchannel {command}: error: unrecognized arguments: {option}" in result.err
