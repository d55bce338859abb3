"""Turning ``send_*`` arguments into checked row bodies (SPEC "Control vs data").

Shared by :class:`~walchannel.GrpcEngineChannel` and the in-memory test
double, so both refuse exactly the same input with the same
:class:`~walchannel.errors.PayloadError`. Every check runs before anything
is logged and before a seq is used.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from walchannel.errors import PayloadError
from walchannel.wire.payload import MAX_VALUES, check_text, plain_payload

__all__ = [
    "MAX_PROGRESS_BYTES",
    "approval_body",
    "done_body",
    "event_bodies",
    "event_body",
    "finding_body",
    "now_rfc3339",
    "parse_rfc3339",
    "progress_marker",
    "rfc3339",
    "rfc3339_at",
]

#: Largest progress marker accepted (bytes of JSON): it is rewritten on every send.
MAX_PROGRESS_BYTES = 64 * 1024
_MAX_UINT64 = 2**64 - 1


def rfc3339(moment: datetime) -> str:
    """Format an aware datetime as RFC 3339 in UTC, e.g. ``2026-11-30T02:51:52.123456Z``."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def now_rfc3339() -> str:
    """The current time as RFC 3339 UTC."""
    return rfc3339(datetime.now(UTC))


def rfc3339_at(unix_s: float) -> str:
    """Format a Unix time (seconds) as RFC 3339 UTC (the channel's clock reads it)."""
    return rfc3339(datetime.fromtimestamp(unix_s, UTC))


