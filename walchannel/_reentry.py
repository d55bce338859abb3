"""Who is inside a piece of the channel's state now: the guard against a signal handler's call.

A Python signal handler runs on the main thread between two bytecodes of
whatever ran there: inside a ``send_*``, inside a write of the log, inside
a group commit. A call it makes into the channel would
interleave with the half-done one, so each piece holds a :class:`Guard`
while it works and a public call refuses to enter one that is held
(SPEC "Signal handlers and the channel").

A guard remembers the frame that took it, and a hold counts only while that
frame is still on the stack of the thread that asks: an exception that
lands on the line of the ``finally`` that releases it (a signal's, at the
worst moment) leaves a stale hold, which counts for nothing instead of
refusing every later call for ever. A release gives the guard back to
whoever held it before, so a handler's call that ran inside another's
``take`` (before its hold was whole) cannot leave the other unguarded.
"""

from __future__ import annotations

import sys
from types import FrameType

__all__ = ["FREE", "Guard", "Held"]

#: What holds a guard: ``(what, the frame that took it)``.
Held = tuple[str | None, FrameType | None]
#: A guard nobody holds (what a ``finally`` releases to when ``take`` never returned).
FREE: Held = (None, None)


class Guard:
    """What holds one piece of the channel's state, and the frame that took it."""

    __slots__ = ("_frame", "_what")

    def __init__(self) -> None:
        self._what: str | None = None
        self._frame: FrameType | None = None

    def take(self, what: str) -> Held:
        """Hold the guard for ``what`` (a name for error messages) from the caller's frame.

        Call it first thing inside the ``try`` whose ``finally`` calls
        :meth:`release` with what it returned (:data:`FREE` until then).

        Returns:
            What held it before: a call a signal handler made inside another
            one's ``take`` gives the other's half-taken hold back on release.
        """
        held = (self._what, self._frame)
        self._frame = sys._getframe(1)
        self._what = what
        return held

    def release(self, held: Held) -> None:
        """Give the guard back to ``held`` (what :meth:`take` returned)."""
        self._what, self._frame = held

    @property
    def holder(self) -> str | None:
        """What holds the guard while it still runs (below the asker on its stack), else None."""
        what = self._what
        if what is None:
            return None
        holding = self._frame
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame is holding:
                return what
            frame = frame.f_back
        return None  # stale: its frame is gone without releasing (the next take overwrites)
