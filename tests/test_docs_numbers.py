"""The numbers and names the docs give agree with the code (issue 28, item 2).

A README that says 30 s where the code waits 5 s, or names a parameter the
call does not have, costs a team an afternoon. These read the config tables
of README.md and SPEC.md, every "`field_ms` (N s)" in the prose of README.md,
SPEC.md and docs/, and the README's table of calls, against the code.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

import pytest

from conftest import ROOT
from walchannel import BlockingEngineChannel, GrpcChannelConfig, GrpcEngineChannel
from walchannel.config import Backoff

DOCS = [ROOT / "README.md", ROOT / "SPEC.md", *sorted((ROOT / "docs").glob("*.md"))]
DEFAULTS: dict[str, Any] = {
    f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
    for f in dataclasses.fields(GrpcChannelConfig)
    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
}


def cell_value(text: str) -> Any:
    """A table cell as the value it stands for: "5 000" -> 5000, "4 MiB", True, None."""
    text = text.strip().strip("`").replace("\u202f", " ")
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    if m := re.fullmatch(r"(\d+) MiB", text):
        return int(m.group(1)) * 1024 * 1024
    if re.fullmatch(r"\d{1,3}( \d{3})*", text):
        return int(text.replace(" ", ""))
    return text.strip('"')


def readme_config_rows() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if m := re.match(r"\| `(\w+)` \| [^|]+ \| ([^|]+) \|", line):
            rows.append((m.group(1), m.group(2)))
    return rows


def spec_config_rows() -> list[tuple[str, str]]:
    text = (ROOT / "SPEC.md").read_text()
    section = text.split("| field | default | rule |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in section.splitlines()[1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = [n.strip() for n in cells[0].split(",")]
        values = [v.strip() for v in cells[1].split(",")] if len(names) > 1 else [cells[1]]
        if len(values) == len(names):
            rows.extend(zip(names, values, strict=True))
    return rows


@pytest.mark.parametrize("rows", [readme_config_rows, spec_config_rows], ids=["README", "SPEC"])
def test_config_tables_give_the_code_defaults(rows: Any) -> None:
    checked = 0
    for name, shown in rows():
        if name not in DEFAULTS or shown.strip() == "required":
            continue
        default = DEFAULTS[name]
        if isinstance(default, Backoff):
            numbers = [int(n.replace(" ", "")) for n in re.findall(r"\d[\d ]*", shown)]
            assert default.initial_ms in numbers and default.max_ms in numbers, (name, shown)
            assert default.jitter_ms in numbers or f"{default.jitter_ms:g}" in shown, (name, shown)
        else:
            got = cell_value(shown)
            assert got == default, f"{name}: the table says {shown!r}, the code {default!r}"
        checked += 1
    assert checked >= 12


def test_every_duration_quoted_in_prose_is_the_default() -> None:
    # "`done_ack_timeout_ms` (5 s)", "`connect_timeout_ms` (10 s)" and the like.
    pattern = re.compile(r"`(\w+_ms)` \((\d+(?:\.\d+)?) (s|ms)\)")
    found = 0
    for doc in DOCS:
        for m in pattern.finditer(doc.read_text()):
            name, number, unit = m.groups()
            if name not in DEFAULTS:
                continue
            ms = float(number) * (1000 if unit == "s" else 1)
            assert ms == DEFAULTS[name], (
                f"{doc.name}: {m.group(0)} but the default is {DEFAULTS[name]} ms"
            )
            found += 1
    assert found >= 2


def test_the_table_of_calls_names_the_real_parameters() -> None:
    text = (ROOT / "docs" / "channel.md").read_text()
    table = text.split("The calls, in short", 1)[1].split("\n\n", 2)[1]
    calls = " ".join(row.split("|")[1] for row in table.splitlines()[2:])  # the first cells
    checked = 0
    for m in re.finditer(r"`(?:await )?(\w+)\(([^)`]*)\)`", calls):
        name, params = m.group(1), m.group(2)
        method = getattr(GrpcEngineChannel, name)
        real = list(inspect.signature(method).parameters)[1:]
        shown = [
            p.split("=")[0].strip() for p in params.split(",") if p.strip() not in ("", "*", "...")
        ]
        assert shown == [p for p in real if p in shown] and set(shown) <= set(real), (
            f"docs/channel.md shows {name}({params}); the call is {name}{inspect.signature(method)}"
        )
        if hasattr(BlockingEngineChannel, name):
            blocking = list(inspect.signature(getattr(BlockingEngineChannel, name)).parameters)[1:]
            assert set(shown) <= set(blocking), (name, blocking)
        checked += 1
    assert checked >= 10


def test_the_install_time_quoted_is_the_measured_one() -> None:
    # The README quotes what a fresh clone measured; keep the claim and the
    # record in one place so they cannot drift apart.
    text = (ROOT / "README.md").read_text()
    assert "about half a minute of `pip install`" not in text
    assert re.search(r"\d+ s of `pip install`", text), "the README quotes the measured install time"


def test_the_line_table_of_design_md_holds() -> None:
    # docs/design.md "Line counts": every module, each count within a tenth (20 lines at least).
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("### Line counts\n", 1)[1].split("\n## ", 1)[0]
    stated = dict(re.findall(r"^\| `([\w/]+\.py)` \| (\d+) \|$", section, re.M))
    modules = {
        p.relative_to(ROOT / "walchannel").as_posix(): len(p.read_text().splitlines())
        for p in (ROOT / "walchannel").rglob("*.py")
        if "_proto" not in p.parts
    }
    assert set(stated) == set(modules), sorted(set(stated) ^ set(modules))
    for name, lines in modules.items():
        said = int(stated[name])
        assert abs(lines - said) <= max(20, said // 10), (
            f"docs/design.md says {name} has {said} lines; it has {lines}: update the table"
        )
    total = int(re.search(r"^\| \*\*all\*\* \| (\d+) \|$", section, re.M).group(1))  # type: ignore[union-attr]
    assert abs(sum(modules.values()) - total) <= total // 10
