"""OpenTelemetry metrics of open channels (README "Monitoring"), read by the SDK's in-memory reader.

Real parts: LocalEngine on loopback, the fault proxy between it and the
channel, SQLite logs; the OpenTelemetry SDK's ``InMemoryMetricReader``
collects exactly what an exporter would.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from conftest import PYTHON, ROOT, child_env, eventually, new_run, offline_config
from walchannel import ChannelState, GrpcEngineChannel
from walchannel.channel import metrics as wm
from walchannel.channel.seams import log_of
from walchannel.log import RunLog
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config
from walchannel.testing.proxy import FaultProxy

PER_CHANNEL = (
    wm.SENT,
    wm.ACKED,
    wm.REPLAYED,
    wm.RECONNECTS,
    wm.PROTOCOL_ERRORS,
    wm.UNACKED,
    wm.UNACKED_SIZE,
    wm.OLDEST_AGE,
    wm.LOG_SIZE,
)


class Readout:
    """An SDK MeterProvider with an in-memory reader, and helpers to read its points."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])

    def points(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                if scope.scope.name != wm.SCOPE:
                    continue
                for metric in scope.metrics:
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out

    def channel(self, run_id: str) -> dict[str, Any]:
        """The per-channel values of ``run_id`` (name -> value; state -> {state: 0/1})."""
        got: dict[str, Any] = {}
        for name, points in self.points().items():
            for p in points:
                if p.attributes.get(wm.RUN_ID_ATTR) != run_id or name == wm.SEND_DURATION:
                    continue  # the histogram: send_duration()
                if name == wm.STATE:
                    got.setdefault(name, {})[p.attributes[wm.STATE_ATTR]] = p.value
                else:
                    got[name] = p.value
        return got

    def send_duration(self) -> Any:
        """The send-duration histogram's one point: every channel's calls, no run id."""
        (point,) = self.points()[wm.SEND_DURATION]
        return point


def log_files_size(path: Path) -> int:
    return sum(os.stat(p).st_size for p in (path, Path(f"{path}-wal")) if os.path.exists(p))


# -- the known scenario ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_instruments_after_sends_a_killed_engine_and_a_replay(tmp_path: Path) -> None:
    n, k = 12, 4
    readout = Readout()
    engine = LocalEngine()
    await engine.start()
    proxy = FaultProxy(engine.grpc_addr)
    await proxy.start()
    run_id, token = new_run(engine, "otel")
    config = local_channel_config(
        engine,
        tmp_path / "wal",
        run_id,
        token,
        grpc_addr=proxy.addr,
        http_addr=None,
        allowed_hosts=None,
        meter_provider=readout.provider,
    )
    try:
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1.0", "otel-test", "1")
            for i in range(n - k):
                ch.send_finding({"n": i})
            assert await ch.wait_acked(timeout_ms=10_000)
            # The unacked size follows the stored ack (coalesced, ~100 ms).
            await eventually(lambda: readout.channel(run_id).get(wm.UNACKED_SIZE) == 0, what="size")
            got = readout.channel(run_id)
            assert got[wm.SENT] == n - k
            assert got[wm.ACKED] == n - k
            assert got[wm.REPLAYED] == 0
            assert got[wm.RECONNECTS] == 0
            assert got[wm.PROTOCOL_ERRORS] == 0
            assert got[wm.UNACKED] == 0
            assert got[wm.OLDEST_AGE] == 0
            assert got[wm.STATE]["streaming"] == 1
            assert sum(got[wm.STATE].values()) == 1
            assert set(got[wm.STATE]) == {s.name.lower() for s in ChannelState}

            # A frozen link: K rows are written into it and never reach the engine.
            proxy.set_mode("freeze")
            for i in range(n - k, n):
                ch.send_finding({"n": i})
            await eventually(lambda: readout.channel(run_id)[wm.SENT] == n, what="K writes")
            got = readout.channel(run_id)
            assert got[wm.UNACKED] == k
            assert got[wm.UNACKED_SIZE] == ch.log.unacked_bytes > 0
            assert 0 < got[wm.OLDEST_AGE] < 60

            # The engine dies and the link is cut; a new engine takes over the store.
            await engine.kill()
            proxy.set_mode("reset")
            await eventually(lambda: ch.state is not ChannelState.STREAMING, what="drop seen")
            await engine.replace()
            proxy.target = engine.grpc_addr
            proxy.set_mode("pass")
            assert await ch.wait_acked(timeout_ms=20_000)
            await eventually(lambda: readout.channel(run_id).get(wm.UNACKED_SIZE) == 0, what="size")

            got = readout.channel(run_id)
            assert got[wm.SENT] == n + k, got
            assert got[wm.ACKED] == n
            assert got[wm.REPLAYED] == k
            assert got[wm.RECONNECTS] == 1
            assert got[wm.PROTOCOL_ERRORS] == 0
            assert got[wm.UNACKED] == 0
            assert got[wm.OLDEST_AGE] == 0
            assert got[wm.STATE]["streaming"] == 1
            assert got[wm.LOG_SIZE] == log_files_size(ch.log.path) > 0
            hist = readout.send_duration()
            # A burst: the first call, and one per 5 ms after it (SEND_SAMPLE_NS).
            assert 1 <= hist.count <= n
            assert 0 < hist.min <= hist.max < 5.0  # seconds: each send well under 5 s
            # The send operation's attributes, never the run id: a histogram's
            # series outlive its channel, so one per run would grow for ever.
            assert dict(hist.attributes) == {
                "messaging.system": "walchannel",
                "messaging.operation.name": "send",
                "messaging.operation.type": "send",
            }
            assert engine.accepted(run_id) == list(range(1, n + 1))
        # Closed: its series are gone (no stale gauges for a finished run).
        assert readout.channel(run_id) == {}
    finally:
        await proxy.stop()
        await engine.stop()


# -- the callbacks never touch SQLite ----------------------------------------------------


@pytest.mark.asyncio
async def test_collection_on_another_thread_runs_no_sql_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="walchannel.channel.metrics")
    wal_dir = tmp_path / "wal"
    with RunLog.open(wal_dir, "otel-nosql", correlation_id="corr") as log:
        for i in range(3):
            log.append("finding", {"fields": {"n": i}})
    readout = Readout()
    config = offline_config(
        wal_dir, "otel-nosql", correlation_id="corr", meter_provider=readout.provider
    )
    async with GrpcEngineChannel(config) as ch:
        for i in range(3, 5):
            ch.send_finding({"n": i})
        statements: list[tuple[int, str]] = []
        conn = log_of(ch)._conn
        conn.set_trace_callback(lambda sql: statements.append((threading.get_ident(), sql)))
        collector: list[int] = []

        def collect() -> dict[str, Any]:
            collector.append(threading.get_ident())
            return readout.channel("otel-nosql")

        # What needs the log is read on the loop's thread, asked for by the
        # first collection; it shows up in a later one.
        got = await asyncio.to_thread(collect)
        while wm.UNACKED_SIZE not in got or wm.OLDEST_AGE not in got:
            await asyncio.sleep(0.02)
            got = await asyncio.to_thread(collect)
        assert got[wm.UNACKED] == 5 and got[wm.SENT] == 0
        assert 0 <= got[wm.OLDEST_AGE] < 60
        expected = sum(r.size for r in ch.log.unacked())
        assert got[wm.UNACKED_SIZE] == expected == ch.log.unacked_bytes
        log_of(ch)._conn.set_trace_callback(None)
        on_collector = [sql for ident, sql in statements if ident in collector]
        assert on_collector == [], on_collector
        assert [ident for ident, _ in statements if ident not in collector], "primed on the loop"
    # sqlite3 refuses another thread's SQL itself: a callback that tried would fail, logged.
    assert not [r for r in caplog.records if "failed" in r.getMessage()], caplog.text


