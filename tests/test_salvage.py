"""One damaged meta field never blocks the intact rows beside it (issue "Hostile inputs", item 3).

A real log (100 unacked rows, a progress marker, a stored handshake) is
closed, copied, and one byte of one meta field is flipped in the copy with
sqlite3 (the damage as it would be on disk). Then the real command runs:

- ``export`` writes every row the log holds, exactly as it would from the
  intact log, names the damaged field, the path and the run on standard
  error, and exits 1 (salvaged, not clean);
- ``inspect`` calls the run ``corrupt``, names the field, never guesses
  ``next_seq`` from a damaged seq field, and its next step is only one that
  works on the file (export; never flush or a restart);
- ``inspect --show`` shows the rows;
- ``flush`` and reopening the log (``RunLog.open``, as a restarted harness's
  channel does) keep refusing with ``WalCorruptError`` naming the field and
  the path: without the marker a harness cannot resume exactly once.

Members of the kind: the progress marker (no longer JSON, or no longer
UTF-8), the stored handshake (token digest, harness name), the last error
text, the run id, the schema version, the seq high-water and the ack
cursor. A damaged row (a flipped byte in its body) keeps exporting as its
``walchannel.row_lost`` event, now named by seq on standard error.

A damaged column of a row (``appended_at`` as text or a blob,
``appended_boot`` as text, a kind that is not UTF-8) is named by path, run,
seq and column, never a traceback: a row whose body checks out is kept (its
time null) and still flushed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import shutil
import sqlite3
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import PYTHON, child_env
from walchannel import GrpcEngineChannel, WalCorruptError
from walchannel.log import RunLog
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config

ROWS = 110
ACKED = 10  # rows 1..10 acked: the log holds seqs 11..110
HELD = ROWS - ACKED
NEXT_SEQ = ROWS + 1


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def cli(*args: str | Path, **env: str) -> Result:
    proc = subprocess.run(
        [PYTHON, "-m", "walchannel", *map(str, args)],
        capture_output=True,
        text=True,
        env=child_env(**env),
        timeout=60,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(folder: Path, run_id: str, token: str) -> Path:
    """A closed log as a harness leaves it: handshake stored, rows with progress, some acked."""
    with RunLog.open(folder, run_id, correlation_id=f"corr-{run_id}") as wal:
        wal.update_meta(
            connector_version="1.4.0",
            harness_name="bandit",
            harness_version="0.3",
            token_sha256=hashlib.sha256(token.encode()).hexdigest(),
            last_error="engine.example:50051: UNAVAILABLE",
            last_error_at=time.time(),
        )
        for i in range(ROWS):
            wal.append(
                "finding",
                {"fields": {"n": i, "text": f"finding {i}"}},
                progress={"page": i, "cursor": f"c-{i}"},
            )
        wal.ack(ACKED)
        path = wal.path
    assert not Path(f"{path}-wal").exists()  # closed: everything is in the file
    return path


def flip_text_byte(log: Path, field: str, at: int, mask: int) -> None:
    """XOR one byte of a TEXT meta field, stored back as TEXT (bytes as they are)."""
    with contextlib.closing(sqlite3.connect(log)) as conn:
        conn.text_factory = bytes
        (raw,) = conn.execute(f"SELECT {field} FROM meta").fetchone()
        data = bytearray(raw)
        data[at] ^= mask
        conn.execute(f"UPDATE meta SET {field} = CAST(? AS TEXT)", (bytes(data),))
        conn.commit()


def flip_integer(log: Path, field: str, mask: int) -> None:
    """XOR bits of an INTEGER meta field (the sign bit: a value walchannel never writes)."""
    with contextlib.closing(sqlite3.connect(log)) as conn:
        conn.execute(f"UPDATE meta SET {field} = (({field} | ?) - ({field} & ?))", (mask, mask))
        conn.commit()


def real_as_blob(log: Path, field: str) -> None:
    """Store a REAL meta field's 8 bytes as a BLOB (its serial type byte flipped, 7 to 28)."""
    with contextlib.closing(sqlite3.connect(log)) as conn:
        (value,) = conn.execute(f"SELECT {field} FROM meta").fetchone()
        conn.execute(f"UPDATE meta SET {field} = ?", (struct.pack(">d", value),))
        conn.commit()


