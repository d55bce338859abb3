"""What a stream's end says: its gRPC status read code first, its details through one table.

The engine (and gRPC itself) explain the end of a stream only in a status:
a code and free-text details. Every reading of those details lives here,
in :data:`PATTERNS`: a row per (status code, pattern, meaning), tried in
order for the end's code, the first match winning. No other module looks
inside a status's details; the driver asks :func:`read_end` (and the
wrappers below, for the tools and the tests) and decides from the meaning.
Pure functions of their arguments: no I/O, no state. SPEC "Reconnect",
"Engine duties" and "Down messages".
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final, NamedTuple

from walchannel.errors import OWNED_BY_ANOTHER_WRITER, WRITER_FENCED

__all__ = [
    "LOST_STATUS_DETAILS",
    "PATTERNS",
    "DownTooLarge",
    "EndRead",
    "Meaning",
    "Pattern",
    "SizeRefusal",
    "describe_end",
    "engine_refusal",
    "is_too_many_pings",
    "parse_receive_limit",
    "parse_size_refusal",
    "read_end",
    "run_completed_by",
    "status_lost",
]


class Meaning(enum.Enum):
    """What a status's details say (:data:`PATTERNS`)."""

    #: FAILED_PRECONDITION "owned by another writer ..." or "writer fenced ...":
    #: the engine refuses this writer (SPEC "Engine duties").
    WRITER_REFUSED = "writer_refused"
    #: FAILED_PRECONDITION "... run completed [by writer ID] ...".
    RUN_COMPLETED = "run_completed"
    #: RESOURCE_EXHAUSTED "CLIENT: Received message larger than max [(N vs. M)]":
    #: a down message over this channel's own receive limit.
    DOWN_TOO_LARGE = "down_too_large"
    #: RESOURCE_EXHAUSTED on the client side in words not known: no refusal.
    CLIENT_SIDE = "client_side"
    #: RESOURCE_EXHAUSTED "... larger than max (N vs. M)" (C-core, Go, Node)
    #: or "... exceeds maximum size M: N" (Java): the engine's receive limit.
    SIZE_REFUSAL = "size_refusal"
    #: INTERNAL "Internal error from Core": grpc.aio's stand-in for a status
    #: it lost to a write in flight (grpc/grpc#36066).
    STATUS_LOST = "status_lost"
    #: FAILED_PRECONDITION "... expected seq N ...": the engine refused a seq
    #: above the one it takes next (SPEC "Engine duties"); group 1 is N.
    EXPECTED_SEQ = "expected_seq"


@dataclass(frozen=True, slots=True)
class Pattern:
    """One row of :data:`PATTERNS`.

    Attributes:
        code: the gRPC status name the row applies to.
        meaning: what a match says.
        pattern: searched in the details (anchors and case are the pattern's).
        sizes: for a size, which groups hold ``(received, limit)`` (1-based).
    """

    code: str
    meaning: Meaning
    pattern: re.Pattern[str]
    sizes: tuple[int, int] = (1, 2)


# What grpc.aio reports, in place of the engine's status, when a write was in
# flight as the stream ended (grpc/grpc#36066; grpcio 1.85 still does).
LOST_STATUS_DETAILS: Final = "Internal error from Core"

