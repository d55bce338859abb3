"""The cost of the OpenTelemetry metrics (``--only metrics``): the same work with and without.

Arms, interleaved as every row (see :func:`~tools.bench.common.interleave`):

- *off*: ``GrpcChannelConfig(metrics=False)``: no hooks, nothing imported.
- *api*: metrics on, no SDK installed: the global provider's no-op proxy
  (what a harness with the extra installed and no SDK pays).
- *sdk*: an SDK ``MeterProvider`` whose ``PeriodicExportingMetricReader``
  collects every second (every observable callback runs) into an exporter
  that drops the data: the library's whole cost, none of an exporter's.

Rows: the pure send path (``send_finding`` committing to the log, no
network: CPU µs per call, the per-send overhead) and end to end against
the engine process acking every 50 (the fastest end-to-end row).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import shutil
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)

from tools.bench.cases import _ACK_WAIT_S, Context, channel_config, e2e_sample
from tools.bench.common import (
    RUN_TOKEN,
    Result,
    Target,
    Timer,
    closed_port,
    interleave,
    interleave_async,
    median,
)
from tools.bench.engine import EngineProcess
from walchannel.channel.grpc_channel import GrpcEngineChannel
from walchannel.config import GrpcChannelConfig

__all__ = ["case_metrics", "meter_provider_for"]

#: How often the SDK arm's reader collects (ms): far more often than a real
#: exporter (15-60 s), so the callbacks' cost shows.
COLLECT_EVERY_MS = 1_000
_ARMS = ("off", "api", "sdk")


class _DropExporter(MetricExporter):
    """Takes every export and keeps nothing."""

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def meter_provider_for(arm: str) -> MeterProvider | None:
    if arm != "sdk":
        return None
    reader = PeriodicExportingMetricReader(_DropExporter(), export_interval_millis=COLLECT_EVERY_MS)
    return MeterProvider(metric_readers=[reader])


def _with_metrics(
    config: GrpcChannelConfig, arm: str, provider: MeterProvider | None
) -> GrpcChannelConfig:
    return dataclasses.replace(config, metrics=arm != "off", meter_provider=provider)


def send_path(ctx: Context, arm: str, n: int) -> dict[str, float]:
    """``send_finding`` ``n`` times on a channel that never dials: µs per call."""
    folder = ctx.fresh_dir(f"metrics-send-{arm}-")
    provider = meter_provider_for(arm)
    config = GrpcChannelConfig(
        grpc_addr=f"127.0.0.1:{closed_port()}",
        run_id=f"bench-metrics-{arm}",
        correlation_id="corr",
        run_token=RUN_TOKEN,
        wal_dir=folder,
        metrics=arm != "off",
        meter_provider=provider,
    )
    pool, size = ctx.pool, len(ctx.pool)
    timer = Timer()

    async def run() -> None:
        ch = GrpcEngineChannel(config)
        try:
            timer.start()
            for i in range(n):
                ch.send_finding(pool[i % size])
            timer.stop()
        finally:
            await ch.close()

    try:
        asyncio.run(run())
    finally:
        if provider is not None:
            provider.shutdown()
        shutil.rmtree(folder)
    return {"us": timer.wall / n * 1e6, "cpu_us": timer.cpu / n * 1e6}


async def e2e(ctx: Context, engine: EngineProcess, arm: str, n: int) -> dict[str, float]:
    """``send_finding`` of ``n`` findings until all are acked (as the e2e rows)."""
    folder = ctx.fresh_dir(f"metrics-e2e-{arm}-")
    provider = meter_provider_for(arm)
    run_id = engine.new_run(f"metrics-{arm}")
    ch = GrpcEngineChannel(_with_metrics(channel_config(engine, run_id, folder), arm, provider))
    pool, size = ctx.pool, len(ctx.pool)
    timer = Timer()
    try:
        await ch.handshake("bench", "walchannel", "1")
        last = 0
        engine_cpu = engine.cpu_seconds()
        timer.start()
        for i in range(n):
            last = ch.send_finding(pool[i % size])
            await asyncio.sleep(0)
        if not await ch.wait_acked(last, timeout_ms=_ACK_WAIT_S * 1000):
            raise RuntimeError(f"{arm} arm: seq {last} not acked in {_ACK_WAIT_S} s")
        timer.stop()
        engine_cpu = engine.cpu_seconds() - engine_cpu
    finally:
        await ch.close()
        if provider is not None:
            provider.shutdown()
        shutil.rmtree(folder)
    return e2e_sample(n, timer, engine_cpu)


def _send_rows(ctx: Context, n: int) -> list[Result]:
    ctx.say(f"metrics: send path, no network, {n} sends x {ctx.sizes.reps}, arms {_ARMS}")
    samples = interleave(
        {arm: functools.partial(send_path, ctx, arm, n) for arm in _ARMS}, ctx.sizes.reps
    )
    # CPU time, not wall: the loop is single-threaded and never waits (no
    # fsync under "process"), so the two agree on a quiet machine, and CPU
    # time stays put when other processes share the CPUs. It includes the
    # SDK reader's thread.
    off = median(samples["off"]["cpu_us"])
    off_wall = median(samples["off"]["us"])
    out = []
    for arm, label in (("sdk", "SDK, collected every 1 s"), ("api", "API only, no SDK")):
        value = median(samples[arm]["cpu_us"])
        out.append(
            Result(
                name=f"metrics: send_finding, no network [{arm}]",
                n=n,
                unit="µs",
                wal=value,
                base=off,
                base_label="metrics=False",
                target=None,
                detail=f"{label}: {value - off:+.1f} µs CPU per send; wall "
                f"{median(samples[arm]['us']):.1f} vs {off_wall:.1f} µs",
                samples={arm: samples[arm], "off": samples["off"]},
            )
        )
    return out


async def _e2e_rows(ctx: Context, n: int) -> list[Result]:
    engine = ctx.engines.get(50)
    ctx.say(f"metrics: e2e send_finding, ack every 50, {n} msgs x {ctx.sizes.reps}")
    arms: Sequence[str] = ("off", "sdk")
    samples = await interleave_async(
        {arm: functools.partial(e2e, ctx, engine, arm, n) for arm in arms}, ctx.sizes.reps
    )
    w, b = samples["sdk"], samples["off"]
    return [
        Result(
            name="metrics: e2e send_finding, ack/50 [sdk]",
            n=n,
            unit="msgs/s",
            wal=median(w["rate"]),
            base=median(b["rate"]),
            base_label="metrics=False",
            target=Target("ratio", ">=", 0.98, ">=0.98x"),
            detail=f"cpu/msg {median(w['cpu_us']):.0f} vs {median(b['cpu_us']):.0f} µs; "
            f"client busy {median(w['busy']):.0%} vs {median(b['busy']):.0%}, "
            f"engine {median(w['engine_busy']):.0%} vs {median(b['engine_busy']):.0%}",
            samples={"sdk": w, "off": b},
        )
    ]


def case_metrics(ctx: Context) -> list[Result]:
    """The metrics' cost: the pure send path (three arms), then end to end."""
    rows = _send_rows(ctx, ctx.sizes.latency_msgs)
    rows += asyncio.run(_e2e_rows(ctx, ctx.sizes.e2e_msgs))
    return rows
