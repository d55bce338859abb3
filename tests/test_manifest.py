"""The run's manifest (SPEC "The runner — `walchannel.run_harness`", "The manifest").

``Manifest.load`` and ``Manifest.channel_config``: each kind of bad input
with at least two members, and for every one of them the run token absent
from the error, its ``repr``, its traceback and the log.
"""

from __future__ import annotations

import json
import logging
import os
import traceback
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from walchannel import GrpcChannelConfig
from walchannel.errors import WalchannelError
from walchannel.runner.manifest import MANIFEST_ENV, MAX_MANIFEST_BYTES, Manifest, ManifestError

TOKEN = "tok-SECRET-abc123"
LOGGER = "walchannel.runner.manifest"
REQUIRED = ("runId", "correlationId", "runToken", "hardDeadline", "grpcAddr")
GOOD: dict[str, Any] = {
    "runId": "run-1",
    "correlationId": "corr-1",
    "runToken": TOKEN,
    "hardDeadline": "2030-01-02T03:04:05Z",
    "grpcAddr": "127.0.0.1:50051",
}


def write(path: Path, content: dict[str, Any] | bytes | str, mode: int = 0o600) -> Path:
    """Write ``content`` (a dict as JSON) to ``path`` with ``mode``; return ``path``."""
    if isinstance(content, dict):
        content = json.dumps(content)
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    path.chmod(mode)
    return path


def good(**changes: Any) -> dict[str, Any]:
    """The good manifest with ``changes`` (a value of ``...`` drops the key)."""
    data = {**GOOD, **changes}
    return {key: value for key, value in data.items() if value is not ...}


def load_fails(path: str | Path | None, caplog: pytest.LogCaptureFixture) -> ManifestError:
    """``Manifest.load(path)`` raises ManifestError, which (and the log) hold no token."""
    with caplog.at_level(logging.DEBUG, logger=LOGGER), pytest.raises(ManifestError) as info:
        Manifest.load(path)
    exc = info.value
    assert_no_token(exc, caplog)
    return exc


def assert_no_token(exc: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    shown = {
        "str": str(exc),
        "repr": repr(exc),
        "args": repr(exc.args),
        "traceback": "".join(traceback.format_exception(exc)),
        "log": caplog.text,
    }
    # Nor in what a tool walking the chain would find (a decode error's .doc is the file).
    context = exc.__context__ or exc.__cause__
    while context is not None:
        shown["context"] = shown.get("context", "") + repr(vars(context)) + repr(context.args)
        context = context.__context__ or context.__cause__
    for where, text in shown.items():
        assert TOKEN not in text, f"the token is in the error's {where}: {text!r}"
        assert "SECRET" not in text, f"part of the token is in the error's {where}: {text!r}"


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING
    ]


# --- a good manifest -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "deadline", "http_addr"),
    [
        ({}, datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC), None),
        (
            {"hardDeadline": "2030-01-02T03:04:05.250+01:30", "httpAddr": "https://engine.example"},
            datetime(2030, 1, 2, 1, 34, 5, 250_000, tzinfo=UTC),
            "https://engine.example",
        ),
        (
            {"hardDeadline": "2030-01-02t03:04:05z", "httpAddr": "http://10.0.0.1:8080"},
            datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
            "http://10.0.0.1:8080",
        ),
    ],
    ids=["utc", "offset-fraction-https", "lowercase-http"],
)
def test_a_good_manifest_loads(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    changes: dict[str, Any],
    deadline: datetime,
    http_addr: str | None,
) -> None:
    path = write(tmp_path / "m.json", good(**changes))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        manifest = Manifest.load(path)
        also = Manifest.load(str(path))  # a str path too
    assert manifest == also
    assert manifest.run_id == "run-1"
    assert manifest.correlation_id == "corr-1"
    assert manifest.run_token == TOKEN
    assert manifest.hard_deadline == deadline
    assert manifest.hard_deadline.utcoffset() == timedelta(0)
    assert manifest.grpc_addr == "127.0.0.1:50051"
    assert manifest.http_addr == http_addr
    assert manifest.path == path
    assert TOKEN not in repr(manifest) and "SECRET" not in repr(manifest)
    assert "run-1" in repr(manifest)  # the repr is a real one, only the token left out
    assert warnings_of(caplog) == []  # mode 0600, known keys only
    assert TOKEN not in caplog.text


