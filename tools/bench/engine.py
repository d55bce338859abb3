"""The local engine as a subprocess: ``python -m walchannel.testing.engine --store FILE``.

Both arms of an end-to-end row talk to the same engine process, so the
engine's cost (one SQLite transaction per message) is the same for both.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

from tools.bench.common import RUN_TOKEN
from tools.bench.fast_engine import FastEngineProcess
from walchannel.testing.store import EngineStore

__all__ = ["ROOT", "EngineProcess", "Engines", "child_env"]

ROOT = Path(__file__).resolve().parents[2]
_CLK_TCK = os.sysconf("SC_CLK_TCK")
# ``python -m walchannel.testing.engine ARGS`` after pinning the process to the CPUs
# in argv[1] (before any thread starts, so every engine thread inherits them);
# no preexec_fn, so the parent's gRPC never sees a fork.
_LAUNCH = """
import os, runpy, sys
cpus = sys.argv.pop(1)
if cpus:
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
sys.argv[0] = "walchannel.testing.engine"
runpy.run_module("walchannel.testing.engine", run_name="__main__", alter_sys=True)
"""


def child_env() -> dict[str, str]:
    """Environment for a Python child that imports walchannel and tools from this tree."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


class EngineProcess:
    """A LocalEngine process on its own store file, with ``--ack-every N``.

    Use as a context manager; :meth:`new_run` registers a fresh run id.
    """

    _ids = itertools.count(1)

    def __init__(self, folder: Path, ack_every: int, cpus: set[int] | None = None) -> None:
        self.ack_every = ack_every
        self.cpus = cpus
        self.store_path = folder / f"engine-ack{ack_every}.sqlite3"
        self._stderr_path = folder / f"engine-ack{ack_every}.stderr"
        self._proc: subprocess.Popen[str] | None = None
        self._store: EngineStore | None = None
        self.grpc_addr = ""
        self.pid = 0

    def start(self) -> EngineProcess:
        self._store = EngineStore(self.store_path)
        with open(self._stderr_path, "w", encoding="utf-8") as stderr:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _LAUNCH,
                    ",".join(map(str, sorted(self.cpus or ()))),
                    "--store",
                    str(self.store_path),
                    "--ack-every",
                    str(self.ack_every),
                ],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                cwd=ROOT,
                env=child_env(),
            )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError(
                f"the engine process did not start: {self._stderr_path.read_text()[-2000:]}"
            )
        info = json.loads(line)
        self.grpc_addr = info["grpc_addr"]
        self.pid = int(info["pid"])
        return self

    def new_run(self, prefix: str) -> str:
        """Register and return a fresh run id (token :data:`RUN_TOKEN`)."""
        assert self._store is not None
        run_id = f"{prefix}-{os.getpid()}-{next(self._ids)}"
        self._store.register_run(run_id, RUN_TOKEN)
        return run_id

    def cpu_seconds(self) -> float:
        """CPU time (user + system, all threads) the engine process has used so far."""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> EngineProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Engines:
    """Engine processes by ack cadence, started on first use, all stopped by :meth:`close`."""

    def __init__(self, folder: Path, cpus: set[int] | None = None) -> None:
        self._folder = folder
        self._cpus = cpus
        self._engines: dict[int, EngineProcess] = {}
        self._fast: dict[int, FastEngineProcess] = {}

    def get(self, ack_every: int) -> EngineProcess:
        engine = self._engines.get(ack_every)
        if engine is None:
            engine = EngineProcess(self._folder, ack_every, self._cpus).start()
            self._engines[ack_every] = engine
        return engine

    def fast(self, ack_every: int) -> FastEngineProcess:
        """The fast engine (stores nothing) acking every ``ack_every`` messages."""
        engine = self._fast.get(ack_every)
        if engine is None:
            engine = FastEngineProcess(self._folder, ack_every, self._cpus).start()
            self._fast[ack_every] = engine
        return engine

    def close(self) -> None:
        for engine in [*self._engines.values(), *self._fast.values()]:
            engine.stop()
        self._engines.clear()
        self._fast.clear()
