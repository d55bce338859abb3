"""BlockingEngineChannel.close() with callbacks queued: bounded, not a wait for every one.

A slow ``on_budget_update`` with 40 updates queued (40 x 0.5 s = 20 s) once
made ``GracePeriod.drain_blocking`` return after 19.6 s of a 10 s period:
``close()`` joined the dispatcher thread, which ran every queued callback
first. Against a real LocalEngine sending the down messages.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_blocking import blocking

from helpers.engine_thread import EngineThread
from walchannel import BlockingEngineChannel, ChannelClosedError, GracePeriod
from walchannel.grace import EXIT_STOPPED


@pytest.fixture
def engine() -> Iterator[EngineThread]:
    e = EngineThread()
    yield e
    e.close()


UPDATES = 40
SLOW_S = 0.5  # each queued callback: 39 x 0.5 s = 19.5 s if close() ran them all


class SlowCallbacks:
    """Budget callbacks: the first is stuck until released (30 s at most), the rest take 0.5 s."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.first_started = threading.Event()
        self.release = threading.Event()
        self.after_release: list[str] = []

    def stuck(self, ch: BlockingEngineChannel) -> None:
        self.first_started.set()
        self.release.wait(30)
        try:
            ch.send_event("late", "info", {})
            self.after_release.append("sent")
        except ChannelClosedError:
            self.after_release.append("ChannelClosedError")

    def budget(self, ch: BlockingEngineChannel) -> Any:
        def callback(message: str, details: dict[str, Any]) -> None:
            self.calls.append(message)
            if len(self.calls) == 1:
                self.stuck(ch)
            else:
                threading.Event().wait(SLOW_S)

        return callback


def queue_updates(engine: EngineThread, ch: BlockingEngineChannel, run_id: str, n: int) -> None:
    """Send ``n`` BudgetUpdates, then see an ack that the engine sent after them.

    Down messages are handled in order, so once the ack is in every update
    has reached the channel and its callback is queued.
    """
    for i in range(n):
        assert engine.run(engine.engine.send_budget_update(run_id, str(i), {"used": i / n}))
    seq = ch.send_finding({"after": "updates"})
    assert ch.wait_acked(seq, timeout_ms=10_000)


def dropped_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "walchannel.channel.blocking" and "queued callback" in r.getMessage()
    ]


def dispatcher_of(run_id: str) -> threading.Thread:
    (thread,) = [t for t in threading.enumerate() if t.name == f"walchannel-callbacks-{run_id}"]
    return thread


def wait_until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {check}"
        threading.Event().wait(0.02)


def test_close_waits_its_timeout_at_most_for_the_callback_in_hand_and_drops_the_queued(
    engine: EngineThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="walchannel.channel.blocking")
    ch, run_id = blocking(engine, tmp_path, close_timeout_ms=1000)
    slow = SlowCallbacks()
    ch.on_budget_update(slow.budget(ch))
    ch.handshake("1", "blocking", "1")
    queue_updates(engine, ch, run_id, UPDATES)
    assert slow.first_started.wait(10)
    dispatcher = dispatcher_of(run_id)

    started = time.monotonic()
    ch.close()  # waits close_timeout_ms (1 s) for the stuck callback, not 30 s + 19.5 s
    took = time.monotonic() - started
    assert 0.9 <= took < 6, took
    assert dispatcher.is_alive() and dispatcher.daemon  # the stuck callback is left running
    assert dropped_lines(caplog) == [
        f"run {run_id}: close(): dropped {UPDATES - 1} queued callback(s) unrun; "
        "a callback still running after 1000 ms is left to finish on its daemon thread"
    ]
    with pytest.raises(ChannelClosedError):
        ch.send_finding({"too": "late"})
    with pytest.raises(ChannelClosedError):
        ch.on_budget_update(lambda m, d: None)

    slow.release.set()
    wait_until(lambda: not dispatcher.is_alive())
    assert slow.calls == ["0"]  # none of the queued ran, even after the one in hand ended
    assert slow.after_release == ["ChannelClosedError"]


