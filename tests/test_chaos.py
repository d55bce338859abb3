"""tools/chaos.py, narrowed: a few of each scenario, every audit clean (``make chaos``: all)."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import PYTHON, ROOT, child_env
from walchannel._killpoints import POINTS

CHAOS = str(ROOT / "tools" / "chaos.py")


def chaos(*args: str, timeout: float) -> str:
    proc = subprocess.run(
        [PYTHON, CHAOS, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def clean_line(out: str, scenario: str) -> str:
    line = next(x for x in out.splitlines() if x.startswith(f"{scenario}:"))
    assert "audit=clean" in line, line
    assert " lost=0 " in line and " applied_twice=0 " in line and " gaps=0 " in line, line
    runs = int(re.search(r" runs=(\d+)", line).group(1))  # type: ignore[union-attr]
    assert f"done_acked={runs}/{runs}" in line, line
    return line


@pytest.mark.slow
def test_harness_killed_at_every_named_point_and_at_random_moments() -> None:
    line = clean_line(chaos("harness-kill", "--iterations", "20", timeout=240), "harness-kill")
    for point in (*POINTS, "random"):
        hit = re.search(rf"\b{point}=(\d+)/(\d+)", line)
        assert hit is not None and int(hit.group(1)) >= 1, f"{point} never hit: {line}"


@pytest.mark.slow
def test_engine_processes_killed_and_replaced() -> None:
    line = clean_line(chaos("engine-kill", "--iterations", "5", timeout=180), "engine-kill")
    assert "replacements=5 " in line


@pytest.mark.slow
def test_one_network_fault_cycle() -> None:
    line = clean_line(chaos("network", "--iterations", "1", timeout=180), "network")
    assert "freeze=1" in line and "dead_stream=1" in line, line


@pytest.mark.slow
def test_engine_replacements_and_harness_kills_interleaved() -> None:
    clean_line(chaos("both", "--iterations", "8", timeout=180), "both")


@pytest.mark.slow
def test_harness_killed_under_group_commit_loses_less_than_its_cap() -> None:
    # Rows a kill takes from the pending group are sent again by the next life
    # (it resumes from its marker): exactly once by content still holds.
    line = clean_line(chaos("group-kill", "--iterations", "6", timeout=240), "group-kill")
    worst = int(re.search(r"max (\d+) \(cap (\d+)", line).group(1))  # type: ignore[union-attr]
    assert "kills=6 " in line and worst < 16, line


@pytest.mark.slow
def test_soak_keeps_resources_flat() -> None:
    line = clean_line(chaos("soak", "--seconds", "20", timeout=180), "soak")
    assert "growth(" in line


def test_the_runner_through_harness_and_engine_kills() -> None:
    # tools/chaos_runner.py narrowed (make chaos: 20 kills, 2 engine kills, 4 at once).
    proc = subprocess.run(
        [PYTHON, str(ROOT / "tools" / "chaos_runner.py"), "--kills", "3", "--engine-kills", "1",
         "--items", "1500", "--seed", "3"],
        capture_output=True, text=True, timeout=300, env=child_env(), cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "runner: 3 harness SIGKILLs (3 mid-run), 1 engine kills" in proc.stdout
    assert ": clean (" in proc.stdout