def flip_row_body_byte(log: Path, seq: int, at: int) -> None:
    with contextlib.closing(sqlite3.connect(log)) as conn:
        (raw,) = conn.execute("SELECT body FROM rows WHERE seq = ?", (seq,)).fetchone()
        data = bytearray(raw)
        data[at] ^= 0x01
        conn.execute("UPDATE rows SET body = ? WHERE seq = ?", (bytes(data), seq))
        conn.commit()


SIGN = -(1 << 63)

#: member -> (field, how to damage it); a text field's byte XORed with a mask.
MEMBERS: dict[str, tuple[str, Any]] = {
    "progress-not-json": ("progress", ("text", 0, 0x01)),  # '{' becomes 'z'
    "progress-not-utf8": ("progress", ("text", 2, 0xFF)),
    "token-digest": ("token_sha256", ("text", 5, 0xFF)),
    "harness-name": ("harness_name", ("text", 0, 0xFF)),
    "last-error": ("last_error", ("text", 3, 0xFF)),
    "last-ack-time": ("last_ack_at", ("blob",)),
    "run-id": ("run_id", ("text", 5, 0xFF)),
    "schema-version": ("schema_version", ("int", 0x02)),  # 1 becomes 3
    "high-water": ("high_water", ("int", SIGN)),
    "ack-cursor": ("last_acked_seq", ("int", SIGN)),
}
#: The members whose every command is run (the rest: the decisive ones).
FULL = ("progress-not-json", "progress-not-utf8", "token-digest", "last-ack-time")
#: Fields that decide seqs: with one damaged, next_seq is not shown.
SEQ_FIELDS = ("high_water", "last_acked_seq")


@dataclass
class Damaged:
    good: Path
    log: Path
    run_id: str
    token: str
    field: str


def damaged_copy(tmp_path: Path, member: str) -> Damaged:
    run_id = f"run-{secrets.token_hex(4)}"
    token = "tok-" + secrets.token_urlsafe(18)
    good = build(tmp_path / "good", run_id, token)
    folder = tmp_path / "wal"
    folder.mkdir(mode=0o700)
    log = folder / good.name
    shutil.copy2(good, log)
    field, how = MEMBERS[member]
    if how[0] == "text":
        flip_text_byte(log, field, how[1], how[2])
    elif how[0] == "blob":
        real_as_blob(log, field)
    else:
        flip_integer(log, field, how[1])
    return Damaged(good, log, run_id, token, field)


def assert_names_the_damage(text: str, case: Damaged) -> None:
    assert case.field in text, text
    assert str(case.log) in text, text
    if case.field != "run_id":
        assert f"run {case.run_id}" in text, text


