"""Real processes killed with SIGKILL: the harness, the engine, both (SPEC "Resume")."""

from __future__ import annotations

import json
import random
import secrets
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import HELPERS, PYTHON, child_env
from walchannel.testing.store import EngineStore

HARNESS = str(HELPERS / "harness_child.py")


def start_json(
    args: list[str], env: dict[str, str]
) -> tuple[subprocess.Popen[str], dict[str, object]]:
    proc = subprocess.Popen(
        [PYTHON, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise AssertionError(f"{args} printed nothing: {proc.stderr.read() if proc.stderr else ''}")
    return proc, json.loads(line)


class Engines:
    """An engine process and a discovery process on one store file."""

    def __init__(self, tmp: Path) -> None:
        self.store = tmp / "engine-store.sqlite3"
        self.env = child_env()
        self.procs: list[subprocess.Popen[str]] = []
        self.engine, info = start_json(
            ["-m", "walchannel.testing.engine", "--store", str(self.store)], self.env
        )
        self.grpc_addr = str(info["grpc_addr"])
        self.procs.append(self.engine)
        disc, info = start_json(
            ["-m", "walchannel.testing.discovery", "--store", str(self.store)], self.env
        )
        self.http_addr = str(info["http_addr"])
        self.procs.append(disc)

    def register(self, run_id: str, token: str) -> None:
        subprocess.run(
            [
                PYTHON,
                "-m",
                "walchannel.testing.engine",
                "register",
                "--store",
                str(self.store),
                "--run-id",
                run_id,
                "--token-env",
                "RUN_TOKEN",
            ],
            check=True,
            env={**self.env, "RUN_TOKEN": token},
        )

    def replace(self) -> None:
        self.engine.send_signal(signal.SIGKILL)
        self.engine.wait()
        self.engine, info = start_json(
            ["-m", "walchannel.testing.engine", "--store", str(self.store)], self.env
        )
        assert info["grpc_addr"] != self.grpc_addr
        self.grpc_addr = str(info["grpc_addr"])
        self.procs.append(self.engine)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()

    def read(self) -> EngineStore:
        return EngineStore(self.store)


@pytest.fixture
def engines(tmp_path: Path):  # type: ignore[no-untyped-def]
    e = Engines(tmp_path)
    yield e
    e.close()


def harness(
    engines: Engines, wal: Path, run_id: str, token: str, n: int, pause: float
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            PYTHON,
            HARNESS,
            str(wal),
            run_id,
            engines.grpc_addr,
            engines.http_addr,
            str(n),
            str(pause),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**engines.env, "HARNESS_TOKEN": token},
    )


def audit(store: EngineStore, run_id: str, n: int) -> None:
    accepted = store.accepted(run_id)
    assert accepted == list(range(1, len(accepted) + 1)), "gap or disorder"
    assert store.gaps(run_id) == []
    contents = Counter(
        int(b["body"]["fields"]["n"]) for b in store.bodies(run_id) if b["kind"] == "finding"
    )
    assert sorted(contents) == list(range(n)), "a finding is missing"
    twice = [k for k, v in contents.items() if v > 1]
    assert twice == [], f"applied twice by content: {twice}"
    done = store.done(run_id)
    assert done is not None and done["findings"] == n and done["seq"] == accepted[-1]


@pytest.mark.slow
def test_engine_process_sigkilled_and_replaced_discovery_follows(
    engines: Engines, tmp_path: Path
) -> None:
    run_id, token = f"run-{secrets.token_hex(3)}", secrets.token_urlsafe(16)
    engines.register(run_id, token)
    proc = harness(engines, tmp_path / "wal", run_id, token, 400, 0.004)
    try:
        store = engines.read()
        deadline = time.monotonic() + 30
        while len(store.accepted(run_id)) < 50:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        before = len(store.accepted(run_id))
        engines.replace()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
        assert len(store.accepted(run_id)) > before
        audit(store, run_id, 400)
    finally:
        proc.kill()


@pytest.mark.slow
def test_harness_sigkilled_at_random_moments_resumes_exactly_once_by_content(
    engines: Engines, tmp_path: Path
) -> None:
    run_id, token = f"run-{secrets.token_hex(3)}", secrets.token_urlsafe(16)
    engines.register(run_id, token)
    wal = tmp_path / "wal"
    rng = random.Random(1234)
    n = 600
    kills = 0
    seqs_seen: list[int] = []
    for _ in range(25):
        proc = harness(engines, wal, run_id, token, n, 0.003)
        try:
            out, _ = proc.communicate(timeout=rng.uniform(0.2, 1.0))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate()
            kills += 1
        seqs_seen += [int(line.split()[2]) for line in out.splitlines() if line.startswith("sent ")]
        if proc.returncode == 0:
            break
    else:
        proc = harness(engines, wal, run_id, token, n, 0.0)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
    assert kills >= 2
    # New seqs continued the run: every seq a harness reported is unique.
    assert len(seqs_seen) == len(set(seqs_seen))
    audit(engines.read(), run_id, n)
    # A harness started again on the completed run exits at once.
    again = harness(engines, wal, run_id, token, n, 0.0)
    out, _ = again.communicate(timeout=30)
    assert again.returncode == 0 and "completed" in out
