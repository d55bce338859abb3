"""``walchannel inspect --watch``: a live view of a log folder for an operator at a terminal.

Every refresh reads each log with :func:`walchannel.cli.inspection.inspect_log`
(read-only: no owner lock, no writes, short read transactions) and shows
one row per run, most urgent first (its detail wrapped under it to fit 120
columns, as ``inspect``'s; ``--wide``: a last column), with two rates since the previous
refresh: rows logged per second (the change in ``next_seq``) and rows acked
per second (the change in the stored cursor). On a terminal each refresh
redraws the screen (ANSI clear); into a pipe or file the refreshes are
appended as blocks separated by a blank line. Ctrl-C ends it with exit 0.
docs/operations.md "inspect --watch".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from walchannel.cli.inspection import ALERT_STATES, PathError, RunReport, inspect_log
from walchannel.formatting import align_table, escape_text, format_age, format_size, note_lines

__all__ = ["CLEAR_SCREEN", "Rates", "render", "watch"]

#: Cursor home, then erase the screen (ANSI): a redraw in place.
CLEAR_SCREEN = "\x1b[H\x1b[2J"

_COLUMNS = (
    # header, right-aligned
    ("STATE", False),
    ("RUN", False),
    ("UNACKED", True),
    ("OLDEST", True),
    ("LOGGED/s", True),
    ("ACKED/s", True),
    ("LAST ACK", True),
    ("OWNER", False),
    ("DISK", True),
)


@dataclass(frozen=True, slots=True)
class _Seen:
    """One run's counters at one refresh (``at``: the monotonic clock, seconds)."""

    at: float
    next_seq: int | None
    acked: int | None


@dataclass(frozen=True, slots=True)
class Rates:
    """Rows per second since the previous refresh (None: not known yet)."""

    logged: float | None
    acked: float | None


def _rate(now: int | None, before: int | None, seconds: float) -> float | None:
    if now is None or before is None or seconds <= 0 or now < before:
        return None  # a first sight, an unreadable log, or a new log under the same name
    return (now - before) / seconds


def _format_rate(rate: float | None) -> str:
    if rate is None:
        return "-"
    return f"{rate:.1f}" if rate < 100 else f"{rate:,.0f}"


def _row(report: RunReport, rates: Rates, now: float) -> tuple[str, ...]:
    return (
        report.state,
        report.run_id or Path(report.file).name,
        "-" if report.unacked_count is None else str(report.unacked_count),
        format_age(report.oldest_unacked_age_s),
        _format_rate(rates.logged),
        _format_rate(rates.acked),
        report.last_ack_text(),
        report.owner_text(),
        format_size(report.file_bytes),
    )


def render(
    reports: Sequence[RunReport],
    rates: Sequence[Rates],
    *,
    where: str,
    interval_s: float,
    now: float,
    wide: bool = False,
) -> list[str]:
    """Return the lines of one refresh.

    Args:
        reports: the runs, most urgent first.
        rates: each run's rates, in the same order.
        where: the folder or file watched (for the header).
        interval_s: the refresh period (seconds).
        now: the wall clock (unix seconds) for ages and the header.
        wide: DETAIL as each row's last column, however long, instead of
            wrapped under the row to fit 120 columns.

    Returns:
        A header, a count of runs per state, and the table (or a line
        saying there are no runs); text from outside (the folder's name, a
        last error) escaped (:func:`~walchannel.formatting.escape_text`).
    """
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    where = escape_text(where)
    lines = [f"walchannel inspect --watch {interval_s:g}s  {where}  {stamp}  (Ctrl-C to stop)"]
    if not reports:
        lines.append("no run logs")
        return lines
    counts: dict[str, int] = {}
    for report in reports:
        counts[report.state] = counts.get(report.state, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    lines.append(f"{len(reports)} run(s): {summary}")
    rows = [
        tuple(escape_text(cell) for cell in _row(r, x, now))
        for r, x in zip(reports, rates, strict=True)
    ]
    if wide:
        details = [(*row, escape_text(r.detail(now))) for row, r in zip(rows, reports, strict=True)]
        return lines + align_table((*_COLUMNS, ("DETAIL", False)), details)
    header, *table = align_table(_COLUMNS, rows, last_free=False)
    lines.append(header)
    for report, row in zip(reports, table, strict=True):
        lines.append(row)
        detail = report.detail(now)
        if detail:
            lines.extend(note_lines("detail", escape_text(detail), label_width=len("detail")))
    return lines


def watch(
    find_logs: Callable[[], list[Path]],
    *,
    where: str,
    interval_s: float,
    out: TextIO,
    clear: bool,
    count: int | None = None,
    stuck_after_s: float,
    verify: bool = False,
    wide: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Refresh the view every ``interval_s`` until Ctrl-C (or ``count`` refreshes).

    Args:
        find_logs: lists the log files (called at every refresh, so new
            runs appear); a :class:`~walchannel.cli.inspection.PathError` is shown
            in the refresh and the watch goes on.
        where: the folder or file watched (for the header).
        interval_s: seconds from one refresh's start to the next's.
        out: where to write.
        clear: redraw in place (ANSI; for a terminal) instead of appending blocks.
        count: stop after this many refreshes (None: until Ctrl-C).
        stuck_after_s: as ``inspect --stuck-after`` (seconds).
        verify: run ``PRAGMA quick_check`` on every refresh (reads every page).
        wide: as :func:`render`'s.
        sleep, clock: the waiting and the monotonic clock (seconds), for tests.

    Returns:
        0 after Ctrl-C; after ``count`` refreshes, what ``inspect`` would
        return for the last: 1 when a run is stuck, orphaned, failed or
        corrupt, else 0.

    SPEC "Operating tools" (``inspect``); docs/operations.md.
    """
    seen: dict[str, _Seen] = {}
    done = 0
    try:
        while True:
            started = clock()
            now = time.time()
            try:
                logs = find_logs()
                problem = None
            except PathError as exc:
                logs, problem = [], str(exc)
            reports = sorted(
                (inspect_log(p, stuck_after_s=stuck_after_s, verify=verify) for p in logs),
                key=lambda r: r.sort_key,
            )
            rates = []
            current: dict[str, _Seen] = {}
            for report in reports:
                mark = _Seen(started, report.next_seq, report.last_acked_seq)
                before = seen.get(report.file)
                if before is None:
                    rates.append(Rates(None, None))
                else:
                    span = started - before.at
                    rates.append(
                        Rates(
                            _rate(mark.next_seq, before.next_seq, span),
                            _rate(mark.acked, before.acked, span),
                        )
                    )
                current[report.file] = mark
            seen = current
            lines = render(reports, rates, where=where, interval_s=interval_s, now=now, wide=wide)
            if problem is not None:
                lines.append(escape_text(problem))
            if clear:
                out.write(CLEAR_SCREEN)
            elif done:
                out.write("\n")
            out.write("\n".join(lines) + "\n")
            out.flush()
            done += 1
            if count is not None and done >= count:
                return 1 if any(r.state in ALERT_STATES for r in reports) else 0
            sleep(max(0.0, interval_s - (clock() - started)))
    except KeyboardInterrupt:
        out.write("\n")
        out.flush()
        return 0
