"""The run's manifest: the JSON file that names a run and carries its token (SPEC "The runner").

The design note hands a harness its run as a manifest (``runId``,
``correlationId``, ``runToken``, ``hardDeadline``); the file format is
walchannel's. Everything else a channel takes comes from keyword options
of :func:`walchannel.run_harness` and the existing environment variables.
"""

from __future__ import annotations

import difflib
import json
import os
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from walchannel._logging import get_logger
from walchannel.config import GrpcChannelConfig
from walchannel.errors import ConfigurationError
from walchannel.wire.messages import parse_rfc3339

__all__ = ["MANIFEST_ENV", "Manifest", "ManifestError"]

logger = get_logger(__name__)

#: The variable that names the manifest when no path is given.
MANIFEST_ENV: Final = "WALCHANNEL_MANIFEST"
#: A manifest is a few hundred bytes; a bigger file is not one.
MAX_MANIFEST_BYTES: Final = 1 << 20
_REQUIRED: Final = ("runId", "correlationId", "runToken", "hardDeadline", "grpcAddr")
_OPTIONAL: Final = ("httpAddr",)
_KNOWN: Final = _REQUIRED + _OPTIONAL


class ManifestError(ConfigurationError, ValueError):
    """The manifest cannot be used: no file, unreadable, not JSON, a key missing or invalid.

    Attributes:
        path: the manifest's path (None: none was named).
        key: the key at fault (None: the file as a whole).

    The message names the file and the key, never the token's value.
    """

    def __init__(self, path: Path | None, key: str | None, reason: str) -> None:
        self.path = path
        self.key = key
        where = "no manifest" if path is None else f"manifest {path}"
        if key is not None:
            where += f": key {key!r}"
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class Manifest:
    """One run, as the platform that started the harness describes it.

    Attributes:
        run_id, correlation_id: the run (``runId``, ``correlationId``).
        run_token: the run's bearer token (``runToken``; never in ``repr``).
        hard_deadline: when the run (and its token) expires, aware, UTC.
        grpc_addr: the engine's gRPC address, ``host:port``.
        http_addr: the discovery base URL (None: re-dial ``grpc_addr``).
        path: the file it was loaded from (None: built in code, as the
            demo builds one from its command line).
    """

    run_id: str
    correlation_id: str
    run_token: str = field(repr=False)
    hard_deadline: datetime
    grpc_addr: str
    http_addr: str | None = None
    path: Path | None = None

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> Manifest:
        """Read and check a manifest file.

        Args:
            path: the file; None: ``$WALCHANNEL_MANIFEST``.

        Returns:
            The manifest. An unknown key (a typo such as ``httpAdr``) and a
            file group or others may read are each a WARNING naming them.

        Raises:
            ManifestError: no path and no ``$WALCHANNEL_MANIFEST``; the file
                cannot be read or is not a JSON object; a required key is
                missing, or a key's value is not what it must be.
        """
        if path is None:
            named = os.environ.get(MANIFEST_ENV)
            if not named:
                raise ManifestError(
                    None, None, f"pass its path (--manifest PATH) or set ${MANIFEST_ENV}"
                )
            path = named
        where = Path(path)
        data = _read_object(where)
        for key in sorted(set(data) - set(_KNOWN)):
            hint = difflib.get_close_matches(key, _KNOWN, n=1)
            logger.warning(
                "manifest %s: unknown key %r ignored%s",
                where,
                key,
                f" (did you mean {hint[0]!r}?)" if hint else f" (known: {', '.join(_KNOWN)})",
            )
        for key in _REQUIRED:
            if key not in data:
                raise ManifestError(where, key, "missing (required: " + ", ".join(_REQUIRED) + ")")
        text = {key: _text(where, key, data[key]) for key in _KNOWN if key in data}
        try:
            deadline = parse_rfc3339(text["hardDeadline"])
        except ValueError as exc:
            raise ManifestError(where, "hardDeadline", str(exc)) from None
        return cls(
            run_id=text["runId"],
            correlation_id=text["correlationId"],
            run_token=text["runToken"],
            hard_deadline=deadline,
            grpc_addr=text["grpcAddr"],
            http_addr=text.get("httpAddr"),
            path=where,
        )

    def channel_config(self, **options: Any) -> GrpcChannelConfig:
        """The run's :class:`~walchannel.GrpcChannelConfig`, ``options`` for the other fields.

        Raises:
            ManifestError: a manifest value the config refuses (``grpcAddr``
                not ``host:port``, a ``runId`` that is not safe); the key named.
            ValueError: an option the config refuses, as the config says.
            TypeError: an option the config has no field for.
        """
        fields_of = {
            "run_id": ("runId", self.run_id),
            "correlation_id": ("correlationId", self.correlation_id),
            "run_token": ("runToken", self.run_token),
            "grpc_addr": ("grpcAddr", self.grpc_addr),
            "http_addr": ("httpAddr", self.http_addr),
            "hard_deadline": ("hardDeadline", self.hard_deadline),
        }
        taken = sorted(set(options) & set(fields_of))
        if taken:
            raise TypeError(
                f"{', '.join(taken)}: the manifest {self.path} gives these; not an option"
            )
        try:
            given: dict[str, Any] = {name: value for name, (_, value) in fields_of.items()}
            return GrpcChannelConfig(**given, **options)
        except ValueError as exc:
            message = str(exc)
            for name, (key, _) in fields_of.items():
                # The config's message starts with its field; the user wrote the key.
                if message.startswith(name):
                    raise ManifestError(self.path, key, message) from None
            raise


def _read_object(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(path, None, f"cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode) and mode & 0o077:
        logger.warning(
            "manifest %s holds the run's token and group or others may read it (mode %s):"
            " chmod 600 %s",
            path,
            oct(stat.S_IMODE(mode)),
            path,
        )
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(path, None, f"over {MAX_MANIFEST_BYTES} bytes: not a manifest")
    # Decoded strictly here (json.loads would guess UTF-16/32 and pass
    # surrogates), and raised outside the except: a decode error's context
    # holds the whole document, the token too.
    problem = None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text (byte {exc.start})"
    except json.JSONDecodeError as exc:
        # exc.msg never quotes the document.
        problem = f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    if problem is not None:
        raise ManifestError(path, None, problem)
    if not isinstance(data, dict):
        raise ManifestError(path, None, f"a JSON object is required, got {type(data).__name__}")
    return data


def _text(path: Path, key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ManifestError(path, key, f"a string is required, got {type(value).__name__}")
    if not value.strip():
        raise ManifestError(path, key, "empty")
    return value
