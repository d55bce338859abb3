from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sqlite3
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from walchannel import GrpcChannelConfig
    from walchannel.log import RunLog
    from walchannel.testing.engine import LocalEngine

ROOT = Path(__file__).resolve().parent.parent
#: The demo (examples/demo), beside the package: ``import demo`` from here.
EXAMPLES = ROOT / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.append(str(EXAMPLES))
HELPERS = Path(__file__).resolve().parent / "helpers"


@pytest.fixture
def wal_dir(tmp_path: Path) -> Path:
    """A fresh log folder (not yet created: RunLog.open makes it 0700)."""
    return tmp_path / "wal"


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a Python child that imports walchannel (and the demo) from this tree."""
    env = dict(os.environ)
    paths = [str(ROOT), str(EXAMPLES), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(paths).rstrip(os.pathsep)
    env.update(extra)
    return env


def offline_config(wal_dir: Path, run_id: str, **settings: Any) -> GrpcChannelConfig:
    """A config whose engine address refuses: for checks that never reach the network."""
    from walchannel import GrpcChannelConfig

    values: dict[str, Any] = {
        "grpc_addr": "127.0.0.1:1",
        "run_id": run_id,
        "correlation_id": "c",
        "run_token": f"tok-{run_id}",
        "wal_dir": wal_dir,
    }
    return GrpcChannelConfig(**{**values, **settings})


PYTHON = sys.executable


def new_run(engine: LocalEngine, prefix: str = "run") -> tuple[str, str]:
    """Register a fresh run with ``engine``; return ``(run_id, token)``."""
    run_id = f"{prefix}-{secrets.token_hex(4)}"
    token = "tok-" + secrets.token_urlsafe(18)
    engine.register_run(run_id, token)
    return run_id, token


def log_on_connection(
    config: GrpcChannelConfig, factory: type[sqlite3.Connection] = sqlite3.Connection
) -> tuple[Any, RunLog]:
    """The run's log as the channel makes it, then opened on a connection of ``factory``.

    Returns the connection (to arm its faults) and the log for ``GrpcEngineChannel(log=)``.
    """
    from walchannel.log import RunLog

    run_id, correlation_id = config.run_id, config.correlation_id
    with RunLog.open(config.wal_dir, run_id, correlation_id=correlation_id) as made:
        path = made.path
    conn = sqlite3.connect(path, factory=factory, isolation_level=None)
    return conn, RunLog.on_connection(conn, run_id=run_id, correlation_id=correlation_id)


async def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "") -> None:
    """Wait until ``check()`` is true, polling every 20 ms; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.02)


async def while_progressing(
    done: Callable[[], bool], progress: Callable[[], Any], stall_s: float = 30.0, what: str = ""
) -> None:
    """Wait until ``done()``; fail only when ``progress()`` did not change for ``stall_s`` s.

    For a fixed amount of work: busy CPUs make it slower, never wrong, so
    no budget for the whole; a stall is the failure.
    """
    seen, since = progress(), time.monotonic()
    while not done():
        now = progress()
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since > stall_s:
            raise AssertionError(f"no progress for {stall_s:g} s waiting for {what}: at {seen!r}")
        await asyncio.sleep(0.02)


# Servers and engines a test left running, kept so that none is collected later.
_LEFT_RUNNING: list[object] = []


def _made_where() -> str:
    """The frames under tests/ that made a server, innermost first (conftest itself left out)."""
    tests, here = f"{Path(__file__).parent}{os.sep}", __file__
    frames = [
        f"{os.path.relpath(frame.filename, ROOT)}:{frame.lineno}"
        for frame in reversed(traceback.extract_stack())
        if frame.filename.startswith(tests) and frame.filename != here
    ]
    return " <- ".join(frames) or "outside tests/"


