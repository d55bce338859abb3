"""The harness runner: the harness gives a work list and a scan function, the runner owns the run.

SPEC "The runner" is the contract (what each item's transaction holds, the
marker, resume, the first answer, concurrency, failures, stop, deadline,
SIGTERM, exit codes); docs/deployment.md runs it under Kubernetes and systemd.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import signal
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeVar

import msgpack

from walchannel._logging import get_logger
from walchannel.channel.grpc_channel import GrpcEngineChannel
from walchannel.channel.interface import ApprovalDecision
from walchannel.clock import Clock, SystemClock
from walchannel.config import GrpcChannelConfig, redact_secret
from walchannel.core.driver import ChannelState
from walchannel.errors import (
    BacklogFullError,
    ConfigurationError,
    EngineBehindError,
    EngineUnavailableError,
    GroupCommitError,
    PayloadError,
    RowRefusedError,
    RunCompletedError,
    RunExpiredError,
    RunRefusedError,
    WalchannelError,
    WalCorruptError,
    WalLocationError,
    WalLockedError,
    WalRemovedError,
    WalWriteError,
    WriterFencedError,
)
from walchannel.grace import GracePeriod
from walchannel.runner.context import AsyncItemContext, ItemContext
from walchannel.runner.exits import ExitCode, said
from walchannel.runner.manifest import Manifest, ManifestError
from walchannel.wire import messages
from walchannel.wire.protobuf import ResumePoint, row_digest

__all__ = [
    "Harness",
    "HarnessError",
    "Seams",
    "WorkListChangedError",
    "run_harness",
    "run_harness_async",
]

logger = get_logger(__name__)

#: The handshake's ``connector_version`` for a run the runner drives.
CONNECTOR_VERSION: Final = "walchannel-runner/1"
#: The marker's format; a marker without it was not written by the runner.
MARKER_VERSION: Final = 1
#: How long a log that never had an answer waits for one before scanning, s.
FIRST_ANSWER_S: Final = 600.0
#: No new item once less than this is left of ``hardDeadline``, s: the
#: items in flight, ``Done`` and its ack need it.
DEADLINE_MARGIN_S: Final = 60.0
#: No item begins while the finished items waiting for an earlier one hold
#: this much (their msgpack size), bytes.
MAX_WAITING_BYTES: Final = 64 * 1024 * 1024
#: A wait for room in the backlog (``BacklogFullError``) looks again after, ms.
BACKLOG_WAIT_MS: Final = 1_000.0
#: A write the disk refused is tried again after this, doubled up to the max, s.
WRITE_RETRY_S: Final = 0.5
WRITE_RETRY_MAX_S: Final = 30.0
#: How often a wait looks for a SIGTERM, s (GracePeriod's own poll).
STOP_POLL_S: Final = 0.2
_T = TypeVar("_T")

ScanErrorPolicy = Literal["fail", "skip", "exit"]
_STATUS_CODES: Final = {
    "completed": ExitCode.DONE,
    "failed": ExitCode.SCAN_FAILED,
    "stopped": ExitCode.STOPPED,
    "deadline": ExitCode.DEADLINE,
}


class HarnessError(ConfigurationError, ValueError):
    """The harness object cannot be run: a part missing, or a work list that is not one."""


class WorkListChangedError(ConfigurationError, ValueError):
    """The work list is not the one this run's marker was made from.

    Resuming by index into another list would skip or repeat items: the
    run is refused instead (exit :attr:`ExitCode.USAGE`). Give the harness
    the same list in the same order, or start a new run.
    """


class Harness(Protocol):
    """What the runner runs: a name, a version, a work list and a scan function.

    ``work()`` returns the items (strings) in a stable order, the same on
    every start. ``scan(item, ctx)`` returns the item's findings (JSON-like
    mappings): a plain function runs in a worker thread (it gets an
    :class:`ItemContext`), a coroutine function on the event loop (an
    :class:`AsyncItemContext`). An optional ``coverage()`` returns what
    ``Done`` reports as scanned (a short summary: the roots, not every item).
    """

    name: str
    version: str

    def work(self) -> Iterable[str]: ...

    def scan(self, item: str, ctx: Any) -> Any: ...


@dataclass
class _Outcome:
    """One item's scan: its findings and events, or the error that ended its last try."""

    state: ItemContext
    findings: list[Mapping[str, Any]]
    error: BaseException | None = None

    size: int | None = None  # bytes it holds while it waits (msgpack): _held() measures it


# -- the work list ---------------------------------------------------------------------


def fingerprint(items: Sequence[str]) -> str:
    """The work list's fingerprint (sha256 hex of the items, each length-prefixed)."""
    digest = hashlib.sha256()
    for item in items:
        raw = item.encode("utf-8", "surrogatepass")
        digest.update(len(raw).to_bytes(8, "big"))
        digest.update(raw)
    return digest.hexdigest()


def _work_list(harness: Harness) -> list[str]:
    for part in ("name", "version", "work", "scan"):
        if not hasattr(harness, part):
            raise HarnessError(
                f"harness {harness!r} has no {part!r}: a harness gives name, version, work()"
                " and scan(item, ctx)"
            )
    for part in ("name", "version"):
        value = getattr(harness, part)
        if not isinstance(value, str) or not value:
            raise HarnessError(f"harness.{part} must be a non-empty str, got {value!r}")
    if inspect.isasyncgenfunction(harness.scan):
        raise HarnessError(
            "harness.scan is an async generator: return the item's findings as a list"
            " (a coroutine function or a plain one)"
        )
    try:
        items = list(harness.work())
    except Exception as exc:
        raise HarnessError(f"harness.work() raised {type(exc).__name__}: {exc}") from exc
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise HarnessError(
                f"harness.work()[{index}] is a {type(item).__name__}, not a str: items are"
                " strings (a path, a URL, an id)"
            )
        if item in seen:
            # Scanned twice, its findings would be applied twice.
            raise HarnessError(
                f"harness.work() holds {item!r} twice (at {seen[item]} and {index}): each item once"
            )
        seen[item] = index
    return items