def test_grace_drain_blocking_closes_within_the_remaining_period(
    engine: EngineThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="walchannel.channel.blocking")
    ch, run_id = blocking(engine, tmp_path)  # close_timeout_ms: the default 2 s
    slow = SlowCallbacks()
    ch.on_budget_update(slow.budget(ch))
    ch.handshake("1", "blocking", "1")
    queue_updates(engine, ch, run_id, UPDATES)
    assert slow.first_started.wait(10)
    period_s = 5.0
    with GracePeriod(seconds=period_s, close_reserve_s=1) as grace:
        signalled = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        wait_until(lambda: grace.stopping)
        code = grace.drain_blocking(ch)
        took = time.monotonic() - signalled
    assert code == EXIT_STOPPED  # every row was acked
    # The stuck callback had the rest of the period (not close_timeout_ms,
    # not the 30 s it asked for, not the 19.5 s queued behind it).
    assert period_s - 0.5 <= took < period_s + 2.5, took
    (line,) = dropped_lines(caplog)
    assert re.fullmatch(
        rf"run {run_id}: close\(\): dropped {UPDATES - 1} queued callback\(s\) unrun; "
        r"a callback still running after \d+ ms is left to finish on its daemon thread",
        line,
    ), line
    with pytest.raises(ChannelClosedError):
        ch.send_event("too", "info", {})
    slow.release.set()
    wait_until(lambda: slow.after_release == ["ChannelClosedError"])
    assert slow.calls == ["0"]


def test_a_slow_on_stop_callback_bounds_close_too(
    engine: EngineThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="walchannel.channel.blocking")
    ch, run_id = blocking(engine, tmp_path)
    slow = SlowCallbacks()
    ch.on_stop(lambda reason: slow.stuck(ch))
    ch.on_budget_update(lambda m, d: slow.calls.append(m))
    ch.handshake("1", "blocking", "1")
    assert engine.run(engine.engine.send_stop(run_id, "operator"))
    queue_updates(engine, ch, run_id, 10)  # queued behind the stuck on_stop
    assert slow.first_started.wait(10)

    started = time.monotonic()
    ch.close(timeout_ms=1500)  # an explicit bound instead of close_timeout_ms
    took = time.monotonic() - started
    assert 1.4 <= took < 6, took
    assert dropped_lines(caplog) == [
        f"run {run_id}: close(): dropped 10 queued callback(s) unrun; "
        "a callback still running after 1500 ms is left to finish on its daemon thread"
    ]
    with pytest.raises(ChannelClosedError):
        ch.send_finding({"too": "late"})
    slow.release.set()
    wait_until(lambda: slow.after_release == ["ChannelClosedError"])
    assert slow.calls == []


def test_close_with_quick_callbacks_joins_the_dispatcher_and_logs_nothing(
    engine: EngineThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="walchannel.channel.blocking")
    ch, run_id = blocking(engine, tmp_path)
    seen: list[str] = []
    ch.on_budget_update(lambda m, d: seen.append(m))
    ch.handshake("1", "blocking", "1")
    queue_updates(engine, ch, run_id, 5)
    wait_until(lambda: len(seen) == 5)
    dispatcher = dispatcher_of(run_id)
    ch.close()
    assert not dispatcher.is_alive()
    assert dropped_lines(caplog) == []


def test_a_bad_close_timeout_is_refused_by_name_and_closes_nothing(
    engine: EngineThread, tmp_path: Path
) -> None:
    ch, _ = blocking(engine, tmp_path)
    for bad in (-1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match=r"^close: timeout_ms must be a finite number >= 0"):
            ch.close(timeout_ms=bad)  # type: ignore[arg-type]
    assert ch.send_finding({"still": "open"}) == 1
    ch.close(timeout_ms=0)
    with pytest.raises(ChannelClosedError):
        ch.send_finding({"now": "closed"})
