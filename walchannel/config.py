"""Channel configuration: frozen, keyword-only, validated when built.

Durations are milliseconds, as in the design note and in gRPC's option names
(``keepalive_ms`` maps to ``grpc.keepalive_time_ms``). An invalid value
raises ``ValueError`` naming the field when the config is built, never when
it is first used. SPEC "The channel" (configuration table).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from walchannel._logging import get_logger
from walchannel.errors import InsecureDiscoveryWarning
from walchannel.log import files
from walchannel.log.replication import SOCKET_ENV
from walchannel.wire.address import AllowedHost, parse_allowed_hosts, parse_host_port

if TYPE_CHECKING:
    import grpc
    import httpx
    from opentelemetry.metrics import MeterProvider

__all__ = [
    "DEFAULT_BACKOFF",
    "METADATA_RULE",
    "Backoff",
    "GroupCommit",
    "GrpcChannelConfig",
    "check_metadata_value",
    "redact_secret",
]

logger = get_logger(__name__)

#: gRPC's default receive limit: larger messages can never be delivered.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: The slowest link a live stream is assumed to move at (bytes/s): 128 kbit/s.
DEFAULT_MIN_SEND_RATE_BYTES_PER_S = 16 * 1024
#: Below this keepalive many engines (gRPC servers) answer with GOAWAY too_many_pings.
KEEPALIVE_WARN_BELOW_MS = 10_000


#: What gRPC accepts as an ASCII metadata value (its C core refuses anything
#: else at dial, and HTTP/2 peers strip surrounding whitespace).
METADATA_RULE = (
    "gRPC metadata values must be printable ASCII (0x20-0x7E) with no leading or "
    "trailing whitespace"
)


def check_metadata_value(name: str, value: str, *, secret: bool = False) -> None:
    """Refuse a value gRPC could never send as (or inside) ASCII call metadata.

    gRPC's C core refuses a metadata value holding anything but printable
    ASCII (``INTERNAL: Invalid metadata`` at dial), and HTTP/2 peers strip
    leading and trailing whitespace, so such a token would fail at every
    dial forever (UNAUTHENTICATED). SPEC "Dial" (the ``authorization``
    metadata) and "Secrets".

    Args:
        name: how the error names the value, e.g. ``"run_token"``.
        value: the value.
        secret: True for the run token: the error gives the position of the
            bad character and its kind, never the character or the value.

    Raises:
        ValueError: naming ``name``, the position and the rule.
    """
    for i, ch in enumerate(value):
        if " " <= ch <= "~":
            continue
        if ch > "\x7f":
            kind = "a non-ASCII character"
        elif ch.isspace():
            kind = "a whitespace control character"
        else:
            kind = "a control character"
        shown = "" if secret else f" {ch!r}"
        raise ValueError(f"{name}: character {i + 1}{shown} is {kind}; {METADATA_RULE}")
    if value != value.strip(" "):
        where = "leading" if value[:1] == " " else "trailing"
        raise ValueError(f"{name} has {where} whitespace; {METADATA_RULE}")


# Characters a bearer token is made of (RFC 6750 token68): an occurrence of
# the token inside a longer run of them is another word, not the token.
_WORD_CHARS = r"A-Za-z0-9\-._~+/="


def redact_secret(text: str, secret: str) -> str:
    """Return ``text`` with every whole occurrence of ``secret`` replaced by ``***``.

    For text that came from elsewhere (an engine's status details, a
    discovery answer) before it is logged or stored: SPEC "Secrets". Only
    occurrences not inside a longer run of token characters (letters,
    digits, ``-._~+/=``) count, so a short token such as ``"t"`` masks an
    echoed ``"token t is bad"`` but leaves ``"UNAUTHENTICATED"`` readable.

    Args:
        text: the text to clean.
        secret: the run token (an empty one changes nothing).

    Returns:
        The cleaned text.
    """
    if not secret or secret not in text:
        return text
    pattern = rf"(?<![{_WORD_CHARS}]){re.escape(secret)}(?![{_WORD_CHARS}])"
    return re.sub(pattern, "***", text)


def _positive(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Reconnect delays: ``min(max_ms, initial_ms * multiplier**attempt) + uniform(0, jitter_ms)``.

    Attempt 0 waits ``initial_ms`` (plus jitter). The arithmetic is pure;
    sleeping is the channel's (the urllib3 ``Retry.get_backoff_time`` split).
    SPEC "Reconnect".

    Attributes:
        initial_ms: first delay (ms), > 0.
        multiplier: growth per attempt, > 0.
        max_ms: cap before jitter (ms), > 0.
        jitter_ms: most random delay added (ms), >= 0.
    """

    initial_ms: float = 500
    multiplier: float = 2
    max_ms: float = 15_000
    jitter_ms: float = 250

    def __post_init__(self) -> None:
        _positive("backoff.initial_ms", self.initial_ms)
        _positive("backoff.multiplier", self.multiplier)
        _positive("backoff.max_ms", self.max_ms)
        if isinstance(self.jitter_ms, bool) or not isinstance(self.jitter_ms, (int, float)):
            raise ValueError("backoff.jitter_ms must be a number")
        if not math.isfinite(self.jitter_ms) or self.jitter_ms < 0:
            raise ValueError(f"backoff.jitter_ms must be >= 0, got {self.jitter_ms!r}")

    def delay_ms(self, attempt: int, rng: random.Random) -> float:
        """Return the delay before reconnect ``attempt`` (0-based), in ms.

        Args:
            attempt: how many reconnects failed since the last reset.
            rng: the random source for the jitter (inject a seeded one in tests).
        """
        try:
            base = min(self.max_ms, self.initial_ms * self.multiplier ** max(attempt, 0))
        except OverflowError:
            base = self.max_ms
        return float(base) + (rng.uniform(0, self.jitter_ms) if self.jitter_ms else 0.0)


