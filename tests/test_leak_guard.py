"""The suite's own guard (tests/conftest.py): a test that leaves a server running fails itself.

A ``grpc.aio`` server nobody stopped used to be collected in a later test,
after its event loop had closed, and fail that test instead ("Event loop is
closed" from grpc's ``Server.__del__``, an unraisable exception).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import HELPERS

LEAKY_TESTS = textwrap.dedent(
    """
    import gc

    import grpc.aio
    import pytest

    from walchannel.testing.engine import LocalEngine


    @pytest.mark.asyncio
    async def test_leaves_a_server_running():
        server = grpc.aio.server()
        server.add_insecure_port("127.0.0.1:0")
        await server.start()
        cycle = {"server": server}
        cycle["self"] = cycle  # as an engine and its servicer are: collected only by gc


    @pytest.mark.asyncio
    async def test_leaves_an_engine_running():
        engine = LocalEngine()
        await engine.start()
        await engine.kill()  # its gRPC server stopped; its discovery server still up


    @pytest.mark.asyncio
    async def test_stops_what_it_starts():
        server = grpc.aio.server()
        server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await server.stop(None)
        engine = LocalEngine()
        await engine.start()
        await engine.stop()


    def test_a_later_test_collects_garbage():
        gc.collect()
    """
)


def test_the_test_that_leaves_a_server_running_fails_and_no_later_one(tmp_path: Path) -> None:
    shutil.copy(HELPERS.parent / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_leaky.py").write_text(LEAKY_TESTS)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly"),
            *("-W", "error::pytest.PytestUnraisableExceptionWarning"),
            *("-o", "asyncio_default_fixture_loop_scope=function", "-rE", "test_leaky.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,  # without the guard, the collected server hangs the run
    )
    out = done.stdout
    # The two that leave one running fail; no other test does, not even the
    # one that collects garbage after the leaked ones' event loops closed.
    assert "4 passed, 2 errors" in out, out
    assert out.count("ERROR at teardown") == 2, out
    made = f"{tmp_path.name}/test_leaky.py"
    lines = LEAKY_TESTS.splitlines()
    server_at = lines.index("    server = grpc.aio.server()") + 1
    engine_at = lines.index("    await engine.start()") + 1
    assert "ERROR at teardown of test_leaves_a_server_running _" in out, out
    assert f"left running: a grpc.aio server made at {made}:{server_at} (" in out, out
    assert "ERROR at teardown of test_leaves_an_engine_running _" in out, out
    assert f"left running: a LocalEngine started at {made}:{engine_at} (" in out, out
