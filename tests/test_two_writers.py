"""One writer per run, shown with real processes: the README's harness against the local engine.

Issue 34's two mistakes, as a new user makes them: two harnesses on one
run id, each with its own log folder (a retried Job whose first pod is not
dead yet), and a harness restarted on a lost or misplaced log (a
``WALCHANNEL_DIR`` typo, a relative ``wal_dir`` started from another
folder). Before the change both ended with exit 0, a ``completed`` log and
findings lost or applied twice. Now the later harness exits non-zero with
``WriterFencedError`` and keeps its log, the first completes, and every
finding is applied once; an explicit ``walchannel takeover`` hands the run
over and fences the old writer.

The harness is the README's asyncio example (tests/test_readme.py builds it
runnable); its scanner gives one finding per file and can be held at a file
until the test says go, so each scenario waits on conditions, not on time.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import pytest
from test_readme import _SCANNER, async_example

from conftest import PYTHON, child_env, eventually, new_run
from walchannel.cli.inspection import inspect_log
from walchannel.log.state import FAILED_FENCED
from walchannel.testing.engine import LocalEngine

#: The files of the scan: one finding each.
FILES = [f"f{i:02d}" for i in range(20)]

_HELD_SCANNER = """
def scan(path: str) -> list[dict]:
    # One finding per file. At $HOLD_AT it says so ($HELD) and waits for $GO:
    # the test decides when this harness goes on.
    import time

    if path == os.environ.get("HOLD_AT"):
        open(os.environ["HELD"], "w").close()
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.02)
    return [{"path": path}]
"""


def harness_script(tmp_path: Path) -> Path:
    """The README harness, its folder from $WAL (relative or absolute) or walchannel's default."""
    code = async_example().replace(_SCANNER, _HELD_SCANNER)
    assert 'wal_dir=os.environ["WAL"],' in code
    code = code.replace('wal_dir=os.environ["WAL"],', 'wal_dir=os.environ.get("WAL") or None,')
    script = tmp_path / "harness.py"
    script.write_text(code)
    return script


class Harness:
    """One harness process of the run."""

    def __init__(self, script: Path, env: dict[str, str], cwd: Path | None = None) -> None:
        self.script, self.env, self.cwd = script, env, cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.err = ""

    async def start(self) -> Harness:
        self.proc = await asyncio.create_subprocess_exec(
            PYTHON,
            str(self.script),
            *FILES,
            env=self.env,
            cwd=self.cwd,
            stderr=asyncio.subprocess.PIPE,
        )
        return self

    @property
    def exited(self) -> bool:
        return self.proc is not None and self.proc.returncode is not None

    async def finish(self, timeout_s: float = 90) -> int:
        assert self.proc is not None
        _, err = await asyncio.wait_for(self.proc.communicate(), timeout_s)
        self.err = err.decode()
        assert self.proc.returncode is not None
        return self.proc.returncode


def run_env(
    tmp_path: Path, engine: LocalEngine, run_id: str, token: str, **extra: str
) -> dict[str, str]:
    env = child_env(
        RUN_ID=run_id,
        CORR_ID="corr-two",
        RUN_TOKEN=token,
        GRPC_ADDR=engine.grpc_addr,
        CONNECT_MS="5000",
        **extra,
    )
    env.pop("WALCHANNEL_DIR", None)
    return env


def applied(engine: LocalEngine, run_id: str) -> Counter[str]:
    """How many times each file's finding was applied."""
    return Counter(
        b["body"]["fields"]["path"] for b in engine.bodies(run_id) if b["kind"] == "finding"
    )


def assert_fenced(harness: Harness, log: Path, cause: str) -> None:
    """The harness exited non-zero with the named error, and its log keeps its rows."""
    assert harness.proc is not None and harness.proc.returncode == 3, harness.err[-3000:]
    assert "not scanning: run " in harness.err and "not this log's to write" in harness.err
    assert cause in harness.err, harness.err[-3000:]
    assert "walchannel takeover" in harness.err
    report = inspect_log(log)
    assert report.state == "failed", report
    assert report.reason is not None and report.reason.startswith(FAILED_FENCED)
    assert report.unacked_count is not None and report.last_acked_seq is not None


def log_in(folder: Path, run_id: str) -> Path:
    return folder / f"{run_id}.wal.sqlite3"


