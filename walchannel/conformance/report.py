"""What ``walchannel conformance`` prints: a line a check, a summary, ``--json``, ``--junit``."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from walchannel.conformance.checks import Check
from walchannel.formatting import escape_text

__all__ = ["Result", "junit", "summary", "text_lines", "to_json"]

Verdict = Literal["PASS", "FAIL", "SKIP", "ERROR"]


@dataclass(frozen=True)
class Result:
    """One check's outcome.

    Attributes:
        check: the check.
        verdict: ``PASS``, ``FAIL``, ``SKIP`` (a hook it needs is missing) or
            ``ERROR`` (a hook could not run).
        detail: what passed, why it was skipped, or the hook's error.
        expected, got: for ``FAIL``, what the duty says and what the engine did.
        seconds: how long the check took.
    """

    check: Check
    verdict: Verdict
    detail: str = ""
    expected: str = ""
    got: str = ""
    seconds: float = 0.0


def text_lines(results: Sequence[Result]) -> list[str]:
    """One line a check (id, verdict, duty), and for a FAIL its expected and got."""
    lines = []
    for r in results:
        lines.append(f"  {r.check.id:<5} {r.verdict:<5} {r.check.duty}")
        if r.verdict == "FAIL":
            lines.append(f"              expected: {escape_text(r.expected)}")
            lines.append(f"              got:      {escape_text(r.got)}")
        elif r.detail:
            lines.append(f"              {escape_text(r.detail)}")
    return lines


def summary(results: Sequence[Result]) -> str:
    """``N passed, N failed, N skipped`` (and errors, if any)."""
    count = {
        v: sum(1 for r in results if r.verdict == v) for v in ("PASS", "FAIL", "SKIP", "ERROR")
    }
    line = f"{count['PASS']} passed, {count['FAIL']} failed, {count['SKIP']} skipped"
    if count["ERROR"]:
        line += f", {count['ERROR']} stopped by a hook that could not run"
    return line


def to_json(results: Sequence[Result]) -> str:
    """The checks as a JSON array: id, duty, section, verdict, detail (expected and got)."""
    return json.dumps(
        [
            {
                "id": r.check.id,
                "duty": r.check.duty,
                "section": r.check.section,
                "verdict": r.verdict,
                "detail": r.detail,
                "expected": r.expected,
                "got": r.got,
                "seconds": round(r.seconds, 3),
            }
            for r in results
        ],
        indent=1,
    )


def junit(results: Sequence[Result]) -> bytes:
    """A JUnit XML report (one ``testcase`` a check) as CI systems read it."""
    suite = ET.Element(
        "testsuite",
        name="walchannel conformance",
        tests=str(len(results)),
        failures=str(sum(r.verdict == "FAIL" for r in results)),
        errors=str(sum(r.verdict == "ERROR" for r in results)),
        skipped=str(sum(r.verdict == "SKIP" for r in results)),
        time=f"{sum(r.seconds for r in results):.3f}",
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
    )
    for r in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname="walchannel.conformance",
            name=f"{r.check.id} {r.check.duty}",
            time=f"{r.seconds:.3f}",
        )
        if r.verdict == "FAIL":
            failure = ET.SubElement(case, "failure", message=f"expected {r.expected}")
            failure.text = f"expected: {r.expected}\ngot: {r.got}\n{r.check.section}"
        elif r.verdict == "ERROR":
            ET.SubElement(case, "error", message=r.detail)
        elif r.verdict == "SKIP":
            ET.SubElement(case, "skipped", message=r.detail)
    return bytes(ET.tostring(suite, encoding="utf-8", xml_declaration=True))
