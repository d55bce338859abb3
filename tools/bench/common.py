"""Shared pieces of the benchmark: payloads, sizes, interleaved medians, rows and the table."""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import socket
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "Result",
    "Sizes",
    "Target",
    "Timer",
    "closed_port",
    "disk_bytes",
    "finding",
    "finding_pool",
    "format_table",
    "interleave",
    "interleave_async",
    "percentile",
    "rss_bytes",
]

RUN_TOKEN = "bench-token"


# -- payloads ----------------------------------------------------------------

_TESTS = (
    ("B602", "subprocess_popen_with_shell_equals_true", "HIGH", 78),
    ("B105", "hardcoded_password_string", "LOW", 259),
    ("B301", "blacklist", "MEDIUM", 502),
    ("B608", "hardcoded_sql_expressions", "MEDIUM", 89),
    ("B506", "yaml_load", "MEDIUM", 20),
)
_TEXTS = {
    "B602": "subprocess call with shell=True identified.",
    "B105": "Possible hardcoded password: 'hunter2'",
    "B301": "Pickle can be unsafe when used to deserialize untrusted data.",
    "B608": "Possible SQL injection through string-based query construction.",
    "B506": "Use of unsafe yaml load: use yaml.safe_load().",
}


def finding(i: int) -> dict[str, Any]:
    """A realistic bandit finding (its ``{"fields": ...}`` body is ~400 bytes of msgpack).

    The fields are those of ``bandit -f json`` results; file, line and test
    vary with ``i`` so consecutive findings differ.
    """
    test_id, test_name, severity, cwe = _TESTS[i % len(_TESTS)]
    line = 10 + (i * 7) % 900
    return {
        "test_id": test_id,
        "test_name": test_name,
        "issue_severity": severity,
        "issue_confidence": "HIGH",
        "issue_cwe": {"id": cwe, "link": f"https://cwe.mitre.org/data/definitions/{cwe}.html"},
        "issue_text": _TEXTS[test_id],
        "filename": f"src/pkg_{i % 37}/mod_{i % 101}.py",
        "line_number": line,
        "line_range": [line, line + 1],
        "col_offset": 8,
        "end_col_offset": 47,
        "code": f"{line} proc = Popen(cmd, shell=True)\n",
        "more_info": f"https://bandit.readthedocs.io/en/1.8.6/plugins/{test_id.lower()}",
    }


def finding_pool(size: int = 1024) -> list[dict[str, Any]]:
    """Pre-built findings: both arms of a row cycle through the same pool."""
    return [finding(i) for i in range(size)]


# -- sizes -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big each case is (``--quick`` shrinks all of them)."""

    reps: int
    append_rows: int
    append_rows_full: int
    e2e_msgs: int
    e2e_msgs_power: int
    replay_rows: int
    replay_reps: int
    open_rows: int
    latency_msgs: int
    memory_msgs: int
    disk_msgs: int
    disk_lag: int
    open_reps: int
    child_reps: int
    backlog_msgs: int = 300_000
    backlog_inspect_msgs: int = 60_000

    @classmethod
    def full(cls) -> Sizes:
        return cls(
            reps=5,
            append_rows=20_000,
            append_rows_full=2_000,
            e2e_msgs=10_000,
            e2e_msgs_power=5_000,
            replay_rows=100_000,
            replay_reps=3,
            open_rows=1_000_000,
            latency_msgs=20_000,
            memory_msgs=1_000_000,
            disk_msgs=1_000_000,
            disk_lag=1_000,
            open_reps=7,
            child_reps=1,
        )

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            reps=2,
            append_rows=1_000,
            append_rows_full=100,
            e2e_msgs=300,
            e2e_msgs_power=200,
            replay_rows=2_000,
            replay_reps=2,
            open_rows=20_000,
            latency_msgs=1_000,
            memory_msgs=10_000,
            disk_msgs=3_000,
            disk_lag=300,
            open_reps=3,
            child_reps=1,
            backlog_msgs=5_000,
            backlog_inspect_msgs=2_000,
        )


# -- measuring ---------------------------------------------------------------


class Timer:
    """Wall time (``perf_counter``), process CPU time and context switches of a block.

    ``switches``: the process's voluntary plus involuntary context switches
    (``getrusage``, every thread's, grpc's own included).
    """

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0
        self.switches = 0
        self._t0 = 0.0
        self._c0 = 0.0
        self._s0 = 0

    @staticmethod
    def _switches() -> int:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_nvcsw + usage.ru_nivcsw

    def start(self) -> None:
        self._s0 = self._switches()
        self._t0 = time.perf_counter()
        self._c0 = time.process_time()

    def stop(self) -> None:
        self.wall = time.perf_counter() - self._t0
        self.cpu = time.process_time() - self._c0
        self.switches = self._switches() - self._s0


