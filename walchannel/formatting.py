"""How walchannel shows things to people: ages, sizes, aligned columns, text from outside.

Ages, sizes and tables are shared by ``walchannel inspect``
(:mod:`walchannel.cli.logs`) and its live view (:mod:`walchannel.cli.watch`).
:func:`escape_text` makes text from outside (an engine's status details,
a discovery answer, a payload's strings, a file name) safe to show: every
message, log record (:mod:`walchannel._logging`) and human output line goes
through it (SPEC "The channel", "Text from outside"). Imports nothing
of walchannel: the lowest layer, so :mod:`walchannel.errors` can use it.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import Final

__all__ = [
    "TABLE_WIDTH",
    "align_table",
    "escape_text",
    "format_age",
    "format_size",
    "note_lines",
]

#: The columns a human table fits by default (``inspect --wide``: no limit).
TABLE_WIDTH: Final = 120
#: How far a note under a table row is indented.
NOTE_INDENT: Final = 4

# C0 controls (newline and tab too: a newline forges a line, a tab breaks
# columns), DEL, C1 controls (U+009B is a one-character CSI), the line and
# paragraph separators (line breaks to some viewers), the bidi embeddings,
# overrides and isolates (Trojan Source), and lone surrogates (a file name
# that is not UTF-8, which a terminal would get as raw bytes or not at all).
_UNSAFE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_SHORT: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_text(text: str) -> str:
    """Return ``text`` safe for a terminal or a log line: its controls as Python escapes.

    C0 controls, DEL, C1 controls (U+0080-U+009F), U+2028/U+2029, the bidi
    controls (U+202A-U+202E, U+2066-U+2069) and lone surrogates are written
    as ``\\x1b`` (below U+0100) or ``\\u202e``; newline, carriage return
    and tab as ``\\n``, ``\\r``, ``\\t``. Everything else (accents, CJK,
    emoji, a backslash) is left as it is, so the result is for reading, not
    for parsing back: ``--json`` and the stored values keep the exact text.
    Escaping twice changes nothing. SPEC "The channel", "Text from outside".

    Args:
        text: the text to show.

    Returns:
        ``text`` itself when nothing needed escaping, else the escaped copy.
    """
    if text.isprintable():  # every character escaped is unprintable: the common case
        return text
    return _UNSAFE.sub(_escape_one, text)


def format_age(seconds: float | None) -> str:
    """Return a duration as ``45s``, ``3m12s``, ``2h05m`` or ``3d04h`` (``-`` for None).

    Args:
        seconds: the duration (seconds); negative values count as 0.
    """
    if seconds is None:
        return "-"
    total = int(max(0.0, seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def align_table(
    columns: Sequence[tuple[str, bool]], rows: Sequence[Sequence[str]], *, last_free: bool = True
) -> list[str]:
    """Return the lines of a table: the header, then ``rows``, columns padded to fit.

    Args:
        columns: ``(header, right-aligned)`` per column.
        rows: the cells of each row, one per column.
        last_free: the last column is free text, never padded (False: it is
            aligned like the others).
    """
    table = [tuple(h for h, _ in columns), *rows]
    padded = len(columns) - 1 if last_free else len(columns)
    widths = [max(len(row[i]) for row in table) for i in range(padded)]
    lines = []
    for row in table:
        cells = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, (_, right) in zip(row, widths, columns, strict=False)
        ]
        free = [row[-1]] if last_free else []
        lines.append("  ".join([*cells, *free]).rstrip())
    return lines


def note_lines(label: str, text: str, *, label_width: int, width: int = TABLE_WIDTH) -> list[str]:
    """Return ``text`` as lines under a table row: ``    label: text``, wrapped.

    Lines break between words to fit ``width`` columns, and continue under
    the text's first character; a word longer than a line (a path, a
    command) is never split, so it can be copied whole. docs/operations.md
    "walchannel inspect".

    Args:
        label: what the text is (``detail``, ``next step``).
        label_width: the longest label of the table (characters), so the
            texts of a row start in one column.
        width: the columns to fit.
    """
    head = " " * NOTE_INDENT + f"{label}:".ljust(label_width + 2)
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=head,
        subsequent_indent=" " * len(head),
        break_long_words=False,
        break_on_hyphens=False,
    )


def format_size(size: int | None) -> str:
    """Return a byte count as ``512 B``, ``1.2 KiB``, ``3.4 MiB`` … (``-`` for None).

    Args:
        size: the size (bytes).
    """
    if size is None:
        return "-"
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"
