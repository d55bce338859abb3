"""What the engine refuses, and what walchannel says of it (pure).

Three refusals: a writer the engine will not take (:func:`fenced_error`,
the one text of a log that may not write its run, for the channel and
``walchannel flush``); an up-message over the engine's receive limit
(which row it was, whether it is set aside: :func:`pick_refused_row`,
:func:`refusal_sets_aside`, :func:`unproven_refusal`); a down message
over the channel's own limit (:func:`down_too_large_text` and its reader
:func:`receive_limit_in`, for the tools). What a status *says* is read in
:mod:`walchannel.core.end_status`; this decides and words. SPEC "Engine
duties", "Down messages"; docs/design.md.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from walchannel.core.end_status import DownTooLarge, SizeRefusal
from walchannel.errors import WriterFencedError
from walchannel.log.state import Writer

__all__ = [
    "RefusalVerdict",
    "down_too_large_text",
    "fenced_error",
    "pick_refused_row",
    "receive_limit_in",
    "refusal_sets_aside",
    "unproven_refusal",
]

# -- how a stream ended --------------------------------------------------------------------


def fenced_error(
    run_id: str,
    path: str,
    writer: Writer | None,
    why: str,
    *,
    engine_high: int | None = None,
    answered: bool | None = None,
) -> WriterFencedError:
    """The :class:`~walchannel.errors.WriterFencedError` of a log that may not write its run.

    The one text, for the channel and ``walchannel flush``: who, why, where
    the rows stay, and the next steps (for a log no engine ever answered,
    first: check the log folder; then review the rows, or take the run over).

    Args:
        run_id: the run.
        path: the log file ("" when unknown).
        writer: the log's writer identity (None: unknown).
        why: the cause.
        engine_high: the engine's high-water, when the evidence is the log's own.
        answered: an engine ever answered this log (None: as ``writer`` says).
    """
    who = f"writer {writer.id} (epoch {writer.epoch})" if writer is not None else "this writer"
    log = shlex.quote(path) if path else "LOG"
    # A log no engine ever answered is most often a harness started on the wrong
    # folder (issue 58): say that first, before the takeover and its cost.
    where = ""
    if answered is None:
        answered = writer is None or writer.answered
    if not answered:
        where = (
            " If this harness ran before, check wal_dir / WALCHANNEL_DIR: its log is not"
            f" where it was (this one is {path or 'new'}); fix the folder and restart."
        )
    return WriterFencedError(
        f"run {run_id}: not this log's to write ({who}): {why}.{where} Every row stays in "
        f"{path or 'the log'}; review them with 'walchannel export {log}', or take "
        f"the run over with 'walchannel takeover {log}' and start again (a new log under "
        "the runner resumes from the engine's resume point where the engine keeps one; "
        "else what the other writer delivered then comes again, unless the harness resumes "
        "from its own record)",
        run_id=run_id,
        path=path,
        writer_id=writer.id if writer is not None else None,
        engine_high=engine_high,
    )


# -- a row the engine refuses for its size -------------------------------------------------


@dataclass(frozen=True, slots=True)
class RefusalVerdict:
    """Which in-flight row a :class:`SizeRefusal` proves refused.

    Attributes:
        seq: the row to set aside, or None when no row is proven.
        suspect: the first in-flight row over the limit (the one the engine
            met first), or None when no in-flight row is over it.
        suspect_size: its encoded size (bytes), or None.
    """

    seq: int | None
    suspect: int | None = None
    suspect_size: int | None = None


def pick_refused_row(in_flight: Iterable[tuple[int, int]], refusal: SizeRefusal) -> RefusalVerdict:
    """Decide which row the engine refused, so that no acceptable row is ever set aside.

    The engine reads a stream's messages in order and refuses the first one
    over its limit; every row written before it on the stream was no larger
    than the limit. So the refused row is the first in-flight row (written
    on the stream, not acked), in seq order, whose encoded size is over
    ``refusal.limit`` — and it counts as proven only when its size is
    exactly ``refusal.received``. Anything else (no row over the limit, or
    a size that differs: a proxy's limit, compression) proves nothing.

    Args:
        in_flight: ``(seq, encoded UpMessage size in bytes)`` of the rows
            above the received ack up to the highest seq written on the
            stream, in seq order; read lazily, up to the first row over the
            limit.
        refusal: what the engine said.
    """
    for seq, size in in_flight:
        if size > refusal.limit:
            if size == refusal.received:
                return RefusalVerdict(seq, seq, size)
            return RefusalVerdict(None, seq, size)
    return RefusalVerdict(None)


def refusal_sets_aside(kind: str) -> bool:
    """Tell whether a refused row of ``kind`` is set aside (True) or stops the channel.

    Every kind is set aside into the quarantine, with a ``walchannel.row_lost``
    event at its seq so later rows flow — except ``done``: it is the last
    row, nothing waits behind it, and replacing it would leave the run
    never completing; the channel stops with a clear error instead and the
    row stays in the log (docs/design.md).
    """
    return kind != "done"


def unproven_refusal(verdict: RefusalVerdict, refusal: SizeRefusal, *, handshake_size: int) -> str:
    """Say why a size refusal proves no row refused, so nothing is set aside.

    For the ERROR line and ``last_error`` when :func:`pick_refused_row`
    found no proven row (``verdict.seq`` is None): the refused size is the
    handshake's, no row written on the stream is over the limit, or the
    first one over it has another size.

    Args:
        verdict: what ``pick_refused_row`` decided.
        refusal: what the engine said (sizes in bytes).
        handshake_size: the encoded handshake's size (bytes).
    """
    if verdict.suspect is None and handshake_size == refusal.received:
        return "it is the handshake: shorten connector_version, harness_name or harness_version"
    if verdict.suspect is None:
        return f"no row written on the stream is over the engine's limit of {refusal.limit} bytes"
    return (
        f"the first row over the limit, seq {verdict.suspect} "
        f"({verdict.suspect_size} bytes), is not the refused "
        f"{refusal.received}-byte message"
    )


# -- a down message over the channel's receive limit ---------------------------------------


def down_too_large_text(found: DownTooLarge, configured: int) -> str:
    """Say that a down message was over the receive limit, naming the field to raise.

    For the ERROR line and ``last_error`` (SPEC "Down messages").

    Args:
        found: what gRPC said (:func:`parse_receive_limit`).
        configured: the config's ``max_receive_message_bytes`` (bytes), said
            when gRPC gave no limit.
    """
    limit = configured if found.limit is None else found.limit
    if found.compressed:
        return (
            f"a compressed down message exceeded max_receive_message_bytes ({limit}) once"
            " inflated (gRPC gives no size for a compressed one): raise it in the config; the"
            " rows wait in the log and the channel keeps retrying"
        )
    what = "a down message" if found.received is None else f"a {found.received}-byte down message"
    return (
        f"{what} exceeded max_receive_message_bytes ({limit}): raise it in the config; "
        "the rows wait in the log and the channel keeps retrying"
    )


_SAID_TOO_LARGE = re.compile(
    r"(?:a (\d+)-byte|a|a (compressed)) down message exceeded max_receive_message_bytes \((\d+)\)"
)


def receive_limit_in(text: str | None) -> DownTooLarge | None:
    """Read :func:`down_too_large_text`'s words back from a ``last_error``, or None.

    For the tools that read a stored or reported error (``flush``'s failure,
    ``inspect``'s next step): they name their own way to raise the limit.

    Args:
        text: a ``last_error`` (None: none).

    Returns:
        The message's size (None if it was not said) and the limit in force.
    """
    found = _SAID_TOO_LARGE.search(text or "")
    if found is None:
        return None
    size = found.group(1)
    return DownTooLarge(
        int(size) if size else None, int(found.group(3)), compressed=found.group(2) is not None
    )
