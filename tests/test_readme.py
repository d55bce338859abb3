"""The README's runnable example runs as written (a newcomer copies it first)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT, child_env, new_run
from walchannel.testing import LocalEngine


def _python_block_after(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(heading, 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


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
    # returns at once only if the stream flows while the scanner runs.
    import time
    from walchannel.testing import LocalEngine

    if path != "last":
        return [{"path": path}]
    store, run = LocalEngine(store_path=os.environ["STORE"]), os.environ["RUN_ID"]
    deadline = time.monotonic() + 20
    while not store.accepted(run) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [{"path": path, "accepted_before": len(store.accepted(run))}]
"""


@pytest.mark.asyncio
async def test_the_harness_example_streams_while_its_blocking_scanner_runs(
    tmp_path: Path,
) -> None:
    code = _python_block_after("## Use it in your harness")
    address = 'grpc_addr="engine:50051", http_addr="https://engines.internal",'
    scanner = code[code.index("def scan(") : code.index("async def main(")]
    assert address in code and "return []" in scanner
    code = code.replace(address, 'grpc_addr=os.environ["GRPC_ADDR"], wal_dir=os.environ["WAL"],')
    script = tmp_path / "harness.py"
    script.write_text(code.replace(scanner, _SCANNER + "\n\n"))
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