@pytest.mark.parametrize("member", list(MEMBERS))
def test_one_damaged_meta_field_never_blocks_the_rows(tmp_path: Path, member: str) -> None:
    case = damaged_copy(tmp_path, member)
    before = digest(case.log)
    want = cli("export", case.good)
    assert want.rc == 0 and len(want.out.splitlines()) == HELD, want.err

    # export: every row the log holds, exactly as from the intact log; the damage named.
    exported = cli("export", case.log)
    assert exported.rc == 1, exported.err
    assert exported.out == want.out
    seqs = [json.loads(line)["seq"] for line in exported.out.splitlines()]
    assert seqs == list(range(ACKED + 1, ROWS + 1))
    assert_names_the_damage(exported.err, case)
    assert "Traceback" not in exported.err

    # inspect: corrupt, the field named, next_seq never guessed, only a step that works.
    listed = cli("inspect", case.log.parent, "--json")
    assert listed.rc == 1, listed.err
    [item] = listed.json()
    assert item["state"] == "corrupt"
    assert case.field in item["reason"], item
    assert item["unacked_count"] == HELD
    if case.field in SEQ_FIELDS:
        assert item["next_seq"] is None
    else:
        assert item["next_seq"] == NEXT_SEQ
    assert item["last_acked_seq"] == (None if case.field == "last_acked_seq" else ACKED)
    # A field read only to label the run is null when damaged, never made up.
    assert (item["last_ack_at"] is None) == (case.field == "last_ack_at")
    assert (item["last_error"] is None) == (case.field == "last_error")
    step = item["next_step"]
    assert f"'walchannel export {case.log}" in step, step
    assert "flush" not in step and "restart" not in step, step
    # The order that loses nothing (issue 58, item 3): export, move aside, and what the
    # new log will meet (refused as another writer's until a takeover), with its cost.
    exported_at, moved_at = step.index("walchannel export"), step.index("move ")
    fenced_at, takeover_at = step.index("another writer's"), step.index("walchannel takeover")
    assert exported_at < moved_at < fenced_at < takeover_at, step
    assert "comes again" in step[takeover_at:], step  # this engine keeps no resume point

    # The owner's open (a restarted harness) and flush keep refusing, naming the field.
    with pytest.raises(WalCorruptError) as info:
        RunLog.open(case.log.parent, case.run_id, correlation_id=f"corr-{case.run_id}")
    assert case.field in info.value.reason and info.value.path == str(case.log)
    assert_names_the_damage(str(info.value), case)
    flushed = cli(
        "flush", case.log, "--grpc-addr", "127.0.0.1:9", "--token-env", "TOK", TOK=case.token
    )
    assert flushed.rc == 2 and "refused" in flushed.err, flushed.err
    assert_names_the_damage(flushed.err, case)
    assert case.token not in flushed.err + exported.err + listed.out
    assert digest(case.log) == before  # nothing wrote to the damaged file

    if member not in FULL:
        return
    # The human table says the same; --show decodes the rows.
    # --wide: one line per run, DETAIL and NEXT STEP its last columns.
    table = cli("inspect", case.log, "--wide")
    assert table.rc == 1
    _header, line = table.out.splitlines()
    assert line.startswith("corrupt") and case.field in line
    assert line.endswith(step)
    last_ack = "damaged: last_ack_at" if case.field == "last_ack_at" else "ago"
    assert last_ack in line, line
    shown = cli("inspect", case.log, "--show", "3", "--wide")
    assert shown.rc == 1, shown.err
    rows = shown.out.splitlines()[2:]
    assert [r.split()[:3] for r in rows] == [
        ["seq", str(seq), "finding"] for seq in range(ACKED + 1, ACKED + 4)
    ], shown.out
    assert '"text":"finding 10"' in rows[0]
    # -o FILE writes the same rows.
    out = tmp_path / "saved.jsonl"
    saved = cli("export", case.log, "-o", out)
    assert saved.rc == 1 and out.read_text() == want.out
    assert digest(case.log) == before


@pytest.mark.asyncio
async def test_a_harness_restarted_on_a_damaged_progress_marker_refuses(
    tmp_path: Path, local_engine: LocalEngine
) -> None:
    case = damaged_copy(tmp_path, "progress-not-json")
    local_engine.register_run(case.run_id, case.token)
    config = local_channel_config(local_engine, case.log.parent, case.run_id, case.token)
    before = digest(case.log)
    with pytest.raises(WalCorruptError) as info:
        GrpcEngineChannel(config)
    assert "progress" in info.value.reason and "not JSON" in info.value.reason
    assert_names_the_damage(str(info.value), case)
    assert digest(case.log) == before
    assert local_engine.accepted(case.run_id) == []


