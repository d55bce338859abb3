"""Body mappings <-> protobuf messages of ``proto/engine_channel.proto``.

A logged row's ``kind`` is the ``UpMessage`` oneof name and its body the
inner message as a plain mapping with proto field names (SPEC "Control vs
data")::

    event             {"type", "severity", "payload", "ts"}
    finding           {"fields"}
    approval_request  {"request_id", "action", "details"}
    done              {"status", "findings", "coverage", "exit_reason"}
    progress          {"marker", "digests"}

and the first row of a transaction given a marker, for an engine that keeps
the resume point, also ``"progress": {"marker", "digests"}`` (the message's
``transaction`` field).

The same shapes come back from :func:`body_of` (used by the local engine and
by ``export``); Struct numbers come back as floats. This module loads
protobuf, never grpc.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.protobuf.struct_pb2 import Struct

from walchannel._proto import down_lenient_pb2 as lenient
from walchannel._proto import engine_channel_pb2 as pb

__all__ = [
    "ResumePoint",
    "resume_point",
    "row_digest",
    "continues_transaction",
    "ROW_LOST_TYPE",
    "CONTROL_KINDS",
    "DATA_KINDS",
    "DecodedDown",
    "DownDecodeError",
    "body_of",
    "decode_down",
    "handshake_message",
    "heartbeat_message",
    "struct_to_dict",
    "up_message",
]

#: The type of the event that takes a quarantined row's seq (SPEC "The log");
#: an engine that keeps the resume point reads it (:func:`continues_transaction`).
ROW_LOST_TYPE: Final = "walchannel.row_lost"
#: Kinds that get a seq and go through the log.
DATA_KINDS: Final = ("event", "finding", "approval_request", "done", "progress")
#: Kinds written directly at seq 0, never logged.
CONTROL_KINDS: Final = ("handshake", "heartbeat")


def up_message(
    run_id: str, correlation_id: str, seq: int, kind: str, body: Mapping[str, Any]
) -> pb.UpMessage:
    """Build the ``UpMessage`` for a logged row.

    Args:
        run_id, correlation_id: the run's identifiers.
        seq: the row's seq (>= 1).
        kind: one of :data:`DATA_KINDS`.
        body: the body mapping in the shape above (already checked).

    Returns:
        The message, ready to serialize.

    Raises:
        ValueError: unknown ``kind`` or a body of the wrong shape.
    """
    msg = pb.UpMessage(run_id=run_id, correlation_id=correlation_id, seq=seq)
    try:
        if kind == "finding":
            # SetInParent: an empty Struct must still select the oneof.
            msg.finding.fields.SetInParent()
            msg.finding.fields.update(body["fields"])
        elif kind == "event":
            ev = msg.event
            ev.type = body["type"]
            ev.severity = body["severity"]
            ev.payload.SetInParent()
            ev.payload.update(body["payload"])
            ev.ts = body["ts"]
        elif kind == "approval_request":
            ar = msg.approval_request
            ar.request_id = body["request_id"]
            ar.action = body["action"]
            ar.details.SetInParent()
            ar.details.update(body["details"])
        elif kind == "done":
            done = msg.done
            done.SetInParent()
            done.status = body["status"]
            done.findings = body["findings"]
            done.coverage.extend(body["coverage"])
            done.exit_reason = body["exit_reason"]
        elif kind == "progress":
            msg.progress.marker.SetInParent()
            msg.progress.marker.update(body["marker"])
            msg.progress.row_digests.extend(body["digests"])
        else:
            raise ValueError(f"unknown row kind {kind!r} (seq {seq})")
        if kind != "progress" and (point := body.get("progress")) is not None:
            msg.transaction.marker.SetInParent()
            msg.transaction.marker.update(point["marker"])
            msg.transaction.row_digests.extend(point["digests"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{kind} body of seq {seq} has the wrong shape: {exc!r}") from None
    return msg


def handshake_message(
    run_id: str,
    correlation_id: str,
    connector_version: str,
    harness_name: str,
    harness_version: str,
    *,
    writer_id: str = "",
    writer_epoch: int = 0,
    take_over: bool = False,
) -> pb.UpMessage:
    """Build the handshake (a control message at seq 0).

    Args:
        run_id, correlation_id: the run's identifiers.
        connector_version, harness_name, harness_version: the harness's fields.
        writer_id, writer_epoch: the log's writer identity ("" and 0: none,
            as an older client sends); SPEC "Wire contract".
        take_over: ask the engine to make this writer the run's owner.
    """
    return pb.UpMessage(
        run_id=run_id,
        correlation_id=correlation_id,
        seq=0,
        handshake=pb.Handshake(
            connector_version=connector_version,
            harness_name=harness_name,
            harness_version=harness_version,
            writer_id=writer_id,
            writer_epoch=writer_epoch,
            take_over=take_over,
        ),
    )


def heartbeat_message(run_id: str, correlation_id: str, ts: str) -> pb.UpMessage:
    """Build a heartbeat (a control message at seq 0); ``ts`` is RFC 3339 UTC."""
    return pb.UpMessage(
        run_id=run_id, correlation_id=correlation_id, seq=0, heartbeat=pb.Heartbeat(ts=ts)
    )


def struct_to_dict(struct: Struct) -> dict[str, Any]:
    """Return a Struct as a plain dict (numbers as floats)."""
    return json_format.MessageToDict(struct)


def body_of(msg: pb.UpMessage) -> tuple[str, dict[str, Any]]:
    """Return ``(kind, body mapping)`` of an up-message, shapes as in the module doc.

    Control messages come back too: ``handshake`` as its fields (the
    writer's too: ``writer_id``, ``writer_epoch``, ``take_over``),
    ``heartbeat`` as ``{"ts"}``; an empty body as ``("", {})``.
    """
    kind, body = _body_of(msg)
    if msg.HasField("transaction") and kind != "progress":
        body["progress"] = {
            "marker": struct_to_dict(msg.transaction.marker),
            "digests": [int(d) for d in msg.transaction.row_digests],
        }
    return kind, body


def _body_of(msg: pb.UpMessage) -> tuple[str, dict[str, Any]]:
    kind = msg.WhichOneof("body")
    if kind == "finding":
        return kind, {"fields": struct_to_dict(msg.finding.fields)}
    if kind == "event":
        ev = msg.event
        return kind, {
            "type": ev.type,
            "severity": ev.severity,
            "payload": struct_to_dict(ev.payload),
            "ts": ev.ts,
        }
    if kind == "approval_request":
        ar = msg.approval_request
        return kind, {
            "request_id": ar.request_id,
            "action": ar.action,
            "details": struct_to_dict(ar.details),
        }
    if kind == "done":
        done = msg.done
        return kind, {
            "status": done.status,
            "findings": int(done.findings),
            "coverage": list(done.coverage),
            "exit_reason": done.exit_reason,
        }
    if kind == "progress":
        progress = msg.progress
        return kind, {
            "marker": struct_to_dict(progress.marker),
            "digests": [int(d) for d in progress.row_digests],
        }
    if kind == "handshake":
        hs = msg.handshake
        return kind, {
            "connector_version": hs.connector_version,
            "harness_name": hs.harness_name,
            "harness_version": hs.harness_version,
            "writer_id": hs.writer_id,
            "writer_epoch": int(hs.writer_epoch),
            "take_over": hs.take_over,
        }
    if kind == "heartbeat":
        return kind, {"ts": msg.heartbeat.ts}
    return "", {}


@dataclass(frozen=True)
class ResumePoint:
    """The engine's resume point, from its answer to a handshake (SPEC "Wire contract").

    Attributes:
        marker: the last progress marker the engine applied for the run
            (its numbers back to ints), or None while it applied none.
        seq: the seq after which the marker's transaction's rows begin (its
            ``progress`` row's own seq, or the seq before the row carrying
            it; 0: none).
        applied: the answer's ``h``.
        digests: :func:`row_digest` of each row of the marker's transaction,
            in order.
        rows: how many of them the engine applied (the first ``rows``): the
            rows its writer wrote after the marker that are the transaction's
            next, in order, up to their number (:func:`continues_transaction`);
            the first that is not (another writer's, a renumbered log's own)
            ends the count.
    """

    marker: dict[str, Any] | None
    seq: int
    applied: int
    digests: tuple[int, ...] = ()
    rows: int = 0

    @property
    def complete(self) -> bool:
        """Every row of the marker's transaction was applied (the marker holds)."""
        return self.rows >= len(self.digests)


def resume_point(ack: pb.Ack) -> ResumePoint | None:
    """Return the resume point an ``Ack`` carries, or None when it announces none.

    Raises:
        ValueError: the point's seq is above the ack's ``h`` (no engine
            applied a marker above what it holds), it counts more rows
            applied than its digests or than ``h`` holds, or its marker holds
            a number that is not an integer (the client sends none).
    """
    if not ack.HasField("resume"):
        return None
    point = ack.resume
    seq, applied, rows = int(point.seq), int(ack.seq), int(point.rows)
    if seq > applied:
        raise ValueError(f"a resume point at seq {seq}, above the Ack({applied}) it came in")
    digests = tuple(int(d) for d in point.row_digests)
    if rows > len(digests) or seq + rows > applied:
        raise ValueError(
            f"a resume point with {rows} rows applied of {len(digests)} after seq {seq},"
            f" in an Ack({applied})"
        )
    if not point.HasField("marker"):
        return ResumePoint(None, seq, applied, digests, rows)
    marker = _integers(struct_to_dict(point.marker), "marker")
    return ResumePoint(marker, seq, applied, digests, rows)


def row_digest(kind: str, body: Mapping[str, Any]) -> int:
    """Return a 64-bit digest of a row's content, the same for the same content logged again.

    The sha256 of the body as canonical JSON (sorted keys, a whole number as
    an integer: ``1`` and the Struct's ``1.0`` are one content); an event's
    ``ts``, when it was logged and not what it says, is left out, and so is
    the marker a transaction's first row carries. The client computes it from
    the bodies it logs, an engine from the bodies it decodes (:func:`body_of`).
    SPEC "The engine keeps the resume point".

    Args:
        kind: the row's kind (``event``, ``finding``, ...).
        body: its body mapping (the shapes above).

    Returns:
        The digest, an int in ``[0, 2**64)``.
    """
    # Not the stamp, nor the marker a first row carries: what the row says.
    left_out = ("ts", "progress") if kind == "event" else ("progress",)
    content = {k: _canonical(v) for k, v in body.items() if k not in left_out}
    text = json.dumps([kind, content], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def _canonical(value: Any) -> Any:
    # A Struct holds doubles: what the client logged as 1 an engine decodes as 1.0.
    # Exact types first: this walk runs for every row of a transaction (1.7 us
    # for a finding of eight fields, against 3.7 us by isinstance alone).
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return value
    if t is dict:
        return {k: _canonical(v) for k, v in value.items()}
    if t is list or t is tuple:
        return [_canonical(v) for v in value]
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def continues_transaction(kind: str, body: Mapping[str, Any], digest: int) -> bool:
    """Tell whether an applied row is the next row of the engine's open transaction.

    The engine's side of the resume point (SPEC "The engine keeps the resume
    point"): the row is the one whose digest is ``digest``, or the
    ``walchannel.row_lost`` event the client sent in its place (the row set
    aside for its size: the event's payload names the row's ``digest`` in 16
    lowercase hex digits). A harness's own event of that type is a row like
    any other: its own digest counts too. Any other row ends the
    transaction's count.

    Args:
        kind: the applied row's kind.
        body: its body, as :func:`body_of` returns it.
        digest: the next of the transaction's digests.

    Returns:
        True when the row counts as the transaction's next.
    """
    if kind == "event" and body.get("type") == ROW_LOST_TYPE:
        payload = body.get("payload")
        if isinstance(payload, Mapping) and payload.get("digest") == f"{digest:016x}":
            return True
    return row_digest(kind, body) == digest


def _integers(value: Any, path: str) -> Any:
    """A marker from a Struct with its numbers back to ints (markers hold no others)."""
    if isinstance(value, dict):
        return {k: _integers(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_integers(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"a resume point whose {path} is {value!r}, not an integer")
        return int(value)
    return value


# -- down messages: the client's own parse (SPEC "Down messages") ---------------------------


class DownDecodeError(ValueError):
    """A down message that cannot be parsed at all: a protocol error of the engine."""


@dataclass(frozen=True, slots=True)
class DecodedDown:
    """A parsed down message.

    Attributes:
        message: the message, every text valid (``U+FFFD`` where the engine
            sent bytes that are not UTF-8).
        repaired: the fields whose text was not valid UTF-8 (``stop.reason``,
            ``budget_update.details.<key>``), in the order met; () for none.
    """

    message: pb.DownMessage
    repaired: tuple[str, ...] = ()


def decode_down(data: bytes) -> DecodedDown:
    """Parse a serialized ``DownMessage``; text that is not UTF-8 is repaired, not refused.

    An engine in C++ or Go may cut a text mid-character (protobuf #4970):
    Python's protobuf refuses the whole message. Parsed again with every
    string read as bytes (``proto/down_lenient.proto``), each text is
    decoded with replacement characters (never surrogates: SQLite cannot
    store them), so a ``Stop`` still stops and a decision still decides.

    Args:
        data: the message as the engine sent it.

    Returns:
        The message, and which fields were repaired.

    Raises:
        DownDecodeError: it is not a ``DownMessage`` even read as bytes.
    """
    try:
        return DecodedDown(pb.DownMessage.FromString(data))
    except DecodeError as exc:
        strict = exc
    try:
        raw = lenient.DownMessage.FromString(data)
    except DecodeError as exc:
        said = str(exc).replace("walchannel.lenient.", "")
        raise DownDecodeError(
            f"a {len(data)}-byte down message that is not a DownMessage ({said})"
        ) from None
    repaired: list[str] = []
    message = _repaired(raw, repaired)
    if not repaired:
        # Parsed as bytes, every text valid: the strict parse failed for another reason.
        raise DownDecodeError(f"a {len(data)}-byte down message that does not parse ({strict})")
    return DecodedDown(message, tuple(repaired))


def _text(raw: bytes, path: str, repaired: list[str]) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        repaired.append(path)
        return raw.decode(errors="replace")


def _repaired(raw: lenient.DownMessage, repaired: list[str]) -> pb.DownMessage:
    kind = raw.WhichOneof("body")
    if kind == "stop":
        return pb.DownMessage(stop=pb.Stop(reason=_text(raw.stop.reason, "stop.reason", repaired)))
    if kind == "approval_decision":
        d = raw.approval_decision
        return pb.DownMessage(
            approval_decision=pb.ApprovalDecision(
                request_id=_text(d.request_id, "approval_decision.request_id", repaired),
                approved=d.approved,
                reason=_text(d.reason, "approval_decision.reason", repaired),
            )
        )
    if kind == "budget_update":
        b = raw.budget_update
        details = Struct()
        details.update(_struct(b.details, "budget_update.details", repaired))
        return pb.DownMessage(
            budget_update=pb.BudgetUpdate(
                message=_text(b.message, "budget_update.message", repaired), details=details
            )
        )
    if kind == "ack":
        ack = pb.Ack(seq=raw.ack.seq)
        if raw.ack.HasField("resume"):
            resume = raw.ack.resume
            ack.resume.SetInParent()
            ack.resume.seq = resume.seq
            ack.resume.row_digests.extend(resume.row_digests)
            ack.resume.rows = resume.rows
            if resume.HasField("marker"):
                ack.resume.marker.SetInParent()
                ack.resume.marker.update(_struct(resume.marker, "ack.resume.marker", repaired))
        return pb.DownMessage(ack=ack)
    return pb.DownMessage()


def _struct(raw: lenient.Struct, path: str, repaired: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in raw.fields:
        key = _text(entry.key, f"{path} (a key)", repaired)
        out[key] = _value(entry.value, f"{path}.{key}", repaired)  # the last of a key wins
    return out


def _value(raw: lenient.Value, path: str, repaired: list[str]) -> Any:
    kind = raw.WhichOneof("kind")
    if kind == "number_value":
        return raw.number_value
    if kind == "string_value":
        return _text(raw.string_value, path, repaired)
    if kind == "bool_value":
        return raw.bool_value
    if kind == "struct_value":
        return _struct(raw.struct_value, path, repaired)
    if kind == "list_value":
        return [_value(v, f"{path}[{i}]", repaired) for i, v in enumerate(raw.list_value.values)]
    return None  # null_value, or no kind set (as Struct reads it)
