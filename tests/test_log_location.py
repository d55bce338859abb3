"""Where a log cannot live is said plainly (issue 57, part 3; SPEC "The log").

No home folder to put the default log folder in, a file system that cannot
give SQLite's WAL its shared-memory file (``-shm``), a runtime without
open-file-description locks: each is a :class:`WalLocationError` naming the
folder, the cause and what to do, never a bare ``RuntimeError`` or "disk
I/O error"; ``walchannel`` exits 2 with it and the runner exits 2 (``USAGE``:
a retry cannot mend it). Every case holds for root too (CI runs as root).
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from pathlib import Path

import pytest

from walchannel import WalLocationError, WalWriteError
from walchannel.log import RunLog
from walchannel.log.files import default_wal_dir, log_path
from walchannel.runner import ExitCode


def _without_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a container user with no passwd entry and no HOME sees it."""
    import pwd

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("WALCHANNEL_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    # The passwd database is the machine's; the user missing from it is not.
    monkeypatch.setattr(pwd, "getpwuid", no_entry)


@pytest.mark.parametrize(
    "where",
    ["the default folder", "a wal_dir under ~", "a WALCHANNEL_DIR under ~"],
)
def test_no_home_folder_is_a_named_configuration_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str
) -> None:
    _without_home(monkeypatch)
    wal_dir: str | None = None
    if where == "a wal_dir under ~":
        wal_dir = "~/wal"
    elif where == "a WALCHANNEL_DIR under ~":
        monkeypatch.setenv("WALCHANNEL_DIR", "~/wal")
    with pytest.raises(WalLocationError) as caught:
        RunLog.open(wal_dir, "r1", correlation_id="c")
    said = str(caught.value)
    assert "home folder" in said and "WALCHANNEL_DIR" in said and "wal_dir" in said, said
    assert not isinstance(caught.value, RuntimeError)
    assert list(tmp_path.iterdir()) == []


def test_the_default_folder_is_said_without_a_home_when_walchannel_dir_is_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _without_home(monkeypatch)
    monkeypatch.setenv("WALCHANNEL_DIR", str(tmp_path / "wal"))
    assert default_wal_dir() == tmp_path / "wal"


@pytest.mark.parametrize("command", [["inspect"], ["export", "~/wal/r1.wal.sqlite3"]])
def test_the_cli_without_a_home_folder_exits_2_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    from walchannel.cli import main

    _without_home(monkeypatch)
    assert main(command) == 2
    said = capsys.readouterr().err
    assert "Traceback" not in said
    assert "home folder" in said and "WALCHANNEL_DIR" in said, said


# -- the -shm: a file system that cannot give SQLite's WAL its shared memory ------------


def _unshareable(shm: Path, member: str) -> None:
    """Put at ``shm`` what a file system without shared memory gives SQLite (two members)."""
    if member == "a folder":
        shm.mkdir()  # SQLITE_READONLY: "attempt to write a readonly database"
    else:
        shm.symlink_to("/dev/null")  # SQLITE_CANTOPEN: "unable to open database file"


@pytest.mark.parametrize("member", ["a folder", "a device"])
def test_a_shm_that_cannot_be_shared_memory_is_named_on_a_new_log(
    tmp_path: Path, member: str
) -> None:
    folder = tmp_path / "wal"
    folder.mkdir(mode=0o700)
    _unshareable(Path(f"{log_path(folder, 'r1')}-shm"), member)
    with pytest.raises(WalLocationError) as caught:
        RunLog.open(folder, "r1", correlation_id="c")
    said = str(caught.value)
    assert str(folder) in said and "-shm" in said and "shared memory" in said, said
    # What to do: this -shm is a thing in SQLite's way, not the file system's lack.
    assert "Move it out of the way" in said and "local file system" not in said, said
    assert "SQLITE_" in said, said  # SQLite's own name for it


@pytest.mark.parametrize("member", ["a folder", "a device"])
def test_a_shm_that_cannot_be_shared_memory_is_named_on_a_log_with_rows(
    tmp_path: Path, member: str
) -> None:
    folder = tmp_path / "wal"
    with RunLog.open(folder, "r1", correlation_id="c") as wal:
        wal.append_many([("finding", {"n": i}) for i in range(3)])
    path = log_path(folder, "r1")
    before = path.read_bytes()
    shm = Path(f"{path}-shm")
    shm.unlink(missing_ok=True)
    _unshareable(shm, member)
    with pytest.raises(WalLocationError, match="shared memory"):
        RunLog.open(folder, "r1", correlation_id="c")
    assert path.read_bytes() == before  # nothing lost, nothing written