def test_a_manifest_error_is_a_value_error_and_a_walchannel_error(tmp_path: Path) -> None:
    path = write(tmp_path / "m.json", good(runId=...))
    with pytest.raises(ValueError, match="runId") as info:
        Manifest.load(path)
    assert isinstance(info.value, ManifestError)
    assert isinstance(info.value, WalchannelError)


# --- 1. a key missing -----------------------------------------------------------------


@pytest.mark.parametrize("key", REQUIRED)
def test_a_missing_key_is_named(tmp_path: Path, caplog: pytest.LogCaptureFixture, key: str) -> None:
    data = good(**{key: ...})
    if key != "runToken":
        assert data["runToken"] == TOKEN  # the token is in the file, and must not leak
    else:
        data["runTokn"] = TOKEN  # a typo: the token is there under an unknown key
    path = write(tmp_path / "m.json", data)
    exc = load_fails(path, caplog)
    assert exc.key == key
    assert exc.path == path
    message = str(exc)
    assert f"'{key}'" in message
    assert str(path) in message
    assert "missing" in message
    if key == "runToken":
        # The unknown key is still warned about, by name, without its value.
        assert any("'runTokn'" in w and "'runToken'" in w for w in warnings_of(caplog))


def test_several_missing_keys_name_one_of_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "m.json", {"runToken": TOKEN})
    exc = load_fails(path, caplog)
    assert exc.key in REQUIRED and exc.key != "runToken"
    assert f"'{exc.key}'" in str(exc) and str(path) in str(exc)


# --- 2. a bad deadline ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("deadline", "says"),
    [
        ("tomorrow", "not an RFC 3339 timestamp"),
        ("2030-01-02 03:04:05", "RFC 3339"),  # a space and no offset
        ("2030-01-02T03:04:05", "no UTC offset"),
        ("2030-02-30T00:00:00Z", "day"),  # Feb 30: out of range
        ("2030-13-01T00:00:00Z", "month"),
        ("2030-01-02T24:00:00Z", "hour"),
        ("2030-W01-1T00:00:00Z", "RFC 3339"),  # ISO 8601 week form
    ],
)
def test_a_bad_deadline_names_hard_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, deadline: str, says: str
) -> None:
    path = write(tmp_path / "m.json", good(hardDeadline=deadline))
    exc = load_fails(path, caplog)
    assert exc.key == "hardDeadline"
    assert exc.path == path
    message = str(exc)
    assert "'hardDeadline'" in message and str(path) in message
    assert says in message
    assert repr(deadline[:40]) in message  # the parser's message: the bad value quoted


# --- 3. a wrong type or an empty value ------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("runId", 42, "a string is required, got int"),
        ("grpcAddr", "", "empty"),
        ("correlationId", None, "a string is required, got NoneType"),
        ("runToken", [TOKEN], "a string is required, got list"),
        ("runToken", "", "empty"),
        ("runToken", {"value": TOKEN}, "a string is required, got dict"),
        ("hardDeadline", 1893456000, "a string is required, got int"),
        ("hardDeadline", "", "empty"),
        ("runId", "   ", "empty"),
        ("grpcAddr", True, "a string is required, got bool"),
        ("httpAddr", 8080, "a string is required, got int"),
        ("httpAddr", "", "empty"),
    ],
)
def test_a_wrong_type_or_empty_value_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, key: str, value: object, says: str
) -> None:
    data = good(**{key: value})
    if key == "runToken":
        data["note"] = TOKEN  # the token elsewhere in the file: still never shown
    path = write(tmp_path / "m.json", data)
    exc = load_fails(path, caplog)
    assert exc.key == key
    assert exc.path == path
    message = str(exc)
    assert f"'{key}'" in message and str(path) in message
    assert says in message