# RFC 3339 §5.6 date-time: full-date "T" full-time, ASCII digits only; "T"
# and "Z" in either case (§5.6 NOTE). The offset is optional here only so
# that its absence gets an error of its own.
_RFC3339 = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})[Tt]"
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})(?:\.(?P<fraction>[0-9]+))?"
    r"(?P<offset>[Zz]|(?P<sign>[+-])(?P<off_hour>[0-9]{2}):(?P<off_minute>[0-9]{2}))?"
)
_RFC3339_SHAPE = "YYYY-MM-DDTHH:MM:SS[.frac] then Z or +HH:MM/-HH:MM, RFC 3339 §5.6"


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 §5.6 ``date-time`` into an aware datetime in UTC.

    The grammar exactly: ``YYYY-MM-DD`` ``T`` ``HH:MM:SS``, an optional
    ``.fraction`` (cut to microseconds, never rounded up) and ``Z`` or
    ``±HH:MM`` (``-00:00`` is UTC); ``T`` and ``Z`` may be lowercase (§5.6
    NOTE). The space separator the NOTE also mentions, ISO 8601's week,
    ordinal and basic forms, and digits of other scripts are refused. Fields
    are checked against their ranges (§5.7: Feb 30 is refused). A leap
    second, second 60, must fall on 23:59 UTC of a month's last day (§5.7);
    it comes back as 23:59:59.999999 of that minute, since a datetime has
    no second 60 (SPEC "Timestamps").

    Args:
        text: the timestamp.

    Returns:
        The moment, ``tzinfo=UTC``.

    Raises:
        ValueError: ``text`` is not an RFC 3339 date-time, a field is out of
            range, or the moment is outside datetime's range once in UTC;
            the message quotes ``text`` (its first 40 characters).
    """
    shown = repr(text[:40])
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ValueError(f"{shown} is not an RFC 3339 timestamp ({_RFC3339_SHAPE})")
    if m["offset"] is None:
        raise ValueError(f"{shown} has no UTC offset: end it with Z or +HH:MM/-HH:MM")
    year, month, day = int(m["year"]), int(m["month"]), int(m["day"])
    hour, minute, second = int(m["hour"]), int(m["minute"]), int(m["second"])
    off_hour = int(m["off_hour"] or 0)
    off_minute = int(m["off_minute"] or 0)
    checks = (
        (year, 1, 9999, "year"),
        (month, 1, 12, "month"),
        (hour, 0, 23, "hour"),
        (minute, 0, 59, "minute"),
        (second, 0, 60, "second"),
        (off_hour, 0, 23, "offset hour"),
        (off_minute, 0, 59, "offset minute"),
    )
    for value, low, high, name in checks:
        if not low <= value <= high:
            raise ValueError(f"{shown}: {name} {value} is out of range ({low:02}-{high:02})")
    last_day = calendar.monthrange(year, month)[1]
    if not 1 <= day <= last_day:
        raise ValueError(
            f"{shown}: day {day} is out of range for {year:04}-{month:02} (01-{last_day})"
        )
    offset = timedelta(hours=off_hour, minutes=off_minute)
    micros = int((m["fraction"] or "")[:6].ljust(6, "0"))
    local = datetime(
        year,
        month,
        day,
        hour,
        minute,
        min(second, 59),
        micros,
        tzinfo=timezone(-offset if m["sign"] == "-" else offset),
    )
    try:
        moment = local.astimezone(UTC)
    except OverflowError:
        # Year 1 at +01:00, or 9999-12-31 at -01:00: no such moment in UTC.
        raise ValueError(f"{shown} is out of range once converted to UTC") from None
    if second == 60:
        last_of_month = calendar.monthrange(moment.year, moment.month)[1]
        if (moment.hour, moment.minute, moment.day) != (23, 59, last_of_month):
            raise ValueError(
                f"{shown}: a leap second (second 60) is 23:59:60 UTC on the last day of a"
                f" month (RFC 3339 §5.7); this one falls at {moment:%Y-%m-%d %H:%M}:60 UTC"
            )
        moment = moment.replace(second=59, microsecond=999_999)
    return moment


def _timestamp(ts: object, path: str) -> str:
    if ts is None:
        return now_rfc3339()
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            raise PayloadError(path, "naive datetime; pass an aware one (e.g. tzinfo=UTC)")
        return _in_utc(ts, path)
    if isinstance(ts, str):
        try:
            return rfc3339(parse_rfc3339(ts))
        except ValueError as exc:
            raise PayloadError(path, str(exc)) from None
    raise PayloadError(path, f"expected an aware datetime, an RFC 3339 str or None, got {ts!r}")


def _in_utc(moment: datetime, path: str) -> str:
    try:
        return rfc3339(moment)
    except OverflowError:
        # Year 1 at +01:00, or 9999-12-31 at -01:00: no such moment in UTC.
        raise PayloadError(
            path, f"{moment.isoformat()!r} is out of range once converted to UTC"
        ) from None


def event_body(
    type: str,
    severity: str,
    payload: Mapping[str, Any],
    ts: object,
    *,
    max_values: int = MAX_VALUES,
) -> dict[str, Any]:
    """Return the ``event`` body ``{"type", "severity", "payload", "ts"}``.

    ``ts`` is an aware datetime, an RFC 3339 §5.6 str (:func:`parse_rfc3339`;
    stored in UTC) or None (now);
    ``max_values`` bounds the payload (:func:`~walchannel.wire.payload.check_payload`).

    Raises:
        PayloadError: a bad field, naming it (``event.type``, ``event.payload.x``).
    """
    check_text(type, "event.type")
    check_text(severity, "event.severity")
    return {
        "type": type,
        "severity": severity,
        "payload": plain_payload(payload, "event.payload", max_values=max_values),
        "ts": _timestamp(ts, "event.ts"),
    }


def finding_body(
    finding: Mapping[str, Any], path: str = "finding", *, max_values: int = MAX_VALUES
) -> dict[str, Any]:
    """Return the ``finding`` body ``{"fields": {...}}``.

    Args:
        finding: the finding's fields.
        path: how errors name it (``findings[3]`` in a batch).
        max_values: the bound on values (:func:`~walchannel.wire.payload.check_payload`).

    Raises:
        PayloadError: naming the bad value's path under ``path``.
    """
    return {"fields": plain_payload(finding, path, max_values=max_values)}


def finding_bodies(
    findings: Iterable[Mapping[str, Any]], *, max_values: int = MAX_VALUES
) -> list[dict[str, Any]]:
    """Return the ``finding`` bodies of a batch (``send_findings``).

    Raises:
        PayloadError: ``findings`` is not a list-like of findings (a mapping,
            a str or a non-iterable: ``findings``), or a bad finding, naming
            its index in the path (``findings[3].x``) and as ``index``.
    """
    if isinstance(findings, (Mapping, str, bytes)) or not isinstance(findings, Iterable):
        raise PayloadError(
            "findings",
            f"expected a list of findings (mappings), got {type(findings).__name__}; "
            "for one finding use send_finding",
        )
    bodies = []
    for index, finding in enumerate(findings):
        try:
            bodies.append(finding_body(finding, f"findings[{index}]", max_values=max_values))
        except PayloadError as exc:
            exc.index = index
            raise
    return bodies


def event_bodies(
    events: Iterable[tuple[str, str, Mapping[str, Any]]],
    ts: object,
    *,
    max_values: int = MAX_VALUES,
) -> list[dict[str, Any]]:
    """Return the ``event`` bodies of a batch (``send_findings(events=...)``), all at ``ts``.

    Raises:
        PayloadError: ``events`` is not a list of ``(type, severity, payload)``,
            or a bad field, naming its index in the path (``events[2].payload.x``).
    """
    if isinstance(events, (Mapping, str, bytes)) or not isinstance(events, Iterable):
        raise PayloadError(
            "events", f"expected a list of (type, severity, payload), got {type(events).__name__}"
        )
    bodies = []
    for index, event in enumerate(events):
        if not isinstance(event, tuple) or len(event) != 3:
            raise PayloadError(f"events[{index}]", "expected a (type, severity, payload) tuple")
        try:
            bodies.append(event_body(*event, ts, max_values=max_values))
        except PayloadError as exc:
            raise PayloadError(
                f"events[{index}]" + exc.path.removeprefix("event"), exc.reason
            ) from None
    return bodies


def approval_body(
    request_id: str,
    action: str,
    details: Mapping[str, Any],
    *,
    max_values: int = MAX_VALUES,
) -> dict[str, Any]:
    """Return the ``approval_request`` body ``{"request_id", "action", "details"}``.

    ``max_values`` bounds ``details`` (:func:`~walchannel.wire.payload.check_payload`).

    Raises:
        PayloadError: a bad field, naming it.
    """
    check_text(request_id, "approval_request.request_id")
    if not request_id:
        raise PayloadError("approval_request.request_id", "must not be empty")
    check_text(action, "approval_request.action")
    return {
        "request_id": request_id,
        "action": action,
        "details": plain_payload(details, "approval_request.details", max_values=max_values),
    }


def done_body(
    status: str, findings: int, coverage: Iterable[str], exit_reason: str
) -> dict[str, Any]:
    """Return the ``done`` body ``{"status", "findings", "coverage", "exit_reason"}``.

    ``status`` is free text; ``completed``, ``failed`` and ``stopped`` are
    the suggested values.

    Raises:
        PayloadError: a bad field, naming it (``findings`` must be an int in
            0..2^64-1; ``coverage`` an iterable of str, not a str).
    """
    check_text(status, "done.status")
    check_text(exit_reason, "done.exit_reason")
    if isinstance(findings, bool) or not isinstance(findings, int):
        raise PayloadError("done.findings", f"expected an int, got {type(findings).__name__}")
    if not 0 <= findings <= _MAX_UINT64:
        raise PayloadError("done.findings", f"{findings} is outside 0..2^64-1")
    if isinstance(coverage, (str, bytes)) or not isinstance(coverage, Iterable):
        raise PayloadError("done.coverage", "expected a list of str")
    paths = list(coverage)
    for i, item in enumerate(paths):
        check_text(item, f"done.coverage[{i}]")
    return {"status": status, "findings": findings, "coverage": paths, "exit_reason": exit_reason}


def progress_marker(progress: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Check the harness's ``progress=`` marker (JSON-like, at most 64 KiB of JSON).

    Its numbers are integers: an engine that keeps the resume point holds the
    marker in a ``Struct``, as doubles, and the client turns them back into
    ints (SPEC "Payloads").

    Raises:
        PayloadError: naming the bad value's path under ``progress``.
    """
    if progress is None:
        return None
    # Each value takes at least a byte of JSON: the bound keeps a marker of
    # shared containers from expanding in json.dumps.
    marker = plain_payload(progress, "progress", max_values=MAX_PROGRESS_BYTES)
    _refuse_floats(marker)
    size = len(json.dumps(marker, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    if size > MAX_PROGRESS_BYTES:
        raise PayloadError(
            "progress", f"{size} bytes of JSON, over {MAX_PROGRESS_BYTES}: keep the marker small"
        )
    return marker


def _refuse_floats(marker: dict[str, Any]) -> None:
    """Raise ``PayloadError`` naming a float in ``marker`` (checked already: finite, shallow)."""
    todo: list[tuple[Any, str]] = [(marker, "progress")]
    while todo:
        value, path = todo.pop()
        if isinstance(value, float):
            raise PayloadError(
                path,
                f"the float {value!r}: a marker's numbers are integers (an engine keeps it as"
                " a double and it comes back as an int); store a string for anything else",
            )
        if isinstance(value, dict):
            todo.extend((v, f"{path}.{k}") for k, v in value.items())
        elif isinstance(value, list):
            todo.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
