"""Text from outside never reaches a terminal or a log record raw (issue "Hostile inputs", item 1).

An engine's status details, a discovery server's answer, the strings of a
payload, a log file's name: walchannel keeps them as received (the log's
meta, ``stats()``, ``inspect --json``, ``export``, an exception's ``args``)
and escapes them wherever it shows them to a person or logs them: C0
controls, DEL, C1 controls, the bidi controls and the line and paragraph
separators come out as ``\\x1b``, ``\\n``, ``\\u202e`` (SPEC "The channel",
"Text from outside"; "Operating tools").
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import http.server
import json
import logging
import re
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from conftest import PYTHON, ROOT, child_env, eventually
from helpers.http_answer import serving
from helpers.rogue import RogueEngine, RogueStream, answer_handshakes
from walchannel import EngineUnavailableError, GrpcEngineChannel
from walchannel.errors import DiscoveryError
from walchannel.log import RunLog
from walchannel.testing.plugin import local_channel_config
from walchannel.transport.discovery import discover

# What a terminal or a log reader must never get raw: C0, DEL, C1, the bidi
# controls, the line/paragraph separators, lone surrogates.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

# The details: set the window title, clear the screen, home the
# cursor, then forge a line of inspect's table; and a right-to-left override.
FORGED = "run-other  idle  0 unacked"
HOSTILE = f"\x1b]0;pwned\x07\x1b[2J\x1b[H\n{FORGED} \u202eevil"
ESCAPED = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[H\\nrun-other  idle  0 unacked \\u202eevil"


def assert_safe(text: str, where: str) -> None:
    found = UNSAFE.search(text)
    assert found is None, f"{where}: raw {found.group()!r} at {found.start()} in {text!r}"


def assert_lines_safe(text: str, where: str) -> None:
    """Each line is safe, and none is the forged one."""
    for line in text.splitlines():
        assert_safe(line, where)
        assert not line.startswith(FORGED), f"{where}: a forged line: {line!r}"


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run ``python -m walchannel ARGS`` for real; its output as text."""
    return subprocess.run(
        [PYTHON, "-m", "walchannel", *map(str, args)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )


def walchannel_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("walchannel")]


# -- the rule -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),  # C0: ESC
        ("\x00\x07\x08", "\\x00\\x07\\x08"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),  # a newline forges a line; a tab breaks columns
        ("\x7f", "\\x7f"),  # DEL
        ("\x85\x9b2J\x9d0;t\x9c", "\\x85\\x9b2J\\x9d0;t\\x9c"),  # C1: NEL, CSI, OSC, ST
        ("\u202aa\u202b\u202c\u202d\u202e", "\\u202aa\\u202b\\u202c\\u202d\\u202e"),  # bidi
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),  # bidi isolates
        ("x\u2028y\u2029", "x\\u2028y\\u2029"),  # line and paragraph separators
        ("run-\udc9b.wal", "run-\\udc9b.wal"),  # a file name byte that is not UTF-8
    ],
)
def test_escape_text_writes_each_control_as_a_python_escape(raw: str, shown: str) -> None:
    from walchannel.formatting import escape_text

    assert escape_text(raw) == shown
    assert escape_text(shown) == shown  # escaping twice changes nothing


def test_escape_text_leaves_printable_text_alone() -> None:
    from walchannel.formatting import escape_text

    # Accents, CJK, emoji with a zero-width joiner, a no-break space, a backslash.
    text = "héllo 日本 \U0001f469\u200d\U0001f4bb a\u00a0b C:\\dir \\x1b"
    assert escape_text(text) is text


def test_every_walchannel_logger_escapes_what_it_logs() -> None:
    # The kind, not one site: a module that logs gets its logger from
    # walchannel._logging.get_logger, whose filter escapes every record.
    plain = []
    for path in sorted((ROOT / "walchannel").rglob("*.py")):
        if "_proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "logging.getLogger"
                and node.args
                and ast.unparse(node.args[0]) == "__name__"
            ):
                plain.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not plain, f"loggers that do not escape (use walchannel._logging.get_logger): {plain}"