# --- 4. a file that cannot be read or is not a manifest -------------------------------


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "absent.json"


def _directory(tmp_path: Path) -> Path:
    path = tmp_path / "a-directory.json"
    path.mkdir()
    return path


def _missing_folder(tmp_path: Path) -> Path:
    return tmp_path / "no-such-folder" / "m.json"


def _content(content: bytes) -> Callable[[Path], Path]:
    def make(tmp_path: Path) -> Path:
        return write(tmp_path / "m.json", content)

    return make


_PREFIX = json.dumps(good())[:-1].encode()  # the good manifest without its closing brace

NOT_A_MANIFEST = [
    pytest.param(_missing, "cannot be read", id="missing-file"),
    pytest.param(_missing_folder, "cannot be read", id="missing-folder"),
    pytest.param(_directory, "cannot be read", id="a-directory"),
    pytest.param(_content(b"runToken = tok-SECRET-abc123\n"), "not JSON", id="not-json-toml"),
    pytest.param(_content(b""), "not JSON", id="empty-file"),
    pytest.param(
        _content(b'{"runToken": "tok-SECRET-abc123",,}'), "not JSON", id="broken-after-token"
    ),
    pytest.param(_content(b'{"runToken": tok-SECRET-abc123}'), "not JSON", id="token-unquoted"),
    pytest.param(_content(_PREFIX), "not JSON", id="truncated-after-token"),
    pytest.param(_content(b'{"runToken": "tok-SECRET-abc123\n"}'), "not JSON", id="raw-newline"),
    pytest.param(
        _content(b'["tok-SECRET-abc123"]'), "a JSON object is required, got list", id="list"
    ),
    pytest.param(_content(b'"tok-SECRET-abc123"'), "a JSON object is required, got str", id="str"),
    pytest.param(_content(b"null"), "a JSON object is required, got NoneType", id="null"),
    pytest.param(_content(b"42"), "a JSON object is required, got int", id="number"),
    pytest.param(_content(_PREFIX[:20] + b"\xff" + _PREFIX[20:] + b"}"), "not UTF-8", id="byte-ff"),
    pytest.param(
        _content(_PREFIX.replace(b"corr-1", b"corr-\xc3\x28") + b"}"),
        "not UTF-8",
        id="bad-continuation",
    ),
    pytest.param(
        _content(_PREFIX.replace(b"corr-1", b"corr-\xe2\x82") + b"}"),
        "not UTF-8",
        id="truncated-sequence",
    ),
    pytest.param(_content(json.dumps(good()).encode("utf-16")), "not UTF-8", id="utf-16"),
    # (UTF-32-BE of ASCII is valid UTF-8, NULs and all: it is no JSON.)
    pytest.param(_content(json.dumps(good()).encode("utf-32-be")), "not JSON", id="utf-32"),
    pytest.param(
        _content(_PREFIX.replace(b"corr-1", b"corr-\xed\xa0\x80") + b"}"),
        "not UTF-8",
        id="surrogate-bytes",
    ),
    pytest.param(
        _content(_PREFIX + b', "pad": "' + b"x" * MAX_MANIFEST_BYTES + b'"}'),
        f"over {MAX_MANIFEST_BYTES} bytes",
        id="over-1-MiB",
    ),
    pytest.param(
        _content(b" " * (MAX_MANIFEST_BYTES + 1)),
        f"over {MAX_MANIFEST_BYTES} bytes",
        id="1-MiB-spaces",
    ),
]


@pytest.mark.parametrize(("make", "says"), NOT_A_MANIFEST)
def test_a_file_that_is_not_a_manifest_names_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, make: Callable[[Path], Path], says: str
) -> None:
    path = make(tmp_path)
    exc = load_fails(path, caplog)
    assert exc.key is None
    assert exc.path == path
    message = str(exc)
    assert f"manifest {path}" in message
    assert ": key " not in message
    assert says in message