#: Every reading of a status's details, by code, in the order tried.
PATTERNS: Final[tuple[Pattern, ...]] = (
    Pattern(
        "FAILED_PRECONDITION",
        Meaning.WRITER_REFUSED,
        re.compile(
            rf"\A\s*({re.escape(OWNED_BY_ANOTHER_WRITER)}|{re.escape(WRITER_FENCED)})", re.I
        ),
    ),
    # "run completed by writer <id>": the engine names the writer whose Done it applied.
    Pattern(
        "FAILED_PRECONDITION",
        Meaning.RUN_COMPLETED,
        re.compile(r"run completed by writer ([0-9A-Za-z_.:-]+)", re.I),
    ),
    Pattern("FAILED_PRECONDITION", Meaning.RUN_COMPLETED, re.compile(r"run completed", re.I)),
    Pattern("FAILED_PRECONDITION", Meaning.EXPECTED_SEQ, re.compile(r"expected seq (\d+)", re.I)),
    # grpcio's own text (C-core, "CLIENT: " in front since about 1.60; grpcio
    # >= 1.85.1 is required): "Received message larger than max (N vs. M)".
    Pattern(
        "RESOURCE_EXHAUSTED",
        Meaning.DOWN_TOO_LARGE,
        re.compile(r"client: received message larger than max(?: \((\d+) vs\.? (\d+)\))?", re.I),
    ),
    # A compressed down message inflated past the limit: grpcio says only
    # this (no sizes, no "CLIENT:"). walchannel never compresses what it
    # sends, so the engine cannot have inflated one of ours.
    Pattern(
        "RESOURCE_EXHAUSTED",
        Meaning.DOWN_TOO_LARGE,
        re.compile(r"decompressed message larger than max", re.I),
    ),
    # The client's own limits read like the engine's but for this marker:
    # they say nothing about our rows.
    Pattern("RESOURCE_EXHAUSTED", Meaning.CLIENT_SIDE, re.compile(r"client:", re.I)),
    # gRPC C-core (Python, C++, ...; "SERVER: " in front since about 1.60),
    # grpc-go ("grpc: received message larger than max (N vs. M)") and
    # grpc-node: "... larger than max (N vs. M)".
    Pattern(
        "RESOURCE_EXHAUSTED",
        Meaning.SIZE_REFUSAL,
        re.compile(r"received message larger than max \((\d+) vs\.? (\d+)\)", re.I),
    ),
    # grpc-java: "gRPC message exceeds maximum size M: N".
    Pattern(
        "RESOURCE_EXHAUSTED",
        Meaning.SIZE_REFUSAL,
        re.compile(r"message exceeds maximum size (\d+): (\d+)", re.I),
        sizes=(2, 1),
    ),
    Pattern("INTERNAL", Meaning.STATUS_LOST, re.compile(rf"\A{re.escape(LOST_STATUS_DETAILS)}\Z")),
)

# A GOAWAY's reason, in the details or gRPC's debug string, whatever the code.
_TOO_MANY_PINGS: Final = re.compile(r"too_many_pings|too many pings", re.I)


class EndRead(NamedTuple):
    """A status read through :data:`PATTERNS`.

    Attributes:
        meaning: the first row's meaning that matched; None: no row did.
        match: that row's match (its groups: the writer, the sizes).
        row: that row.
    """

    meaning: Meaning | None
    match: re.Match[str] | None
    row: Pattern | None


_NOTHING: Final = EndRead(None, None, None)


def read_end(code: str | None, details: str | None) -> EndRead:
    """Read a stream's end status: its code first, then its details through :data:`PATTERNS`.

    Args:
        code: the gRPC status name (``"FAILED_PRECONDITION"``); None when
            none is known.
        details: the status details.

    Returns:
        The first matching row's meaning and match; ``(None, None, None)``
        when no row of the code matches (or there is no code or detail).
    """
    if code is None or not details:
        return _NOTHING
    for row in PATTERNS:
        if row.code == code:
            found = row.pattern.search(details)
            if found is not None:
                return EndRead(row.meaning, found, row)
    return _NOTHING


def engine_refusal(code: str | None, details: str | None) -> str | None:
    """Read a stream's end as the engine refusing this writer; the prefix said, or None.

    Only FAILED_PRECONDITION whose details begin with
    :data:`~walchannel.errors.OWNED_BY_ANOTHER_WRITER` or
    :data:`~walchannel.errors.WRITER_FENCED` (any case) counts. SPEC
    "Engine duties".

    Args:
        code: the gRPC status name.
        details: the status details.
    """
    read = read_end(code, details)
    if read.meaning is not Meaning.WRITER_REFUSED or read.match is None:
        return None
    return read.match.group(1).lower()