def test_a_log_record_keeps_its_template_and_numbers() -> None:
    from walchannel._logging import get_logger

    logger = get_logger("walchannel.test_hostile_text")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger.addHandler(handler)
    try:
        logger.warning(
            "run %s: %d rows, %.1f s, %r, %s", "r\x1b", 3, 1.5, "x\u202e", ValueError("a\nb")
        )
    finally:
        logger.removeHandler(handler)
    (record,) = records
    assert record.msg == "run %s: %d rows, %.1f s, %r, %s"  # grouping by template still works
    assert record.getMessage() == "run r\\x1b: 3 rows, 1.5 s, 'x\\u202e', a\\nb"


# -- an engine's status details (the case) -----------------------------------------


async def end_with_hostile_details(
    wal: Path,
) -> tuple[EngineUnavailableError, str | None, str | None]:
    """A run whose engine ends every stream with :data:`HOSTILE` before answering.

    Returns the handshake's error, ``stats().last_error`` and the log's
    stored ``last_error``. The run keeps one unacked row and no owner.
    """

    async def script(stream: RogueStream) -> None:
        await stream.read()  # the handshake: never answered
        await stream.abort(grpc.StatusCode.UNAVAILABLE, HOSTILE)

    engine = RogueEngine(script)
    await engine.start()
    token = secrets.token_urlsafe(18)
    config = engine.channel_config(wal, "run-hostile", token, connect_timeout_ms=1_500)
    try:
        async with GrpcEngineChannel(config) as ch:
            ch.send_finding({"n": 1})
            with pytest.raises(EngineUnavailableError) as caught:
                await ch.handshake("1", "h", "1")
            return caught.value, ch.stats().last_error, ch.log.meta().last_error
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_an_engines_hostile_status_details_are_escaped_in_its_error_and_log_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="walchannel"):
        exc, last_error, stored = await end_with_hostile_details(tmp_path / "wal")
    # Shown (str, a traceback, a log line): escaped; kept (args, stats, meta): as received.
    assert_safe(str(exc), "str(EngineUnavailableError)")
    assert ESCAPED in str(exc)
    assert HOSTILE in exc.args[0]
    assert last_error is not None and HOSTILE in last_error
    assert stored is not None and HOSTILE in stored
    records = walchannel_records(caplog)
    assert any(ESCAPED in r.getMessage() for r in records), "the stream's end was not logged"
    for record in records:
        assert_safe(record.getMessage(), f"log record {record.name}")
    assert_lines_safe(caplog.text, "the formatted log")


# -- a discovery server's answer --------------------------------------------------------------

# A same-host redirect whose path holds C1 controls (CSI, OSC, ST), as
# Latin-1 bytes: HTTP lets them through, and the next answer is an error
# whose text names the URL.
HOSTILE_PATH = b"/next\x9b2J\x9d0;pwned\x9c"
RAW_PATH = HOSTILE_PATH.decode("latin-1")
SHOWN_PATH = "/next\\x9b2J\\x9d0;pwned\\x9c"