def test_a_manifest_of_exactly_1_mib_is_read(tmp_path: Path) -> None:
    body = json.dumps(good()).encode()
    padded = body + b" " * (MAX_MANIFEST_BYTES - len(body))
    assert len(padded) == MAX_MANIFEST_BYTES
    manifest = Manifest.load(write(tmp_path / "m.json", padded))
    assert manifest.run_token == TOKEN


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 0000")
@pytest.mark.parametrize("mode", [0o000, 0o200])
def test_a_file_without_read_permission_names_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    path = write(tmp_path / "m.json", good(), mode=mode)
    exc = load_fails(path, caplog)
    assert exc.key is None and exc.path == path
    assert str(path) in str(exc) and "cannot be read" in str(exc)


# --- 5. unknown keys ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        ({"httpAdr": "https://engine.example"}, ["'httpAdr'", "did you mean 'httpAddr'"]),
        ({"runid": "run-2"}, ["'runid'", "did you mean 'runId'"]),
        ({"grpcAdress": "x:1"}, ["'grpcAdress'", "did you mean 'grpcAddr'"]),
        (
            {"colour": "blue"},
            ["'colour'", "known: runId, correlationId, runToken, hardDeadline, grpcAddr, httpAddr"],
        ),
        ({"zzz": 1}, ["'zzz'", "known: runId, correlationId, runToken", "httpAddr"]),
    ],
)
def test_an_unknown_key_is_a_warning_and_the_manifest_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, extra: dict[str, Any], expect: list[str]
) -> None:
    path = write(tmp_path / "m.json", {**good(), **extra})
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        manifest = Manifest.load(path)
    assert manifest.run_id == "run-1" and manifest.grpc_addr == "127.0.0.1:50051"
    assert manifest.http_addr is None  # httpAdr is not httpAddr
    warned = warnings_of(caplog)
    assert len(warned) == 1, warned
    assert str(path) in warned[0] and "unknown key" in warned[0]
    for part in expect:
        assert part in warned[0]
    assert TOKEN not in caplog.text


def test_each_unknown_key_is_its_own_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "m.json", {**good(), "httpAdr": "https://x", "colour": "red"})
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        Manifest.load(path)
    warned = warnings_of(caplog)
    assert len(warned) == 2
    assert any("'httpAdr'" in w and "'httpAddr'" in w for w in warned)
    assert any("'colour'" in w and "known:" in w for w in warned)


def test_an_unknown_key_is_warned_even_when_the_manifest_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "m.json", {**good(grpcAddr=...), "grpcAdr": "127.0.0.1:1"})
    exc = load_fails(path, caplog)
    assert exc.key == "grpcAddr"
    assert any("'grpcAdr'" in w and "did you mean 'grpcAddr'" in w for w in warnings_of(caplog))


# --- 6. permissions -------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_manifest_others_may_read_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    path = write(tmp_path / "m.json", good(), mode=mode)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        manifest = Manifest.load(path)
    assert manifest.run_token == TOKEN  # it still loads
    warned = warnings_of(caplog)
    assert len(warned) == 1, warned
    assert f"chmod 600 {path}" in warned[0]
    assert oct(mode) in warned[0]
    assert TOKEN not in caplog.text


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_manifest_is_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    path = write(tmp_path / "m.json", good(), mode=mode)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        Manifest.load(path)
    assert warnings_of(caplog) == []
    assert "chmod" not in caplog.text


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_the_permission_warning_comes_before_a_bad_manifest_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    path = write(tmp_path / "m.json", good(hardDeadline="tomorrow"), mode=mode)
    exc = load_fails(path, caplog)
    assert exc.key == "hardDeadline"
    assert any("chmod 600" in w for w in warnings_of(caplog))


# --- 7. no path: $WALCHANNEL_MANIFEST -------------------------------------------------


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_no_path_and_no_variable_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(MANIFEST_ENV, raising=False)
    else:
        monkeypatch.setenv(MANIFEST_ENV, value)
    exc = load_fails(None, caplog)
    assert exc.path is None and exc.key is None
    assert "WALCHANNEL_MANIFEST" in str(exc)
    assert "--manifest" in str(exc)
    assert str(exc).startswith("no manifest")