def _orders(names: Sequence[str], reps: int) -> list[list[str]]:
    # A/B, B/A, A/B, … : neither arm always goes first (warm caches, growing stores).
    return [list(names) if rep % 2 == 0 else list(reversed(names)) for rep in range(reps)]


def interleave(
    arms: dict[str, Callable[[], dict[str, float]]], reps: int
) -> dict[str, dict[str, list[float]]]:
    """Run the arms alternately ``reps`` times; return each arm's samples per metric.

    Each arm returns a mapping of metric -> value for one repetition.
    """
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in arms}
    for order in _orders(list(arms), reps):
        for name in order:
            gc.collect()
            for metric, value in arms[name]().items():
                samples[name].setdefault(metric, []).append(value)
    return samples


async def interleave_async(
    arms: dict[str, Callable[[], Awaitable[dict[str, float]]]], reps: int
) -> dict[str, dict[str, list[float]]]:
    """:func:`interleave` for coroutine arms (run on the caller's event loop)."""
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in arms}
    for order in _orders(list(arms), reps):
        for name in order:
            gc.collect()
            for metric, value in (await arms[name]()).items():
                samples[name].setdefault(metric, []).append(value)
    return samples


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, nearest rank."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))
    return float(sorted_values[index])


def rss_bytes() -> int:
    """This process's resident set size (``VmRSS`` of /proc/self/status), bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def disk_bytes(db: str | os.PathLike[str]) -> int:
    """Size of a SQLite database plus its ``-wal`` (bytes; missing files count 0)."""
    total = 0
    for path in (Path(db), Path(f"{db}-wal")):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- rows and the table --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """A row's target: on the ratio (walchannel ÷ baseline) or on walchannel's own value."""

    on: Literal["ratio", "value"]
    op: Literal[">=", "<=", "<"]
    bound: float
    text: str

    def met(self, value: float, ratio: float | None) -> bool | None:
        x = ratio if self.on == "ratio" else value
        if x is None or x != x:  # no baseline, or NaN
            return None
        if self.op == ">=":
            return x >= self.bound
        if self.op == "<=":
            return x <= self.bound
        return x < self.bound


@dataclass(slots=True)
class Result:
    """One row of the table (medians over the repetitions)."""

    name: str
    n: int
    unit: str
    wal: float
    base: float | None
    base_label: str
    target: Target | None = None
    detail: str = ""
    samples: dict[str, Any] = field(default_factory=dict)
    #: The median of the repetitions' own ratios (arms alternate, so each
    #: repetition is a pair); when set, it is the row's ratio, not wal / base.
    paired: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.paired is not None:
            return self.paired
        if self.base is None or self.base == 0:
            return None
        return self.wal / self.base

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        met = self.target.met(self.wal, self.ratio)
        return "-" if met is None else ("pass" if met else "FAIL")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["target"] = self.target.text if self.target else None
        out["ratio"] = self.ratio
        out["verdict"] = self.verdict
        return out


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if value != value:
        return "nan"
    if unit in ("rows/s", "msgs/s"):
        return f"{value:,.0f}"
    if unit == "MB":
        return f"{value:,.1f}"
    if unit in ("ms", "µs"):
        return f"{value:,.2f}" if value < 10 else f"{value:,.1f}"
    return f"{value:,.3g}"


def _fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"


def _fmt_n(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def format_table(results: Sequence[Result], *, details: bool = True) -> str:
    """The results as an aligned text (and Markdown-compatible) table."""
    header = ["case", "n", "unit", "walchannel", "baseline", "vs", "ratio", "target", "ok"]
    if details:
        header.append("detail")
    lines = []
    for r in results:
        ratio = r.ratio
        cells = [
            r.name,
            _fmt_n(r.n),
            r.unit,
            _fmt(r.wal, r.unit),
            _fmt(r.base, r.unit),
            r.base_label,
            _fmt_ratio(ratio),
            r.target.text if r.target else "",
            r.verdict,
        ]
        if details:
            cells.append(r.detail)
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(header)]
    right = {1, 3, 4, 6}

    def row(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(parts) + " |"

    rule = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":" if i in right else "-" * (w + 2)) for i, w in enumerate(widths)
        )
        + "|"
    )
    return "\n".join([row(header), rule, *(row(c) for c in lines)])
