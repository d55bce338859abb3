"""What a stream's end says (walchannel.core.end_status): code first, details through one table."""

from __future__ import annotations

import ast

import pytest

from conftest import ROOT
from walchannel.core.end_status import (
    PATTERNS,
    Meaning,
    engine_refusal,
    parse_receive_limit,
    parse_size_refusal,
    read_end,
    run_completed_by,
)

# One example per row of PATTERNS, in the table's order: (code, details, meaning).
EXAMPLES = [
    ("FAILED_PRECONDITION", " Owned by another writer w-2 (epoch 3)", Meaning.WRITER_REFUSED),
    ("FAILED_PRECONDITION", "run completed by writer w-2", Meaning.RUN_COMPLETED),
    ("FAILED_PRECONDITION", "Run Completed", Meaning.RUN_COMPLETED),
    ("FAILED_PRECONDITION", "expected seq 11, got seq 16", Meaning.EXPECTED_SEQ),
    (
        "RESOURCE_EXHAUSTED",
        "CLIENT: Received message larger than max (900 vs. 500)",
        Meaning.DOWN_TOO_LARGE,
    ),
    ("RESOURCE_EXHAUSTED", "Decompressed message larger than max", Meaning.DOWN_TOO_LARGE),
    ("RESOURCE_EXHAUSTED", "CLIENT: something else", Meaning.CLIENT_SIDE),
    (
        "RESOURCE_EXHAUSTED",
        "SERVER: Received message larger than max (900 vs. 500)",
        Meaning.SIZE_REFUSAL,
    ),
    ("RESOURCE_EXHAUSTED", "gRPC message exceeds maximum size 500: 900", Meaning.SIZE_REFUSAL),
    ("INTERNAL", "Internal error from Core", Meaning.STATUS_LOST),
]


def test_every_row_of_the_table_has_an_example_that_it_reads() -> None:
    assert len(EXAMPLES) == len(PATTERNS)
    for (code, details, meaning), row in zip(EXAMPLES, PATTERNS, strict=True):
        read = read_end(code, details)
        assert (read.meaning, read.row) == (meaning, row), details


@pytest.mark.parametrize(("code", "details", "meaning"), EXAMPLES)
def test_the_code_comes_first(code: str, details: str, meaning: Meaning) -> None:
    assert read_end(code, details).meaning is meaning
    for other in ("UNAVAILABLE", "UNKNOWN", "CANCELLED", None):
        assert read_end(other, details).meaning is None, other
    assert read_end(code, "").meaning is None
    assert read_end(code, None).meaning is None


@pytest.mark.parametrize(("code", "details", "meaning"), EXAMPLES)
def test_each_reader_answers_only_for_its_own_meaning(
    code: str, details: str, meaning: Meaning
) -> None:
    # Another row's match (a writer id, a size) is never read as this one's.
    assert (engine_refusal(code, details) is not None) is (meaning is Meaning.WRITER_REFUSED)
    assert run_completed_by(code, details)[0] is (meaning is Meaning.RUN_COMPLETED)
    assert (parse_size_refusal(code, details) is not None) is (meaning is Meaning.SIZE_REFUSAL)
    assert (parse_receive_limit(code, details) is not None) is (meaning is Meaning.DOWN_TOO_LARGE)


def test_the_first_matching_row_wins() -> None:
    # A refusal that mentions completion is a refusal; a named writer is kept.
    said = "owned by another writer: run completed by writer w-2"
    assert read_end("FAILED_PRECONDITION", said).meaning is Meaning.WRITER_REFUSED
    assert run_completed_by("FAILED_PRECONDITION", "x; run completed by writer w-2") == (
        True,
        "w-2",
    )
    assert run_completed_by("FAILED_PRECONDITION", "run completed") == (True, None)
    assert run_completed_by("UNAVAILABLE", "run completed") == (False, None)
    # The client's own limit is never the engine refusing a row.
    client = "CLIENT: grpc: received message larger than max (900 vs. 500)"
    assert read_end("RESOURCE_EXHAUSTED", client).meaning is Meaning.CLIENT_SIDE
    # A refusal's prefix only counts at the start; the lost status only whole.
    assert read_end("FAILED_PRECONDITION", "not owned by another writer").meaning is None
    assert read_end("INTERNAL", "Internal error from Core\n").meaning is None


def test_no_other_module_reads_a_status_details_with_a_pattern() -> None:
    # The one table: no module but end_status compiles a pattern over status
    # details or compares them with a text (driver.py, the channel, ...).
    for path in (ROOT / "walchannel").rglob("*.py"):
        if path.name == "end_status.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            sides = (node.left, *node.comparators) if isinstance(node, ast.Compare) else ()
            if any(isinstance(side, ast.Name) and side.id == "details" for side in sides) and any(
                isinstance(side, ast.Constant) and isinstance(side.value, str) for side in sides
            ):
                raise AssertionError(f"{path.name}:{node.lineno} compares a status's details")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("search", "match", "fullmatch", "startswith")
                and any(isinstance(a, ast.Name) and a.id == "details" for a in node.args)
            ):
                raise AssertionError(f"{path.name}:{node.lineno} reads a status's details")