@pytest.mark.parametrize("name", ["m.json", "run manifest.json"])
def test_no_path_reads_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = write(tmp_path / name, good(runId="run-from-env"))
    monkeypatch.setenv(MANIFEST_ENV, str(path))
    manifest = Manifest.load()
    assert manifest.run_id == "run-from-env"
    assert manifest.path == path
    assert Manifest.load(None) == manifest


def test_a_path_given_wins_over_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = write(tmp_path / "env.json", good(runId="run-from-env"))
    given = write(tmp_path / "given.json", good(runId="run-given"))
    monkeypatch.setenv(MANIFEST_ENV, str(named))
    assert Manifest.load(given).run_id == "run-given"


@pytest.mark.parametrize("content", [None, b'{"runToken": "tok-SECRET-abc123",,}'])
def test_the_variable_naming_a_bad_file_names_that_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    content: bytes | None,
) -> None:
    path = tmp_path / "m.json"
    if content is not None:
        write(path, content)
    monkeypatch.setenv(MANIFEST_ENV, str(path))
    exc = load_fails(None, caplog)
    assert exc.path == path and exc.key is None
    assert str(path) in str(exc)


# --- 9. channel_config ----------------------------------------------------------------


def loaded(tmp_path: Path, **changes: Any) -> Manifest:
    return Manifest.load(write(tmp_path / "m.json", good(**changes)))


@pytest.mark.parametrize(
    ("grpc_addr", "says"),
    [
        ("no-port", "has no port"),
        ("http://x:1", "not a URL or path"),
        ("[::1]", "IPv6"),
        ("engine.example:99999", "out of range"),
        ("engine.example:http", "not a number"),
        (" engine.example:1", "without spaces"),
    ],
)
def test_channel_config_names_grpc_addr(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, grpc_addr: str, says: str
) -> None:
    with caplog.at_level(logging.DEBUG):
        manifest = loaded(tmp_path, grpcAddr=grpc_addr)  # a non-empty str: load takes it
        with pytest.raises(ManifestError) as info:
            manifest.channel_config()
    exc = info.value
    assert exc.key == "grpcAddr"
    assert exc.path == tmp_path / "m.json"
    assert str(tmp_path / "m.json") in str(exc) and "'grpcAddr'" in str(exc)
    assert says in str(exc)
    assert_no_token(exc, caplog)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"runId": "../escape"}, "runId"),
        ({"runId": "a b"}, "runId"),
        ({"runId": "run/1"}, "runId"),
        ({"correlationId": "corr\u00e9"}, "correlationId"),
        ({"correlationId": " corr"}, "correlationId"),
        ({"httpAddr": "ftp://engine.example"}, "httpAddr"),
        ({"httpAddr": "https://"}, "httpAddr"),
    ],
)
def test_channel_config_names_the_manifest_key_the_config_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, changes: dict[str, Any], key: str
) -> None:
    with caplog.at_level(logging.DEBUG):
        manifest = loaded(tmp_path, **changes)
        with pytest.raises(ManifestError) as info:
            manifest.channel_config()
    assert info.value.key == key
    assert f"'{key}'" in str(info.value) and str(manifest.path) in str(info.value)
    assert_no_token(info.value, caplog)


