"""Every walchannel module's logger: its records escaped before any handler formats them.

SPEC "The channel", "Text from outside"; :func:`walchannel.formatting.escape_text`
says what is escaped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

from walchannel.formatting import escape_text

__all__ = ["get_logger"]


class _Shown:
    """A log argument that is neither a str nor a number: escaped once formatted."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __str__(self) -> str:
        return escape_text(str(self.value))

    def __repr__(self) -> str:
        return escape_text(repr(self.value))


def _shown(value: object) -> object:
    if value is None or isinstance(value, int | float):
        return value  # %d, %.1f need the number; numbers print safe
    if isinstance(value, str) and escape_text(value) is value:
        return value
    # Wrapped, not escaped now: "%r" of it must not escape a repr's own escapes.
    return _Shown(value)


class _EscapeRecords(logging.Filter):
    """Escape a record's message and arguments before any handler formats it.

    The template (``record.msg``) stays a template, so handlers that group
    by it still do; numbers stay numbers. A traceback (``exc_info``) is left
    to the application's formatter: walchannel's exceptions escape their own
    messages (:class:`walchannel.errors.WalchannelError`).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = escape_text(record.msg) if isinstance(record.msg, str) else _Shown(record.msg)
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(_shown(arg) for arg in args)
        elif isinstance(args, Mapping):
            record.args = {key: _shown(arg) for key, arg in args.items()}
        return True


_ESCAPE_RECORDS: Final = _EscapeRecords()


def get_logger(name: str) -> logging.Logger:
    """Return ``logging.getLogger(name)`` with the filter that escapes its records.

    Every walchannel module gets its logger here (``get_logger(__name__)``):
    a filter on a logger applies to the records that logger makes, so each
    one carries it (``tests/test_hostile_text.py`` checks that none is
    missed). What it logs is escaped as :func:`escape_text` says, whichever
    handler or formatter the application installs.

    Args:
        name: the logger's name, the module's ``__name__``.
    """
    logger = logging.getLogger(name)
    logger.addFilter(_ESCAPE_RECORDS)  # no-op when already there
    return logger