# -- the run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Seams:
    """What the simulator replaces (SPEC "The runner"): the channel, the clock and the
    stop source (a ``GracePeriod`` it stops itself)."""

    open_channel: Callable[[GrpcChannelConfig], GrpcEngineChannel] = GrpcEngineChannel
    clock: Clock | None = None
    grace: GracePeriod | None = None


@dataclass(frozen=True)
class _Options:
    concurrency: int
    retries: int
    retry_backoff_s: float
    on_scan_error: ScanErrorPolicy
    item_timeout_s: float | None
    grace_s: float
    drain_timeout_s: float
    first_answer_s: float
    deadline_margin_s: float
    progress_every_s: float
    max_waiting_bytes: int

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int):
            raise ValueError(f"concurrency must be an int >= 1, got {self.concurrency!r}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, got {self.concurrency!r}")
        waiting = self.max_waiting_bytes
        if isinstance(waiting, bool) or not isinstance(waiting, int) or waiting < 1:
            raise ValueError(f"max_waiting_bytes must be an int >= 1, got {waiting!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {self.retries!r}")
        if self.on_scan_error not in ("fail", "skip", "exit"):
            raise ValueError(
                f"on_scan_error must be 'fail', 'skip' or 'exit', got {self.on_scan_error!r}"
            )
        for name in (
            "retry_backoff_s",
            "grace_s",
            "drain_timeout_s",
            "first_answer_s",
            "deadline_margin_s",
            "progress_every_s",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        if self.grace_s <= 0:
            raise ValueError(f"grace_s must be > 0 seconds, got {self.grace_s!r}")
        timeout = self.item_timeout_s
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise ValueError(f"item_timeout_s must be None or seconds > 0, got {timeout!r}")


class _Run:
    """One run of a harness: the state the pieces below share."""

    def __init__(
        self,
        harness: Harness,
        manifest: Manifest,
        items: list[str],
        config: GrpcChannelConfig,
        options: _Options,
        seams: Seams,
    ) -> None:
        self.harness = harness
        self.manifest = manifest
        self.items = items
        self.fingerprint = fingerprint(items)
        self.config = config
        self.options = options
        self.open_channel = seams.open_channel
        self.clock = seams.clock or SystemClock()
        self.run_id = manifest.run_id
        self.loop = asyncio.get_running_loop()
        self.signals = seams.grace is None  # the simulator requests its stops itself
        self.grace = seams.grace or GracePeriod(
            options.grace_s, close_reserve_s=min(3.0, options.grace_s / 2), clock=self.clock
        )
        self.engine_stop: str | None = None
        self.channel: GrpcEngineChannel | None = None
        self.coroutine_scan = inspect.iscoroutinefunction(harness.scan)
        self.done_items = 0
        self.findings = 0
        self.skipped_findings = 0
        self.skipped_items = 0
        self.started = self._now_s()
        self.resumed_at = 0  # items done before this process: not its rate
        # A takeover's item the engine applied in part: its index, and the
        # digests of the rows it applied (left out when the item is logged again).
        self.partial: tuple[int, Counter[int]] | None = None

    def _now_s(self) -> float:
        return self.clock.monotonic_ms() / 1000

    # -- state a scan reads ------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self.grace.stopping or self.engine_stop is not None or self.deadline_near()

    def deadline_near(self) -> bool:
        left = self.manifest.hard_deadline.timestamp() - self.clock.wall_s()
        return left < self.options.deadline_margin_s

    async def approval(
        self, action: str, details: Mapping[str, Any], rid: str, timeout_s: float | None
    ) -> ApprovalDecision:
        assert self.channel is not None
        timeout_ms = None if timeout_s is None else timeout_s * 1000
        return await self.channel.request_approval(
            action, details, request_id=rid, timeout_ms=timeout_ms
        )

    # -- the whole run -----------------------------------------------------------------

    async def run(self) -> int:
        installed = self.signals and self._install_signal()
        try:
            try:
                channel = self.open_channel(self.config)
            except RunCompletedError as exc:
                return self._completed(None, exc)
            except WalchannelError as exc:
                return self._ended(exc)
            self.channel = channel
            logger.info("run %s: its log is %s", self.run_id, channel.log.path)
            try:
                return await self._drive(channel)
            except RunCompletedError as exc:
                return self._completed(channel, exc)
            except WalchannelError as exc:
                return self._ended(exc)
            finally:
                await channel.close()
        finally:
            if installed:
                self.loop.remove_signal_handler(signal.SIGTERM)

    def _install_signal(self) -> bool:
        try:
            # Between the loop's callbacks, never inside a call of the channel.
            self.loop.add_signal_handler(signal.SIGTERM, self.grace.request_stop, signal.SIGTERM)
        except (NotImplementedError, RuntimeError, ValueError) as exc:
            logger.warning("run %s: SIGTERM not handled (%s): it kills the run", self.run_id, exc)
            return False
        return True

    def _ended(self, exc: WalchannelError) -> int:
        code = _code_for(exc)
        said = str(exc)
        # Most of walchannel's errors name the run already: once is enough.
        said = said.removeprefix(f"run {self.run_id}: ")
        logger.error("run %s: %s (exit %d, %s)", self.run_id, said, code, code.name)
        return code

    def _completed(self, channel: GrpcEngineChannel | None, exc: RunCompletedError) -> int:
        # The status the runner committed before Done stays in the tombstone's meta.
        marker = exc.progress if channel is None else channel.log.progress
        status = marker.get("status") if marker is not None else None
        if isinstance(status, str) and status in _STATUS_CODES:
            code = _STATUS_CODES[status]
            logger.info(
                "run %s: completed earlier with status %r (exit %d)", self.run_id, status, code
            )
            return code
        logger.error(
            "run %s: %s; this log holds nothing of how it ended (exit %d, %s)",
            self.run_id,
            str(exc).removeprefix(f"run {self.run_id}: "),  # named once
            ExitCode.COMPLETED_ELSEWHERE,
            ExitCode.COMPLETED_ELSEWHERE.name,
        )
        return ExitCode.COMPLETED_ELSEWHERE

    async def _drive(self, channel: GrpcEngineChannel) -> int:
        channel.on_stop(self._on_engine_stop)
        early = await self._first_answer(channel)
        if early is not None:
            return early
        marker = channel.progress()
        if marker is None and (point := channel.takeover_point()) is not None:
            marker = self._from_engine(point)
        start, status = self._resume(marker)
        if status is None:
            reporter = self.loop.create_task(self._report_every(channel))
            try:
                ended = await self._scan(channel, start)
            finally:
                reporter.cancel()
                self._report(channel, final=True)
            if isinstance(ended, int):
                return ended
            status = ended
            # The run's status travels in the marker: a restart after Done,
            # or on the tombstone, exits with the same code.
            try:
                await self._commit_marker(channel, len(self.items), status)
            except _StoppedInCommit:
                return await self.grace.drain(channel)
        return await self._done(channel, status)

    def _on_engine_stop(self, reason: str) -> None:
        if self.engine_stop is None:
            logger.warning("run %s: the engine asks to stop: %s", self.run_id, reason)
            self.engine_stop = reason or "stopped by the engine"

    async def _first_answer(self, channel: GrpcEngineChannel) -> int | None:
        harness = self.harness
        answered_before = channel.log.meta().answered_at is not None
        waited_from = self._now_s()
        said_waiting = False  # the wait said once at WARNING, then at INFO
        while True:
            # A new log's whole wait is first_answer_s, a handshake's own wait
            # (connect_timeout_ms) within it: not rounded up to whole ones.
            left = None
            if not answered_before:
                left = max(0.0, self.options.first_answer_s - (self._now_s() - waited_from))
            try:
                async with asyncio.timeout(left):
                    await channel.handshake(CONNECTOR_VERSION, harness.name, harness.version)
                return None
            except TimeoutError:
                last = channel.stats().last_error
                why = f"the last attempt: {last}" if last else "the handshake is unanswered"
                return self._no_engine(self._now_s() - waited_from, why)
            except RunRefusedError as exc:
                logger.error("run %s: nothing scanned: %s", self.run_id, exc)
                return ExitCode.REFUSED
            except WalWriteError as exc:  # storing the handshake: the disk is full
                logger.warning("run %s: the log cannot be written (%s)", self.run_id, exc)
                try:
                    await self._sleep_unless_stopped(WRITE_RETRY_S)
                except _StoppedInCommit:
                    return await self.grace.drain(channel)
                continue
            except EngineUnavailableError as exc:
                if answered_before:
                    # Rows wait in the log; the channel keeps dialing.
                    logger.warning("run %s: scanning on: %s", self.run_id, exc)
                    return None
                if self.grace.stopping:
                    return await self.grace.drain(channel)
                waited = self._now_s() - waited_from
                if waited >= self.options.first_answer_s or self.deadline_near():
                    return self._no_engine(waited, str(exc))
                # A new log scans only after an answer: findings logged into a
                # log that is then fenced and taken over would apply twice.
                logger.log(
                    logging.INFO if said_waiting else logging.WARNING,
                    "run %s: not scanning until an engine answers (this log never had an"
                    " answer); waiting up to %.0f s more (--first-answer): check that the"
                    " engine runs and that the manifest's grpcAddr / httpAddr are right: %s",
                    self.run_id,
                    self.options.first_answer_s - waited,
                    exc,
                )
                said_waiting = True

    def _no_engine(self, waited_s: float, why: str) -> int:
        logger.error(
            "run %s: nothing scanned: no engine answered this new log's handshake within"
            " %.1f s (--first-answer %.0f): %s",
            self.run_id,
            waited_s,
            self.options.first_answer_s,
            why,
        )
        return ExitCode.NO_ENGINE

    def _from_engine(self, point: ResumePoint) -> Mapping[str, Any] | None:
        """The marker a lost log taken over resumes from: the engine's (SPEC "The runner").

        A transaction the engine applied in part is its item's: that item is
        scanned again from the counts before it, and the rows the engine
        applied (by :func:`~walchannel.wire.protobuf.row_digest`) are left out.
        """
        marker = point.marker
        if marker is not None and marker.get("runner") != MARKER_VERSION:
            # Another kind of harness wrote the run before the takeover: its point says
            # nothing of the runner's items. Scan from the start, as with an engine that
            # keeps no point (what the runner delivered before comes again).
            logger.warning(
                "run %s: taken over: the engine's resume point was not written by the runner"
                " (%r): another kind of harness wrote this run; scanning from the first item",
                self.run_id,
                sorted(marker),
            )
            return None
        after = point.rows
        last = marker.get("last") if marker is not None else None
        if marker is None or (not point.complete and not isinstance(last, dict)):
            # Rows before the engine's first marker (or a marker not the runner's):
            # nothing says which they were.
            if point.applied > point.seq:
                logger.warning(
                    "run %s: taken over: the engine's resume point covers none of the %d rows"
                    " it applied after it: they may come again",
                    self.run_id,
                    point.applied - point.seq,
                )
            return marker
        if point.complete or not isinstance(last, dict):
            logger.warning(
                "run %s: taken over: resuming from the engine's resume point (item %s)",
                self.run_id,
                marker.get("next"),
            )
            return marker
        before = dict(marker)
        try:
            before["next"] = int(last["index"])
            for key in ("findings", "skipped_findings", "skipped_items"):
                before[key] = int(marker.get(key, 0)) - int(last[key])
        except (KeyError, TypeError, ValueError):
            return marker  # not the runner's: _resume refuses it
        applied = Counter(point.digests[:after])
        # An item taken over in part before: the rows applied then count too.
        try:
            applied.update(int(h, 16) for h in last.get("applied", ()))
        except (TypeError, ValueError):
            return marker  # not the runner's: _resume refuses it
        self.partial = (before["next"], applied)
        logger.warning(
            "run %s: taken over: resuming from the engine's resume point (item %d, %d of its"
            " %d rows applied: the rest are logged again)",
            self.run_id,
            before["next"],
            after,
            len(point.digests),
        )
        return before

    def _resume(self, marker: Mapping[str, Any] | None) -> tuple[int, str | None]:
        if marker is None:
            return 0, None
        if marker.get("runner") != MARKER_VERSION or not isinstance(marker.get("next"), int):
            raise WorkListChangedError(
                f"run {self.run_id}: the log's progress marker was not written by the runner"
                f" ({sorted(marker)!r}): a log of a harness of your own cannot be resumed by"
                " it; start a new run"
            )
        if marker.get("work") != self.fingerprint or marker.get("items") != len(self.items):
            raise WorkListChangedError(
                f"run {self.run_id}: the work list is not the one this run started with"
                f" ({len(self.items)} items now, {marker.get('items')} then; fingerprint"
                f" {self.fingerprint[:16]} now, {str(marker.get('work'))[:16]} then): resuming"
                f" at item {marker['next']} would skip or repeat items. Give the harness the same"
                " items in the same order, or start a new run"
            )
        self.done_items = self.resumed_at = marker["next"]
        self.findings = int(marker.get("findings", 0))
        self.skipped_findings = int(marker.get("skipped_findings", 0))
        self.skipped_items = int(marker.get("skipped_items", 0))
        status = marker.get("status")
        if marker["next"]:
            logger.info(
                "run %s: resuming at item %d of %d (%d findings logged before)",
                self.run_id,
                marker["next"],
                len(self.items),
                self.findings,
            )
        return marker["next"], status if isinstance(status, str) else None

    # -- scanning ----------------------------------------------------------------------

    async def _scan(self, channel: GrpcEngineChannel, start: int) -> str | int:
        """Scan from ``start``; return the run's status, or an exit code (no Done)."""
        window: dict[int, asyncio.Task[_Outcome]] = {}
        begun = start
        try:
            for index in range(start, len(self.items)):
                begun = self._begin(window, begun)
                task = window.get(index)
                if task is None:
                    break  # stopping, nothing of this item begun
                # Slots refill as any item finishes, not only the one committed next.
                while not task.done() and not self.grace.stopping:
                    running = [t for t in window.values() if not t.done()]
                    await asyncio.wait(
                        running, timeout=STOP_POLL_S, return_when=asyncio.FIRST_COMPLETED
                    )
                    begun = self._begin(window, begun)
                del window[index]
                outcome = await self._await_in_hand(task)
                if outcome is None:
                    break  # SIGTERM: the item was given up
                try:
                    if outcome.error is not None:
                        ended = await self._scan_failed(channel, outcome)
                        if ended is not None:
                            return ended
                    else:
                        await self._commit_item(channel, outcome)
                except _StoppedInCommit:
                    break  # SIGTERM while waiting for room or the disk: the drain below
        finally:
            for task in window.values():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self.grace.stopping:
            return await self.grace.drain(channel)
        if self.done_items < len(self.items):
            if self.engine_stop is not None:
                return "stopped"
            return "deadline"
        if self._all_skipped():
            return "failed"  # "skip" let every item go: nothing was scanned
        return "completed"

    def _all_skipped(self) -> bool:
        return 0 < len(self.items) == self.skipped_items

    def _begin(self, window: dict[int, asyncio.Task[_Outcome]], begun: int) -> int:
        """Begin items from ``begun`` while the window has room; return the next not begun.

        Room: fewer than ``concurrency`` scans running, at most ``concurrency``
        items begun beyond the first not committed (so at most that many
        finished ones wait for it), and the finished ones holding less than
        ``max_waiting_bytes``: as a Kafka consumer bounds what it fetched
        ahead of its committed offset. The first item not committed is never
        held back: when it is not begun, nothing is.
        """
        limit = self.options.concurrency
        while not self.stopping and begun < len(self.items):
            finished = [t for t in window.values() if t.done()]
            first = min(window, default=begun)  # committed next: it holds nothing back
            held = sum(
                _held(t.result())
                for i, t in window.items()
                if i != first and t.done() and not t.cancelled() and t.exception() is None
            )
            if (
                len(window) - len(finished) >= limit
                or len(window) > limit
                or held >= self.options.max_waiting_bytes
            ):
                break
            window[begun] = self.loop.create_task(self._scan_item(begun))
            begun += 1
        return begun

    async def _await_in_hand(self, task: asyncio.Task[_Outcome]) -> _Outcome | None:
        # Looked at every STOP_POLL_S: a SIGTERM while a long scan runs starts
        # the period's budget at once, not when the scan ends.
        while not self.grace.stopping:
            done, _ = await asyncio.wait([task], timeout=STOP_POLL_S)
            if task in done:
                return task.result()
        # SIGTERM: the item in hand may finish within half of what is left of
        # the period; the rest goes to the drain, and the next start scans it.
        budget = self.grace.remaining_s() / 2
        try:
            async with asyncio.timeout(budget):
                return await asyncio.shield(task)
        except TimeoutError:
            return None

    async def _scan_item(self, index: int) -> _Outcome:
        item = self.items[index]
        options = self.options
        error: BaseException | None = None
        state = self._context(index)
        for attempt in range(options.retries + 1):
            state = self._context(index)
            try:
                findings = await self._call_scan(state)
                return _Outcome(state, findings)
            except (asyncio.CancelledError, HarnessError):
                # Cancelled, or a result of the wrong shape: a bug of the harness
                # that no retry mends (exit 2, no Done: a fixed harness resumes).
                state.abandoned = True
                raise
            except Exception as exc:  # the harness's: retried, then the policy decides
                error = exc
                state.abandoned = True
                if attempt < options.retries:
                    delay = options.retry_backoff_s * (2**attempt)
                    logger.warning(
                        "run %s: item %d (%s): scan failed (%s: %s); try %d of %d in %.1f s",
                        self.run_id,
                        index,
                        item,
                        type(exc).__name__,
                        self._said(exc),
                        attempt + 2,
                        options.retries + 1,
                        delay,
                    )
                    await asyncio.sleep(delay)
        return _Outcome(state, [], error)

    def _said(self, exc: BaseException) -> str:
        """A scan's exception as the runner logs and stores it: the run token masked."""
        token = self.manifest.run_token
        text = str(exc)
        # Inside a URL ("token=...") too: redact_secret spares a token within a
        # longer run of token characters, so a short one does not eat words.
        return text.replace(token, "***") if len(token) >= 8 else redact_secret(text, token)

    def _context(self, index: int) -> ItemContext:
        return ItemContext(
            index,
            self.items[index],
            self.fingerprint,
            stopping=lambda: self.stopping,
            approve=self.approval,
            loop=self.loop,
        )

    async def _call_scan(self, state: ItemContext) -> list[Mapping[str, Any]]:
        timeout = self.options.item_timeout_s
        scan = self.harness.scan
        work: Awaitable[Any]
        if self.coroutine_scan:
            work = scan(state.item, AsyncItemContext(state))
        else:
            work = self._in_thread(scan, state)
        bound = asyncio.timeout(timeout)
        try:
            async with bound:
                found = await work
        except TimeoutError:
            if not bound.expired():
                raise  # the scan's own (a socket's, an approval's): its message kept
            state.abandoned = True
            raise TimeoutError(
                f"item {state.index} ({state.item}): no result within item_timeout_s={timeout}"
            ) from None
        return found if isinstance(found, list) else _findings(state.item, found)

    def _in_thread(
        self, scan: Callable[[str, ItemContext], Any], state: ItemContext
    ) -> asyncio.Future[Any]:
        """Run a plain scan in a thread of its own (a daemon: a hung scan never holds the exit).

        Not a pool: a scan past ``item_timeout_s`` cannot be stopped, and in a
        pool it would hold a worker the next items then wait for.
        """
        loop = self.loop
        future: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if future.done():
                return  # given up (its time ran out, or the run ended)
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def work() -> None:
            try:
                # A generator's body runs as it is iterated: here, not on the loop.
                result, error = _findings(state.item, scan(state.item, state)), None
            except BaseException as exc:  # handed to the loop, re-raised there
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, result, error)

        name = f"walchannel-scan-{state.index}"
        threading.Thread(target=work, name=name, daemon=True).start()
        return future

    async def _scan_failed(self, channel: GrpcEngineChannel, outcome: _Outcome) -> str | int | None:
        state, exc = outcome.state, outcome.error
        assert exc is not None
        policy = self.options.on_scan_error
        what = f"{type(exc).__name__}: {self._said(exc)}"
        tries = self.options.retries + 1
        logger.error(
            "run %s: item %d (%s) failed (%d %s): %s; on_scan_error=%r",
            self.run_id,
            state.index,
            state.item,
            tries,
            "try" if tries == 1 else "tries",
            what,
            policy,
            exc_info=exc if self.manifest.run_token not in _chain_text(exc) else None,
        )
        if policy == "skip":
            self.skipped_items += 1
            skip = (
                "runner.item_skipped",
                "error",
                {"item": state.item, "index": state.index, "error": what[:500]},
            )
            await self._commit(channel, state.index, [], [skip])
            return None
        if policy == "exit":
            return ExitCode.SCAN_EXIT
        return "failed"

    async def _commit_item(self, channel: GrpcEngineChannel, outcome: _Outcome) -> None:
        state = outcome.state
        kept = list(enumerate(outcome.findings))
        events = list(state.events)
        while True:
            try:
                await self._commit(channel, state.index, [f for _, f in kept], events)
                return
            except PayloadError as exc:
                if exc.index is None:
                    if not events:
                        raise  # the marker itself: the runner's, never the harness's data
                    # An event too large for a message: say so in one that fits.
                    events = [_skip_event(state, None, exc.path, exc.reason)]
                    continue
                number, _ = kept.pop(exc.index)
                self.skipped_findings += 1
                # Named by its place in what scan() returned, not in the batch
                # left after earlier skips.
                path = f"findings[{number}]" + exc.path.partition("]")[2]
                logger.warning(
                    "run %s: item %d (%s): finding %d skipped: %s: %s",
                    self.run_id,
                    state.index,
                    state.item,
                    number,
                    path,
                    exc.reason,
                )
                events.append(_skip_event(state, number, path, exc.reason))

    async def _commit(
        self,
        channel: GrpcEngineChannel,
        index: int,
        findings: list[Mapping[str, Any]],
        events: list[tuple[str, str, Mapping[str, Any]]],
    ) -> None:
        marker = self._marker(index + 1, self.findings + len(findings))
        # What this transaction adds to the counts: a takeover that finds it
        # applied in part counts from before it.
        kinds = [e[0] for e in events]
        marker["last"] = {
            "index": index,
            "findings": len(findings),
            "skipped_findings": kinds.count("runner.finding_skipped"),
            "skipped_items": kinds.count("runner.item_skipped"),
        }
        events_out, kept = events, list(range(len(findings)))
        if self.partial is not None and self.partial[0] == index:
            applied = self.partial[1]
            events_out, kept = _not_applied(events, findings, applied)
            # The rows left out: a later takeover of this item counts them applied.
            marker["last"]["applied"] = [f"{d:016x}" for d in sorted(applied.elements())]
        findings_out = [findings[i] for i in kept]
        try:
            await self._written(
                channel,
                lambda: channel.send_findings(findings_out, events=events_out, progress=marker),
            )
        except PayloadError as exc:
            if exc.index is None:
                raise
            # Its place among those sent is not its place in the item's: name the latter
            # (simulator seed 438735: a rescan left rows out and the wrong ones were skipped).
            where = kept[exc.index]
            raise PayloadError(
                f"findings[{where}]{exc.path.partition(']')[2]}", exc.reason, index=where
            ) from None
        self.partial = None
        self.done_items = index + 1
        self.findings += len(findings)

    async def _commit_marker(self, channel: GrpcEngineChannel, next_item: int, status: str) -> None:
        marker = self._marker(next_item if status == "completed" else self.done_items, None)
        marker["status"] = status
        # (A row too, for an engine that keeps the resume point: room is waited for.)
        await self._written(channel, lambda: channel.send_findings([], progress=marker))

    async def _written(self, channel: GrpcEngineChannel, write: Callable[[], _T]) -> _T:
        """``write()``, again while the disk refuses it (full) or the backlog has no room.

        The run waits, it does not fail: room comes as the engine's acks are
        stored; the rows wait in the log.

        Raises:
            _StoppedInCommit: SIGTERM while waiting.
        """
        delay = WRITE_RETRY_S
        full = False
        while True:
            try:
                return write()
            except BacklogFullError as exc:
                if not full:
                    logger.info("run %s: waiting for room in the backlog: %s", self.run_id, exc)
                full = True
                if await channel.wait_acked(timeout_ms=BACKLOG_WAIT_MS):
                    # All acked, yet no room: the ack is not stored yet (the disk
                    # refused it): wait, not spin.
                    await self._sleep_unless_stopped(BACKLOG_WAIT_MS / 1000)
                elif self.grace.stopping:
                    raise _StoppedInCommit from None
                continue
            except WalWriteError as exc:
                # Nothing of the write was logged; the rows before it are safe.
                logger.warning(
                    "run %s: the log cannot be written (%s); trying again in %.1f s",
                    self.run_id,
                    exc,
                    delay,
                )
            await self._sleep_unless_stopped(delay)
            delay = min(delay * 2, WRITE_RETRY_MAX_S)

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        end = self._now_s() + seconds
        while self._now_s() < end:
            if self.grace.stopping:
                raise _StoppedInCommit
            await asyncio.sleep(min(STOP_POLL_S, end - self._now_s()))

    def _marker(self, next_item: int, findings: int | None) -> dict[str, Any]:
        return {
            "runner": MARKER_VERSION,
            "work": self.fingerprint,
            "items": len(self.items),
            "next": next_item,
            "findings": self.findings if findings is None else findings,
            "skipped_findings": self.skipped_findings,
            "skipped_items": self.skipped_items,
        }

    # -- the end -----------------------------------------------------------------------

    async def _done(self, channel: GrpcEngineChannel, status: str) -> int:
        coverage = _coverage(self.harness)
        reason = (
            f"{self.done_items} of {len(self.items)} items scanned, {self.findings} findings;"
            f" {self.skipped_findings} findings and {self.skipped_items} items skipped"
        )
        if status == "stopped" and self.engine_stop:
            reason += f"; the engine's stop: {self.engine_stop}"
        if status == "failed" and self._all_skipped():
            reason += f"; every item failed ({self.skipped_items} skipped)"
        delay = WRITE_RETRY_S
        while True:
            try:
                acked = await channel.send_done(status, self.findings, coverage, reason)
                break
            except PayloadError as exc:
                raise HarnessError(
                    f"Done cannot travel: {exc}; keep harness.coverage() a short summary"
                    " (the roots scanned, not every item)"
                ) from None
            except WalWriteError as exc:
                logger.warning("run %s: the log cannot be written (%s)", self.run_id, exc)
                try:
                    await self._sleep_unless_stopped(delay)
                except _StoppedInCommit:
                    return await self.grace.drain(channel)
                delay = min(delay * 2, WRITE_RETRY_MAX_S)
        if not acked and channel.state is ChannelState.EXPIRED:
            raise RunExpiredError(f"run {self.run_id}: hardDeadline passed before Done was acked")
        if not acked:
            acked = await self.grace.wait_acked(
                channel, timeout_ms=self.options.drain_timeout_s * 1000
            )
        if not acked and self.grace.stopping:
            return await self.grace.drain(channel)
        if not acked:
            logger.error(
                "run %s: Done (status %r) is logged, but no ack of it was stored within"
                " %.0f s (no engine acked it, or the log could not store the ack);"
                " the next start or `walchannel flush` delivers it (exit %d, %s)",
                self.run_id,
                status,
                self.options.drain_timeout_s,
                ExitCode.DONE_NOT_ACKED,
                ExitCode.DONE_NOT_ACKED.name,
            )
            return ExitCode.DONE_NOT_ACKED
        code = _STATUS_CODES[status]
        logger.info("run %s: Done (status %r) acked (exit %d)", self.run_id, status, code)
        return code

    # -- progress ----------------------------------------------------------------------

    async def _report_every(self, channel: GrpcEngineChannel) -> None:
        every = self.options.progress_every_s
        if every <= 0:
            return
        while True:
            await asyncio.sleep(every)
            self._report(channel, final=False)

    def _report(self, channel: GrpcEngineChannel, *, final: bool) -> None:
        total = len(self.items)
        elapsed = max(1e-9, self._now_s() - self.started)
        rate = (self.done_items - self.resumed_at) / elapsed
        left = total - self.done_items
        eta = f"{left / rate:.0f} s" if rate > 0 and left else "-"
        line = (
            f"run {self.run_id}: items {self.done_items}/{total}, findings {self.findings},"
            f" unacked {channel.unacked_count}, {rate:.1f} items/s, ETA {eta}"
        )
        if sys.stderr.isatty() and not final:
            sys.stderr.write("\r" + line + "\x1b[K")
            sys.stderr.flush()
        else:
            logger.info("%s", line)