@pytest.mark.parametrize(
    "token",
    [
        TOKEN + " ",  # trailing whitespace: HTTP/2 would strip it
        TOKEN + "\u00e9",  # not ASCII
        TOKEN + "\t",
        " " + TOKEN,
    ],
)
def test_channel_config_refusing_the_token_never_shows_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, token: str
) -> None:
    with caplog.at_level(logging.DEBUG):
        manifest = loaded(tmp_path, runToken=token)
        with pytest.raises(ManifestError) as info:
            manifest.channel_config()
    assert info.value.key == "runToken"
    assert "'runToken'" in str(info.value)
    assert_no_token(info.value, caplog)
    assert "\u00e9" not in str(info.value)  # not even the bad character


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"keepalive_ms": 5}, "keepalive_ms"),
        ({"connect_timeout_ms": 0}, "connect_timeout_ms"),
        ({"durability": "fast"}, "durability"),
        ({"tls_server_name": ""}, "tls_server_name"),
        ({"allowed_hosts": "engine.example"}, "allowed_hosts"),
    ],
)
def test_channel_config_refusing_an_option_is_a_value_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, options: dict[str, Any], names: str
) -> None:
    manifest = loaded(tmp_path)
    with caplog.at_level(logging.DEBUG), pytest.raises(ValueError, match=names) as info:
        manifest.channel_config(**options)
    assert not isinstance(info.value, ManifestError)
    assert_no_token(info.value, caplog)


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"run_id": "other"}, "run_id"),
        ({"run_token": "tok-other"}, "run_token"),
        ({"grpc_addr": "127.0.0.1:1"}, "grpc_addr"),
        ({"hard_deadline": datetime(2031, 1, 1, tzinfo=UTC)}, "hard_deadline"),
        ({"correlation_id": "c", "http_addr": None}, "correlation_id, http_addr"),
    ],
)
def test_channel_config_refuses_an_option_the_manifest_gives(
    tmp_path: Path, options: dict[str, Any], names: str
) -> None:
    manifest = loaded(tmp_path)
    with pytest.raises(TypeError) as info:
        manifest.channel_config(**options)
    assert names in str(info.value) and "the manifest" in str(info.value)
    assert str(manifest.path) in str(info.value)
    assert TOKEN not in str(info.value)


@pytest.mark.parametrize("option", ["no_such_option", "runId"])
def test_channel_config_refuses_an_unknown_option(tmp_path: Path, option: str) -> None:
    manifest = loaded(tmp_path)
    with pytest.raises(TypeError, match=option) as info:
        manifest.channel_config(**{option: 1})
    assert not isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("changes", "options"),
    [
        ({}, {}),
        (
            {"httpAddr": "https://engine.example", "hardDeadline": "2030-06-01T12:00:00-05:00"},
            {"keepalive_ms": 30_000, "durability": "power"},
        ),
    ],
)
def test_channel_config_gives_the_run(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    changes: dict[str, Any],
    options: dict[str, Any],
) -> None:
    manifest = loaded(tmp_path, **changes)
    with caplog.at_level(logging.DEBUG):
        config = manifest.channel_config(wal_dir=tmp_path / "wal", **options)
    assert isinstance(config, GrpcChannelConfig)
    assert config.run_id == manifest.run_id == "run-1"
    assert config.correlation_id == "corr-1"
    assert config.run_token == TOKEN
    assert config.grpc_addr == "127.0.0.1:50051"
    assert config.hard_deadline == manifest.hard_deadline
    assert config.http_addr == manifest.http_addr == changes.get("httpAddr")
    assert config.wal_dir == tmp_path / "wal"
    for name, value in options.items():
        assert getattr(config, name) == value
    assert TOKEN not in repr(config) and "SECRET" not in repr(config)
    assert "run-1" in repr(config)
    assert TOKEN not in caplog.text


@pytest.mark.parametrize(
    ("changes", "options", "key"),
    [
        ({"grpcAddr": "run_id"}, {}, "grpcAddr"),  # a value that spells another field's name
        ({"grpcAddr": "correlation_id"}, {}, "grpcAddr"),
        ({}, {"durability": "run_id"}, None),  # an option's fault stays a ValueError
        ({}, {"durability": "correlation_id"}, None),
    ],
)
def test_channel_config_blames_the_key_at_fault_not_one_its_value_names(
    tmp_path: Path, changes: dict[str, Any], options: dict[str, Any], key: str | None
) -> None:
    manifest = Manifest.load(write(tmp_path / "m.json", good(**changes)))
    with pytest.raises(ValueError) as info:
        manifest.channel_config(**options)
    if key is None:
        assert not isinstance(info.value, ManifestError)
    else:
        assert isinstance(info.value, ManifestError) and info.value.key == key
