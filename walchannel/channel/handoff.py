"""A call handed to an event loop's thread, and its caller's wait, with no lock between them.

:class:`~walchannel.BlockingEngineChannel` runs every call on its loop
thread; the calling thread waits here. SPEC "Signal handlers and the channel".
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

from walchannel.errors import ChannelClosedError

__all__ = ["Handoff"]

_T = TypeVar("_T")


class Handoff(Generic[_T]):
    """One call run on the loop thread, and its caller's wait for it.

    The caller waits on a plain lock the loop thread releases: it holds no
    lock while it waits, and the loop thread never waits on one the caller
    holds. A ``concurrent.futures.Future`` would not do: its ``result()``
    holds the future's lock for a few bytecodes before it waits, and a
    signal handler landing there whose own call waits on the loop would
    block the loop thread's ``set_result`` on that lock for ever (issue 52).
    """

    __slots__ = ("_done", "_error", "_once", "_result")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()  # released once, by finish()
        self._once = threading.Lock()  # taken by the first finish()
        self._result: _T | None = None
        self._error: BaseException | None = None

    async def run(self, coro: Coroutine[Any, Any, _T], calls: set[Handoff[Any]]) -> None:
        """On the loop thread: run ``coro`` and hand its outcome to the caller."""
        try:
            result = await coro
        except asyncio.CancelledError:
            # Only close() cancels a call (one that outlived the drain).
            self.finish(error=ChannelClosedError("the blocking channel was closed during the call"))
            raise
        except BaseException as exc:
            self.finish(error=exc)
        else:
            self.finish(result)
        finally:
            calls.discard(self)

    def finish(self, result: _T | None = None, *, error: BaseException | None = None) -> None:
        """Give the caller ``result`` or ``error`` (any thread; the first one wins)."""
        if not self._once.acquire(blocking=False):
            return
        self._result, self._error = result, error
        self._done.release()

    def wait(self) -> _T:
        """The caller's wait: the result, or the error raised."""
        self._done.acquire()
        error = self._error
        if error is not None:
            self._error = None  # (no cycle through the traceback)
            raise error
        return self._result  # type: ignore[return-value]
