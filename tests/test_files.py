"""Where logs live (SPEC "The log"), on a fake file system: no SQLite involved."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pyfakefs.fake_filesystem import FakeFilesystem

from walchannel.log import files


def test_default_folder_prefers_walchannel_dir(
    fs: FakeFilesystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WALCHANNEL_DIR", "/srv/wal")
    monkeypatch.setenv("XDG_STATE_HOME", "/state")
    assert files.default_wal_dir() == Path("/srv/wal")


def test_default_folder_falls_back_to_xdg_state_home(
    fs: FakeFilesystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WALCHANNEL_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", "/state")
    assert files.default_wal_dir() == Path("/state/walchannel")


def test_default_folder_falls_back_to_home(
    fs: FakeFilesystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WALCHANNEL_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", "")
    monkeypatch.setenv("HOME", "/home/scan")
    assert files.default_wal_dir() == Path("/home/scan/.local/state/walchannel")


def test_folder_is_created_0700_with_parents_under_a_permissive_umask(
    fs: FakeFilesystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WALCHANNEL_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", "/state/deep")
    old = os.umask(0)
    try:
        made = files.ensure_wal_dir(None)
    finally:
        os.umask(old)
    assert made == Path("/state/deep/walchannel")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_existing_folder_is_used_as_it_is(fs: FakeFilesystem) -> None:
    fs.create_dir("/srv/wal", perm_bits=0o750)
    assert files.ensure_wal_dir("/srv/wal") == Path("/srv/wal")
    assert stat.S_IMODE(Path("/srv/wal").stat().st_mode) == 0o750


def test_a_file_where_the_folder_should_be_is_refused(fs: FakeFilesystem) -> None:
    fs.create_file("/srv/wal")
    with pytest.raises(NotADirectoryError, match="/srv/wal"):
        files.ensure_wal_dir("/srv/wal")


def test_log_and_sidecar_names(fs: FakeFilesystem) -> None:
    log = files.log_path(Path("/w"), "run:42.a-b_c")
    assert log == Path("/w/run:42.a-b_c.wal.sqlite3")
    assert files.lock_path(log) == Path("/w/run:42.a-b_c.wal.sqlite3.lock")
    tmp = files.temporary_path(log, "0123abcd")
    assert tmp.parent == log.parent and tmp.name.startswith(".")
    # Never longer than the log's name: a path the log fits in fits it too.
    assert len(tmp.name) < len(log.name)
    assert files.is_temporary_for(tmp, log)
    assert not files.is_temporary_for(log, log)
    for other_run in ("run:42.a-b_c2", "run:42.a-b_c.", "run:42.a-b_"):
        other = files.log_path(Path("/w"), other_run)
        assert not files.is_temporary_for(files.temporary_path(other, "0123abcd"), log)
        assert not files.is_temporary_for(tmp, other)


@pytest.mark.parametrize(
    "run_id",
    [
        *("", ".", "..", "...", ".hidden", "a/b", "../x", "a\x00b", "a b", "é", "x" * 201),
        *("a\\b", "a*b", 17, None),
    ],
)
def test_unsafe_run_ids_are_refused(run_id: object) -> None:
    with pytest.raises(ValueError, match="run_id"):
        files.check_run_id(run_id)


def test_safe_run_ids_pass() -> None:
    for run_id in ("a", "run-1", "RUN_2.x", "ns:run:3", "x" * 200, "a...", "-x", "x."):
        assert files.check_run_id(run_id) == run_id


def test_a_relative_xdg_state_home_is_ignored_and_a_tilde_is_home(
    fs: FakeFilesystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", "/home/scan")
    monkeypatch.delenv("WALCHANNEL_DIR", raising=False)
    for relative in ("state", "./state", "~/state"):
        monkeypatch.setenv("XDG_STATE_HOME", relative)
        assert files.default_wal_dir() == Path("/home/scan/.local/state/walchannel")
    for tilde, expected in (("~/wal", "/home/scan/wal"), ("~", "/home/scan")):
        monkeypatch.setenv("WALCHANNEL_DIR", tilde)
        assert files.default_wal_dir() == Path(expected)
