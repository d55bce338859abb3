"""How the operating tools print numbers and tables: ages, sizes, aligned columns.

Shared by ``walchannel inspect`` (:mod:`walchannel.cli_logs`) and its live
view (:mod:`walchannel.watch`). Pure functions; imports nothing of
walchannel.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["align_table", "format_age", "format_size"]


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


def align_table(columns: Sequence[tuple[str, bool]], rows: Sequence[Sequence[str]]) -> list[str]:
    """Return the lines of a table: the header, then ``rows``, columns padded to fit.

    Args:
        columns: ``(header, right-aligned)`` per column; the last column is
            free text, never padded.
        rows: the cells of each row, one per column.
    """
    table = [tuple(h for h, _ in columns), *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns) - 1)]
    lines = []
    for row in table:
        cells = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, (_, right) in zip(row, widths, columns, strict=False)
        ]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


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
