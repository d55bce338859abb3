"""The engines as subprocesses: the LocalEngine and the fast engine (stores nothing).

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
from typing import Self

from tools.bench.common import RUN_TOKEN
from walchannel.testing.store import EngineStore

__all__ = [
    "ROOT",
    "EngineChild",
    "EngineProcess",
    "Engines",
    "FastEngineProcess",
    "child_env",
]

ROOT = Path(__file__).resolve().parents[2]
_CLK_TCK = os.sysconf("SC_CLK_TCK")
# ``python -m MODULE ARGS`` after pinning the process to the CPUs in argv[1]
# (before any thread starts, so every engine thread inherits them); no
# preexec_fn, so the parent's gRPC never sees a fork.
_LAUNCH = """
import os, runpy, sys
cpus = sys.argv.pop(1)
module = sys.argv.pop(1)
if cpus:
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
sys.argv[0] = module
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def child_env() -> dict[str, str]:
    """Environment for a Python child that imports walchannel and tools from this tree."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


class EngineChild:
    """An engine as a child process, pinned to ``cpus``; a context manager.

    The child runs ``python -m MODULE ARGS`` and prints one JSON line with
    its ``grpc_addr`` and ``pid`` once it listens.
    """

    def __init__(
        self, module: str, args: list[str], stderr_path: Path, cpus: set[int] | None
    ) -> None:
        self._module = module
        self._args = args
        self._stderr_path = stderr_path
        self.cpus = cpus
        self._proc: subprocess.Popen[str] | None = None
        self.grpc_addr = ""
        self.pid = 0

    def start(self) -> Self:
        with open(self._stderr_path, "w", encoding="utf-8") as stderr:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _LAUNCH,
                    ",".join(map(str, sorted(self.cpus or ()))),
                    self._module,
                    *self._args,
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
                f"{self._module} did not start: {self._stderr_path.read_text()[-2000:]}"
            )
        info = json.loads(line)
        self.grpc_addr = info["grpc_addr"]
        self.pid = int(info["pid"])
        return self

    def cpu_seconds(self) -> float:
        """CPU time (user + system, all threads) the engine process has used so far."""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class EngineProcess(EngineChild):
    """A LocalEngine process on its own store file, with ``--ack-every N``.

    Use as a context manager; :meth:`new_run` registers a fresh run id.
    """

    _ids = itertools.count(1)

    def __init__(self, folder: Path, ack_every: int, cpus: set[int] | None = None) -> None:
        self.ack_every = ack_every
        self.store_path = folder / f"engine-ack{ack_every}.sqlite3"
        super().__init__(
            "walchannel.testing.engine",
            ["--store", str(self.store_path), "--ack-every", str(ack_every)],
            folder / f"engine-ack{ack_every}.stderr",
            cpus,
        )
        self._store: EngineStore | None = None

    def start(self) -> Self:
        self._store = EngineStore(self.store_path)
        return super().start()

    def new_run(self, prefix: str) -> str:
        """Register and return a fresh run id (token :data:`RUN_TOKEN`)."""
        assert self._store is not None
        run_id = f"{prefix}-{os.getpid()}-{next(self._ids)}"
        self._store.register_run(run_id, RUN_TOKEN)
        return run_id

    def stop(self) -> None:
        super().stop()
        if self._store is not None:
            self._store.close()
            self._store = None


class FastEngineProcess(EngineChild):
    """The fast engine (:mod:`tools.bench.fast_engine`: stores nothing, acks) as a child."""

    _ids = itertools.count(1)

    def __init__(
        self, folder: Path, ack_every: int, cpus: set[int] | None = None, *, flood: bool = False
    ) -> None:
        self.ack_every = ack_every
        super().__init__(
            "tools.bench.fast_engine",
            ["--ack-every", str(ack_every), *(["--flood"] if flood else [])],
            folder / f"fast-engine-ack{ack_every}{'-flood' if flood else ''}.stderr",
            cpus,
        )

    def new_run(self, prefix: str) -> str:
        """A fresh run id (the fast engine accepts any run and token)."""
        return f"{prefix}-{os.getpid()}-{next(self._ids)}"


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
