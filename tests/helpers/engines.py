"""Engine and discovery *processes* on one store file, for tests that SIGKILL or SIGSTOP them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a Python child that imports walchannel from this tree."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


class Proc:
    """A ``python -m MODULE`` child that prints one JSON line once serving."""

    def __init__(self, module: str, args: list[str], stderr: Path, env: dict[str, str]) -> None:
        self.stderr_path = stderr
        with stderr.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"{module} printed nothing: {stderr.read_text()[-3000:]}")
        self.info = json.loads(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGCONT)  # a stopped process must run to die cleanly
        self.signal(signal.SIGKILL)
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


class EngineProcs:
    """Engine processes (and optionally discovery) sharing ``tmp/engine-store.sqlite3``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store = tmp / "engine-store.sqlite3"
        self.env = child_env()
        self.procs: list[Proc] = []
        self._n = 0

    def engine(self, *extra: str) -> Proc:
        """Start one more engine process (port 0, INFO log to its own stderr file)."""
        self._n += 1
        proc = Proc(
            "walchannel.testing.engine",
            ["--store", str(self.store), "--log-level", "INFO", *extra],
            self.tmp / f"engine-{self._n}.stderr",
            self.env,
        )
        self.procs.append(proc)
        return proc

    def discovery(self) -> Proc:
        proc = Proc(
            "walchannel.testing.discovery",
            ["--store", str(self.store)],
            self.tmp / "discovery.stderr",
            self.env,
        )
        self.procs.append(proc)
        return proc

    def register(self, run_id: str, token: str) -> None:
        from walchannel.testing.store import EngineStore

        with EngineStore(self.store) as store:
            store.register_run(run_id, token)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
