"""Turning ``send_*`` arguments into checked row bodies (SPEC "Control vs data").

Shared by :class:`~walchannel.GrpcEngineChannel` and the in-memory test
double, so both refuse exactly the same input with the same
:class:`~walchannel.errors.PayloadError`. Every check runs before anything
is logged and before a seq is used.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from walchannel.errors import PayloadError
from walchannel.payload import MAX_VALUES, check_text, plain_payload

__all__ = [
    "MAX_PROGRESS_BYTES",
    "approval_body",
    "done_body",
    "event_body",
    "finding_body",
    "now_rfc3339",
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


def _timestamp(ts: object, path: str) -> str:
    if ts is None:
        return now_rfc3339()
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            raise PayloadError(path, "naive datetime; pass an aware one (e.g. tzinfo=UTC)")
        return _in_utc(ts, path)
    if isinstance(ts, str):
        try:
            parsed = datetime.fromisoformat(ts)
        except ValueError:
            raise PayloadError(path, f"{ts[:40]!r} is not an RFC 3339 timestamp") from None
        if parsed.tzinfo is None:
            raise PayloadError(path, f"{ts[:40]!r} has no UTC offset")
        return _in_utc(parsed, path)
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

    ``ts`` is an aware datetime, an RFC 3339 str (stored in UTC) or None (now);
    ``max_values`` bounds the payload (:func:`~walchannel.payload.check_payload`).

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
        max_values: the bound on values (:func:`~walchannel.payload.check_payload`).

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


def approval_body(
    request_id: str,
    action: str,
    details: Mapping[str, Any],
    *,
    max_values: int = MAX_VALUES,
) -> dict[str, Any]:
    """Return the ``approval_request`` body ``{"request_id", "action", "details"}``.

    ``max_values`` bounds ``details`` (:func:`~walchannel.payload.check_payload`).

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

    Raises:
        PayloadError: naming the bad value's path under ``progress``.
    """
    if progress is None:
        return None
    # Each value takes at least a byte of JSON: the bound keeps a marker of
    # shared containers from expanding in json.dumps.
    marker = plain_payload(progress, "progress", max_values=MAX_PROGRESS_BYTES)
    size = len(json.dumps(marker, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    if size > MAX_PROGRESS_BYTES:
        raise PayloadError(
            "progress", f"{size} bytes of JSON, over {MAX_PROGRESS_BYTES}: keep the marker small"
        )
    return marker