@pytest.mark.asyncio
@pytest.mark.parametrize("apart_s", [0.5, 1.5, 3.0])
async def test_the_later_of_two_harnesses_is_refused_and_the_first_completes(
    tmp_path: Path, apart_s: float
) -> None:
    script = harness_script(tmp_path)
    async with LocalEngine(store_path=tmp_path / "engine.sqlite3") as engine:
        run_id, token = new_run(engine)
        env = run_env(tmp_path, engine, run_id, token)
        go = tmp_path / "go"
        loop = asyncio.get_running_loop()
        started = loop.time()
        a = await Harness(
            script,
            {
                **env,
                "WAL": str(tmp_path / "a"),
                "HOLD_AT": FILES[-1],
                "HELD": str(tmp_path / "held"),
                "GO": str(go),
            },
        ).start()
        # B starts apart_s after A, and not before A streams (a busy machine
        # may take longer than apart_s to start a Python): the scenario is B
        # being the later one.
        await eventually(lambda: engine.accepted(run_id), timeout=60, what="A streaming")
        await asyncio.sleep(max(0.0, started + apart_s - loop.time()))
        b = await Harness(script, {**env, "WAL": str(tmp_path / "b")}).start()
        code_b = await b.finish()
        go.touch()
        code_a = await a.finish()
        counts = applied(engine, run_id)
        done = engine.done(run_id)
    # Exactly one completes, and every finding is applied exactly once.
    assert (code_a, code_b) == (0, 3), a.err[-2000:] + b.err[-2000:]
    assert counts == Counter(FILES), counts
    assert done is not None and done["findings"] == len(FILES)
    assert_fenced(b, log_in(tmp_path / "b", run_id), "owned by another writer")
    assert inspect_log(log_in(tmp_path / "a", run_id)).state == "completed"


@pytest.mark.asyncio
async def test_two_harnesses_started_together_one_completes_the_other_is_refused(
    tmp_path: Path,
) -> None:
    script = harness_script(tmp_path)
    async with LocalEngine(store_path=tmp_path / "engine.sqlite3") as engine:
        run_id, token = new_run(engine)
        env = run_env(tmp_path, engine, run_id, token, GO=str(tmp_path / "go"), HOLD_AT=FILES[-1])
        a, b = (
            Harness(script, {**env, "WAL": str(tmp_path / n), "HELD": str(tmp_path / f"held-{n}")})
            for n in ("a", "b")
        )
        await asyncio.gather(a.start(), b.start())
        both_held = lambda: all((tmp_path / f"held-{n}").exists() for n in "ab")  # noqa: E731
        # One is refused at its handshake; both scanning the run is the bug.
        await eventually(lambda: a.exited or b.exited or both_held(), timeout=60, what="an outcome")
        assert not both_held(), "both harnesses scan the run"
        loser, winner, lost = (a, b, "a") if a.exited else (b, a, "b")
        assert await loser.finish() == 3
        (tmp_path / "go").touch()
        assert await winner.finish() == 0, winner.err[-3000:]
        counts = applied(engine, run_id)
    assert counts == Counter(FILES), counts
    assert_fenced(loser, log_in(tmp_path / lost, run_id), "owned by another writer")