class _StoppedInCommit(Exception):
    """SIGTERM while an item waited for room in the backlog."""


def _chain_text(exc: BaseException) -> str:
    """Every message of ``exc``'s chain, and its frames' source lines, as a traceback shows."""
    import traceback

    return "".join(traceback.format_exception(exc))


def tls_credentials(ca_file: str) -> Any:
    """``grpc.ssl_channel_credentials`` trusting the PEM CA in ``ca_file`` (``--tls-ca``).

    Raises:
        OSError: the file cannot be read.
    """
    import grpc

    with open(ca_file, "rb") as f:
        roots = f.read()
    return grpc.ssl_channel_credentials(root_certificates=roots)


def _findings(item: str, found: Any) -> list[Mapping[str, Any]]:
    """A scan's result as its list of findings.

    Raises:
        HarnessError: not an iterable of findings (a mapping, a str, an
            async generator...): a bug of the harness.
    """
    if found is None:
        return []
    if isinstance(found, Mapping | str | bytes) or not isinstance(found, Iterable):
        raise HarnessError(
            f"scan({item!r}) returned {type(found).__name__!r}: return a list of findings"
            " (mappings), [] for none"
        )
    return list(found)


def _held(outcome: _Outcome) -> int:
    """What a finished item holds while it waits for an earlier one, bytes (msgpack).

    Measured once, and only for an item that waits: the one committed next
    never does, so most items are packed once, at commit.
    """
    if outcome.size is None:
        try:
            outcome.size = len(
                msgpack.packb([outcome.findings, outcome.state.events], default=repr)
            )
        except (TypeError, ValueError, OverflowError):
            outcome.size = 0  # not packable: its commit refuses it (PayloadError) and skips it
    return outcome.size