def test_a_damaged_row_exports_as_row_lost_named_by_seq(tmp_path: Path) -> None:
    run_id = f"run-{secrets.token_hex(4)}"
    log = build(tmp_path / "wal", run_id, "tok-" + secrets.token_urlsafe(18))
    flip_row_body_byte(log, 57, 3)

    exported = cli("export", log)
    assert exported.rc == 1, exported.err
    records = [json.loads(line) for line in exported.out.splitlines()]
    assert [r["seq"] for r in records] == list(range(ACKED + 1, ROWS + 1))
    lost = records[57 - ACKED - 1]
    assert lost["kind"] == "event" and lost["body"]["type"] == "walchannel.row_lost"
    assert lost["body"]["payload"]["seq"] == 57 and "crc32" in lost["body"]["payload"]["reason"]
    intact = [r for r in records if r["seq"] != 57]
    assert all(r["body"]["fields"]["n"] == r["seq"] - 1 for r in intact)
    assert "seq 57" in exported.err and str(log) in exported.err and "crc32" in exported.err

    # The same row with a damaged progress marker: both named, the rest still saved.
    flip_text_byte(log, "progress", 0, 0x01)
    both = cli("export", log)
    assert both.rc == 1, both.err
    again = [json.loads(line) for line in both.out.splitlines()]
    for record in (*records, *again):
        if record["seq"] == 57:
            del record["body"]["ts"]  # the substitute is dated when it is made
    assert again == records
    assert "seq 57" in both.err and "progress" in both.err
    [item] = cli("inspect", log, "--json").json()
    assert item["state"] == "corrupt" and "seq 57" in item["reason"], item
    assert "progress" in item["reason"] and "'walchannel export" in item["next_step"]


def test_export_of_the_quarantine_needs_no_meta(tmp_path: Path) -> None:
    run_id = f"run-{secrets.token_hex(4)}"
    log = build(tmp_path / "wal", run_id, "tok-" + secrets.token_urlsafe(18))
    flip_text_byte(log, "progress", 0, 0x01)
    quarantine = cli("export", log, "--quarantined")
    assert quarantine.rc == 0 and quarantine.out == "", quarantine.err


def test_a_file_nothing_can_be_read_from_suggests_no_export(tmp_path: Path) -> None:
    folder = tmp_path / "wal"
    folder.mkdir()
    junk = folder / "run-junk.wal.sqlite3"
    junk.write_bytes(b"not a database at all" * 100)
    [item] = cli("inspect", folder, "--json").json()
    assert item["state"] == "corrupt" and "move " in item["next_step"]
    assert "walchannel export" not in item["next_step"], item
    assert cli("export", junk).rc == 2  # it would not have worked


# -- a damaged column of a row ---------------------------------------------------------------

#: member -> (seq, SQL setting one column of that row, the column named).
ROW_COLUMNS: dict[str, tuple[int, str, str]] = {
    # The oldest unacked row: plain inspect reads its time for the run's age.
    "appended-at-text": (ACKED + 1, "appended_at = 'yesterday'", "appended_at"),
    "appended-at-blob": (57, "appended_at = X'3FF0000000000000'", "appended_at"),
    "appended-boot-text": (ACKED + 1, "appended_boot = 'boot?'", "appended_boot"),
    "kind-not-utf8": (57, "kind = CAST(X'66FF6E64' AS TEXT)", "kind"),
}


