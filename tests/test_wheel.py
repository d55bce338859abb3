"""The built wheel works outside the checkout: `walchannel --help`, a harness, the demo.

It carries py.typed, the .proto and its stubs, and not the demo (examples/demo,
which runs here on the installed wheel).

A fresh virtual environment in a temp folder gets the wheel from pip, then
its ``demo`` extra (what README "Installing it" says); nothing of the
checkout is on its path, and every command runs with the temp folder as
its working directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

_HARNESS = """
import asyncio, sys
from walchannel import GrpcChannelConfig, GrpcEngineChannel
from walchannel.testing import LocalEngine
import walchannel

async def main() -> None:
    async with LocalEngine(store_path="store.sqlite3") as engine:
        engine.register_run("run-wheel", "tok-wheel-harness-secret")
        config = GrpcChannelConfig(
            grpc_addr=engine.grpc_addr, wal_dir="wal", run_id="run-wheel",
            correlation_id="corr", run_token="tok-wheel-harness-secret",
        )
        async with GrpcEngineChannel(config) as channel:
            await channel.handshake("1.0", "wheel-harness", "1")
            seqs = channel.send_findings([{"path": "a.py"}, {"path": "b.py"}])
            assert await channel.send_done("completed", 2, ["."], "")
        print(walchannel.__file__)
        print(seqs, engine.accepted("run-wheel"))

asyncio.run(main())
"""


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_checkout(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = ["pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([sys.executable, "-m", *build, "--wheel-dir", str(dist), str(ROOT)], check=True)
    (wheel,) = dist.glob("walchannel-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("py.typed", "_proto/engine_channel.proto", "_proto/engine_channel_pb2.pyi"):
        assert f"walchannel/{name}" in names
    assert not any(n.startswith(("walchannel/demo/", "demo/")) for n in names), names
    assert not any("__pycache__" in n for n in names)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, str(wheel)], check=True)  # the core: no extras yet
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            list(argv), cwd=work, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, (argv, proc.stdout[-3000:], proc.stderr[-3000:])
        return proc

    assert "inspect" in run(str(venv / "bin" / "walchannel"), "--help").stdout

    (work / "harness.py").write_text(_HARNESS)
    out = run(str(venv / "bin" / "python"), "harness.py").stdout.splitlines()
    assert out[0].startswith(str(venv)), out  # the installed package, not the checkout
    assert out[1] == "[1, 2] [1, 2, 3]", out

    # A project with pytest but no pytest-asyncio: the plugin the wheel
    # registers loads, and only the fixtures needing an event loop say so.
    run(str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "pytest")
    (work / "test_mine.py").write_text(
        "def test_plain():\n    assert True\n\ndef test_wants_the_engine(local_engine):\n    pass\n"
    )
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "1 passed" in proc.stdout and "1 error" in proc.stdout, proc.stdout[-3000:]
    assert "local_engine fixture needs pytest-asyncio" in proc.stdout, proc.stdout[-3000:]

    # The demo scans with bandit: without the demo extra it says so.
    # Only the example folder on the path: walchannel is the wheel's.
    demo_env = {**env, "PYTHONPATH": str(ROOT / "examples")}
    no_bandit = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "demo"],
        cwd=work,
        env=demo_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert no_bandit.returncode == 2, no_bandit.stderr[-3000:]
    assert "bandit is not installed" in no_bandit.stderr and "demo extra" in no_bandit.stderr
    assert "Traceback" not in no_bandit.stderr
    subprocess.run([*pip, f"{wheel}[demo]"], check=True)

    tree = Path(sysconfig.get_paths()["stdlib"]) / "email"
    env.update(demo_env)
    demo = run(
        str(venv / "bin" / "python"),
        "-m",
        "demo",
        "--tree",
        str(tree),
        "--pace",
        "0.05",
        "--workdir",
        str(tmp_path / "demo"),
        timeout=300,
    ).stdout
    # The kills happened and the audit holds (README: what `make demo` shows).
    assert ">>> SIGKILL engine" in demo and ">>> SIGKILL harness" in demo, demo
    phases = re.search(r"findings at engine: (\d+) -> (\d+) -> (\d+)", demo)
    assert phases, demo
    first, second, final = map(int, phases.groups())
    assert first <= second <= final and final > 50
    for line in ("gaps:                            0", "lost:                            0"):
        assert line in demo
    assert "applied twice by content:        0" in demo
    assert re.search(r"applied exactly once by content: (\d+) / \1 ", demo)
    assert "Done acked:                      yes" in demo
    assert "PASS" in demo, demo
