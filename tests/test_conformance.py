"""``walchannel conformance`` proven on real engines: every check passes on the local engine
with all hooks, and each check fails on an engine broken in its duty (issue 56).

Engines are real processes (``python -m walchannel.testing.engine start``),
driven through the hooks exactly as docs/conformance.md shows, from the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, child_env
from walchannel.conformance import CHECKS
from walchannel.testing.engine import LocalEngine
from walchannel.testing.servicer import FAULTS

ENGINE = f"{shlex.quote(sys.executable)} -m walchannel.testing.engine"

#: Each broken engine and the checks it must fail (docs/conformance.md's table).
FAILS: dict[str, list[str]] = {
    "answer_ahead": ["1.1", "1.2"],
    "ack_ahead": ["2.1"],
    "--no-heartbeat-acks": ["2.2"],
    "duplicate_unacked": ["2.3"],
    "gap_text": ["3.1"],
    "done_ack_late": ["4.1"],
    "forget_completion": ["4.2"],
    "ignore_half_close": ["5.1"],
    "keep_older": ["5.2"],
    "refused_ends_older": ["5.3"],
    "no_fencing": ["6.1", "6.2"],
    "takeover_keeps_old": ["6.3"],
    "no_resend": ["7.1", "7.2"],
    "forget_owner_on_restart": ["8.1"],
    "never_commit": ["8.2"],
}


def test_every_check_is_failed_by_some_broken_engine_and_every_fault_is_used() -> None:
    assert sorted({c for fails in FAILS.values() for c in fails}) == sorted(c.id for c in CHECKS)
    assert sorted(f for f in FAILS if not f.startswith("--")) == sorted(FAULTS)


class Engine:
    """A local engine process with a pid file, and the hooks that drive it."""

    def __init__(self, folder: Path, *flags: str) -> None:
        self.store, self.pid_file = folder / "engine.sqlite3", folder / "engine.pid"
        # One port for good: a restarted engine comes back where it was.
        serve = [
            f"--store {self.store}",
            f"--pid-file {self.pid_file}",
            f"--grpc-port {free_port()}",
            *flags,
        ]
        self.serve = " ".join(serve)
        line = self.sh(f"{ENGINE} start {self.serve}")
        self.grpc_addr = json.loads(line)["grpc_addr"]
        store = f"--store {self.store}"
        self.hooks = {
            "--register": f"{ENGINE} register {store}",
            "--restart": f"{ENGINE} restart {self.serve}",
            "--applied": f"{ENGINE} applied {store}",
            "--stop": f"{ENGINE} stop-run {store}",
            "--decide": f"{ENGINE} decide {store}",
        }

    @staticmethod
    def sh(command: str) -> str:
        done = subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, timeout=60, env=child_env()
        )
        assert done.returncode == 0, done
        return done.stdout

    def kill(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(self.pid_file.read_text()), signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for engine in made:
        engine.kill()


def conformance(engine: Engine, *args: str, hooks: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "walchannel", "conformance", "--grpc-addr", engine.grpc_addr]
    if hooks:
        for flag, command in engine.hooks.items():
            argv += [flag, command]
    else:
        argv += ["--register", engine.hooks["--register"]]
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=300, env=child_env(), cwd=ROOT
    )


def test_the_local_engine_with_every_hook_passes_every_check(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine = Engine(tmp_path)
    engines.append(engine)
    started = time.monotonic()
    report = tmp_path / "junit.xml"
    done = conformance(engine, "--junit", str(report))
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == f"{len(CHECKS)} passed, 0 failed, 0 skipped", done.stdout
    for check in CHECKS:
        assert any(line.split()[:2] == [check.id, "PASS"] for line in lines), check.id
    assert took < 60, took
    suite = ET.parse(report).getroot()
    assert suite.tag == "testsuite" and suite.get("tests") == str(len(CHECKS))
    assert suite.get("failures") == "0" and suite.get("skipped") == "0"
    assert [c.get("name", "").split()[0] for c in suite.iter("testcase")] == [c.id for c in CHECKS]
    # --json: each check with its id, duty, SPEC section and verdict.
    as_json = conformance(engine, "--json", "--only", "1.1,2.2")
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [(r["id"], r["verdict"]) for r in rows] == [("1.1", "PASS"), ("2.2", "PASS")]
    assert all(r["duty"] and "Engine duties" in r["section"] for r in rows)


@pytest.mark.parametrize("fault", list(FAILS))
def test_an_engine_broken_in_one_duty_fails_its_check(
    tmp_path: Path, engines: list[Engine], fault: str
) -> None:
    flag = fault if fault.startswith("--") else f"--fault {fault}"
    engine = Engine(tmp_path, flag)
    engines.append(engine)
    want = FAILS[fault]
    done = conformance(engine, "--json", "--only", ",".join(want))
    assert done.returncode == 1, done.stdout + done.stderr
    rows = json.loads(done.stdout)
    assert [(r["id"], r["verdict"]) for r in rows] == [(c, "FAIL") for c in want], rows
    assert all(r["expected"] and r["got"] for r in rows), rows


def test_a_check_whose_hook_is_missing_is_skipped_naming_it(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine = Engine(tmp_path)
    engines.append(engine)
    done = conformance(engine, "--only", "7.1,7.2,8.1,8.2,1.1", hooks=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "1 passed, 0 failed, 4 skipped"
    assert "needs --stop" in done.stdout and "needs --decide" in done.stdout
    assert done.stdout.count("needs --restart") == 2


def test_a_hook_that_fails_is_exit_2_naming_it_without_the_token(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine = Engine(tmp_path)
    engines.append(engine)
    engine.hooks["--register"] = (
        'echo "cannot reach the admin API with $WALCHANNEL_RUN_TOKEN" >&2; exit 3'
    )
    done = conformance(engine, "--only", "1.1,1.2")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--register exited 3" in done.stderr and "cannot reach the admin API" in done.stderr
    assert "the checks stopped" in done.stderr and done.stderr.count("exited 3") == 1
    assert "1.2" not in done.stdout  # stopped at the first: the rest would say the same
    assert "tok-" not in done.stderr + done.stdout  # the kit's token, masked as ***
    assert "***" in done.stderr


@pytest.mark.asyncio
async def test_an_engine_that_hangs_fails_within_the_bound(tmp_path: Path) -> None:
    # It takes the handshake and never answers: the check fails within its bound.
    store = tmp_path / "engine.sqlite3"
    async with LocalEngine(store_path=store, ack_handshakes=False) as engine:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "walchannel", "conformance", "--grpc-addr", engine.grpc_addr,
            "--register", f"{ENGINE} register --store {store}", "--only", "1.1",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_env(),
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    text = out.decode()
    assert proc.returncode == 1, text + err.decode()
    assert "1.1   FAIL" in text and "nothing within 5 s" in text, text
    assert time.monotonic() - started < 30


def test_usage_errors_exit_2(tmp_path: Path, engines: list[Engine]) -> None:
    engine = Engine(tmp_path)
    engines.append(engine)
    done = conformance(engine, "--only", "9.9", hooks=False)
    assert done.returncode == 2 and "no check 9.9" in done.stderr, done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "walchannel", "conformance", "--grpc-addr", engine.grpc_addr],
        capture_output=True, text=True, timeout=60, env=child_env(),
    )  # fmt: skip
    assert missing.returncode == 2 and "--register" in missing.stderr


def _block(doc: str, after: str, fence: str) -> str:
    text = (ROOT / doc).read_text().split(after, 1)[1]
    return text.split(fence, 1)[1].split("```", 1)[0]


def test_the_deployment_example_runs_as_printed(tmp_path: Path) -> None:
    # docs/deployment.md's worked example, its folder and ports swapped for free ones.
    script = _block("docs/deployment.md", "### Proving the duties", "```sh")
    grpc_port, http_port = free_port(), free_port()
    script = (
        script.replace("/tmp/conformance-engine", str(tmp_path / "engine"))
        .replace("50051", str(grpc_port))
        .replace("50052", str(http_port))
    )
    pid_file = tmp_path / "engine" / "engine.pid"
    # As in the user's environment: its python and walchannel first on PATH.
    env = child_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    try:
        done = subprocess.run(
            ["sh", "-ec", script], capture_output=True, text=True, timeout=300, env=env
        )
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(CHECKS)} passed, 0 failed, 0 skipped" in done.stdout, done.stdout
    assert (tmp_path / "engine" / "conformance.xml").exists()


def test_the_guide_shows_what_the_kit_prints_and_a_row_for_every_check(
    tmp_path: Path, engines: list[Engine]
) -> None:
    text = (ROOT / "docs/conformance.md").read_text()
    guide = text.split("## The checks", 1)[1].split("\n## ", 1)[0]
    for check in CHECKS:
        (row,) = [line for line in guide.splitlines() if line.startswith(f"| {check.id} |")]
        for fault, fails in FAILS.items():
            assert (f"`{fault}`" in row) == (check.id in fails), (check.id, fault, row)
    # The output shown is a real run's: the local engine acking ahead, one hook.
    shown = _block("docs/conformance.md", "## Output", "```").strip().splitlines()
    engine = Engine(tmp_path, "--fault ack_ahead")
    engines.append(engine)
    done = conformance(engine, "--only", "1.1,2.1,7.1", hooks=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[1:] == shown[1:], done.stdout


def test_a_hook_that_hangs_in_a_child_is_an_error_within_its_timeout_not_an_engine_fail(
    tmp_path: Path, engines: list[Engine]
) -> None:
    # A hook script that starts a process which hangs: the child holds the pipes.
    engine = Engine(tmp_path)
    engines.append(engine)
    engine.hooks["--register"] = "sleep 1001; true"
    started = time.monotonic()
    done = conformance(engine, "--only", "1.1,1.2", "--hook-timeout", "2")
    took = time.monotonic() - started
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--register did not finish within 2 s" in done.stderr, done.stderr
    assert "the engine hangs" not in done.stdout and "1.2" not in done.stdout, done.stdout
    assert took < 20, took
    left = subprocess.run(["pgrep", "-f", "sleep 1001"], capture_output=True, text=True)
    assert left.stdout.strip() == "", "the hook's child was left running"


def test_an_address_where_nothing_answers_is_a_setup_error_no_check_run(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine = Engine(tmp_path)
    engines.append(engine)
    engine.grpc_addr = f"127.0.0.1:{free_port()}"  # nothing listens there
    marker = tmp_path / "registered"
    engine.hooks["--register"] = f"touch {marker}"
    done = conformance(engine, hooks=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"nothing answers at {engine.grpc_addr}" in done.stderr, done.stderr
    assert "check --grpc-addr" in done.stderr and "no check was run" in done.stderr
    assert "FAIL" not in done.stdout and not marker.exists()


def test_a_junit_path_that_cannot_be_written_is_refused_before_any_check(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine = Engine(tmp_path)
    engines.append(engine)
    marker = tmp_path / "registered"
    engine.hooks["--register"] = f"touch {marker}"
    done = conformance(engine, "--junit", str(tmp_path / "nope" / "report.xml"), hooks=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--junit" in done.stderr and "cannot be written" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not marker.exists()