@pytest.mark.parametrize("member", list(ROW_COLUMNS))
def test_a_damaged_column_of_a_row_is_named_never_a_traceback(tmp_path: Path, member: str) -> None:
    seq, assignment, column = ROW_COLUMNS[member]
    run_id = f"run-{secrets.token_hex(4)}"
    token = "tok-" + secrets.token_urlsafe(18)
    good = build(tmp_path / "good", run_id, token)
    log = tmp_path / "wal" / good.name
    log.parent.mkdir(mode=0o700)
    shutil.copy2(good, log)
    with contextlib.closing(sqlite3.connect(log)) as conn:
        conn.execute(f"UPDATE rows SET {assignment} WHERE seq = ?", (seq,))
        conn.commit()
    want = [json.loads(line) for line in cli("export", good).out.splitlines()]
    before = digest(log)

    def names_it(text: str) -> None:
        assert "Traceback" not in text, text
        assert f"seq {seq}" in text and column in text, text

    # export: every row, the damaged cell null (or the row as its row_lost event); named.
    exported = cli("export", log)
    assert "Traceback" not in exported.err, exported.err
    records = [json.loads(line) for line in exported.out.splitlines()]
    assert [r["seq"] for r in records] == [r["seq"] for r in want]
    intact = [(r, w) for r, w in zip(records, want, strict=True) if r["seq"] != seq]
    assert all(r == w for r, w in intact)
    [hit] = [r for r in records if r["seq"] == seq]
    if column == "kind":
        assert hit["body"]["type"] == "walchannel.row_lost" and exported.rc == 1
        assert "kind" in hit["body"]["payload"]["reason"]
        names_it(exported.err)
        assert str(log) in exported.err and f"run {run_id}" in exported.err
    elif column == "appended_at":
        # The body checks out (its CRC): written as it is, its time null.
        assert hit["body"] == want[seq - ACKED - 1]["body"] and hit["appended_at"] is None
        assert exported.rc == 1
        names_it(exported.err)
        assert str(log) in exported.err and f"run {run_id}" in exported.err
    else:
        # Never exported: only the run's age reads it (by the wall clock instead).
        assert exported.rc == 0 and records == want, exported.err

    # inspect: its three forms, the damage named where the row is read.
    listed = cli("inspect", log.parent, "--json")
    assert listed.rc == 1 and "Traceback" not in listed.err, listed.err
    [item] = listed.json()
    assert item["unacked_count"] == HELD
    if seq == ACKED + 1:  # plain inspect reads the oldest row
        names_it(item["reason"])
        assert item["state"] == "orphaned", item
        if column == "appended_at":
            assert item["oldest_unacked_age_s"] is None
        else:
            assert item["oldest_unacked_age_s"] is not None
    table = cli("inspect", log, "--wide")
    assert table.rc == 1 and "Traceback" not in table.err, table.err
    shown = cli("inspect", log, "--show", str(seq - ACKED), "--wide")
    assert shown.rc == 1 and "Traceback" not in shown.err, shown.err
    last = shown.out.splitlines()[-1]
    assert last.split()[:2] == ["seq", str(seq)], shown.out
    if column in ("kind", "appended_at"):
        assert "damaged" in last and column in last, last
    assert digest(log) == before  # nothing wrote to the file


@pytest.mark.asyncio
async def test_a_row_with_a_damaged_time_is_still_flushed(
    tmp_path: Path, local_engine: LocalEngine
) -> None:
    """inspect's step for such a run (flush, or a restart) works: the body is intact."""
    run_id = f"run-{secrets.token_hex(4)}"
    token = "tok-" + secrets.token_urlsafe(18)
    local_engine.register_run(run_id, token)
    # Nothing acked: this engine has seen none of the rows.
    with RunLog.open(tmp_path / "wal", run_id, correlation_id=f"corr-{run_id}") as wal:
        wal.update_meta(
            connector_version="1",
            harness_name="h",
            harness_version="1",
            token_sha256=hashlib.sha256(token.encode()).hexdigest(),
        )
        seqs = [wal.append("finding", {"fields": {"n": i}}) for i in range(20)]
        log = wal.path
    with contextlib.closing(sqlite3.connect(log)) as conn:
        conn.execute("UPDATE rows SET appended_at = 'yesterday' WHERE seq IN (1, 7)")
        conn.commit()
    [item] = cli("inspect", log, "--json").json()
    assert item["state"] == "orphaned" and "flush" in item["next_step"], item
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "walchannel",
        "flush",
        str(log),
        "--grpc-addr",
        local_engine.grpc_addr,
        "--token-env",
        "TOK",
        "--timeout",
        "60",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(TOK=token),
    )
    _out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()
    assert local_engine.accepted(run_id) == seqs
