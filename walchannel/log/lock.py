"""One owner per run log: an open-file-description lock on a ``<log>.lock`` sidecar.

``F_OFD_SETLK`` locks (Linux ≥ 3.15, fcntl(2)) belong to the open file
description, not the process: a second open of the sidecar conflicts even
inside the same process, and the lock is released by the kernel the moment
its owner dies (SIGKILL included). The sidecar holds the owner's pid and
host as JSON so a refused opener can name it.

A forked child inherits the open file description and with it the lock. So
``os.register_at_fork`` makes the child close its copy (the parent keeps the
lock) and mark the lock lost: every later write through it raises
:class:`~walchannel.errors.WalLockedError`. The child can neither write into
its parent's log nor keep the lock alive after the parent dies.

Readers (``walchannel inspect``) test liveness with ``F_OFD_GETLK`` and never
take the lock. SPEC "The log" (one owner at a time).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path

from walchannel.errors import WalLockedError

__all__ = ["LockOwner", "OwnerLock", "probe_owner"]

# struct flock on Linux (x86_64 and aarch64): short l_type, short l_whence,
# off_t l_start, off_t l_len, pid_t l_pid, padded to 32 bytes. l_pid must be
# 0 for OFD locks.
_FLOCK = "hhqqi4x"
_LIVE_LOCKS: weakref.WeakSet[OwnerLock] = weakref.WeakSet()
_SIDECAR_RETRIES = 5


@dataclass(frozen=True)
class LockOwner:
    """Who holds a log: the pid and host written into the sidecar (None if unreadable)."""

    pid: int | None
    host: str | None

    def describe(self) -> str:
        """Return ``pid 1234 on host-a`` (or what is known of it)."""
        pid = "unknown pid" if self.pid is None else f"pid {self.pid}"
        return f"{pid} on {self.host}" if self.host else pid


def _flock(kind: int) -> bytes:
    return struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 0, 0)


#: The sidecar's JSON is written at this width (spaces after it): one ``pwrite``
#: replaces it whole, with no truncation between (JSON ignores the spaces).
_SIDECAR_BYTES = 512


def _read_written(fd: int) -> tuple[str | None, int | None]:
    """The ``(boot, written)`` an earlier owner kept in the sidecar (None, None: none)."""
    try:
        raw = os.pread(fd, 4096, 0)
        data = json.loads(raw.decode("utf-8")) if raw.strip() else {}
        boot, written = data.get("boot"), data.get("written")
    except (OSError, ValueError, AttributeError):
        return None, None
    if not isinstance(boot, str) or not isinstance(written, int) or isinstance(written, bool):
        return None, None
    return (boot, written) if written >= 0 else (None, None)


def _read_owner(fd: int) -> LockOwner:
    try:
        raw = os.pread(fd, 4096, 0)
        data = json.loads(raw.decode("utf-8")) if raw else {}
        pid = data.get("pid")
        host = data.get("host")
        return LockOwner(
            pid if isinstance(pid, int) else None, host if isinstance(host, str) else None
        )
    except (OSError, ValueError, AttributeError):
        return LockOwner(None, None)


class OwnerLock:
    """The owner lock of one log, held from :meth:`acquire` until :meth:`release`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        self._forked = False
        self.owner = LockOwner(os.getpid(), socket.gethostname())
        self._written: tuple[str | None, int | None] = (None, None)

    def _write_sidecar(self) -> None:
        if self._fd is None:
            raise OSError(f"{self.path}: the lock is released")
        boot, written = self._written
        fields: dict[str, object] = {"pid": self.owner.pid, "host": self.owner.host}
        if boot is not None and written is not None:
            fields.update(boot=boot, written=written)
        data = json.dumps(fields).encode()
        os.pwrite(self._fd, data.ljust(_SIDECAR_BYTES), 0)

    def written(self) -> tuple[str | None, int | None]:
        """``(boot id, highest seq)`` this log's owners kept here (``RunLog.written_bound``)."""
        return self._written

    def keep_written(self, boot_id: str | None, seq: int) -> None:
        """Keep ``seq``, the bound of every seq written on ``boot_id``, in the sidecar.

        One ``pwrite`` of the whole record (no fsync: a power loss changes the
        boot id, and a kept bound of another boot is not trusted).

        Raises:
            OSError: the sidecar could not be written (or the lock is released).
        """
        before = self._written
        self._written = (boot_id, seq)
        try:
            self._write_sidecar()
        except OSError:
            self._written = before
            raise

    @classmethod
    def acquire(cls, path: Path, *, log: Path) -> OwnerLock:
        """Take the lock on ``path`` (created 0600 if missing, never through a symlink).

        Args:
            path: the ``<log>.lock`` sidecar.
            log: the log it guards, named in errors.

        Returns:
            The held lock; its sidecar now names this process.

        Raises:
            WalLockedError: another open file description holds it; the
                message names the owner's pid and host.
            OSError: the sidecar cannot be opened (a symlink, no permission).
        """
        for _ in range(_SIDECAR_RETRIES):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK))
            except OSError as exc:
                owner = _read_owner(fd)
                os.close(fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    raise WalLockedError(
                        f"{log}: the run's log is held by {owner.describe()}",
                        path=str(log),
                        pid=owner.pid,
                        host=owner.host,
                    ) from None
                raise
            # `walchannel prune` may have unlinked the sidecar between our open
            # and our lock: then we hold a lock on a file nobody else opens.
            try:
                same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            raise OSError(f"{path}: the lock file keeps being replaced")
        lock = cls(path, fd)
        # What earlier owners kept (RunLog.note_writing) goes on, under our name.
        lock._written = _read_written(fd)
        try:
            os.ftruncate(fd, 0)
            lock._write_sidecar()
        except OSError:
            lock.release()
            raise
        _LIVE_LOCKS.add(lock)
        return lock

    def identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the sidecar this lock holds (``fstat``), None once released."""
        if self._fd is None:
            return None
        st = os.fstat(self._fd)
        return st.st_dev, st.st_ino

    @property
    def held(self) -> bool:
        """True while this process holds the lock (False after release or in a forked child)."""
        return self._fd is not None and not self._forked

    @property
    def forked(self) -> bool:
        """True in a forked child of the owner: the lock is not this process's."""
        return self._forked

    def _drop_in_child(self) -> None:
        self._forked = True
        if self._fd is not None:
            # Closing the child's copy leaves the parent's lock in place.
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def release(self) -> None:
        """Release the lock (idempotent). The sidecar file stays: it is reused."""
        _LIVE_LOCKS.discard(self)
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if not self._forked:
                # Closing the only fd of the open file description drops the lock.
                os.close(fd)


def _after_fork_in_child() -> None:
    for lock in list(_LIVE_LOCKS):
        lock._drop_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def probe_owner(path: Path) -> LockOwner | None:
    """Return the live owner of a log's lock, or None when nobody holds it.

    Uses ``F_OFD_GETLK`` on a read-only descriptor: it never takes the lock,
    so it cannot block or disturb a live owner. A missing sidecar means no
    owner.

    Raises:
        OSError: the sidecar exists but cannot be opened.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _flock(fcntl.F_WRLCK))
        kind = struct.unpack(_FLOCK, answer)[0]
        if kind == fcntl.F_UNLCK:
            return None
        return _read_owner(fd)
    finally:
        os.close(fd)
