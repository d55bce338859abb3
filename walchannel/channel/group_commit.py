"""Group commit: the rows of many sends in one transaction. One part of the channel.

Under ``GrpcChannelConfig.group_commit`` (SPEC "Group commit") ``send_*``
hands out seqs and returns before its rows are committed. :class:`PendingGroup`
holds them, with the progress marker last set, and commits them all in one
transaction of the log: at the end of the first turn of the event loop
that added nothing to it (a ``call_soon`` callback that looks once per turn),
or inline, in the send that finds the group full (``max_rows``,
``max_bytes``) or its oldest row ``max_delay_ms`` old. Looking for a quiet
turn, not committing at the end of the first, is what makes groups of a
harness that yields after every send (``await asyncio.sleep(0)``): its next
send runs in the next turn. A call
that waits on the engine (``send_done``, ``request_approval``,
``wait_acked``, ``close``) and the taking of a handshake answer commit it
first.

Nothing of a group is handed to the writer before it commits, so nothing
of it reaches the stream. A group's seqs are the log's next ones at the time
it commits, counted ahead: the log takes no other rows while a group is
pending (the calls that log their own row commit the group first), so the
seqs handed out are the seqs the rows get. A send's rows are never split
across groups, and its marker commits with them.

A commit that fails (``WalWriteError``: a full disk) keeps the group and
tries again after each of :data:`RETRY_MS`; a send that finds the group
full meanwhile tries at once, and raises the error with nothing of its own
added. When the last try fails too the channel fails with a
:class:`~walchannel.errors.GroupCommitError` naming the seqs lost: a seq
handed out is never handed out again by this channel.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from walchannel._logging import get_logger
from walchannel._reentry import FREE, Guard
from walchannel.errors import (
    GroupCommitError,
    WalchannelError,
    WalRemovedError,
    WalWriteError,
    raw_message,
)

if TYPE_CHECKING:
    from walchannel.clock import Clock
    from walchannel.config import GroupCommit
    from walchannel.log.writer import RunLog

__all__ = ["RETRY_MS", "PendingGroup"]

logger = get_logger(__name__)

#: After a failed commit, the group is tried again after each of these (ms).
RETRY_MS: Final = (10, 100, 1000)

Items = list[tuple[str, bytes]]
Commit = Callable[[Items, dict[str, Any] | None], list[int]]


class PendingGroup:
    """The rows handed out but not yet committed, and when they will be.

    Args:
        settings: the caps (:class:`~walchannel.config.GroupCommit`).
        run_id: the run, for log lines and errors.
        log: the run's log (its ``next_seq`` numbers the group).
        clock: the monotonic clock the group's age is read on (ms).
        commit: commits ``(items, marker)`` in one transaction and hands the
            rows to the writer; returns their seqs; raises ``WalchannelError``
            with nothing committed.
        give_up: called with a :class:`~walchannel.errors.GroupCommitError`
            when the group cannot be committed: the channel fails with it.
        next_seq_after: the driver's
            :meth:`~walchannel.core.driver.Driver.next_seq_after`: the seq a
            row gets after this many pending ones (the seqs handed out).
    """

    def __init__(
        self,
        settings: GroupCommit,
        run_id: str,
        log: RunLog,
        clock: Clock,
        commit: Commit,
        give_up: Callable[[GroupCommitError], None],
        next_seq_after: Callable[[int], int],
    ) -> None:
        self._next_seq_after = next_seq_after
        self._settings = settings
        self._run_id = run_id
        self._log = log
        self._clock = clock
        self._commit = commit
        self._give_up = give_up
        self._items: Items = []
        self._bytes = 0
        self._marker: dict[str, Any] | None = None
        self._since_ms = 0.0
        self._handle: asyncio.Handle | None = None
        self._failures = 0
        # Sends added so far, and at the callback's last look (None: not looked yet).
        self._adds = 0
        self._looked: int | None = None
        self.guard = Guard()
        """Held while the group commits: a send then can only be a signal handler's."""

    # -- read-outs -------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        """Rows handed out and not yet committed."""
        return len(self._items)

    @property
    def bytes(self) -> int:
        """Their msgpack size (bytes)."""
        return self._bytes

    @property
    def marker(self) -> dict[str, Any] | None:
        """A copy of the progress marker set since the last commit (None: none)."""
        return None if self._marker is None else json.loads(json.dumps(self._marker))

    @property
    def pending(self) -> bool:
        """Something (rows or a marker) waits to be committed."""
        return bool(self._items) or self._marker is not None

    # -- adding ----------------------------------------------------------------------------

    def add(self, items: Items, marker: dict[str, Any] | None) -> list[int]:
        """Hand out seqs for ``items`` (and set ``marker``); commit now when the group is full.

        Returns:
            The seqs of ``items``, consecutive (``[]`` for none).

        Raises:
            WalchannelError: the log refuses rows now (``RunLog.check_append``:
                closed, a ``Done`` logged, a tombstone); or the group had to
                commit first, or with these rows, and could not
                (``WalWriteError``): nothing of this call was added; the
                group stays and is tried again.
        """
        # What the log would refuse at the commit is refused now, before a seq is handed out.
        self._log.check_append([kind for kind, _ in items])
        caps = self._settings
        size = sum(len(blob) for _, blob in items)
        now = self._clock.monotonic_ms()
        if self.pending and (
            len(self._items) + len(items) > caps.max_rows
            or self._bytes + size > caps.max_bytes
            or now - self._since_ms >= caps.max_delay_ms
        ):
            self.commit()
        if len(self._items) + len(items) >= caps.max_rows or self._bytes + size >= caps.max_bytes:
            # Full with these: one transaction for the group and this call.
            before = len(self._items)
            seqs = self._commit_all(
                self._items + items, marker if marker is not None else self._marker
            )
            return seqs[before:]
        first = self._next_seq_after(len(self._items))  # the driver numbers rows
        if not self.pending:
            self._since_ms = now
        self._adds += 1
        self._items.extend(items)
        self._bytes += size
        if marker is not None:
            self._marker = marker
        self._schedule()
        return list(range(first, first + len(items)))

    # -- committing ------------------------------------------------------------------------

    def commit(self) -> None:
        """Commit the group now (nothing to do when none is pending).

        Raises:
            WalchannelError: the commit failed; the group stays, to be tried again.
        """
        if not self.pending:
            return
        self._commit_all(self._items, self._marker)

    def flush(self) -> None:
        """Commit the group now; a failure is handled as at the turn's end (tried again later).

        While a failed commit waits for its next try, that try stands: a
        caller does not spend the tries faster than :data:`RETRY_MS`.
        """
        if self.pending and self._failures == 0:
            self.cancel()
            self._try_commit()

    def commit_or_give_up(self) -> None:
        """Commit the group now; if it cannot be, fail the channel with the lost seqs named.

        For ``close()``: nothing is left to try again later.
        """
        try:
            self.commit()
        except GroupCommitError:
            return  # given up already, its seqs named
        except WalchannelError as exc:
            self._lose(exc)

    def cancel(self) -> None:
        """Stop the pending end-of-turn or retry callback (the channel closes)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _commit_all(self, items: Items, marker: dict[str, Any] | None) -> list[int]:
        """Commit the group (as ``items`` and ``marker``) and forget it; on failure keep it.

        An exception raised after the ``COMMIT`` landed (a signal handler's,
        SPEC "The log") leaves the log following its disk: when the rows are
        there, the group is forgotten too, so it is never committed twice.
        """
        first = self._log.next_seq
        held = FREE
        try:
            held = self.guard.take("a group commit")
            seqs = self._commit(items, marker)
        except WalRemovedError as exc:
            # Committed only into a file no path names any more: as lost as if
            # never committed (SPEC "The log"); named, and given up at once.
            raise self._lose(exc, first=first) from None
        except BaseException:
            if self._log.next_seq != first:
                self._reset()
            raise
        finally:
            self.guard.release(held)
        self._reset()
        return seqs

    def _reset(self) -> None:
        self._items = []
        self._bytes = 0
        self._marker = None
        self._failures = 0
        self._looked = None
        self.cancel()

    def _schedule(self) -> None:
        if self._handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # No event loop turns (a send outside any): nothing would end the
            # turn, so the group commits now, as without group commit.
            self.commit()
            return
        self._handle = loop.call_soon(self._at_turn_end)

    def _at_turn_end(self) -> None:
        """Once per turn of the loop: commit once a turn added nothing to the group.

        A group that keeps growing ends at a cap, in the send that finds it
        full or ``max_delay_ms`` old (:meth:`add`).
        """
        self._handle = None
        if self._looked != self._adds:
            # Sends are still adding: look again after the callbacks now ready.
            self._looked = self._adds
            self._handle = asyncio.get_running_loop().call_soon(self._at_turn_end)
            return
        self._try_commit()

    def _try_commit(self) -> None:
        """Commit now; after a ``WalWriteError`` try again after each of :data:`RETRY_MS`."""
        self._handle = None
        try:
            self.commit()
        except WalWriteError as exc:
            if self._failures >= len(RETRY_MS):
                self._lose(exc)
                return
            delay_ms = RETRY_MS[self._failures]
            self._failures += 1
            logger.warning(
                "run %s: committing %d row(s) failed (%s); trying again in %d ms",
                self._run_id,
                len(self._items),
                raw_message(exc),
                delay_ms,
            )
            self._handle = asyncio.get_running_loop().call_later(delay_ms / 1000, self._try_commit)
        except GroupCommitError:
            return  # given up already, its seqs named
        except WalchannelError as exc:  # a closed or lost log: trying again cannot help
            self._lose(exc)

    def _lose(self, cause: WalchannelError, *, first: int | None = None) -> GroupCommitError:
        """The group cannot be committed: drop it, fail the channel naming its seqs; return why.

        ``first``: the group's first seq, when a commit of it landed where no
        path names it (else the log's next seq: nothing of it committed).
        """
        rows = len(self._items)
        if first is None:
            first = self._log.next_seq
        last = first + rows - 1
        what = f"{rows} row(s) handed out as seqs {first}..{last}" if rows else ""
        marker = "the progress marker set with them" if self._marker is not None else ""
        lost = " and ".join(part for part in (what, marker) if part)
        self._reset()
        error = GroupCommitError(
            f"run {self._run_id}: {lost} could not be committed ({raw_message(cause)}); "
            "they are not in the log and were never sent: a harness resuming from "
            "progress() in a new channel sends them again",
            path=str(self._log.path),
            first_seq=first if rows else None,
            last_seq=last if rows else None,
        )
        self._give_up(error)
        return error