def run_completed_by(code: str | None, details: str | None) -> tuple[bool, str | None]:
    """Read a stream's end as the engine saying the run is completed, and by which writer.

    FAILED_PRECONDITION whose details say "run completed" (any case), and
    "run completed by writer ID" when the engine names the writer whose
    ``Done`` it applied. SPEC "Reconnect".

    Returns:
        ``(completed, writer id or None)``.
    """
    read = read_end(code, details)
    if read.meaning is not Meaning.RUN_COMPLETED or read.match is None:
        return False, None
    return True, read.match.group(1) if read.match.re.groups else None


def describe_end(code: str | None, details: str | None) -> str:
    """The text of a stream's end for logs and ``last_error``: ``"CODE: details"``.

    grpc.aio can replace the engine's status with ``INTERNAL: Internal error
    from Core`` when a write races the end of the call (grpc/grpc#36066): the
    text says so, so an operator does not chase an engine bug. The channel
    reconnects either way and the next dial learns the engine's real answer.
    """
    text = f"{code}: {details or ''}"
    if status_lost(code, details):
        text += (
            " (the stream ended during a write, and gRPC reported this in place"
            " of the engine's status: grpc/grpc#36066; the next dial learns it)"
        )
    return text


def status_lost(code: str | None, details: str | None) -> bool:
    """Tell whether a stream's end is grpc.aio's stand-in for a status it lost (grpc/grpc#36066).

    Args:
        code: the gRPC status name.
        details: the status details.
    """
    return read_end(code, details).meaning is Meaning.STATUS_LOST


def is_too_many_pings(text: str) -> bool:
    """Tell whether ``text`` (details and debug string) holds GOAWAY ``too_many_pings``."""
    return _TOO_MANY_PINGS.search(text) is not None


# -- sizes ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SizeRefusal:
    """The engine ended a stream because a message was over its receive limit.

    Attributes:
        received: the size of the message it refused (bytes).
        limit: its receive limit (bytes), below ``received``.
    """

    received: int
    limit: int


def parse_size_refusal(code: str | None, details: str | None) -> SizeRefusal | None:
    """Read a stream's end as the engine refusing an up-message for its size, or None.

    Only RESOURCE_EXHAUSTED whose details give both sizes, the received one
    over the limit, and that is not the client's own receive limit
    (``CLIENT:``, a down message too large for us) counts.

    Args:
        code: the gRPC status name (``"RESOURCE_EXHAUSTED"``).
        details: the status details.
    """
    read = read_end(code, details)
    if read.meaning is not Meaning.SIZE_REFUSAL or read.match is None or read.row is None:
        return None
    at_received, at_limit = read.row.sizes
    received, limit = int(read.match.group(at_received)), int(read.match.group(at_limit))
    if received <= limit:
        return None
    return SizeRefusal(received, limit)


@dataclass(frozen=True, slots=True)
class DownTooLarge:
    """A down message was over the channel's receive limit (``max_receive_message_bytes``).

    Attributes:
        received: its size (bytes), None when gRPC did not say.
        limit: the limit in force (bytes), None when gRPC did not say.
        compressed: it came compressed and inflated past the limit (gRPC
            then gives no sizes).
    """

    received: int | None
    limit: int | None
    compressed: bool = False


def parse_receive_limit(code: str | None, details: str | None) -> DownTooLarge | None:
    """Read a stream's end as a down message over the channel's own receive limit, or None.

    The status code first: only RESOURCE_EXHAUSTED, whose details are gRPC's
    client-side "CLIENT: Received message larger than max (N vs. M)" (the
    sizes optional). The engine's limit refusing an up-message reads the
    same with ``SERVER:`` (or nothing) in front: :func:`parse_size_refusal`.
    SPEC "Down messages".

    Args:
        code: the gRPC status name (``"RESOURCE_EXHAUSTED"``).
        details: the status details.
    """
    read = read_end(code, details)
    if read.meaning is not Meaning.DOWN_TOO_LARGE or read.match is None:
        return None
    if "decompressed" in read.match.group(0).lower():
        return DownTooLarge(None, None, compressed=True)
    received, limit = read.match.group(1), read.match.group(2)
    if received is None or limit is None:
        return DownTooLarge(None, None)
    return DownTooLarge(int(received), int(limit))