DEFAULT_BACKOFF = Backoff()


@dataclass(frozen=True, kw_only=True)
class GroupCommit:
    """Commit the rows of many sends in one transaction: an opt-in loss window. SPEC "Group commit".

    With it, ``send_*`` hands out seqs and returns before its rows are
    committed; the group commits at the end of the first turn of the event
    loop that adds nothing to it, or inline in the send that finds it full
    or old. A process killed
    in that window loses the group's rows and their seqs, which were never
    written to the stream (the engine never saw them); a harness resuming
    from ``progress()`` sends them again, as its marker commits with them.

    Attributes:
        max_rows: a group holding this many rows commits inline (> 0).
        max_bytes: a group whose rows hold this many msgpack bytes commits
            inline (bytes, > 0).
        max_delay_ms: a send finding the group's oldest row this old (the
            event loop was held that long) commits the group first (ms, > 0).
    """

    max_rows: int = 256
    max_bytes: int = 1024 * 1024
    max_delay_ms: float = 50

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"group_commit.{name} must be an int > 0, got {value!r}")
        _positive("group_commit.max_delay_ms", self.max_delay_ms)

    def describe(self) -> str:
        """The setting as the log's meta stores it and ``inspect`` shows it (JSON)."""
        return json.dumps(
            {
                "max_rows": self.max_rows,
                "max_bytes": self.max_bytes,
                "max_delay_ms": self.max_delay_ms,
            },
            separators=(",", ":"),
        )


