"""A fault an engine repeats in every message: said once per kind per stream, then counted.

docs/operations.md, "A fault in every message: one line, then a count", lists the kinds.
"""

from __future__ import annotations

import logging

__all__ = ["OncePerKind"]


class OncePerKind:
    """Say each kind of per-message event once, count the rest, sum them up at the end.

    An engine can send the same fault in every message (15,000 unknown down
    messages in 5 s); a line each would drown the log. The first of a kind
    is logged at its level with ``(said once per stream, the rest counted)``;
    :meth:`summary` (at the stream's end) logs one line per kind seen more
    than once. docs/operations.md lists the kinds.

    Args:
        logger: where the lines go.
        where: what the lines are about, e.g. ``"run r-1: the stream to host:1"``.
    """

    def __init__(self, logger: logging.Logger, where: str) -> None:
        self._logger = logger
        self._where = where
        self._seen: dict[str, tuple[int, int]] = {}  # kind -> (level, count)

    def say(self, kind: str, level: int, message: str, *args: object) -> bool:
        """Log ``message % args`` at ``level`` if it is the first of ``kind``; else count it.

        Returns:
            True if the line was logged (the first of its kind).
        """
        first = kind not in self._seen
        count = self._seen.get(kind, (level, 0))[1]
        self._seen[kind] = (level, count + 1)
        if first:
            self._logger.log(level, f"{message} (said once per stream, the rest counted)", *args)
        return first

    def count(self, kind: str) -> int:
        """How many events of ``kind`` were said or counted."""
        return self._seen.get(kind, (0, 0))[1]

    def summary(self) -> None:
        """One line per kind seen more than once: ``<where>: N more <kind>``; then forget."""
        for kind, (level, count) in self._seen.items():
            if count > 1:
                self._logger.log(level, "%s: %d more %s", self._where, count - 1, kind)
        self._seen.clear()
