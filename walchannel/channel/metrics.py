"""OpenTelemetry metrics of the open channels (the optional extra ``walchannel[otel]``).

Switched on as an instrumented library is: with ``opentelemetry-api``
importable and ``GrpcChannelConfig.metrics`` True (the default), every
channel reports to ``config.meter_provider``, or, when that is None, to the
global provider (``opentelemetry.metrics.get_meter``), which does nothing
until the application installs the OpenTelemetry SDK and binds once it
does. Without the API, or with ``metrics=False``, this module imports
nothing of OpenTelemetry and the channel carries no hooks.
docs/operations.md "Monitoring" lists the instruments and what to alert on.

What it costs (docs/performance.md): per ``send_*`` call two clock reads
and a comparison, and at most 200 histogram records a second per channel
(:data:`SEND_SAMPLE_NS`); the observable instruments run only when a reader
collects, maybe on its own thread. Their callbacks read plain attributes of
the channel (its counters, its cursor, its state) and ``os.stat`` the log
files; they never run SQL, and never on the caller's path. Two values need
the log once: the unacked bytes (kept in memory by the log once summed) and
when the rows left by an earlier process were committed; the first
collection asks the channel's event loop to read them (``call_soon_threadsafe``)
and the values appear from the next collection on.

The oldest unacked row's age is the driver's answer
(``Driver.oldest_unacked_at``): each commit is fed to it as
``RowsCommitted``, and it keeps marks of ``(first seq, commit time)`` at a
resolution of 0.1 s in the log's own numbering
(:class:`~walchannel.core.ages.CommitAges`), so it costs a comparison per
commit and bounded memory, and errs at most two resolutions on the old side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from walchannel._logging import get_logger
from walchannel._version import __version__
from walchannel.core import events as ev
from walchannel.core.ages import BASE_RESOLUTION_S
from walchannel.core.driver import ChannelState, Driver
from walchannel.errors import WalchannelError
from walchannel.log import files

if TYPE_CHECKING:
    from types import ModuleType

    from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation

    from walchannel.config import GrpcChannelConfig
    from walchannel.log.writer import RunLog

    Read = Callable[["ChannelMetrics", Driver], float | int | None]

__all__ = [
    "ACKED",
    "LOG_SIZE",
    "OLDEST_AGE",
    "PROTOCOL_ERRORS",
    "RECONNECTS",
    "REPLAYED",
    "RUN_ID_ATTR",
    "SCOPE",
    "SEND_DURATION",
    "SENT",
    "STATE",
    "STATE_ATTR",
    "UNACKED",
    "UNACKED_SIZE",
    "ChannelMetrics",
    "attach",
]

logger = get_logger(__name__)

#: The instrumentation scope (the meter's name).
SCOPE: Final = "walchannel"
#: Data messages written to streams, re-sends included (OpenTelemetry messaging
#: semantic conventions). Counter, ``{message}``.
SENT: Final = "messaging.client.sent.messages"
#: The run's cumulative ack: the highest seq the engine acked. Seqs run 1, 2, …
#: per run, so it counts the rows acked over the whole run. Counter, ``{message}``.
ACKED: Final = "walchannel.acked.messages"
#: Data messages written again after a reconnect or rewind. Counter, ``{message}``.
REPLAYED: Final = "walchannel.replayed.messages"
#: Dials after the channel's first, whether their stream came up or not. Counter, ``{reconnect}``.
RECONNECTS: Final = "walchannel.reconnects"
#: Engine messages that broke the protocol (ignored). Counter, ``{error}``.
PROTOCOL_ERRORS: Final = "walchannel.protocol.errors"
#: Logged rows not covered by a received ack. UpDownCounter, ``{message}``.
UNACKED: Final = "walchannel.unacked.messages"
#: Their msgpack size, as the log stores the cursor (up to ~100 ms behind the
#: received ack). UpDownCounter, ``By``.
UNACKED_SIZE: Final = "walchannel.unacked.size"
#: Age of the oldest unacked row (0 when none). Gauge, ``s``.
OLDEST_AGE: Final = "walchannel.unacked.oldest.age"
#: The log file and its ``-wal`` on disk (as ``inspect``'s DISK). UpDownCounter, ``By``.
LOG_SIZE: Final = "walchannel.log.size"
#: 1 for the channel's state, 0 for the others (attribute :data:`STATE_ATTR`).
#: UpDownCounter, ``{channel}``: summed over channels, how many are in each state.
STATE: Final = "walchannel.channel.state"
#: Time of one ``send_event``/``send_finding``/``send_findings`` call: checks,
#: encoding, the commit; at most one call per 5 ms per channel is recorded
#: (:data:`SEND_SAMPLE_NS`). Histogram, ``s`` (the semantic conventions'
#: unit of every duration); attributes: ``messaging.system`` and the send
#: operation's, never the run id: the SDK keeps a synchronous instrument's
#: series for the process's life, so one per run would grow without bound.
SEND_DURATION: Final = "walchannel.send.duration"

#: The run of a per-channel point. One series per open channel: see
#: docs/operations.md "Monitoring" on cardinality.
RUN_ID_ATTR: Final = "walchannel.run_id"
#: The state name (``streaming``, ``backoff``, …) on :data:`STATE` points. Not
#: the instrument's own name: metric and attribute names share one hierarchy
#: (OpenTelemetry's naming guidance), and a backend would show both as one key.
STATE_ATTR: Final = "walchannel.state"
#: ``on`` or ``off`` on every per-channel point: whether the channel runs
#: under ``group_commit`` (SPEC "Group commit"), where a send returns before
#: its row is committed.
GROUP_COMMIT_ATTR: Final = "walchannel.group_commit"
_SYSTEM: Final = {"messaging.system": "walchannel"}
_OPERATION: Final = {"messaging.operation.name": "send", "messaging.operation.type": "send"}
#: Bucket bounds of :data:`SEND_DURATION` (s), 5 µs to 1 s: a commit takes tens
#: of µs, an fsync ("power") milliseconds.
SEND_BUCKETS_S: Final = (
    5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
    2.5e-2, 0.1, 1.0,
)  # fmt: skip
#: :data:`SEND_DURATION` records at most one call per channel per this many ns
#: (every call below 200 a second): the SDK's ``Histogram.record`` costs 5-13 µs
#: (docs/performance.md), so recording every call of a fast sender would cost it
#: ~10% of its CPU. Calls are picked by their start time, never by how long they
#: took, so the recorded ones are an unbiased sample of the durations.
SEND_SAMPLE_NS: Final = 5_000_000

#: Rows read to date a backlog an earlier process left (one primary-key read each).
SEED_SAMPLES: Final = 32


class ChannelMetrics:
    """The hooks of one channel: called by it on commits, sends and close.

    Made by :func:`attach`. The instruments' callbacks read the channel's
    :class:`~walchannel.core.driver.Driver` (its public counters, cursor and
    state) and its log through weak references, so a channel dropped
    without ``close()`` leaves the metrics too.

    Attributes:
        clock_ns: the clock of :meth:`on_send`'s start times (``time.perf_counter_ns``).
    """

    def __init__(
        self, instruments: _Instruments, driver: Driver, log: RunLog, *, group_commit: bool
    ) -> None:
        self._instruments = instruments
        self._driver_ref = weakref.ref(driver)
        self._log_ref = weakref.ref(log)
        self._histogram = instruments.histogram
        base = {
            **_SYSTEM,
            RUN_ID_ATTR: driver.run_id,
            GROUP_COMMIT_ATTR: "on" if group_commit else "off",
        }
        self.attributes: dict[str, str] = base
        self.sent_attributes: dict[str, str] = {**base, **_OPERATION}
        # The histogram's: no run id (SEND_DURATION).
        self.send_attributes: dict[str, str] = {**_SYSTEM, **_OPERATION}
        self.state_attributes: dict[ChannelState, dict[str, str]] = {
            state: {**base, STATE_ATTR: state.name.lower()} for state in ChannelState
        }
        self.path = log.path
        self.acked_seen = 0
        # Rows were logged before this channel: dated by _seed() (their seqs
        # are below every commit fed since, whatever a verification moved).
        self._to_seed = driver.unacked > 0
        self._sampled_ns = -SEND_SAMPLE_NS  # the first call is always recorded
        self._fed_s = -BASE_RESOLUTION_S  # the first commit is always fed
        self.clock_ns = time.perf_counter_ns
        self._loop: asyncio.AbstractEventLoop | None = None
        self._prime_asked = False
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()

    @property
    def driver(self) -> Driver | None:
        """The channel's driver, or None once the channel is gone."""
        return self._driver_ref()

    # -- on the channel's thread -----------------------------------------------

    def on_commit(self, first_seq: int) -> None:
        """Rows from ``first_seq`` were committed just now (every ``send_*``, ``send_done``).

        Fed to the driver at most once per :data:`~walchannel.core.ages.BASE_RESOLUTION_S`:
        a commit sooner than that after the last one fed is dated by that
        one's mark or the one before it, less than two resolutions older
        (the bound :class:`~walchannel.core.ages.CommitAges` keeps), and a
        send then costs a clock read and a comparison, no event.
        """
        now = time.perf_counter()
        if now - self._fed_s < BASE_RESOLUTION_S:
            return
        driver = self._driver_ref()
        if driver is None:
            return
        self._fed_s = now
        try:
            driver.handle(ev.RowsCommitted(first_seq, now))  # asks for nothing
        except Exception:  # the row is committed: metrics must never fail its send
            _hook_failed(self)
        if self._loop is None:
            with contextlib.suppress(RuntimeError):
                self._loop = asyncio.get_running_loop()

    def on_send(self, started_ns: int) -> None:
        """A ``send_*`` call that began at ``started_ns`` (``perf_counter_ns``) returns.

        Recorded when it began :data:`SEND_SAMPLE_NS` or more after the last
        recorded one.
        """
        if started_ns - self._sampled_ns < SEND_SAMPLE_NS:
            return
        self._sampled_ns = started_ns
        try:
            self._histogram.record((self.clock_ns() - started_ns) / 1e9, self.send_attributes)
        except Exception:  # the row is committed: metrics must never fail its send
            _hook_failed(self)

    def close(self) -> None:
        """The channel closes: its series end."""
        self._instruments.remove(self)

    def _prime(self) -> None:
        # On the loop's thread, asked for by a collection: the SQL that the
        # callbacks must not run themselves.
        self._prime_asked = False
        driver, log = self._driver_ref(), self._log_ref()
        if driver is None or log is None or log.closed:
            return
        try:
            log.unacked_bytes  # noqa: B018 - sums once; the log keeps it current
            if self._to_seed:
                self._seed(driver, log)
        except WalchannelError as exc:
            logger.debug("run %s: metrics cannot read the log: %s", log.run_id, exc)

    def _seed(self, driver: Driver, log: RunLog) -> None:
        self._to_seed = False
        after, upto = driver.stored, driver.high_water
        if after >= upto:
            return
        step = max(1, (upto - after) // SEED_SAMPLES)
        wall, perf = time.time(), time.perf_counter()
        points: list[tuple[int, float]] = []
        while len(points) <= SEED_SAMPLES:
            row = next(iter(log.unacked(after_seq=after, limit=1)), None)
            if row is None or row.seq > upto:
                break
            if row.appended_at is not None:  # None: a damaged cell, no age to seed
                points.append((row.seq, perf - max(0.0, wall - row.appended_at)))
            after = row.seq + step - 1
        # Rows this channel committed are dated already: the seed stops below them.
        driver.handle(ev.BacklogDated(tuple(points)))  # asks for nothing

    # -- on a reader's thread ------------------------------------------------------

    def ask_prime(self) -> None:
        """Have the channel's loop read what the callbacks may not (once per need)."""
        loop = self._loop
        if self._prime_asked or loop is None:
            return
        self._prime_asked = True
        try:
            loop.call_soon_threadsafe(self._prime)
        except RuntimeError:  # the loop is closed
            self._prime_asked = False

    def unacked_size(self, driver: Driver) -> int | None:
        log = self._log_ref()
        size = None if log is None else log.unacked_bytes_known
        if size is None:
            self.ask_prime()
        return size

    def oldest_age(self, driver: Driver) -> float | None:
        if driver.unacked <= 0:
            return 0.0
        if self._to_seed:
            self.ask_prime()
        at = driver.oldest_unacked_at()
        return None if at is None else max(0.0, time.perf_counter() - at)

    def acked(self, driver: Driver) -> int:
        # Monotonic, as a counter must be: an engine that forgot acks it gave
        # (not yet stored) moves the cursor back until it acks them again.
        self.acked_seen = max(self.acked_seen, driver.acked)
        return self.acked_seen

    def log_size(self, driver: Driver) -> int:
        return files.disk_bytes(self.path)


class _Instruments:
    """The instruments of one meter, observing every attached channel."""

    def __init__(self, api: ModuleType, meter: Meter) -> None:
        self._api = api
        self._lock = threading.Lock()
        # Replaced, never changed in place: callbacks iterate it unlocked.
        self._members: tuple[ChannelMetrics, ...] = ()
        counters: tuple[tuple[str, str, str, Read], ...] = (
            (SENT, "{message}", "Data messages written to streams, re-sends included.",
             lambda m, d: d.sent),
            (ACKED, "{message}", "The run's cumulative ack: rows the engine acked over the run.",
             ChannelMetrics.acked),
            (REPLAYED, "{message}", "Data messages written again after a reconnect or rewind.",
             lambda m, d: d.replayed),
            (RECONNECTS, "{reconnect}", "Dials after the channel's first.",
             lambda m, d: d.reconnects),
            (PROTOCOL_ERRORS, "{error}", "Engine messages that broke the protocol (ignored).",
             lambda m, d: d.protocol_errors),
        )  # fmt: skip
        for name, unit, text, read in counters:
            meter.create_observable_counter(
                name, [self._observe(read, sent=name == SENT)], unit=unit, description=text
            )
        updown: tuple[tuple[str, str, str, Read], ...] = (
            (UNACKED, "{message}", "Logged rows not covered by a received ack.",
             lambda m, d: d.unacked),
            (UNACKED_SIZE, "By", "Msgpack bytes of the unacked rows (as the log stores the ack).",
             ChannelMetrics.unacked_size),
            (LOG_SIZE, "By", "The run's log file and its -wal on disk.",
             ChannelMetrics.log_size),
        )  # fmt: skip
        for name, unit, text, read in updown:
            meter.create_observable_up_down_counter(
                name, [self._observe(read)], unit=unit, description=text
            )
        meter.create_observable_gauge(
            OLDEST_AGE,
            [self._observe(ChannelMetrics.oldest_age)],
            unit="s",
            description="Age of the oldest unacked row (0 when none).",
        )
        meter.create_observable_up_down_counter(
            STATE,
            [self._states],
            unit="{channel}",
            description="1 for the channel's state, 0 for the others.",
        )
        text = "Time of one send_event/send_finding/send_findings call (checks, encoding, commit)."
        try:
            self.histogram: Histogram = meter.create_histogram(
                SEND_DURATION,
                unit="s",
                description=text,
                explicit_bucket_boundaries_advisory=SEND_BUCKETS_S,
            )
        except TypeError:  # opentelemetry-api < 1.23: the SDK's default buckets
            self.histogram = meter.create_histogram(SEND_DURATION, unit="s", description=text)

    def add(self, member: ChannelMetrics) -> None:
        with self._lock:
            self._members = (*self._members, member)

    def remove(self, member: ChannelMetrics) -> None:
        with self._lock:
            self._members = tuple(m for m in self._members if m is not member)

    def _live(self) -> Iterable[tuple[ChannelMetrics, Driver]]:
        for member in self._members:
            driver = member.driver
            if driver is None:
                self.remove(member)
            else:
                yield member, driver

    def _observe(
        self, read: Read, *, sent: bool = False
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        observation = self._api.Observation

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            out = []
            for member, driver in self._live():
                try:
                    value = read(member, driver)
                except Exception:  # a callback must not stop the collection
                    _hook_failed(member)
                    continue
                if value is not None:
                    attrs = member.sent_attributes if sent else member.attributes
                    out.append(observation(value, attrs))
            return out

        return callback

    def _states(self, options: CallbackOptions) -> Iterable[Observation]:
        observation = self._api.Observation
        out = []
        for member, driver in self._live():
            current = driver.state
            for state, attrs in member.state_attributes.items():
                out.append(observation(1 if state is current else 0, attrs))
        return out


def _hook_failed(member: ChannelMetrics) -> None:
    # A bug, not a condition: loud once, then quiet (sends and collections repeat).
    global _FAILED_ONCE
    level = logging.DEBUG if _FAILED_ONCE else logging.WARNING
    _FAILED_ONCE = True
    logger.log(level, "metrics of %r failed; ignored", member.attributes, exc_info=True)


_FAILED_ONCE = False
_LOCK = threading.Lock()
_API: Any = None
_UNAVAILABLE = False
_GLOBAL: _Instruments | None = None
_BY_PROVIDER: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()


def _api() -> ModuleType | None:
    """``opentelemetry.metrics``, or None when it cannot be imported (then never tried again)."""
    global _API, _UNAVAILABLE
    if _API is None and not _UNAVAILABLE:
        try:
            from opentelemetry import metrics as api
        except ImportError:
            _UNAVAILABLE = True
        else:
            _API = api
    return _API  # type: ignore[no-any-return]


def _instruments(provider: Any) -> _Instruments | None:
    global _GLOBAL
    api = _api()
    if api is None:
        return None
    with _LOCK:
        if provider is None:
            # The API's proxy binds these to the SDK whenever it is installed.
            if _GLOBAL is None:
                _GLOBAL = _Instruments(api, api.get_meter(SCOPE, __version__))
            return _GLOBAL
        found = _BY_PROVIDER.get(provider)
        if found is None:
            found = _Instruments(api, provider.get_meter(SCOPE, __version__))
            _BY_PROVIDER[provider] = found
        return found


def attach(config: GrpcChannelConfig, driver: Driver, log: RunLog) -> ChannelMetrics | None:
    """Report a channel to its configured meter provider; None when metrics are off.

    Off when ``config.metrics`` is False or ``opentelemetry`` cannot be
    imported: then nothing of it is imported and the channel has no hooks.
    Instruments are made once per provider and observe every attached
    channel through its driver (public counters, cursor, state) and log.

    Args:
        config: the channel's configuration.
        driver: the channel's driver.
        log: the channel's log.

    Returns:
        Its hooks, or None.

    README "Monitoring"; docs/operations.md "Monitoring".
    """
    if not config.metrics:
        return None
    try:
        instruments = _instruments(config.meter_provider)
        if instruments is None:
            return None
        member = ChannelMetrics(
            instruments, driver, log, group_commit=config.group_commit is not None
        )
    except Exception:  # a broken provider must not stop the run
        logger.warning(
            "run %s: cannot set up metrics; the run goes on without them",
            config.run_id,
            exc_info=True,
        )
        return None
    instruments.add(member)
    return member