@pytest.mark.asyncio
async def test_oldest_age_of_a_backlog_left_on_disk(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    with RunLog.open(wal_dir, "otel-resume", correlation_id="corr") as log:
        for i in range(40):
            log.append("finding", {"fields": {"n": i}})
        path = log.path
    # An earlier process logged rows 1-20 five minutes ago and 21-40 a minute ago.
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE rows SET appended_at = appended_at - 300 WHERE seq <= 20")
        conn.execute("UPDATE rows SET appended_at = appended_at - 60 WHERE seq > 20")
    conn.close()
    readout = Readout()
    config = offline_config(
        wal_dir, "otel-resume", correlation_id="corr", meter_provider=readout.provider
    )
    async with GrpcEngineChannel(config) as ch:
        ch.send_finding({"n": 40})
        await eventually(
            lambda: wm.OLDEST_AGE in readout.channel("otel-resume"), what="the age, once seeded"
        )
        got = readout.channel("otel-resume")
        assert 299 <= got[wm.OLDEST_AGE] < 330
        assert got[wm.UNACKED] == 41


# -- the oldest-unacked tracker, against a plain model ------------------------------------


# -- the send duration: a sample by start time ------------------------------------------


@pytest.mark.asyncio
async def test_send_duration_records_one_call_per_sample_interval(tmp_path: Path) -> None:
    readout = Readout()
    config = offline_config(tmp_path / "wal", "otel-sample", meter_provider=readout.provider)
    async with GrpcEngineChannel(config) as ch:
        hooks = ch._metrics
        assert hooks is not None
        # 100 calls, each begun 1 ms after the previous one and taking 40 µs.
        base = time.perf_counter_ns() - 10**9
        for i in range(100):
            started = base + i * 1_000_000
            hooks.clock_ns = lambda started=started: started + 40_000
            hooks.on_send(started)
        hooks.clock_ns = time.perf_counter_ns
        hist = readout.send_duration()
        assert hist.count == 100 // (wm.SEND_SAMPLE_NS // 1_000_000)
        assert hist.min == hist.max == pytest.approx(40e-6)  # 40 µs, in seconds
        # A real send, begun long after the last recorded one, is recorded.
        ch.send_finding({"n": 1})
        assert readout.send_duration().count == hist.count + 1


# -- metrics never fail a run -----------------------------------------------------------


class BrokenProvider(MeterProvider):
    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("this provider is broken")


class BrokenHistogram:
    def record(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("this histogram is broken")


@pytest.mark.asyncio
async def test_broken_metrics_never_fail_a_channel_or_a_send(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wal_dir = tmp_path / "wal"
    broken = offline_config(wal_dir, "otel-broken", meter_provider=BrokenProvider())
    async with GrpcEngineChannel(broken) as ch:
        assert ch._metrics is None
        assert ch.send_finding({"n": 0}) == 1
    assert "cannot set up metrics" in caplog.text
    readout = Readout()
    config = offline_config(wal_dir, "otel-broken-2", meter_provider=readout.provider)
    async with GrpcEngineChannel(config) as ch:
        assert ch._metrics is not None
        ch._metrics._histogram = BrokenHistogram()  # type: ignore[assignment]
        # The row is committed before the hook runs: the send must return its seq.
        assert ch.send_finding({"n": 0}) == 1
        assert ch.send_findings([{"n": 1}, {"n": 2}]) == [2, 3]
        assert [r.seq for r in ch.log.unacked()] == [1, 2, 3]
        assert readout.channel("otel-broken-2")[wm.UNACKED] == 3


# -- switching it on and off ----------------------------------------------------------------

_CHILD = """
import asyncio, sys

mode, wal_dir = sys.argv[1], sys.argv[2]
if mode == "blocked":
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ImportError(f"blocked: {name}")
            return None
    sys.meta_path.insert(0, Blocker())

from walchannel import GrpcChannelConfig, GrpcEngineChannel

async def main():
    config = GrpcChannelConfig(
        grpc_addr="127.0.0.1:9", run_id="child", correlation_id="c", run_token="t",
        wal_dir=wal_dir, metrics=(mode != "off"),
    )
    async with GrpcEngineChannel(config) as ch:
        for i in range(10):
            ch.send_finding({"n": i})
        ch.send_findings([{"n": 10}, {"n": 11}])
        ch.send_event("progress", "info", {"done": 12})
        ch.stats()
        print("hooks:", ch._metrics is not None)

asyncio.run(main())
print("loaded:", sorted({m.split(".")[0] for m in sys.modules if m.startswith("opentelemetry")}))
"""


@pytest.mark.parametrize(
    ("mode", "hooks", "loaded"),
    [
        ("blocked", False, "[]"),  # the extra not installed
        ("off", False, "[]"),  # installed, metrics=False
        ("default", True, "['opentelemetry']"),  # installed: the global provider
    ],
)
def test_without_opentelemetry_nothing_is_imported(
    tmp_path: Path, mode: str, hooks: bool, loaded: str
) -> None:
    proc = subprocess.run(
        [PYTHON, "-c", _CHILD, mode, str(tmp_path / "wal")],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"hooks: {hooks}" in proc.stdout, proc.stdout
    assert f"loaded: {loaded}" in proc.stdout, proc.stdout


_GLOBAL_CHILD = """
import asyncio, sys
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from walchannel import GrpcChannelConfig, GrpcEngineChannel

async def main():
    config = GrpcChannelConfig(
        grpc_addr="127.0.0.1:9", run_id="global", correlation_id="c", run_token="t",
        wal_dir=sys.argv[1],
    )
    async with GrpcEngineChannel(config) as ch:
        ch.send_finding({"n": 0})
        # The application installs its SDK after the library made its instruments.
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        for i in range(1, 3):
            ch.send_finding({"n": i})
        values = {}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        if m.name == "walchannel.unacked.messages":
                            values[p.attributes["walchannel.run_id"]] = p.value
        print("values:", dict(sorted(values.items())))

asyncio.run(main())
"""


def test_the_global_provider_is_used_by_default_even_when_set_later(tmp_path: Path) -> None:
    proc = subprocess.run(
        [PYTHON, "-c", _GLOBAL_CHILD, str(tmp_path / "wal")],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "values: {'global': 3}" in proc.stdout, proc.stdout


def test_config_checks_the_metrics_fields(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="metrics must be a bool"):
        offline_config(tmp_path, "r", metrics=1)
    with pytest.raises(ValueError, match="meter_provider must be an opentelemetry"):
        offline_config(tmp_path, "r", meter_provider=object())
    with pytest.raises(ValueError, match="meter_provider is set but metrics=False"):
        offline_config(tmp_path, "r", meter_provider=Readout().provider, metrics=False)
    config = offline_config(tmp_path, "r", meter_provider=Readout().provider)
    assert "meter_provider" not in repr(config)


@pytest.mark.asyncio
async def test_two_channels_report_apart_and_a_provider_is_set_up_once(tmp_path: Path) -> None:
    readout = Readout()
    wal_dir = tmp_path / "wal"
    a = GrpcEngineChannel(offline_config(wal_dir, "otel-a", meter_provider=readout.provider))
    b = GrpcEngineChannel(offline_config(wal_dir, "otel-b", meter_provider=readout.provider))
    try:
        a.send_finding({"n": 1})
        for i in range(3):
            b.send_finding({"n": i})
        assert readout.channel("otel-a")[wm.UNACKED] == 1
        assert readout.channel("otel-b")[wm.UNACKED] == 3
        # Each channel records its first call at least (SEND_SAMPLE_NS), into
        # one series: the histogram has no run id.
        assert 2 <= readout.send_duration().count <= 4
        await a.close()
        assert readout.channel("otel-a") == {}
        assert readout.channel("otel-b")[wm.UNACKED] == 3
    finally:
        await a.close()
        await b.close()


# -- OpenTelemetry's conventions and the operations table ---------------------------------

#: UCUM time units other than the second: the conventions measure durations in ``s``.
NOT_SECONDS = {"ns", "us", "µs", "ms", "min", "h", "d"}
KINDS = {"Sum": "counter", "Gauge": "gauge", "Histogram": "histogram"}


async def created(tmp_path: Path) -> dict[str, tuple[str, str, set[str], list[Any]]]:
    """Every instrument of a channel that sent: name -> (kind, unit, attribute keys, points)."""
    readout = Readout()
    config = offline_config(tmp_path / "wal", "otel-table", meter_provider=readout.provider)
    async with GrpcEngineChannel(config) as ch:
        ch.send_finding({"n": 1})  # the histogram records its first call
        wanted = {*PER_CHANNEL, wm.STATE, wm.SEND_DURATION}
        await eventually(lambda: wanted <= set(readout.points()), what="every instrument")
        data = readout.reader.get_metrics_data()
    out: dict[str, tuple[str, str, set[str], list[Any]]] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            if scope.scope.name != wm.SCOPE:
                continue
            for metric in scope.metrics:
                kind = KINDS[type(metric.data).__name__]
                if kind == "counter" and not metric.data.is_monotonic:
                    kind = "up-down counter"
                points = list(metric.data.data_points)
                keys = {key for p in points for key in p.attributes}
                out[metric.name] = (kind, metric.unit or "", keys, points)
    return out


@pytest.mark.asyncio
async def test_instruments_follow_opentelemetry_naming_and_units(tmp_path: Path) -> None:
    instruments = await created(tmp_path)
    names = set(instruments)
    attributes = {key for _, _, keys, _ in instruments.values() for key in keys}
    for name, (kind, unit, keys, points) in instruments.items():
        # Durations in seconds (semantic conventions, "Units").
        assert unit not in NOT_SECONDS, f"{name}: unit {unit!r}, not seconds"
        # A synchronous histogram's series live as long as the process: no
        # per-run attribute, or they grow with every run.
        if kind == "histogram":
            assert wm.RUN_ID_ATTR not in keys, f"{name} carries {wm.RUN_ID_ATTR}"
            assert len(points) == 1, points
    # Metric and attribute names share one hierarchy: no attribute is named
    # as an instrument, and no name is another's namespace.
    assert not names & attributes, names & attributes
    everything = names | attributes
    for a in everything:
        inside = [b for b in everything if b.startswith(a + ".")]
        assert not inside, f"{a} is also a namespace of {inside}"


#: The names dashboards and alerts are built on, as released: a module moving
#: (issue 59 renamed walchannel.log.size by a mechanical rewrite) never renames them.
RELEASED_NAMES = {
    "messaging.client.sent.messages",
    "walchannel.acked.messages",
    "walchannel.replayed.messages",
    "walchannel.reconnects",
    "walchannel.protocol.errors",
    "walchannel.unacked.messages",
    "walchannel.unacked.size",
    "walchannel.unacked.oldest.age",
    "walchannel.log.size",
    "walchannel.channel.state",
    "walchannel.send.duration",
}
RELEASED_ATTRIBUTES = {
    "messaging.system",
    "messaging.operation.name",
    "messaging.operation.type",
    "walchannel.run_id",
    "walchannel.state",
    "walchannel.group_commit",
}


@pytest.mark.asyncio
async def test_the_instrument_and_attribute_names_are_the_released_ones(tmp_path: Path) -> None:
    instruments = await created(tmp_path)
    assert set(instruments) == RELEASED_NAMES
    attributes = {key for _, _, keys, _ in instruments.values() for key in keys}
    assert attributes == RELEASED_ATTRIBUTES, attributes
    assert set(operations_table()) == RELEASED_NAMES


def operations_table() -> dict[str, tuple[str, str, set[str]]]:
    """docs/operations.md's metrics table: instrument -> (kind, unit, attribute names)."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Monitoring: OpenTelemetry metrics", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[:4] == ["instrument", "kind", "unit", "attributes"], header
    table: dict[str, tuple[str, str, set[str]]] = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        name, kind, unit, attrs = cells[0].strip("`"), cells[1], cells[2].strip("`"), cells[3]
        table[name] = (kind, unit, set(re.findall(r"`([^`]+)`", attrs)))
    return table


@pytest.mark.asyncio
async def test_the_operations_table_is_what_the_channel_creates(tmp_path: Path) -> None:
    instruments = await created(tmp_path)
    got = {name: (kind, unit, keys) for name, (kind, unit, keys, _) in instruments.items()}
    assert operations_table() == got