@contextlib.contextmanager
def redirecting_server() -> Iterator[str]:
    """GET /grpc-address: 302 to :data:`HOSTILE_PATH`, which answers 503."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            # Raw bytes: http.server would encode a str header value itself.
            head = (
                b"HTTP/1.1 302 Found\r\nLocation: " + HOSTILE_PATH
                if self.path == "/grpc-address"
                else b"HTTP/1.1 503 Service Unavailable"
            )
            self.wfile.write(head + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    with serving(Handler) as url:
        yield url


@pytest.mark.asyncio
async def test_a_hostile_discovery_answer_is_escaped_in_the_error_and_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with redirecting_server() as http_addr:
        async with httpx.AsyncClient() as client:
            with pytest.raises(DiscoveryError) as caught:
                await discover(client, http_addr, allowed_hosts=None, timeout_s=5)
        assert_safe(str(caught.value), "str(DiscoveryError)")
        assert f"{SHOWN_PATH} answered HTTP 503" in str(caught.value)
        assert RAW_PATH in caught.value.args[0]  # kept as received

        # The channel asks discovery when it re-dials: the first stream ends at once.
        streams: list[int] = []

        async def script(stream: RogueStream) -> None:
            streams.append(1)
            await answer_handshakes(stream)
            if len(streams) == 1:
                await stream.abort(grpc.StatusCode.UNAVAILABLE, "moving")
            while await stream.read() is not None:
                pass

        engine = RogueEngine(script)
        await engine.start()
        config = local_channel_config(
            engine,  # type: ignore[arg-type]
            tmp_path / "wal",
            "run-discovery",
            secrets.token_urlsafe(18),
            http_addr=http_addr,
            allowed_hosts=["127.0.0.1"],
        )
        try:
            with caplog.at_level(logging.DEBUG, logger="walchannel"):
                async with GrpcEngineChannel(config) as ch:
                    await ch.handshake("1", "h", "1")
                    await eventually(lambda: len(streams) >= 2, what="a second stream")
                    last_error = ch.log.meta().last_error
        finally:
            await engine.stop()
    assert last_error is not None and RAW_PATH in last_error  # kept as received
    records = walchannel_records(caplog)
    for record in records:
        assert_safe(record.getMessage(), f"log record {record.name}")
    assert any(SHOWN_PATH in r.getMessage() for r in records), "discovery's failure not logged"


# -- the command's human output ------------------------------------------------------------


def test_inspect_escapes_an_engines_hostile_details_and_json_keeps_them(
    tmp_path: Path,
) -> None:
    wal = tmp_path / "wal"
    # Not a pytest-asyncio test: the engine is gone before the command runs.
    asyncio.run(end_with_hostile_details(wal))
    # The run is orphaned (a row, no owner): its last error is shown.
    shown = cli("inspect", wal)
    assert shown.returncode == 1, shown
    assert_lines_safe(shown.stdout, "inspect")
    assert ESCAPED in shown.stdout
    watched = cli("inspect", wal, "--watch", "1", "--watch-count", "1")
    assert_lines_safe(watched.stdout, "inspect --watch")
    assert ESCAPED in watched.stdout
    # --json is exact: the text as received, escaped by JSON alone.
    (run,) = json.loads(cli("inspect", wal, "--json").stdout)
    assert HOSTILE in run["last_error"]


# Short enough that ``--show --wide`` prints it whole (a body is cut at 100 characters).
PAYLOAD_TEXT = "\x1b]0;t\x07\x9b2J\x7f\u202eevil\nrun-other"


def test_inspect_show_escapes_the_strings_of_a_payload_and_export_keeps_them(
    tmp_path: Path,
) -> None:
    wal = tmp_path / "wal"
    body = {"type": "note\u2066", "severity": "info", "payload": {"msg": PAYLOAD_TEXT}, "ts": ""}
    with RunLog.open(wal, "run-payload", correlation_id="c") as log:
        log.append("event", body)
    fitted = cli("inspect", wal, "--show", "1")
    assert fitted.returncode == 1, fitted  # orphaned: a row, no owner
    assert_lines_safe(fitted.stdout, "inspect --show")  # cut to fit 120 columns, still safe
    shown = cli("inspect", wal, "--show", "1", "--wide")
    assert_lines_safe(shown.stdout, "inspect --show --wide")
    for escaped in ("\\x9b2J", "\\x7f", "\\u202eevil", "note\\u2066"):
        assert escaped in shown.stdout
    exported = cli("export", wal / "run-payload.wal.sqlite3")
    assert json.loads(exported.stdout)["body"] == body  # exact


def test_a_log_file_name_with_controls_is_escaped_by_inspect_and_in_errors(
    tmp_path: Path,
) -> None:
    wal = tmp_path / "wal"
    with RunLog.open(wal, "run-named", correlation_id="c") as log:
        log.append("finding", {"fields": {"n": 1}})
    hostile = wal / "run-named\x1bc\u202e.wal.sqlite3"
    (wal / "run-named.wal.sqlite3").rename(hostile)
    shown = cli("inspect", wal)
    assert_lines_safe(shown.stdout, "inspect")
    assert "run-named\\x1bc\\u202e.wal.sqlite3" in shown.stdout
    (run,) = json.loads(cli("inspect", wal, "--json").stdout)
    assert run["file"] == str(hostile)  # exact
    missing = cli("inspect", tmp_path / "no\x1b[2Jsuch")
    assert missing.returncode == 2
    assert_lines_safe(missing.stderr, "inspect's error")
    assert "no\\x1b[2Jsuch" in missing.stderr


def test_the_watch_view_escapes_a_folder_name(tmp_path: Path) -> None:
    wal = tmp_path / "w\x1b[2J\u202e"
    with RunLog.open(wal, "run-w", correlation_id="c") as log:
        log.append("finding", {"fields": {"n": 1}})
    watched = cli("inspect", wal, "--watch", "1", "--watch-count", "1")
    assert_lines_safe(watched.stdout, "inspect --watch")
    assert "w\\x1b[2J\\u202e" in watched.stdout
