"""Body mappings <-> protobuf messages of ``proto/engine_channel.proto``.

A logged row's ``kind`` is the ``UpMessage`` oneof name and its body the
inner message as a plain mapping with proto field names (SPEC "Control vs
data")::

    event             {"type", "severity", "payload", "ts"}
    finding           {"fields"}
    approval_request  {"request_id", "action", "details"}
    done              {"status", "findings", "coverage", "exit_reason"}

The same shapes come back from :func:`body_of` (used by the local engine and
by ``export``); Struct numbers come back as floats. This module loads
protobuf, never grpc.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from google.protobuf import json_format

from walchannel._proto import engine_channel_pb2 as pb

if TYPE_CHECKING:
    from google.protobuf.struct_pb2 import Struct

__all__ = [
    "CONTROL_KINDS",
    "DATA_KINDS",
    "body_of",
    "handshake_message",
    "heartbeat_message",
    "struct_to_dict",
    "up_message",
]

#: Kinds that get a seq and go through the log.
DATA_KINDS: Final = ("event", "finding", "approval_request", "done")
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
        else:
            raise ValueError(f"unknown row kind {kind!r} (seq {seq})")
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
