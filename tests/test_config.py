"""GrpcChannelConfig and Backoff: every rule of SPEC's table, each naming the field."""

from __future__ import annotations

import ipaddress
import logging
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from walchannel import GrpcEngineChannel, InsecureDiscoveryWarning
from walchannel.config import Backoff, GrpcChannelConfig
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config

TOKEN = "tok-SECRET-4f1c"


def build(**overrides: Any) -> GrpcChannelConfig:
    values: dict[str, Any] = {
        "grpc_addr": "127.0.0.1:50051",
        "run_id": "run-1",
        "correlation_id": "corr-1",
        "run_token": TOKEN,
    }
    values.update(overrides)
    return GrpcChannelConfig(**values)


def test_defaults_are_the_spec_table() -> None:
    c = build()
    assert (c.keepalive_ms, c.connect_timeout_ms, c.engine_acks_handshake) == (25_000, 10_000, True)
    assert (c.done_ack_timeout_ms, c.close_timeout_ms) == (5_000, 2_000)
    assert c.backoff == Backoff(initial_ms=500, multiplier=2, max_ms=15_000, jitter_ms=250)
    assert c.max_message_bytes == c.max_receive_message_bytes == 4 * 1024 * 1024
    assert c.min_send_rate_bytes_per_s == 16 * 1024
    assert c.max_unacked_bytes is None and c.dead_stream_ms is None
    assert c.durability == "process" and c.hard_deadline is None
    assert c.proxy_from_env is True


def test_token_never_in_repr_or_str() -> None:
    c = build()
    assert TOKEN not in repr(c) and TOKEN not in str(c)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("grpc_addr", ""),
        ("grpc_addr", "localhost"),
        ("grpc_addr", "http://h:1"),
        ("grpc_addr", "h:0"),
        ("grpc_addr", "h:70000"),
        ("grpc_addr", "h:port"),
        ("grpc_addr", "::1:50"),
        ("run_id", ""),
        ("run_id", "a/b"),
        ("correlation_id", ""),
        ("run_token", ""),
        ("run_token", "a\nb"),
        ("keepalive_ms", 999),
        ("keepalive_ms", 0),
        ("keepalive_ms", 1.5e3),
        ("connect_timeout_ms", 0),
        ("connect_timeout_ms", -1),
        ("engine_acks_handshake", 1),
        ("proxy_from_env", "no"),
        ("dead_stream_ms", 0),
        ("http_addr", "ftp://x"),
        ("http_addr", "engine:8080"),
        ("http_addr", "http://"),
        ("http_addr", "http://h:99999"),
        ("http_addr", "http://h/?q=1"),
        ("durability", "disk"),
        ("done_ack_timeout_ms", 0),
        ("close_timeout_ms", -5),
        ("max_message_bytes", 0),
        ("max_unacked_bytes", 0),
        ("max_receive_message_bytes", 0),
        ("max_receive_message_bytes", -1),
        ("max_receive_message_bytes", True),
        ("max_receive_message_bytes", 4.5e6),
        ("max_receive_message_bytes", "8MiB"),
        ("max_receive_message_bytes", None),
        ("min_send_rate_bytes_per_s", 0),
        ("min_send_rate_bytes_per_s", -16_384),
        ("min_send_rate_bytes_per_s", 1.5e4),
        ("min_send_rate_bytes_per_s", True),
        ("min_send_rate_bytes_per_s", None),
        ("tls_server_name", ""),
        ("allowed_hosts", "engine"),
        ("allowed_hosts", ["ok", ""]),
        ("allowed_hosts", ["bad host!"]),
        ("hard_deadline", datetime(2030, 1, 1)),
        ("hard_deadline", "2030-01-01"),
        ("backoff", {"initial_ms": 1}),
        ("wal_dir", 123),
        ("wal_dir", ""),
        ("wal_dir", "a\x00b"),
        ("http_client", "client"),
        ("credentials", "tls"),
    ],
)
def test_each_rule_raises_value_error_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        build(**{field: value})


@pytest.mark.parametrize(
    "url",
    ["http://user:s3cr3t-pw@engine", "https://engine/?token=s3cr3t-pw", "ftp://u:s3cr3t-pw@h"],
)
def test_http_addr_errors_never_echo_a_credential_in_the_url(url: str) -> None:
    with pytest.raises(ValueError, match="http_addr") as info:
        build(http_addr=url)
    assert "s3cr3t-pw" not in str(info.value), info.value