def _not_applied(
    events: list[tuple[str, str, Mapping[str, Any]]],
    findings: list[Mapping[str, Any]],
    applied: Counter[int],
) -> tuple[list[tuple[str, str, Mapping[str, Any]]], list[int]]:
    """The events of an item the engine did not apply, and the positions of its findings
    the engine did not apply (in ``findings``), by row digest.

    ``applied`` counts the digests of the rows it applied (each matches one
    row). A row that differs from every applied one is kept: a scan that
    does not repeat itself costs a row twice, never a row lost.
    """
    left = Counter(applied)

    def new(kind: str, body: Mapping[str, Any] | None) -> bool:
        if body is None:
            return True  # refused by the channel's checks: named there
        digest = row_digest(kind, body)
        if left[digest] > 0:
            left[digest] -= 1
            return False
        return True

    kept_events = [e for e in events if new("event", _checked_event(e))]
    kept_findings = [i for i, f in enumerate(findings) if new("finding", _checked_finding(f))]
    return kept_events, kept_findings


def _checked_event(event: tuple[str, str, Mapping[str, Any]]) -> dict[str, Any] | None:
    try:
        return messages.event_bodies([event], None)[0]  # (its stamp is no content)
    except PayloadError:
        return None


def _checked_finding(finding: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        return messages.finding_bodies([finding])[0]
    except PayloadError:
        return None


def _skip_event(
    state: ItemContext, number: int | None, path: str, reason: str
) -> tuple[str, str, Mapping[str, Any]]:
    # The path and the reason, never the value: it could not travel anyway.
    payload: dict[str, Any] = {"item": state.item, "index": state.index, "path": path}
    payload["reason"] = reason[:500]
    if number is not None:
        payload["finding"] = number
    return (
        "runner.finding_skipped" if number is not None else "runner.events_skipped",
        "warning",
        payload,
    )


def _coverage(harness: Harness) -> list[str]:
    """``harness.coverage()``, checked.

    Raises:
        HarnessError: it raised, or returned no list of str (a str alone would
            be split into its characters).
    """
    coverage = getattr(harness, "coverage", None)
    if coverage is None:
        return []
    try:
        parts = coverage()
    except Exception as exc:
        raise HarnessError(f"harness.coverage() raised {type(exc).__name__}: {exc}") from exc
    if isinstance(parts, str) or not isinstance(parts, Iterable):
        raise HarnessError(
            f"harness.coverage() returned {type(parts).__name__!r}: return a list of str"
            " (the roots scanned, a summary)"
        )
    parts = list(parts)
    if not all(isinstance(part, str) for part in parts):
        raise HarnessError("harness.coverage() returned a list holding a non-str")
    return parts


def _code_for(exc: BaseException) -> ExitCode:
    if isinstance(exc, WriterFencedError):
        return ExitCode.FENCED
    if isinstance(exc, WalLockedError):
        return ExitCode.LOCKED
    if isinstance(exc, WalWriteError):
        return ExitCode.LOG_WRITE_FAILED
    if isinstance(exc, WalCorruptError | WalRemovedError | GroupCommitError):
        return ExitCode.LOG_BROKEN
    if isinstance(exc, EngineBehindError | RowRefusedError):
        return ExitCode.RUN_FAILED
    if isinstance(exc, RunExpiredError):
        return ExitCode.EXPIRED
    if isinstance(exc, WorkListChangedError | HarnessError | ManifestError | WalLocationError):
        return ExitCode.USAGE
    return ExitCode.RUN_FAILED


# -- the entry points --------------------------------------------------------------------


async def run_harness_async(
    harness: Harness,
    manifest: Manifest | str | None = None,
    *,
    concurrency: int = 1,
    retries: int = 2,
    retry_backoff_s: float = 1.0,
    on_scan_error: ScanErrorPolicy = "fail",
    item_timeout_s: float | None = None,
    grace_s: float = 25.0,
    drain_timeout_s: float = 600.0,
    first_answer_s: float = FIRST_ANSWER_S,
    deadline_margin_s: float = DEADLINE_MARGIN_S,
    progress_every_s: float = 10.0,
    max_waiting_bytes: int = MAX_WAITING_BYTES,
    _seams: Seams | None = None,
    **channel_options: Any,
) -> int:
    """Run ``harness`` for the run ``manifest`` names; return the exit code.

    SPEC "The runner" says what each option does and what each code means
    (:class:`~walchannel.runner.exits.ExitCode`).

    Args:
        harness: a :class:`Harness`.
        manifest: a :class:`Manifest`, its path, or None (``$WALCHANNEL_MANIFEST``).
        concurrency: items scanned at once (int >= 1); committed in work order,
            with at most as many finished ones waiting for an earlier one.
        retries: how often a failed scan is tried again (int >= 0).
        retry_backoff_s: the first wait before a retry, s (doubled each time).
        on_scan_error: past the retries: ``"fail"`` (Done ``failed``),
            ``"skip"`` (an event, then the next item) or ``"exit"`` (no Done).
        item_timeout_s: a scan's bound, s (None: none).
        grace_s: SIGTERM's grace period, s (the platform's, a little less).
        drain_timeout_s: after ``Done``, how long to wait for its ack, s.
        first_answer_s: how long a log that never had an answer waits for
            one before giving up, s.
        deadline_margin_s: no new item once less than this is left of
            ``hardDeadline``, s.
        progress_every_s: the progress line's period, s (0: only at the end).
        max_waiting_bytes: no item begins while the finished ones waiting for
            an earlier one hold this much, bytes (their msgpack size).
        channel_options: the other :class:`~walchannel.GrpcChannelConfig`
            fields (``wal_dir``, ``durability``, ``credentials``,
            ``tls_server_name``, ``allowed_hosts``, ...).

    Returns:
        An :class:`~walchannel.runner.exits.ExitCode` (an int).

    Raises:
        Nothing of walchannel's: each outcome is a code, said in one log line.
        An exception of the harness's scan never escapes either (it is a
        failed item). ``KeyboardInterrupt`` and ``SystemExit`` pass.
    """
    try:
        loaded = manifest if isinstance(manifest, Manifest) else Manifest.load(manifest)
        options = _Options(
            concurrency,
            retries,
            retry_backoff_s,
            on_scan_error,
            item_timeout_s,
            grace_s,
            drain_timeout_s,
            first_answer_s,
            deadline_margin_s,
            progress_every_s,
            max_waiting_bytes,
        )
        items = _work_list(harness)
        config = loaded.channel_config(**channel_options)
    except (ManifestError, HarnessError) as exc:
        logger.error("%s", exc)
        return said(None, ExitCode.USAGE)
    except (ValueError, TypeError) as exc:
        logger.error("bad option: %s", exc)
        return said(None, ExitCode.USAGE)
    code = await _Run(harness, loaded, items, config, options, _seams or Seams()).run()
    return said(loaded.run_id, ExitCode(code))


def run_harness(harness: Harness, manifest: Manifest | str | None = None, **options: Any) -> int:
    """:func:`run_harness_async` in a new event loop (``asyncio.run``); return the exit code."""
    return asyncio.run(run_harness_async(harness, manifest, **options))