@pytest.mark.asyncio
async def test_an_explicit_takeover_fences_the_old_writer_and_the_new_one_completes(
    tmp_path: Path,
) -> None:
    script = harness_script(tmp_path)
    async with LocalEngine(store_path=tmp_path / "engine.sqlite3") as engine:
        run_id, token = new_run(engine)
        env = run_env(tmp_path, engine, run_id, token)
        go = tmp_path / "go"
        a = await Harness(
            script,
            {
                **env,
                "WAL": str(tmp_path / "a"),
                "HOLD_AT": FILES[10],
                "HELD": str(tmp_path / "held"),
                "GO": str(go),
            },
        ).start()
        await eventually(lambda: len(engine.accepted(run_id)) == 10, timeout=60, what="A at f10")
        b_env = {**env, "WAL": str(tmp_path / "b")}
        b = await Harness(script, b_env).start()
        assert await b.finish() == 3, b.err[-3000:]  # refused: A owns the run
        b_log = log_in(tmp_path / "b", run_id)
        took = await asyncio.create_subprocess_exec(
            PYTHON, "-m", "walchannel", "takeover", str(b_log), env=child_env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(took.communicate(), 60)
        assert took.returncode == 0, err.decode()
        b = await Harness(script, b_env).start()  # restarted: it takes the run over
        assert await b.finish() == 0, b.err[-3000:]
        go.touch()  # A goes on: its next send is refused, its log kept
        assert await a.finish() == 3
        counts = applied(engine, run_id)
        takeovers = engine.takeovers(run_id)
        done = engine.done(run_id)
    assert_fenced(a, log_in(tmp_path / "a", run_id), "writer fenced")
    # A's log had answers: no folder to check, it is not a misplaced log.
    assert "check wal_dir / WALCHANNEL_DIR" not in a.err
    # What A delivered comes again from B, which started over (the takeover's cost).
    assert counts == Counter(FILES) + Counter(FILES[:10]), counts
    assert done is not None and done["findings"] == len(FILES)
    assert len(takeovers) == 1
    assert inspect_log(b_log).state == "completed"


@pytest.mark.asyncio
@pytest.mark.parametrize("mistake", ["misspelled WALCHANNEL_DIR", "relative wal_dir"])
async def test_a_restart_on_a_misplaced_log_is_refused_and_a_takeover_continues_the_run(
    tmp_path: Path, mistake: str
) -> None:
    script = harness_script(tmp_path)
    first, other = tmp_path / "work", tmp_path / "elsewhere"
    first.mkdir()
    other.mkdir()
    if mistake == "relative wal_dir":
        # The same WAL=wal, started from another directory the second time.
        right = {"WAL": "wal"}
        right_cwd, wrong, wrong_cwd, wrong_log = first, {"WAL": "wal"}, other, other / "wal"
    else:
        right = {"WALCHANNEL_DIR": str(first / "wal")}
        right_cwd, wrong, wrong_cwd = first, {"WALCHANNEL_DIR": str(first / "wall")}, first
        wrong_log = first / "wall"
    async with LocalEngine(store_path=tmp_path / "engine.sqlite3") as engine:
        run_id, token = new_run(engine)
        env = run_env(tmp_path, engine, run_id, token)
        held = tmp_path / "held"
        hold = {"HOLD_AT": FILES[10], "HELD": str(held), "GO": str(tmp_path / "go")}
        life = await Harness(script, {**env, **right, **hold}, cwd=right_cwd).start()
        await eventually(lambda: len(engine.accepted(run_id)) == 10, timeout=60, what="f00..f09")
        await eventually(held.exists, timeout=60, what="held at f10")
        assert life.proc is not None
        life.proc.send_signal(signal.SIGKILL)  # killed mid-scan
        assert await life.finish() == -signal.SIGKILL
        # Restarted with the mistake: a new, empty log meets an engine with rows.
        again = await Harness(script, {**env, **wrong}, cwd=wrong_cwd).start()
        assert await again.finish() == 3, again.err[-3000:]
        assert applied(engine, run_id) == Counter(FILES[:10])  # 0 findings applied twice
        log = log_in(wrong_log, run_id)
        assert_fenced(again, log, "owned by another writer")
        # The likeliest cause first: the log is not where it was (issue 58).
        hint = again.err.index("check wal_dir / WALCHANNEL_DIR")
        assert hint < again.err.index("take the run over with"), again.err[-3000:]
        # Takeover: the mistaken log becomes the run's writer and the run
        # continues as before the change (it starts over: the cost said above).
        took = await asyncio.create_subprocess_exec(
            PYTHON, "-m", "walchannel", "takeover", str(log), env=child_env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(took.communicate(), 60)
        assert took.returncode == 0, err.decode()
        last = await Harness(script, {**env, **wrong}, cwd=wrong_cwd).start()
        assert await last.finish() == 0, last.err[-3000:]
        counts = applied(engine, run_id)
        done = engine.done(run_id)
    assert counts == Counter(FILES) + Counter(FILES[:10]), counts
    assert done is not None


@pytest.mark.asyncio
async def test_fixing_the_folder_resumes_the_run_with_each_finding_once(tmp_path: Path) -> None:
    # The other way out of a misplaced log: start the harness with the right folder.
    script = harness_script(tmp_path)
    async with LocalEngine(store_path=tmp_path / "engine.sqlite3") as engine:
        run_id, token = new_run(engine)
        env = run_env(tmp_path, engine, run_id, token)
        held = tmp_path / "held"
        hold = {"HOLD_AT": FILES[10], "HELD": str(held), "GO": str(tmp_path / "go")}
        life = await Harness(script, {**env, "WAL": str(tmp_path / "wal"), **hold}).start()
        await eventually(held.exists, timeout=60, what="held at f10")
        await eventually(lambda: len(engine.accepted(run_id)) == 10, timeout=60, what="f00..f09")
        assert life.proc is not None
        life.proc.send_signal(signal.SIGKILL)
        await life.finish()
        typo = await Harness(script, {**env, "WAL": str(tmp_path / "wall")}).start()
        assert await typo.finish() == 3
        fixed = await Harness(script, {**env, "WAL": str(tmp_path / "wal")}).start()
        assert await fixed.finish() == 0, fixed.err[-3000:]
        counts = applied(engine, run_id)
    assert counts == Counter(FILES), counts
