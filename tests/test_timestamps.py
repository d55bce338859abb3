"""``send_event(ts=...)`` strings: RFC 3339 §5.6's grammar, no more and no less.

Python's ``datetime.fromisoformat`` reads ISO 8601, a larger language: week
and ordinal dates and the basic format are not RFC 3339, while a lowercase
``t``/``z`` and a leap second (second 60) are.
"""

from __future__ import annotations

import pytest

from walchannel import GrpcEngineChannel
from walchannel.errors import PayloadError
from walchannel.testing.engine import LocalEngine
from walchannel.wire.messages import event_body


def ts_of(value: str) -> str:
    return event_body("t", "info", {}, value)["ts"]


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        # Lowercase z and t (§5.6 NOTE: "T" and "Z" may be lowercase).
        ("2024-06-01T12:00:00z", "2024-06-01T12:00:00.000000Z"),
        ("2024-06-01t12:00:00Z", "2024-06-01T12:00:00.000000Z"),
        ("2024-06-01t12:00:00.25+02:00", "2024-06-01T10:00:00.250000Z"),
        # -00:00: the time is UTC, its local offset unknown (§4.3).
        ("2024-06-01T12:00:00-00:00", "2024-06-01T12:00:00.000000Z"),
        # More fraction digits than a datetime holds: cut to microseconds, never rounded up.
        ("2024-06-01T12:00:00.9999999Z", "2024-06-01T12:00:00.999999Z"),
        ("2024-02-29T00:00:00Z", "2024-02-29T00:00:00.000000Z"),
        # Leap seconds: second 60 is sent as 23:59:59.999999 of that minute in UTC.
        ("2016-12-31T23:59:60Z", "2016-12-31T23:59:59.999999Z"),
        ("2016-12-31T23:59:60+00:00", "2016-12-31T23:59:59.999999Z"),
        ("2016-12-31T18:59:60-05:00", "2016-12-31T23:59:59.999999Z"),
        ("2017-01-01T00:59:60+01:00", "2016-12-31T23:59:59.999999Z"),
        ("2015-06-30T23:59:60.5z", "2015-06-30T23:59:59.999999Z"),
    ],
)
def test_rfc3339_timestamps_are_accepted_and_sent_in_utc(given: str, sent: str) -> None:
    assert ts_of(given) == sent


@pytest.mark.parametrize(
    ("given", "words"),
    [
        # ISO 8601 forms that RFC 3339 does not have.
        ("2024-W22-6T12:00:00Z", "not an RFC 3339 timestamp"),
        ("20240601T120000Z", "not an RFC 3339 timestamp"),
        ("2024-153T12:00:00Z", "not an RFC 3339 timestamp"),
        ("2024-06-01T12:00Z", "not an RFC 3339 timestamp"),
        ("2024-06-01T12:00:00+0200", "not an RFC 3339 timestamp"),
        ("2024-06-01T12:00:00+02", "not an RFC 3339 timestamp"),
        ("2024-06-01T12:00:00,5Z", "not an RFC 3339 timestamp"),
        ("2024-06-01T12:00:00.Z", "not an RFC 3339 timestamp"),
        ("2024-06-01", "not an RFC 3339 timestamp"),
        # The space separator is only a NOTE of §5.6: refused.
        ("2024-06-01 12:00:00Z", "not an RFC 3339 timestamp"),
        # Digits of other scripts and a trailing newline.
        ("\u0662\u0660\u0662\u0664-06-01T12:00:00Z", "not an RFC 3339 timestamp"),
        ("2024-06-01T12:00:00Z\n", "not an RFC 3339 timestamp"),
        # No offset.
        ("2024-06-01T12:00:00", "has no UTC offset"),
        ("2024-06-01T12:00:00.123456", "has no UTC offset"),
        # Fields out of range (§5.7).
        ("2024-02-30T00:00:00Z", "day 30 is out of range for 2024-02"),
        ("2023-02-29T00:00:00Z", "day 29 is out of range for 2023-02"),
        ("2024-04-31T00:00:00Z", "day 31 is out of range for 2024-04"),
        ("2024-13-01T00:00:00Z", "month 13 is out of range"),
        ("2024-06-00T00:00:00Z", "day 0 is out of range"),
        ("2024-06-01T24:00:00Z", "hour 24 is out of range"),
        ("2024-06-01T12:60:00Z", "minute 60 is out of range"),
        ("2024-06-01T12:00:61Z", "second 61 is out of range"),
        ("2024-06-01T12:00:00+24:00", "offset hour 24 is out of range"),
        ("2024-06-01T12:00:00+02:60", "offset minute 60 is out of range"),
        ("0000-01-01T00:00:00Z", "year 0 is out of range"),
        # A leap second only ends the last minute of a month, in UTC (§5.7).
        ("2024-06-01T12:00:60Z", "a leap second (second 60) is 23:59:60 UTC"),
        ("2016-12-31T23:59:60+01:00", "a leap second (second 60) is 23:59:60 UTC"),
        ("2016-12-30T23:59:60Z", "a leap second (second 60) is 23:59:60 UTC"),
    ],
)
def test_other_strings_are_refused_naming_the_field_and_the_value(given: str, words: str) -> None:
    with pytest.raises(PayloadError) as caught:
        ts_of(given)
    assert caught.value.path == "event.ts"
    assert repr(given) in str(caught.value)
    assert words in caught.value.reason


@pytest.mark.asyncio
async def test_the_engine_receives_rfc3339_timestamps_in_utc(
    engine_channel: GrpcEngineChannel, local_engine: LocalEngine
) -> None:
    ch = engine_channel
    await ch.handshake("1", "h", "1")
    assert ch.send_event("a", "info", {}, ts="2024-06-01t12:00:00z") == 1
    assert ch.send_event("b", "info", {}, ts="2016-12-31T18:59:60-05:00") == 2
    for refused in ("2024-W22-6T12:00:00Z", "20240601T120000Z", "2024-02-30T00:00:00Z"):
        with pytest.raises(PayloadError, match=r"^event\.ts: "):
            ch.send_event("c", "info", {}, ts=refused)
    assert ch.send_event("d", "info", {}, ts="2015-06-30T23:59:60Z") == 3  # no seq was used
    assert await ch.wait_acked(timeout_ms=5000)
    got = [row["body"]["ts"] for row in local_engine.bodies(ch.config.run_id)]
    assert got == [
        "2024-06-01T12:00:00.000000Z",
        "2016-12-31T23:59:59.999999Z",
        "2015-06-30T23:59:59.999999Z",
    ]
