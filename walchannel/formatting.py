"""How the operating tools print numbers and tables: ages, sizes, aligned columns.

Shared by ``walchannel inspect`` (:mod:`walchannel.cli_logs`) and its live
view (:mod:`walchannel.watch`). Pure functions; imports nothing of
walchannel.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Final

__all__ = ["TABLE_WIDTH", "align_table", "format_age", "format_size", "note_lines"]

#: The columns a human table fits by default (``inspect --wide``: no limit).
TABLE_WIDTH: Final = 120
#: How far a note under a table row is indented.
NOTE_INDENT: Final = 4


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