@dataclass(frozen=True, kw_only=True)
class GrpcChannelConfig:
    """Everything a :class:`~walchannel.GrpcEngineChannel` needs. Durations in ms.

    Attributes:
        grpc_addr: the engine, ``host:port``.
        run_id: the run; a safe file name (it names the log).
        correlation_id: carried on every message; printable ASCII without
            leading or trailing whitespace (:data:`METADATA_RULE`).
        run_token: the run's bearer token; only ever sent as call metadata,
            never logged, stored or shown (not in ``repr``); printable ASCII
            without leading or trailing whitespace (:data:`METADATA_RULE`).
        keepalive_ms: heartbeat and gRPC keepalive period, >= 1000
            (WARNING below 10 000: engines commonly refuse faster pings).
        connect_timeout_ms: bounds each dial and ``handshake()``.
        engine_acks_handshake: False only for an engine that does not answer
            the handshake with ``Ack(h)`` (no verification rule then).
        dead_stream_ms: with a value, a stream with no down message for this
            long while heartbeats go out is dead (needs heartbeat acks).
        http_addr: the stable engine base URL for discovery
            (``GET {http_addr}/grpc-address``), ``http://`` or ``https://``.
        http_client: an ``httpx.AsyncClient`` to reuse for discovery.
        wal_dir: the log folder (None: the default, see
            :func:`walchannel.log.files.default_wal_dir`).
        durability: ``"process"``, ``"power"`` or ``"replicated"`` (a row
            is written only once Litestream's replica holds it). SPEC "The
            log"; docs/operations.md.
        done_ack_timeout_ms: how long ``send_done`` waits for its ack.
        close_timeout_ms: how long ``close`` waits for the stream's end (and
            ``BlockingEngineChannel.close`` for a running callback).
        backoff: reconnect delays.
        max_message_bytes: largest encoded ``UpMessage`` accepted (bytes).
        max_unacked_bytes: refuse sends past this backlog (bytes; None: no limit).
        max_receive_message_bytes: largest encoded ``DownMessage`` the channel
            accepts (bytes; gRPC's ``grpc.max_receive_message_length``). A
            larger one ends the stream; the channel names this field in
            ``last_error`` and keeps retrying (SPEC "Down messages").
        min_send_rate_bytes_per_s: the slowest rate a live link moves
            (bytes/s, > 0), which the watchdog's bounds allow for. SPEC
            "Reconnect".
        credentials: ``grpc.ChannelCredentials`` (None: plaintext).
        tls_server_name: the name to check the engine's certificate against
            when the address is an IP (``grpc.ssl_target_name_override``).
        allowed_hosts: host names or IP networks discovery may send the
            harness to (None: any; an :class:`InsecureDiscoveryWarning` when
            ``http_addr`` is plaintext).
        hard_deadline: aware datetime, the token's expiry: the run ends there.
        proxy_from_env: honour the proxy variables for the stream and for
            discovery, as gRPC and httpx do (True, the default); False: both
            connect directly (:func:`walchannel.wire.address.proxy_for`;
            docs/security.md "Proxies").
        metrics: report OpenTelemetry metrics when ``opentelemetry-api`` is
            installed (the ``walchannel[otel]`` extra); False: never import it.
        meter_provider: the ``opentelemetry.metrics.MeterProvider`` to report
            to (None: the global one, a no-op until the application installs
            the SDK). docs/operations.md "Monitoring".
        group_commit: a :class:`GroupCommit` to commit the rows of many
            sends in one transaction, ``send_*`` returning before its rows
            are committed (None, the default: each send commits before it
            returns). It combines with every ``durability``. SPEC "Group commit".

    Raises:
        ValueError: naming the field, when a value breaks its rule.
    """

    grpc_addr: str
    run_id: str
    correlation_id: str
    run_token: str = field(repr=False)
    keepalive_ms: int = 25_000
    connect_timeout_ms: int = 10_000
    engine_acks_handshake: bool = True
    dead_stream_ms: int | None = None
    http_addr: str | None = None
    http_client: httpx.AsyncClient | None = field(default=None, repr=False, compare=False)
    wal_dir: str | os.PathLike[str] | None = None
    durability: Literal["process", "power", "replicated"] = "process"
    done_ack_timeout_ms: int = 5_000
    close_timeout_ms: int = 2_000
    backoff: Backoff = DEFAULT_BACKOFF
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_unacked_bytes: int | None = None
    max_receive_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    min_send_rate_bytes_per_s: int = DEFAULT_MIN_SEND_RATE_BYTES_PER_S
    credentials: grpc.ChannelCredentials | None = field(default=None, repr=False, compare=False)
    tls_server_name: str | None = None
    allowed_hosts: Sequence[AllowedHost] | None = None
    hard_deadline: datetime | None = None
    proxy_from_env: bool = True
    metrics: bool = True
    meter_provider: MeterProvider | None = field(default=None, repr=False, compare=False)
    group_commit: GroupCommit | None = None

    def __post_init__(self) -> None:
        for name in ("grpc_addr", "run_id", "correlation_id", "run_token"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty str")
        parse_host_port(self.grpc_addr, what="grpc_addr")
        files.check_run_id(self.run_id)
        # The token goes out as metadata; the correlation id is held to the
        # same rule so it can travel in headers and log lines as it is.
        check_metadata_value("run_token", self.run_token, secret=True)
        check_metadata_value("correlation_id", self.correlation_id)
        if isinstance(self.keepalive_ms, bool) or not isinstance(self.keepalive_ms, int):
            raise ValueError("keepalive_ms must be an int (ms)")
        if self.keepalive_ms < 1000:
            raise ValueError(f"keepalive_ms must be >= 1000, got {self.keepalive_ms}")
        if self.keepalive_ms < KEEPALIVE_WARN_BELOW_MS:
            logger.warning(
                "keepalive_ms=%d is below %d: engines commonly refuse pings that fast "
                "(GOAWAY too_many_pings)",
                self.keepalive_ms,
                KEEPALIVE_WARN_BELOW_MS,
            )
        _positive("connect_timeout_ms", self.connect_timeout_ms)
        for name in ("engine_acks_handshake", "proxy_from_env"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool")
        _positive("dead_stream_ms", self.dead_stream_ms, allow_none=True)
        if self.http_addr is not None:
            self._check_http_addr(self.http_addr)
        if self.durability not in ("process", "power", "replicated"):
            raise ValueError(
                f"durability must be 'process', 'power' or 'replicated', got {self.durability!r}"
            )
        if self.durability == "replicated" and not os.environ.get(SOCKET_ENV):
            raise ValueError(
                f"durability='replicated' needs Litestream's control socket in ${SOCKET_ENV} "
                "(run the harness under 'walchannel replicate --exec')"
            )
        _positive("done_ack_timeout_ms", self.done_ack_timeout_ms)
        _positive("close_timeout_ms", self.close_timeout_ms)
        if not isinstance(self.backoff, Backoff):
            raise ValueError("backoff must be a walchannel.Backoff")
        if self.group_commit is not None and not isinstance(self.group_commit, GroupCommit):
            raise ValueError(
                "group_commit must be a walchannel.GroupCommit or None, "
                f"got {type(self.group_commit).__name__}"
            )
        for name in ("max_message_bytes", "max_unacked_bytes", "max_receive_message_bytes"):
            value = getattr(self, name)
            if value is None and name == "max_unacked_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be an int > 0 (bytes), got {value!r}")
        rate = self.min_send_rate_bytes_per_s
        if isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0:
            raise ValueError(
                f"min_send_rate_bytes_per_s must be an int > 0 (bytes/s), got {rate!r}"
            )
        if self.tls_server_name is not None and (
            not isinstance(self.tls_server_name, str) or not self.tls_server_name
        ):
            raise ValueError("tls_server_name must be a non-empty str or None")
        if self.wal_dir is not None and (
            not isinstance(self.wal_dir, str | os.PathLike)
            or not os.fspath(self.wal_dir)
            or "\x00" in str(os.fspath(self.wal_dir))
        ):
            raise ValueError(
                f"wal_dir must be a non-empty path (str or PathLike) without NUL bytes, "
                f"got {self.wal_dir!r}"
            )
        self._check_clients()
        if self.allowed_hosts is not None:
            # Its errors name allowed_hosts already.
            object.__setattr__(self, "allowed_hosts", parse_allowed_hosts(self.allowed_hosts))
        elif self.http_addr is not None and self.http_addr.startswith("http://"):
            # A Python warning, not a log line: shown with its category and the
            # caller's line, once per place, and filterable (urllib3's way).
            warnings.warn(
                f"http_addr {self.http_addr} is plaintext and allowed_hosts is None: a forged "
                f"discovery answer could send run {self.run_id} anywhere; set allowed_hosts",
                InsecureDiscoveryWarning,
                stacklevel=3,  # __post_init__ <- the dataclass __init__ <- the caller
            )
        if self.hard_deadline is not None and (
            not isinstance(self.hard_deadline, datetime) or self.hard_deadline.tzinfo is None
        ):
            raise ValueError("hard_deadline must be an aware datetime (with tzinfo)")
        self._check_metrics()

    def _check_metrics(self) -> None:
        if not isinstance(self.metrics, bool):
            raise ValueError(f"metrics must be a bool, got {self.metrics!r}")
        if self.meter_provider is None:
            return
        # As _check_clients: a real provider means its API is already loaded.
        api = sys.modules.get("opentelemetry.metrics")
        if api is None or not isinstance(self.meter_provider, api.MeterProvider):
            raise ValueError(
                "meter_provider must be an opentelemetry.metrics.MeterProvider or None, "
                f"got {type(self.meter_provider).__name__}"
            )
        if not self.metrics:
            raise ValueError("meter_provider is set but metrics=False: drop one of them")

    def _check_clients(self) -> None:
        # Without importing grpc or httpx (this module stays light): a real
        # client or credentials object means its library is already loaded.
        checks = (
            ("http_client", self.http_client, "httpx", "AsyncClient"),
            ("credentials", self.credentials, "grpc", "ChannelCredentials"),
        )
        for name, value, module, cls in checks:
            if value is None:
                continue
            loaded = sys.modules.get(module)
            if loaded is None or not isinstance(value, getattr(loaded, cls)):
                raise ValueError(
                    f"{name} must be a {module}.{cls} or None, got {type(value).__name__}"
                )

    @staticmethod
    def _check_http_addr(url: object) -> None:
        if not isinstance(url, str) or not url:
            raise ValueError("http_addr must be a non-empty str URL")
        parts = urlsplit(url)
        # A user, password, query or fragment may hold a credential: never echoed.
        netloc = parts.netloc.rpartition("@")[2]
        shown = repr(parts._replace(netloc=netloc, query="", fragment="").geturl())
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"http_addr {shown} must start with http:// or https://")
        if not parts.hostname:
            raise ValueError(f"http_addr {shown} has no host")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(
                f"http_addr {shown} must be a base URL (no query, fragment or user; not shown here)"
            )
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ValueError(f"http_addr {shown}: {exc}") from None

    @property
    def allowed(self) -> tuple[AllowedHost, ...] | None:
        """``allowed_hosts`` as normalized at build time (a tuple, or None)."""
        return None if self.allowed_hosts is None else tuple(self.allowed_hosts)
