"""Light commands never load grpc; the lazy exports resolve (the wheel: test_wheel.py)."""

from __future__ import annotations

import subprocess

import pytest

from conftest import PYTHON, child_env


def test_package_and_log_import_without_grpc() -> None:
    code = (
        "import sys, walchannel, walchannel.log.writer, walchannel.log.files, walchannel.log.lock\n"
        "walchannel.log.RunLog, walchannel.WalCorruptError\n"
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
