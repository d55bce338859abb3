"""Where run logs live on disk: the folder, the file names, safe run ids.

Pure file-system rules with no SQLite, so they are tested on a fake file
system. SPEC "The log": one database per run, ``<wal_dir>/<run_id>.wal.sqlite3``,
mode 0600 in a 0700 folder; ``wal_dir`` defaults to ``$WALCHANNEL_DIR``,
else ``$XDG_STATE_HOME/walchannel``, else ``~/.local/state/walchannel``. The
folder must be on a local file system: SQLite's WAL mode relies on shared
memory that network file systems do not provide (https://sqlite.org/wal.html).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import pwd
import re
import resource
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

# Imported here, not on first use (as Python 3.13's Path.as_uri does): an
# import reads a module file, and with no descriptor left its OSError would
# escape the open or the read it interrupts unnamed.
from urllib.parse import quote_from_bytes

from walchannel.errors import WalLocationError

__all__ = [
    "LOG_SUFFIX",
    "LOCK_SUFFIX",
    "MAX_RUN_ID_BYTES",
    "SQLITE_MAX_PATH_BYTES",
    "check_path_length",
    "check_run_id",
    "default_wal_dir",
    "describe_os_error",
    "disk_bytes",
    "ensure_wal_dir",
    "expand_user",
    "file_kind",
    "file_size",
    "identity",
    "is_temporary_for",
    "lock_path",
    "log_path",
    "open_failure",
    "shared_memory_failure",
    "sqlite_uri",
    "temporary_path",
    "watch_files",
]

#: A folder's mtime is dated from the kernel's coarse clock (a tick: 1 to 10 ms):
#: watch_files trusts one older than this (ns) to show every change since.
_COARSE_CLOCK_NS: Final = 20_000_000
LOG_SUFFIX = ".wal.sqlite3"
LOCK_SUFFIX = ".lock"
MAX_RUN_ID_BYTES = 200
_SAFE_RUN_ID = re.compile(r"[A-Za-z0-9._:-]+")
# "~" is not allowed in a run id, so ".<run_id>.~" prefixes only that run's
# temporaries; with 8 hex digits the name is a byte shorter than the log's.
_TMP_MARK = ".~"
#: The longest absolute path (bytes) SQLite opens as a database: its unix
#: VFS holds 512 bytes (``MAX_PATHNAME``) and the pager refuses a name that
#: leaves no room for the 8 bytes of ``-journal`` (``nPathname+8 >
#: mxPathname``: SQLITE_CANTOPEN, which names no cause). Measured here: 504
#: opens, 505 does not.
SQLITE_MAX_PATH_BYTES: Final = 504


def check_run_id(run_id: object) -> str:
    """Return ``run_id`` if it is a safe file name, else raise ``ValueError``.

    Refused (SPEC "The log"): a non-``str``, empty, over 200 bytes, holding
    anything outside ``[A-Za-z0-9._:-]`` (so ``/``, NUL, spaces and other
    separators never reach a path), or starting with ``.`` (``.``, ``..``
    and hidden files, which ``inspect`` and ``prune`` do not list: every run
    id accepted here names a log they show).

    Raises:
        ValueError: naming the run id and what is wrong with it.
    """
    if not isinstance(run_id, str):
        raise ValueError(f"run_id must be a str, got {type(run_id).__name__}")
    if not run_id:
        raise ValueError("run_id is empty")
    if len(run_id.encode("utf-8", "surrogatepass")) > MAX_RUN_ID_BYTES:
        raise ValueError(f"run_id {run_id[:40]!r}... is over {MAX_RUN_ID_BYTES} bytes")
    if run_id in (".", ".."):
        raise ValueError(f"run_id {run_id!r} is not a file name")
    if run_id.startswith("."):
        raise ValueError(
            f"run_id {run_id!r} must not start with '.' (it would name a hidden log "
            "file, which inspect does not list)"
        )
    if not _SAFE_RUN_ID.fullmatch(run_id):
        raise ValueError(
            f"run_id {run_id!r} may only hold letters, digits and . _ : - "
            "(it names a file in the log folder)"
        )
    return run_id


def default_wal_dir() -> Path:
    """Return the default log folder: ``$WALCHANNEL_DIR``, ``$XDG_STATE_HOME/walchannel``,
    or ``~/.local/state/walchannel``, in that order.

    Empty variables are ignored, and so is a relative ``XDG_STATE_HOME`` (the
    XDG Base Directory spec: such a value is invalid); a leading ``~`` in
    ``WALCHANNEL_DIR`` is the home folder, as a shell would have it.

    Raises:
        WalLocationError: there is no home folder to put it in (nor to read
            a ``~`` in ``WALCHANNEL_DIR`` by).
    """
    explicit = os.environ.get("WALCHANNEL_DIR")
    if explicit:
        return expand_user(Path(explicit), "WALCHANNEL_DIR")
    state = os.environ.get("XDG_STATE_HOME")
    if state and os.path.isabs(state):
        return Path(state) / "walchannel"
    return expand_user(Path("~/.local/state/walchannel"), "the default log folder")


def expand_user(path: Path, what: str = "wal_dir", *, log: bool = True) -> Path:
    """``path`` with a leading ``~`` made the home folder.

    Args:
        path: a folder or file.
        what: the setting it came from, named in the error.
        log: it places a log (the error then says how to set the log folder).

    Raises:
        WalLocationError: it starts with ``~`` and there is no home folder
            (``HOME`` unset and no passwd entry for this user, as for a
            container started with ``--user``).
    """
    try:
        return path.expanduser()
    except (RuntimeError, KeyError):
        fix = (
            "set WALCHANNEL_DIR to the log folder, or pass wal_dir= (walchannel run: --wal-dir;"
            " the other commands: PATH)"
            if log
            else "give it without ~, or set HOME"
        )
        raise WalLocationError(
            f"{what} {str(path)!r} needs a home folder, and there is none (HOME is unset and"
            f" user id {os.getuid()} has no entry in the password database, as for a container"
            f" started with --user): {fix}",
            path=str(path),
        ) from None


def ensure_wal_dir(wal_dir: str | os.PathLike[str] | None) -> Path:
    """Create the log folder (mode 0700, parents too) if missing and return it.

    An existing folder is used as it is. Raises ``NotADirectoryError`` when
    the path exists and is not a folder, and ``OSError`` when it cannot be
    created.
    """
    path = Path(wal_dir) if wal_dir is not None else default_wal_dir()
    path = expand_user(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"wal_dir {str(path)!r} exists and is not a folder")
    if not path.is_dir():
        # mkdir's mode is filtered by the umask; chmod makes 0700 exact.
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, stat.S_IRWXU)
    return path


def log_path(wal_dir: Path, run_id: str) -> Path:
    """Return ``<wal_dir>/<run_id>.wal.sqlite3`` for a checked run id."""
    return wal_dir / f"{check_run_id(run_id)}{LOG_SUFFIX}"


def sqlite_uri(path: Path, query: str) -> str:
    """Return ``path``, resolved, as SQLite's ``file:`` URI with ``query`` (https://sqlite.org/uri.html).

    The same URI as ``f"{path.resolve().as_uri()}?{query}"``, with nothing
    imported on the way (a late import needs a descriptor of its own).

    Args:
        path: the database file.
        query: the URI parameters, such as ``"mode=ro&immutable=1"``.
    """
    return f"file://{quote_from_bytes(os.fsencode(path.resolve()))}?{query}"


def identity(path: Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file ``path`` names now (not following a symlink), or None."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def watch_files(
    folder: Path, files: dict[str, tuple[Path, tuple[int, int]]]
) -> Callable[[], str | None]:
    """A check that each path still names the file that was open under it.

    One ``stat`` of ``folder`` a call while it stays as it was at the last
    full look: every unlink, rename or create inside it changes its mtime.
    Only when it changed are the files stat'ed, one ``stat`` each. Its
    mtime is trusted once older than :data:`_COARSE_CLOCK_NS`: the kernel
    dates it from a coarse clock, so a change within the same tick as the
    last look could leave it as it was. It never opens a descriptor on the
    log (closing one would drop SQLite's POSIX locks).

    Args:
        folder: the folder the files are in.
        files: what each file is (``"the log file"``) -> its path and the
            ``(st_dev, st_ino)`` of the file open under it.

    Returns:
        A function of no arguments: None while every path names its file,
        else what changed (``"the log file /x/r.wal.sqlite3 is gone"``).
    """
    where = os.fspath(folder)
    watched = [(what, os.fspath(path), ident) for what, (path, ident) in files.items()]
    unchanged: list[tuple[int, int, int] | None] = [None]  # the folder at the last full look

    def look() -> str | None:
        for what, path, ident in watched:
            try:
                st = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                return f"{what} {path} is gone"
            except OSError as exc:
                return f"{what} {path} cannot be looked at ({describe_os_error(exc)})"
            if (st.st_dev, st.st_ino) != ident:
                return f"{what} {path} is another file now"
        return None

    def moved() -> str | None:
        try:
            st = os.stat(where)
        except FileNotFoundError:
            return f"its folder {where} is gone"
        except OSError as exc:
            return f"its folder {where} cannot be looked at ({describe_os_error(exc)})"
        key = (st.st_dev, st.st_ino, st.st_mtime_ns)
        if key == unchanged[0]:
            return None
        found = look()
        if found is None and time.time_ns() - st.st_mtime_ns > _COARSE_CLOCK_NS:
            unchanged[0] = key
        return found

    return moved


def lock_path(log: Path) -> Path:
    """Return the owner-lock sidecar of a log, ``<log>.lock``."""
    return log.with_name(log.name + LOCK_SUFFIX)


def disk_bytes(log: Path) -> int:
    """Return the size of a log plus its ``-wal`` (bytes): the disk the run holds.

    A file that is missing or cannot be stat'ed counts 0. ``inspect``'s
    DISK, ``file_bytes`` and the ``walchannel.log.size`` metric.
    """
    total = 0
    for name in (log, f"{log}-wal"):
        with contextlib.suppress(OSError):
            total += os.lstat(name).st_size
    return total


def file_kind(path: Path) -> str:
    """Say what is at ``path`` without following a link: ``"missing"``, ``"file"``,
    ``"symlink"``, ``"folder"`` or ``"special file"``.

    Raises:
        OSError: it cannot be looked at (a folder on the path not searchable,
            a part of the path that is a file).
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISREG(mode):
        return "file"
    return "folder" if stat.S_ISDIR(mode) else "special file"


def file_size(path: Path) -> int:
    """Return the size of the file at ``path`` (bytes; symlinks followed), 0 if unreadable.

    The channel compares it before and after a checkpoint step, to tell a
    reclaim that is going on from one a reader held off.
    """
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _run_of(log: Path) -> str:
    return log.name.removesuffix(LOG_SUFFIX)


def temporary_path(log: Path, token: str) -> Path:
    """Return the name a new log is built (or restored) under before it is linked into place.

    ``.<run_id>.~<token>``: hidden, so ``inspect`` and ``prune`` skip it, and
    with an 8-character ``token`` a byte shorter than the log's own name, so
    a path the log fits in fits its temporary too (:func:`check_path_length`).
    """
    return log.with_name(f".{_run_of(log)}{_TMP_MARK}{token}")


def is_temporary_for(candidate: Path, log: Path) -> bool:
    """Tell whether ``candidate`` is a (possibly stale) temporary of ``log`` or its sidecars."""
    return candidate.name.startswith(f".{_run_of(log)}{_TMP_MARK}")


def check_path_length(path: Path) -> None:
    """Raise ``OSError(ENAMETOOLONG)`` when SQLite could not open ``path`` for its length.

    Measured on the absolute path with symbolic links resolved, as SQLite's
    unix VFS does. The error names the length and the limit
    (:data:`SQLITE_MAX_PATH_BYTES`); callers wrap it in their own error.

    Raises:
        OSError: ``ENAMETOOLONG``, the path over the limit; ``ELOOP``, a
            symbolic link loop on the way.
    """
    real = _real_path(path)
    size = len(os.fsencode(real))
    if size > SQLITE_MAX_PATH_BYTES:
        raise OSError(
            errno.ENAMETOOLONG,
            f"its path is {size} bytes long (links resolved) and SQLite opens paths of up to "
            f"{SQLITE_MAX_PATH_BYTES} bytes: use a shorter folder",
            str(path),
        )


def _real_path(path: Path) -> str:
    try:
        return os.path.realpath(path, strict=False)
    except (OSError, RuntimeError, ValueError) as exc:
        raise OSError(errno.ELOOP, f"its path cannot be resolved: {exc}", str(path)) from None


def describe_os_error(exc: OSError) -> str:
    """Say what an ``OSError`` means for a log, in words an operator can act on.

    The errno names the cause (``EMFILE`` gives the open-file limit too);
    the path is left to the caller's error, which names it once.
    """
    code = exc.errno
    said = exc.strerror or str(exc)
    if code == errno.ENAMETOOLONG and exc.strerror and "SQLite" in exc.strerror:
        return exc.strerror
    if code in (errno.EMFILE, errno.ENFILE):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        whose = "this process" if code == errno.EMFILE else "the system"
        return f"{said}: {whose} has no file descriptor left (RLIMIT_NOFILE {soft}; EMFILE)"
    name = errno.errorcode.get(code or 0)
    what = {
        errno.ENOENT: "it or a folder on its path does not exist",
        errno.ENOTDIR: "a part of its path is a file, not a folder",
        errno.EISDIR: "it is a folder, not a file",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.EROFS: "the file system is read-only",
        errno.ENOSPC: "no space left on the device",
        errno.ELOOP: "too many symbolic links on its path",
        errno.ENAMETOOLONG: "a name on its path is too long",
    }.get(code or 0)
    detail = f"{what} ({said})" if what else said
    return f"{detail}; {name}" if name else detail


def user_name() -> str:
    """`` (name)`` of this process's effective user, or "" for a uid with no passwd entry."""
    try:
        return f" ({pwd.getpwuid(os.geteuid()).pw_name})"
    except KeyError:
        return ""  # a container's uid with no passwd entry


def not_writable(folder: Path, exc: OSError) -> str | None:
    """Say who cannot write where, when ``exc`` (from creating a log in ``folder``) is a
    permission or read-only refusal; None for any other error.

    Returns:
        e.g. ``"the folder /srv/wal is not writable by uid 1000 (scanner): EACCES"``,
        with what to do.
    """
    if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
        return None
    # A folder to be made, or one that cannot be entered: the one that refused is above.
    while not os.path.exists(folder) and folder != folder.parent:
        folder = folder.parent
    name = errno.errorcode[exc.errno]
    if exc.errno == errno.EROFS:
        return (
            f"the folder {folder} is on a read-only file system ({name}): point wal_dir /"
            " WALCHANNEL_DIR at a writable volume"
        )
    uid = os.geteuid()
    user = user_name()
    how = "is not writable" if os.access(folder, os.X_OK) else "cannot be entered"
    return (
        f"the folder {folder} {how} by uid {uid}{user} ({name}): give that user"
        " write access to it, or point wal_dir / WALCHANNEL_DIR at a folder it can write"
    )


#: Descriptors SQLite holds for a log in WAL mode: the file, its -wal, its -shm.
_SQLITE_FDS: Final = 3


def _descriptors_short() -> str | None:
    """Say so when this process has too few file descriptors left to open a log."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        in_use = len(os.listdir("/proc/self/fd")) - 1  # less listdir's own
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return describe_os_error(exc)
        return None  # not Linux, or /proc hidden: cannot tell
    if soft == resource.RLIM_INFINITY or soft - in_use > _SQLITE_FDS:
        return None
    return (
        f"this process has {in_use} of its {soft} file descriptors open (RLIMIT_NOFILE) and "
        f"SQLite needs {_SQLITE_FDS} for a log (the file, its -wal and -shm); EMFILE"
    )


#: What SQLite's WAL maps of its -shm first: one region of 32 KiB.
_SHM_REGION: Final = 32 * 1024
#: What mmap(2) answers on a file system that cannot map a file shared.
_CANNOT_MAP: Final = frozenset(
    {errno.ENODEV, errno.EINVAL, errno.EACCES, errno.EPERM, errno.ENOTSUP}
)


def shared_memory_failure(path: Path, *, probe: bool = True) -> str | None:
    """Say why SQLite cannot have the shared memory its WAL needs beside ``path``; None if it can.

    SQLite's WAL keeps its index in ``<log>-shm``, a file it maps into
    shared memory (https://sqlite.org/wal.html, section 8). That file must
    be a regular file (or absent), and the folder's file system must map a
    file shared: virtiofs, 9p, network file systems and some bind mounts
    cannot. This looks at the ``-shm`` and maps a probe file of its own
    beside it (removed after), never the ``-shm`` itself.

    Args:
        path: the log file (or the temporary it is built under).
        probe: map a probe file in the folder too (the owner's open; a
            reader writes nothing, so it looks at the ``-shm`` alone).

    Returns:
        The cause in words, or None when nothing is wrong with either.
    """
    shm = Path(f"{path}-shm")
    kind = file_kind(shm)
    if kind == "symlink":
        target = os.readlink(shm)
        try:
            mode: int | None = os.stat(shm).st_mode
        except OSError:
            mode = None
        if mode is None or not stat.S_ISREG(mode):
            what = "nothing that exists" if mode is None else "no regular file"
            return f"its -shm {shm} is a symbolic link to {target!r}, {what}"
    elif kind not in ("missing", "file"):
        return f"its -shm {shm} is a {kind}, not a file SQLite can map"
    if not probe:
        return None
    probe_file = path.parent / f".{path.name}.shm-probe-{os.getpid()}"
    try:
        fd = os.open(
            probe_file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError:
        return None  # no file can be made here: open_failure says why
    try:
        try:
            os.ftruncate(fd, _SHM_REGION)
        except OSError:
            return None  # a size limit, a full disk: the cause is SQLite's own error
        try:
            # Mapped, never written: a page written on a full tmpfs is a SIGBUS.
            mmap.mmap(fd, _SHM_REGION, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE).close()
        except OSError as exc:
            if exc.errno not in _CANNOT_MAP:
                return None  # out of memory or address space: not the file system's lack
            said = describe_os_error(exc)
            return f"the file system of {path.parent} cannot map a file into shared memory ({said})"
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            probe_file.unlink()
    return None


def open_failure(path: Path, *, write: bool) -> str | None:
    """Ask the OS why SQLite could not open ``path``; None when the OS sees nothing wrong.

    Python's ``sqlite3`` reports only SQLITE_CANTOPEN ("unable to open
    database file") for a path too long, a missing folder, a folder where the
    file should be, permissions, no descriptor left: this checks the path's
    length (:func:`check_path_length`), opens the file the way SQLite would
    (read-write for the owner), and, for the owner, that the folder lets
    SQLite create the ``-wal`` and ``-shm``.

    Args:
        path: the log file.
        write: the owner's open (read-write, sidecars created) rather than a reader's.

    Returns:
        The cause in words (:func:`describe_os_error`), or None.
    """
    try:
        check_path_length(path)
        fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC)
        os.close(fd)
    except OSError as exc:
        return describe_os_error(exc)
    short = _descriptors_short()
    if short is not None:
        return short
    if write:
        folder = path.parent
        for sidecar in (f"{path}-wal", f"{path}-shm"):
            if os.path.lexists(sidecar) and not os.access(sidecar, os.R_OK | os.W_OK):
                return f"its {sidecar[len(str(path)) :]} is not writable (permission denied)"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"SQLite cannot create its -wal and -shm in {folder} (permission denied)"
    return None
