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
import os
import re
import stat
from pathlib import Path

__all__ = [
    "LOG_SUFFIX",
    "LOCK_SUFFIX",
    "MAX_RUN_ID_BYTES",
    "check_run_id",
    "default_wal_dir",
    "disk_bytes",
    "ensure_wal_dir",
    "file_size",
    "is_temporary_for",
    "lock_path",
    "log_path",
    "temporary_path",
]

LOG_SUFFIX = ".wal.sqlite3"
LOCK_SUFFIX = ".lock"
MAX_RUN_ID_BYTES = 200
_SAFE_RUN_ID = re.compile(r"[A-Za-z0-9._:-]+")
_TMP_MARK = ".creating-"


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
    or ``~/.local/state/walchannel``, in that order (empty variables are ignored)."""
    explicit = os.environ.get("WALCHANNEL_DIR")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME")
    if state:
        return Path(state) / "walchannel"
    return Path.home() / ".local" / "state" / "walchannel"


def ensure_wal_dir(wal_dir: str | os.PathLike[str] | None) -> Path:
    """Create the log folder (mode 0700, parents too) if missing and return it.

    An existing folder is used as it is. Raises ``NotADirectoryError`` when
    the path exists and is not a folder, and ``OSError`` when it cannot be
    created.
    """
    path = Path(wal_dir) if wal_dir is not None else default_wal_dir()
    path = path.expanduser()
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


def file_size(path: Path) -> int:
    """Return the size of the file at ``path`` (bytes; symlinks followed), 0 if unreadable.

    The channel compares it before and after a checkpoint step, to tell a
    reclaim that is going on from one a reader held off.
    """
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def temporary_path(log: Path, token: str) -> Path:
    """Return the name a new log is built under before it is renamed into place."""
    return log.with_name(f".{log.name}{_TMP_MARK}{token}")


def is_temporary_for(candidate: Path, log: Path) -> bool:
    """Tell whether ``candidate`` is a (possibly stale) temporary of ``log`` or its sidecars."""
    return candidate.name.startswith(f".{log.name}{_TMP_MARK}")