@pytest.fixture(autouse=True)
def _every_server_stopped(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail the test that leaves a ``grpc.aio`` server or a ``LocalEngine`` running.

    A server nobody stopped is collected later, in whatever test runs then,
    after its event loop closed: grpc's ``Server.__del__`` then raises
    "Event loop is closed" into that innocent test. Here the test that made
    it fails instead (an error at teardown naming where it was made), and
    the server is kept, never collected, so no later test pays for it.
    """
    import grpc.aio

    from walchannel.testing.engine import LocalEngine

    servers: list[tuple[grpc.aio.Server, str]] = []
    engines: list[tuple[LocalEngine, str]] = []
    make_server = grpc.aio.server
    start_engine = LocalEngine.start

    def server(*args: Any, **kwargs: Any) -> grpc.aio.Server:
        made = make_server(*args, **kwargs)
        servers.append((made, _made_where()))
        return made

    async def start(self: LocalEngine) -> None:
        where = _made_where()
        await start_engine(self)
        engines.append((self, where))

    monkeypatch.setattr(grpc.aio, "server", server)
    monkeypatch.setattr(LocalEngine, "start", start)
    yield
    # Server.__del__ shuts down exactly what is_running() says is running.
    left = [(s, f"a grpc.aio server made at {w}") for s, w in servers if s._server.is_running()]
    left += [(e, f"a LocalEngine started at {w}") for e, w in engines if not e._stopped]
    if left:
        _LEFT_RUNNING.extend(thing for thing, _ in left)
        pytest.fail(
            "the test left running: "
            + "; ".join(what for _, what in left)
            + " (await server.stop(None) / await engine.stop(), in a finally)",
            pytrace=False,
        )


class _Lines(logging.Handler):
    """Every record walchannel's loggers let through, kept to be read at teardown."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


#: The loggers of a run's stream: each line begins ``run <run_id>:`` (docs/operations.md,
#: "A run's story in the log"), so one grep finds one run in a process of many.
_RUN_FIRST = frozenset(f"walchannel.channel.{m}" for m in ("connection", "stream", "refused_rows"))

#: What a template logged with no arguments leaves in its line.
_UNFILLED = ("%s", "%d", "%r")


@pytest.fixture(autouse=True)
def _every_log_line_whole() -> Iterator[None]:
    """Fail the test in which walchannel logs a line that does not format or says ``None``.

    Also a line of a run's stream (:data:`_RUN_FIRST`) that does not begin
    with ``run <id>:``, and a line whose template was never filled (logged
    with no arguments, logging leaves ``%s`` as it is).

    logging reports a line whose arguments do not fit its template on
    stderr ("--- Logging error ---") and drops the line: the operator never
    reads it. A ``None`` where a client's line names something (a run id, an
    address, a cause) names nothing. Either is a walchannel defect; the test that
    drove it names where. Every level is checked, DEBUG too: walchannel's
    loggers are opened to DEBUG for the test (a test's ``caplog.set_level``
    narrows what is checked, and ``caplog`` sees those lines as well).
    """
    lines = _Lines()
    product = logging.getLogger("walchannel")
    level = product.level
    product.setLevel(logging.DEBUG)
    product.addHandler(lines)
    try:
        yield
    finally:
        product.removeHandler(lines)
        product.setLevel(level)
    for record in lines.records:
        where = f"{record.pathname}:{record.lineno} ({record.levelname})"
        try:
            text = record.getMessage()
        except Exception as exc:
            pytest.fail(f"walchannel logged a line that does not format, at {where}: {exc!r}")
        args = record.args if isinstance(record.args, tuple) else ()
        # The local engine shows a value that may be absent ("stop=None"):
        # only the client's lines name things.
        client = not record.name.startswith("walchannel.testing")
        if client and (record.msg is None or None in args):
            pytest.fail(f"walchannel logged a line that says None, at {where}: {record.msg!r}")
        if record.name in _RUN_FIRST and not text.startswith("run "):
            pytest.fail(f"a line of a run's stream does not begin 'run <id>:', at {where}")
        if client and not args and any(f in text for f in _UNFILLED):
            pytest.fail(f"walchannel logged a template it never filled, at {where}: {text!r}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that fork a child as another user (``helpers.users.as_user``).

    A fork without exec in a process that has gRPC threads (any earlier test
    in the same worker that dialed or served) can crash the child: these
    run apart, in a pytest process of their own (Makefile ``pytest``).
    """
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if item.path.name == "test_readers.py" or "nobody_dir" in fixtures:
            item.add_marker(pytest.mark.forks)
