"""The wheel carries py.typed and the .proto; light commands never load grpc."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT, child_env


def test_wheel_carries_py_typed_and_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("walchannel-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "walchannel/py.typed" in names
    assert "walchannel/_proto/engine_channel.proto" in names
    assert "walchannel/_proto/engine_channel_pb2.pyi" in names
    assert not any("__pycache__" in n for n in names)


def test_package_and_log_import_without_grpc() -> None:
    code = (
        "import sys, walchannel, walchannel.log, walchannel.files, walchannel.lock\n"
        "walchannel.RunLog, walchannel.WalCorruptError\n"
        "assert 'grpc' not in sys.modules, 'grpc was imported'\n"
        "assert 'httpx' not in sys.modules, 'httpx was imported'\n"
    )
    subprocess.run([PYTHON, "-c", code], check=True, env=child_env())


def test_lazy_exports_resolve_and_unknown_names_fail() -> None:
    import walchannel

    for name in walchannel.__all__:
        assert getattr(walchannel, name) is not None
    assert sorted(walchannel.__all__) == walchannel.__all__
    with pytest.raises(AttributeError, match="NoSuchThing"):
        walchannel.NoSuchThing  # noqa: B018


def test_testing_names_resolve_lazily_without_grpc() -> None:
    code = (
        "import sys, walchannel.testing as t\n"
        "assert 'grpc' not in sys.modules\n"
        "assert sorted(t.__all__) == t.__all__\n"
        "t.InMemoryEngineChannel, t.EngineStore\n"
        "assert 'grpc' not in sys.modules, 'the in-memory double and the store need no grpc'\n"
        "t.LocalEngine, t.FaultProxy\n"
    )
    subprocess.run([PYTHON, "-c", code], check=True, env=child_env())