# -- locks the runtime lacks --------------------------------------------------------------


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOLCK])
def test_a_runtime_without_ofd_locks_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, code: int
) -> None:
    real = fcntl.fcntl

    def lacking(fd: int, cmd: int, arg: object = 0) -> object:
        # gVisor and WSL1 answer F_OFD_SETLK with EINVAL, an NFS without lockd ENOLCK:
        # no such runtime here, so the call answers as theirs does.
        if cmd == fcntl.F_OFD_SETLK:
            raise OSError(code, os.strerror(code))
        return real(fd, cmd, arg)  # type: ignore[arg-type]

    monkeypatch.setattr(fcntl, "fcntl", lacking)
    with pytest.raises(WalLocationError) as caught:
        RunLog.open(tmp_path / "wal", "r1", correlation_id="c")
    said = str(caught.value)
    assert "lock" in said and "runtime" in said and str(tmp_path / "wal") in said, said


def test_a_location_error_is_no_write_error_a_retry_could_mend() -> None:
    # The runner exits 16 (retriable) on a WalWriteError at open; a log that cannot
    # live where it was put is USAGE (2): starting it again there cannot help.
    assert not issubclass(WalLocationError, WalWriteError)
    from walchannel.runner.run import _code_for

    assert _code_for(WalLocationError("x", path="/x")) == ExitCode.USAGE


@pytest.mark.parametrize("target", ["/dev/null", "/nonexistent/shm"])
def test_inspect_names_a_log_it_cannot_read_for_want_of_shared_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    import shutil

    from walchannel.cli import main

    folder, copy = tmp_path / "wal", tmp_path / "copy"
    # A log whose rows are still in its -wal, as a harness killed leaves it,
    # copied onto a file system whose -shm SQLite cannot open.
    wal = RunLog.open(folder, "r1", correlation_id="c")
    try:
        wal.append_many([("finding", {"n": i}) for i in range(3)])
        copy.mkdir(mode=0o700)
        for name in ("r1.wal.sqlite3", "r1.wal.sqlite3-wal"):
            shutil.copy(folder / name, copy / name)
    finally:
        wal.close()
    (copy / "r1.wal.sqlite3-shm").symlink_to(target)
    assert main(["inspect", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "unreadable" in out and "shared memory" in out, out
    assert "local file system" in " ".join(out.split()), out
    assert "as the log's owner or root" not in out


@pytest.mark.parametrize("where", ["wal_dir", "a folder below it", "WALCHANNEL_DIR"])
def test_a_file_where_the_log_folder_should_be_is_named_with_its_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    wal_dir: Path | None = a_file / "below" if where == "a folder below it" else a_file
    if where == "WALCHANNEL_DIR":
        monkeypatch.setenv("WALCHANNEL_DIR", str(a_file))
        wal_dir = None
    with pytest.raises(WalLocationError) as caught:
        RunLog.open(wal_dir, "r1", correlation_id="c")
    said = str(caught.value)
    assert str(a_file) in said and "not a folder" in said, said
    assert ("WALCHANNEL_DIR" if where == "WALCHANNEL_DIR" else "wal_dir") in said, said
    assert a_file.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a child as another uid (needs root)")
@pytest.mark.parametrize(
    "where", ["the folder itself", "a folder above one to be made", "a folder it cannot enter"]
)
def test_a_folder_the_user_cannot_write_names_the_uid_and_says_not_writable(where: str) -> None:
    # Issue 58, item 7: "cannot take the owner lock: permission denied" named
    # neither who nor what; as a WalWriteError the runner took it for a full
    # disk (exit 16, "retriable"); a folder it cannot enter was a bare PermissionError.
    from helpers.users import as_user

    uid = 4243
    with tempfile.TemporaryDirectory(dir="/tmp") as top:  # not under a 0700 pytest folder
        base = Path(top) / "base"
        locked = base / "wal"
        locked.mkdir(parents=True)
        os.chmod(top, 0o755)
        os.chmod(locked, 0o555)
        os.chmod(base, 0o700 if where == "a folder it cannot enter" else 0o555)
        wal_dir = locked if where == "the folder itself" else base / "new" / "wal"
        refusing = locked if where == "the folder itself" else base
        how = "cannot be entered" if where == "a folder it cannot enter" else "is not writable"

        def open_it() -> object:
            try:
                RunLog.open(wal_dir, "run-ro", correlation_id="c")
            except WalLocationError as exc:
                return ("location", str(exc), exc.path)
            except Exception as exc:
                return ("other", type(exc).__name__, str(exc))
            return ("opened", "", "")

        kind, said, path = as_user(uid, open_it)
        assert kind == "location", said
        assert f"the folder {refusing} {how} by uid {uid}" in said, said
        assert "EACCES" in said and "WALCHANNEL_DIR" in said and "run-ro" in said, said
        assert path == str(wal_dir), said
        assert not list(locked.iterdir())  # nothing written