@pytest.mark.parametrize(
    ("field", "value"),
    [("initial_ms", 0), ("multiplier", 0), ("max_ms", -1), ("jitter_ms", -1), ("initial_ms", True)],
)
def test_backoff_rules(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        Backoff(**{field: value})


def test_jitter_zero_is_valid() -> None:
    assert Backoff(jitter_ms=0).jitter_ms == 0


def test_keepalive_below_ten_seconds_is_accepted_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="walchannel.config"):
        assert build(keepalive_ms=1000).keepalive_ms == 1000
    assert "too_many_pings" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="walchannel.config"):
        build(keepalive_ms=10_000)
    assert caplog.text == ""


def test_plaintext_discovery_without_allowed_hosts_warns() -> None:
    with pytest.warns(InsecureDiscoveryWarning, match="allowed_hosts") as caught:
        build(http_addr="http://engines.internal:8080")
    # It points at the caller's line, so the user sees where the config is built.
    assert [Path(w.filename).name for w in caught] == ["test_config.py"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build(http_addr="http://engines.internal:8080", allowed_hosts=["10.0.0.0/8"])
        build(http_addr="https://engines.internal")


def test_allowed_hosts_are_normalized() -> None:
    c = build(allowed_hosts=["Engine.Internal.", "10.0.0.0/8", "127.0.0.1", "::1"])
    assert c.allowed == (
        "engine.internal",
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("::1/128"),
    )


def test_good_values_pass() -> None:
    c = build(
        grpc_addr="[::1]:443",
        http_addr="https://h.example:8443/base/",
        dead_stream_ms=3000,
        durability="power",
        max_unacked_bytes=1,
        tls_server_name="engine.local",
        hard_deadline=datetime(2030, 1, 1, tzinfo=UTC),
    )
    assert c.durability == "power"


def test_a_bad_allowed_hosts_entry_is_named_once() -> None:
    with pytest.raises(ValueError) as info:
        build(allowed_hosts=["bad host!"])
    assert str(info.value).count("allowed_hosts") == 1


@pytest.mark.asyncio
async def test_a_real_http_client_and_credentials_are_accepted() -> None:
    import grpc
    import httpx

    async with httpx.AsyncClient() as client:
        credentials = grpc.ssl_channel_credentials()
        config = build(http_client=client, credentials=credentials)
        assert config.http_client is client and config.credentials is credentials


# -- values sent as gRPC metadata (issue 13, item 4) ---------------------------------------

METADATA_RULE = "printable ASCII"
BAD_METADATA_VALUES = [
    pytest.param(" tok", id="leading-space"),
    pytest.param("tok ", id="trailing-space"),
    pytest.param("   ", id="only-spaces"),
    pytest.param("tök", id="non-ascii"),
    pytest.param("to\tk", id="tab"),
    pytest.param("to\x7fk", id="del"),
    pytest.param("to\u00a0k", id="nbsp"),
    pytest.param("to\rk", id="cr"),
    pytest.param("to\x00k", id="nul"),
    pytest.param("tok\n", id="trailing-newline"),
]


@pytest.mark.parametrize("value", BAD_METADATA_VALUES)
def test_a_run_token_grpc_cannot_send_is_refused_naming_the_rule_never_the_token(
    value: str,
) -> None:
    secret = value.replace("tok", "SECRET-tok")
    with pytest.raises(ValueError) as info:
        build(run_token=secret)
    message = str(info.value)
    assert "run_token" in message and METADATA_RULE in message
    assert "leading or trailing whitespace" in message
    assert "SECRET" not in message and secret not in message


@pytest.mark.parametrize("value", BAD_METADATA_VALUES)
def test_a_correlation_id_breaking_the_metadata_rule_is_refused(value: str) -> None:
    with pytest.raises(ValueError) as info:
        build(correlation_id=value)
    message = str(info.value)
    assert "correlation_id" in message and METADATA_RULE in message


@pytest.mark.parametrize("value", ["tok", "a b", "Bearer-like.token_~+/=", "x" * 4096, "!~"])
def test_printable_ascii_metadata_values_pass(value: str) -> None:
    assert build(run_token=value, correlation_id=value).correlation_id == value


def test_the_error_gives_the_position_of_the_bad_character() -> None:
    with pytest.raises(ValueError, match="character 3"):
        build(run_token="ab\u00e9cd")


@pytest.mark.asyncio
async def test_every_printable_ascii_token_the_config_accepts_authenticates(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    # The accepted set really travels: inner spaces and every punctuation mark.
    token = "a b " + "".join(chr(c) for c in range(0x21, 0x7F))
    run_id = "run-ascii"
    local_engine.register_run(run_id, token)
    config = local_channel_config(local_engine, tmp_path, run_id, token, correlation_id="c !~")
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        seq = ch.send_finding({"n": 1})
        assert await ch.wait_acked(seq, timeout_ms=10_000)
    assert local_engine.accepted(run_id) == [1]
