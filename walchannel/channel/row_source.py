"""Where the writer's rows come from: the in-memory tail, readahead from disk, encoding.

SPEC "The channel", "The log is the queue": what is written to the stream
comes from the log in seq order — from a small bounded tail of rows already
committed, else read from disk a batch at a time — so memory stays flat
however large the backlog is, and replay and live sends never interleave.
The tail holds the committed msgpack bytes, never the caller's dicts, which
a harness may change once ``send_*`` returned.

No gRPC here: rows become ``UpMessage`` bytes through :mod:`walchannel.wire.protobuf`
(protobuf only); the stream driver (:mod:`walchannel.channel.stream`) writes
them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgpack

from walchannel.errors import PayloadError, WalCorruptError
from walchannel.log.format import encode_body
from walchannel.wire import protobuf as wire

if TYPE_CHECKING:
    from walchannel.log.writer import RunLog

__all__ = [
    "READAHEAD_ROWS",
    "STRUCT_GROWTH",
    "TAIL_BYTES",
    "TAIL_ROW_OVERHEAD",
    "RowMissingError",
    "RowSource",
]

#: The in-memory tail of committed rows the writer reads before disk (bytes:
#: each row counts its msgpack body plus TAIL_ROW_OVERHEAD).
TAIL_BYTES = 4 * 1024 * 1024
#: What a tail entry costs beyond its body (the tuple, int and bytes objects),
#: so tiny rows cannot make the tail many times TAIL_BYTES in memory.
TAIL_ROW_OVERHEAD = 160
#: A Struct-encoded message is at most this many times its msgpack body.
STRUCT_GROWTH = 16
#: Rows read from disk at a time when the writer is behind the tail.
READAHEAD_ROWS = 256


class RowMissingError(Exception):
    """The row the writer asked for is neither in the tail nor in the log.

    Internal: the stream driver ends the stream with it (the next dial
    replays from the cursor).
    """


class RowSource:
    """The rows of one run's log in seq order, as encoded ``UpMessage`` bytes.

    Args:
        log: the run's open log (read only here: the channel owns its writes).
        run_id: the run, set on every message.
        correlation_id: set on every message.
        max_message_bytes: the bound on a new row's encoded message (bytes).

    Attributes:
        tail: the newest committed rows ``(seq, kind, msgpack body)``,
            consecutive, at most :data:`TAIL_BYTES` (counting
            :data:`TAIL_ROW_OVERHEAD` per row) but always the newest one.
        tail_bytes: what the tail counts against :data:`TAIL_BYTES`.
    """

    def __init__(
        self, log: RunLog, run_id: str, correlation_id: str, max_message_bytes: int
    ) -> None:
        self._log = log
        self._run_id = run_id
        self._correlation_id = correlation_id
        self._max_message_bytes = max_message_bytes
        self.tail: deque[tuple[int, str, bytes]] = deque()
        self.tail_bytes = 0
        self._readahead: deque[tuple[int, str, dict[str, Any]]] = deque()
        # What an UpMessage adds around its body, for the size bound below.
        self._envelope = 64 + len(run_id) + len(correlation_id)

    # -- new rows -------------------------------------------------------------------

    def prepare(self, kind: str, body: dict[str, Any]) -> tuple[str, bytes]:
        """Encode a checked body for the log; refuse it if its message could never travel.

        Args:
            kind: the ``UpMessage`` oneof name (``event``, ``finding``, ...).
            body: the checked body mapping (SPEC "Control vs data").

        Returns:
            ``(kind, msgpack bytes)`` for ``RunLog.append_encoded``.

        Raises:
            PayloadError: the encoded ``UpMessage`` is over
                ``max_message_bytes`` (SPEC "Payloads"); nothing is logged.
        """
        blob = encode_body(kind, body)
        # A Struct takes at most ~11x the msgpack bytes of the same values
        # (a list of small ints); only near the limit is the exact size worth
        # building the message for.
        if len(blob) * STRUCT_GROWTH + self._envelope > self._max_message_bytes:
            msg = wire.up_message(self._run_id, self._correlation_id, 0, kind, body)
            # + 11: the seq's tag and varint are not set yet.
            size = msg.ByteSize() + 11
            if size > self._max_message_bytes:
                raise PayloadError(
                    kind,
                    f"encoded message is {size} bytes, over max_message_bytes "
                    f"{self._max_message_bytes}; it could never be delivered",
                )
        return kind, blob

    def on_commit(self, seqs: list[int], items: list[tuple[str, bytes]]) -> None:
        """Rows ``items`` were committed under ``seqs``: keep their bytes in the tail."""
        tail = self.tail
        if tail and tail[-1][0] + 1 != seqs[0]:
            # Not consecutive with the tail (renumbered, or rows set aside):
            # the tail must stay a run of consecutive seqs.
            tail.clear()
            self.tail_bytes = 0
        for seq, (kind, blob) in zip(seqs, items, strict=True):
            tail.append((seq, kind, blob))
            self.tail_bytes += len(blob) + TAIL_ROW_OVERHEAD
        while self.tail_bytes > TAIL_BYTES and len(tail) > 1:
            self.tail_bytes -= len(tail.popleft()[2]) + TAIL_ROW_OVERHEAD

    def drop_acked(self, acked: int) -> None:
        """Forget the tail's rows at or below ``acked``: they will not be written again."""
        tail = self.tail
        while tail and tail[0][0] <= acked:
            self.tail_bytes -= len(tail.popleft()[2]) + TAIL_ROW_OVERHEAD

    def clear_tail(self) -> None:
        """Forget the tail (its seqs were renumbered): the rows come from disk."""
        self.tail.clear()
        self.tail_bytes = 0

    def clear_readahead(self) -> None:
        """Forget the rows read ahead (a new stream, or the writer rewound)."""
        self._readahead.clear()

    def forget(self) -> None:
        """Forget the tail and the readahead: a row was replaced on disk (set aside)."""
        self.clear_tail()
        self.clear_readahead()

    # -- what the writer writes -----------------------------------------------------------

    def row_bytes(self, seq: int) -> bytes:
        """Return the encoded ``UpMessage`` of row ``seq``: from the tail, else from disk.

        Raises:
            RowMissingError: the log holds no row ``seq`` (it was acked meanwhile).
            WalchannelError: the log cannot be read (``WalCorruptError`` among them).
        """
        # No guard: a signal handler's send may append to the tail (and drop its
        # oldest) between two of these bytecodes, or its replay_unacked() clear
        # the read-ahead. An entry counts only when it is the row asked for;
        # else the row comes from disk (SPEC "Signal handlers and the channel").
        tail = self.tail
        try:
            entry = tail[seq - tail[0][0]] if tail and tail[0][0] <= seq else None
        except IndexError:
            entry = None
        if entry is not None and entry[0] == seq:
            kind, body = entry[1], msgpack.unpackb(entry[2], raw=False)
        else:
            kind, body = self._read_ahead(seq)
        msg = wire.up_message(self._run_id, self._correlation_id, seq, kind, body)
        return msg.SerializeToString()

    def _read_ahead(self, seq: int) -> tuple[str, dict[str, Any]]:
        """Row ``seq`` from the rows read ahead from disk, reading them when needed."""
        ahead = self._readahead
        try:
            got, kind, body = ahead.popleft()
        except IndexError:  # none read ahead, or a handler's replay_unacked() cleared them
            got = 0
        if got == seq:
            return kind, body
        # Read from disk (also after an ack moved the writer past the rows read
        # ahead: rare). Decided from a list of our own: a handler may clear the
        # read-ahead, or change the tail, at any bytecode.
        try:
            tail_from = self.tail[0][0]
        except IndexError:
            tail_from = 0
        rows: list[tuple[int, str, dict[str, Any]]] = []
        budget = TAIL_BYTES
        for row in self._log.unacked(after_seq=seq - 1, limit=READAHEAD_ROWS):
            rows.append((row.seq, row.kind, row.body))
            budget -= row.size
            # Stop where the tail takes over, or at the memory budget.
            if budget <= 0 or row.seq + 1 >= tail_from > 0:
                break
        if not rows or rows[0][0] != seq:
            raise self._missing(seq)
        ahead.clear()
        ahead.extend(rows[1:])
        return rows[0][1], rows[0][2]

    def _missing(self, seq: int) -> RowMissingError | WalCorruptError:
        """Why row ``seq`` is not in the log: acked meanwhile, or a gap in the file.

        A row goes only when a stored ack covers it; one above the stored
        cursor and at or below the high-water that the log lacks is a gap
        (a damaged file, an older writer's bug): re-dialing cannot mend it,
        and the writer would ask for it for ever.
        """
        log = self._log
        if log.last_acked_seq < seq <= log.high_water:
            return WalCorruptError(
                str(log.path),
                f"row seq {seq} is missing: the log holds rows above the stored cursor "
                f"{log.last_acked_seq} up to seq {log.high_water} but not this one (run "
                f"{self._run_id}); keep the file for 'walchannel export', which salvages "
                "the rows it holds",
            )
        return RowMissingError(f"row seq {seq} is not in the log")

    def in_flight_sizes(self, after: int, top: int) -> Iterator[tuple[int, int]]:
        """``(seq, encoded size)`` of the rows in ``(after, top]``, in seq order, lazily.

        For :func:`~walchannel.core.engine_refusals.pick_refused_row`: ``after`` is the
        received ack, ``top`` the highest seq whose write started on the
        refusing stream.
        """
        for row in self._log.unacked(after_seq=after):
            if row.seq > top:
                return
            msg = wire.up_message(self._run_id, self._correlation_id, row.seq, row.kind, row.body)
            yield row.seq, msg.ByteSize()
