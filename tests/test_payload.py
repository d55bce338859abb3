"""Payload rules (SPEC "Payloads"): refused with the path of the bad value."""

from __future__ import annotations

import datetime
import math
from collections import OrderedDict
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from walchannel._proto import engine_channel_pb2 as pb
from walchannel.config import DEFAULT_MAX_MESSAGE_BYTES
from walchannel.errors import PayloadError
from walchannel.wire.payload import (
    MAX_DEPTH,
    MAX_SAFE_INT,
    MAX_VALUES,
    check_payload,
    plain_payload,
)
from walchannel.wire.protobuf import body_of, continues_transaction, row_digest, up_message


def nested(depth: int) -> dict[str, Any]:
    """A mapping nested ``depth`` levels deep (the outer mapping is level 1)."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


@pytest.mark.parametrize(
    ("payload", "path", "words"),
    [
        ({"a": 2**53 + 1}, "finding.a", "±2^53"),
        ({"a": -(2**53) - 1}, "finding.a", "±2^53"),
        ({"a": [1, {"b": math.nan}]}, "finding.a[1].b", "finite"),
        ({"a": math.inf}, "finding.a", "finite"),
        ({"a": -math.inf}, "finding.a", "finite"),
        ({"a": b"x"}, "finding.a", "bytes is not JSON-like"),
        ({"a": {1, 2}}, "finding.a", "set is not JSON-like"),
        ({"a": datetime.datetime.now()}, "finding.a", "datetime is not JSON-like"),
        ({"a": object()}, "finding.a", "object is not JSON-like"),
        ({1: "x"}, "finding[1]", "key must be a string"),
        ({"evidence": [{}, {}, {}, {"id": b"\x00"}]}, "finding.evidence[3].id", "bytes"),
        ({"a": "\ud800"}, "finding.a", "lone surrogate"),
        ({"\udfff": 1}, "finding['\\udfff']", "lone surrogate"),
        ({"odd key": {"x": 1.5, "y": math.nan}}, "finding['odd key'].y", "finite"),
    ],
)
def test_bad_values_are_refused_with_their_path(payload: Any, path: str, words: str) -> None:
    with pytest.raises(PayloadError) as info:
        check_payload(payload, "finding")
    assert info.value.path == path
    assert words in str(info.value)
    assert isinstance(info.value, ValueError)


def test_limits_themselves_are_accepted() -> None:
    check_payload({"a": MAX_SAFE_INT, "b": -MAX_SAFE_INT, "c": None, "d": True}, "finding")
    check_payload({"a": [1.5, "x", [], {}], "b": (1, 2)}, "finding")


def test_payload_must_be_a_mapping() -> None:
    with pytest.raises(PayloadError, match="expected a mapping"):
        check_payload([1, 2], "event.payload")


def test_depth_limit_exactly_round_trips_through_up_message() -> None:
    payload = nested(MAX_DEPTH)
    check_payload(payload, "finding")
    msg = up_message("r", "c", 1, "finding", {"fields": payload})
    decoded = pb.UpMessage.FromString(msg.SerializeToString())
    kind, body = body_of(decoded)
    assert kind == "finding"
    inner = body["fields"]
    for _ in range(MAX_DEPTH - 1):
        inner = inner["k"]
    assert inner == {"leaf": 1.0}


def test_one_level_past_the_limit_is_refused() -> None:
    with pytest.raises(PayloadError, match=f"deeper than {MAX_DEPTH}"):
        check_payload(nested(MAX_DEPTH + 1), "finding")


def test_ten_thousand_levels_refused_without_recursion_error() -> None:
    payload: Any = 1
    for _ in range(10_000):
        payload = [payload]
    with pytest.raises(PayloadError, match="deeper"):
        check_payload({"deep": payload}, "event.payload")


def test_a_cycle_is_refused_by_the_depth_limit() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(PayloadError, match="deeper"):
        check_payload(cyclic, "finding")


def test_foreign_mappings_are_copied_to_plain_dicts() -> None:
    payload = MappingProxyType({"a": MappingProxyType({"b": (1, 2)})})
    plain = plain_payload(payload, "finding")
    assert plain == {"a": {"b": [1, 2]}}
    assert type(plain) is dict and type(plain["a"]) is dict
    ordinary = {"a": OrderedDict(b=1)}
    assert plain_payload(ordinary, "finding") is ordinary


json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE_INT, max_value=MAX_SAFE_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@given(st.dictionaries(st.text(), json_values, max_size=6))
def test_every_json_like_payload_travels(payload: dict[str, Any]) -> None:
    check_payload(payload, "finding")
    msg = up_message("r", "c", 7, "finding", {"fields": payload})
    kind, body = body_of(pb.UpMessage.FromString(msg.SerializeToString()))
    assert kind == "finding"
    assert body["fields"] == _as_struct_numbers(payload)


@given(
    st.dictionaries(st.text(), json_values, max_size=6),
    st.sampled_from(["finding", "event", "approval_request"]),
)
def test_the_engine_computes_the_digest_the_client_computed(
    payload: dict[str, Any], kind: str
) -> None:
    # The resume point's count (SPEC "The engine keeps the resume point"): an engine
    # compares the digest of the body it decodes, numbers as doubles, with the one
    # the client computed from the body it logged, ints as ints.
    check_payload(payload, kind)
    if kind == "finding":
        logged: dict[str, Any] = {"fields": payload}
    elif kind == "event":
        logged = {"type": "t", "severity": "info", "payload": payload, "ts": "2026-01-01T00:00:00Z"}
    else:
        logged = {"request_id": "r1", "action": "scan", "details": payload}
    msg = up_message("r", "c", 7, kind, logged)
    decoded = body_of(pb.UpMessage.FromString(msg.SerializeToString()))
    assert decoded[0] == kind
    assert row_digest(*decoded) == row_digest(kind, logged)
    assert continues_transaction(*decoded, row_digest(kind, logged))


def _as_struct_numbers(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {k: _as_struct_numbers(v) for k, v in value.items()}
    return [_as_struct_numbers(v) for v in value]


@given(st.dictionaries(st.text(), json_values, max_size=6))
def test_struct_size_stays_under_the_channels_bound(payload: dict[str, Any]) -> None:
    # GrpcEngineChannel skips the exact size check below this bound.
    from walchannel.channel.row_source import STRUCT_GROWTH
    from walchannel.log.format import encode_body

    body = {"fields": payload}
    blob = encode_body("finding", body)
    msg = up_message("r" * 200, "c" * 200, 2**63, "finding", body)
    assert msg.ByteSize() <= len(blob) * STRUCT_GROWTH + 64 + 400


def test_struct_size_bound_holds_for_the_worst_shape() -> None:
    from walchannel.channel.row_source import STRUCT_GROWTH
    from walchannel.log.format import encode_body

    for fields in ({"l": [1] * 10_000}, {"l": [[]] * 10_000}, {"l": [None] * 10_000}):
        body = {"fields": fields}
        ratio = up_message("r", "c", 1, "finding", body).ByteSize() / len(encode_body("f", body))
        assert ratio < STRUCT_GROWTH


def test_the_default_value_bound_matches_the_default_message_bound() -> None:
    # A Struct value takes at least 2 bytes: more values could never travel.
    assert MAX_VALUES == DEFAULT_MAX_MESSAGE_BYTES // 2


def test_shared_containers_count_each_time_they_appear() -> None:
    shared: list[Any] = [1]
    for _ in range(30):  # 31 lists, 2**30 values once expanded (within MAX_DEPTH)
        shared = [shared, shared]
    with pytest.raises(PayloadError, match=r"^finding: more than 1000 values"):
        check_payload({"tree": shared}, "finding", max_values=1000)
    check_payload({"flat": list(range(999))}, "finding", max_values=1000)
