"""``walchannel flush``: deliver an orphaned run's unacked rows to an engine.

Its options (:func:`add_flush`, which :mod:`walchannel.cli` assembles) and
its code (:func:`flush_command`). SPEC "Operating tools"; docs/operations.md
says when to use it.

flush reads the run token (from an environment variable or standard input,
never an argument, never printed), checks that the log can be flushed
(:func:`_check_flushable`: a stored handshake, the token's sha256, ``PRAGMA
quick_check``), takes the log's owner lock (so a live harness's log is
refused), and delivers the unacked rows through a
:class:`~walchannel.GrpcEngineChannel` speaking with the stored
handshake. It is the only command that loads grpc and httpx, imported
inside :func:`_flush`, so importing this module loads neither.

The token comes from ``--token-env VAR``, else ``$WALCHANNEL_RUN_TOKEN``
when set, else standard input. ``--allowed-host`` holds ``--grpc-addr``
and every discovery answer before any dial (an address is often copied
from a log, by ``inspect``'s NEXT STEP).

``--replace-token`` flushes a log started with a wrong token with the
right one: a WARNING (never the token), and the new token's sha256 is
stored only once an engine accepts the handshake.

``--max-receive-message-bytes`` is the channel's ``max_receive_message_bytes``
(an engine may send a down message over the 4 MiB default after every
handshake: every stream would end on it); when the receive limit stopped
delivery, the failure names the flag.

Exit codes: 0 when all is acked; 1 when not within ``--timeout``, or the
engine says the run is completed or is behind; 2 when refused (owner
alive, wrong token, no stored handshake, corrupt log, an engine address
outside ``--allowed-host``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import hashlib
import logging
import os
import shlex
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from walchannel._logging import get_logger
from walchannel.cli.common import (
    RAW,
    positive_float,
    positive_int,
)
from walchannel.cli.inspection import FLUSH_TOKEN_ENV
from walchannel.cli.logs import err
from walchannel.config import DEFAULT_MAX_MESSAGE_BYTES
from walchannel.core.engine_refusals import fenced_error
from walchannel.errors import (
    InsecureDiscoveryWarning,
    WalCorruptError,
    WalLockedError,
    WriterFencedError,
)
from walchannel.log import files
from walchannel.log.format import MetaDamagedError
from walchannel.log.reader import LogReader, LogUnreadableError, run_id_from_name
from walchannel.log.state import refused_at_open
from walchannel.wire.address import AllowedHost, host_allowed, parse_allowed_hosts, parse_host_port

if TYPE_CHECKING:
    import httpx

    from walchannel.channel.grpc_channel import GrpcEngineChannel
    from walchannel.log.format import RunMeta
    from walchannel.log.writer import RunLog

__all__ = ["DEFAULT_FLUSH_TIMEOUT_S", "flush_command"]

logger = get_logger(__name__)

#: flush's default bound for delivering everything (seconds).
DEFAULT_FLUSH_TIMEOUT_S: Final = 300.0
# flush's bound for one dial and handshake, as the channel's default (ms).
_FLUSH_CONNECT_TIMEOUT_MS: Final = 10_000
# How long flush waits between discovery attempts at most (s).
_DISCOVERY_RETRY_MAX_S: Final = 5.0


class _Refused(Exception):
    """A command that must stop with exit 2 (the message says why)."""


def _read_token(env: str | None) -> str:
    """Read the run token: from the variable ``env``, else ``$WALCHANNEL_RUN_TOKEN``, else stdin.

    ``$WALCHANNEL_RUN_TOKEN`` counts when set and not empty; standard input
    is not echoed on a terminal. The token is never printed.

    Raises:
        _Refused: no token there, or one gRPC cannot send (its position, not it).
    """
    from walchannel.config import check_metadata_value

    if env is None and os.environ.get(FLUSH_TOKEN_ENV, "").strip():
        env = FLUSH_TOKEN_ENV
    source = env if env is not None else "standard input"
    if env is not None:
        value = os.environ.get(env, "").strip()
        if not value:
            raise _Refused(f"the environment variable {env} is not set or empty")
    elif sys.stdin is None:
        raise _Refused("no standard input to read the run token from; use --token-env VAR")
    elif sys.stdin.isatty():
        # Not echoed: the token must not land on the screen or in scrollback.
        value = getpass.getpass("run token: ").strip()
    else:
        value = sys.stdin.readline().strip()
    if not value:
        raise _Refused("no run token on standard input (or use --token-env VAR)")
    try:
        # The error gives a position and a kind, never the token.
        check_metadata_value(f"the run token from {source}", value, secret=True)
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    return value


def _check_flushable(wal: RunLog, token: str, *, replace_token: bool = False) -> RunMeta:
    """Refuse a log flush cannot speak for with ``token``; return its meta.

    With ``replace_token``, a token whose sha256 differs from the stored one
    is let through (the caller warns, and the channel stores the new hash
    only once an engine accepts it).

    Raises:
        _Refused: no stored handshake, another token (naming
            ``--replace-token``), ``quick_check`` finds damage, or the log
            was fenced (``WriterFencedError``'s text) and is not marked to
            take the run over.
    """
    meta = wal.meta()
    if meta.completed_at is not None:
        return meta
    if refused_at_open(meta.failed_reason, meta.takeover_at is not None):
        why = f"it was refused before: {meta.failed_reason}"
        raise _Refused(str(fenced_error(meta.run_id, str(wal.path), wal.writer, why)))
    if meta.harness_name is None:
        raise _Refused(
            f"{wal.path}: no stored handshake (the harness never called handshake()); "
            "flush cannot speak for it: restart the harness instead"
        )
    if not replace_token and not _token_matches(meta, token):
        raise _Refused(
            f"{wal.path}: the token does not match this run's (its sha256 differs from "
            "the one stored in the log); if the log was started with a wrong token, "
            "flush with the right one and --replace-token (its sha256 is stored once "
            "the engine accepts it)"
        )
    complaints = wal.quick_check()
    if complaints:
        raise _Refused(f"{wal.path}: corrupt: quick_check: {'; '.join(complaints[:3])}")
    return meta


def _token_matches(meta: RunMeta, token: str) -> bool:
    return meta.token_sha256 == hashlib.sha256(token.encode("utf-8")).hexdigest()


def flush_command(args: argparse.Namespace) -> int:
    """Run ``walchannel flush`` with the parsed ``args``; return the exit code (module doc)."""
    path = files.expand_user(Path(args.log), "LOG")
    try:
        run_id = run_id_from_name(path)
        if run_id is None:
            raise _Refused(f"{path}: LOG must be a run log named <run_id>{files.LOG_SUFFIX}")
        # Read the stored correlation id first, without taking anything; this
        # also makes sure the file exists (RunLog.open would create one).
        try:
            with LogReader(path, run_id) as reader:
                correlation_id = reader.meta().correlation_id
        except MetaDamagedError as exc:
            # Without the marker the harness cannot resume exactly once: refuse,
            # and say what does work on this file.
            raise _Refused(
                f"{exc}; 'walchannel export {shlex.quote(str(path))}' saves its rows"
            ) from None
        except (WalCorruptError, LogUnreadableError) as exc:
            raise _Refused(str(exc)) from None
        try:
            allowed = parse_allowed_hosts(args.allowed_host) if args.allowed_host else None
        except ValueError as exc:
            raise _Refused(f"--allowed-host: {exc}") from None
        if args.grpc_addr is not None:
            # An address often copied from a log (inspect's NEXT STEP): held
            # to --allowed-host as a discovery answer is, before any dial.
            _check_allowed(args.grpc_addr, allowed, f"--grpc-addr {args.grpc_addr}")
        if allowed is None and (args.http_addr or "").startswith("http://"):
            # The config's InsecureDiscoveryWarning, in the CLI's terms (it is
            # silenced in _flush): its file and line would point into walchannel.
            err(
                "flush",
                f"warning: --http-addr {args.http_addr} is plaintext and no --allowed-host "
                f"was given: a forged discovery answer could send run {run_id} anywhere; "
                "pass --allowed-host HOST (or use https://)",
            )
        token = _read_token(args.token_env)
        ca: bytes | None = None
        if args.ca_file is not None:
            try:
                ca = files.expand_user(Path(args.ca_file), "--ca-file", log=False).read_bytes()
            except OSError as exc:
                raise _Refused(f"{args.ca_file}: cannot read: {exc.strerror or exc}") from None
        return asyncio.run(_flush(args, path, run_id, correlation_id, token, ca, allowed))
    except _Refused as exc:
        err("flush", f"refused: {exc}")
        return 2


def _check_allowed(addr: str, allowed: tuple[AllowedHost, ...] | None, what: str) -> None:
    """Refuse ``addr`` (``host:port``) unless its host is in ``--allowed-host`` (None: any).

    Raises:
        _Refused: not ``host:port``, or its host is not allowed; nothing was dialled.
    """
    try:
        host, _port = parse_host_port(addr, what=what.split(" ", 1)[0])
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    if not host_allowed(host, allowed):
        raise _Refused(
            f"{what}: its host {host} is not one --allowed-host allows; not dialled "
            "(the run token was not sent)"
        )


async def _discover_until(
    client: httpx.AsyncClient,
    http_addr: str,
    allowed_hosts: tuple[AllowedHost, ...] | None,
    deadline: float,
    via: str = "",
) -> str | None:
    """Ask ``http_addr`` for the engine's address, retrying until ``deadline``.

    ``via`` (`` via proxy host:port`` or empty) goes into the error lines.
    """
    from walchannel.errors import DiscoveryError
    from walchannel.transport.discovery import discover

    loop = asyncio.get_running_loop()
    delay = 0.5
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return None
        try:
            return await discover(
                client,
                http_addr,
                allowed_hosts=allowed_hosts,
                timeout_s=min(remaining, _FLUSH_CONNECT_TIMEOUT_MS / 1000),
            )
        except DiscoveryError as exc:
            err("flush", f"discovery{via}: {exc}")
        await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))
        delay = min(delay * 2, _DISCOVERY_RETRY_MAX_S)


async def _wait_delivered(channel: GrpcEngineChannel, deadline: float) -> bool:
    from walchannel.core.driver import ChannelState

    loop = asyncio.get_running_loop()
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        if await channel.wait_acked(timeout_ms=min(remaining, 0.5) * 1000):
            return True
        # wait_acked only ends early on close: watch for a final state too.
        if channel.state in (ChannelState.FAILED, ChannelState.EXPIRED, ChannelState.CLOSED):
            return False


@contextlib.contextmanager
def _flush_logging() -> Iterator[None]:
    # The channel reports reconnects and refusals through logging: show them.
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("walchannel flush: %(levelname)s: %(message)s"))
    # The package's root logger, not this module's: every walchannel module
    # logs under getLogger(__name__), and all of them propagate to it.
    package_logger = logging.getLogger("walchannel")
    package_logger.addHandler(handler)
    try:
        yield
    finally:
        package_logger.removeHandler(handler)


async def _flush(
    args: argparse.Namespace,
    path: Path,
    run_id: str,
    correlation_id: str,
    token: str,
    ca: bytes | None,
    allowed: tuple[AllowedHost, ...] | None,
) -> int:
    # grpc and httpx load here, and only here: inspect and export never import them.
    import ssl

    import grpc
    import httpx

    from walchannel.channel.seams import open_channel
    from walchannel.config import GrpcChannelConfig
    from walchannel.core.driver import ChannelState
    from walchannel.core.engine_refusals import receive_limit_in
    from walchannel.errors import (
        EngineBehindError,
        EngineUnavailableError,
        RunCompletedError,
        WalLocationError,
        WalWriteError,
    )
    from walchannel.log.writer import RunLog
    from walchannel.transport.discovery import discovery_client

    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.timeout
    try:
        wal = RunLog.open(path.parent, run_id, correlation_id=correlation_id)
    except WalLockedError as exc:
        raise _Refused(f"{exc} (a live harness owns it; flush only an orphaned run)") from None
    except (WalCorruptError, WalWriteError, ValueError) as exc:
        raise _Refused(str(exc)) from None
    except WalLocationError as exc:  # e.g. not this user's folder: flush as the log's owner
        raise _Refused(f"{exc}; or run flush as the log's owner") from None
    handed_over = False
    try:
        meta = _check_flushable(wal, token, replace_token=args.replace_token)
        replacing = meta.completed_at is None and not _token_matches(meta, token)
        if meta.completed_at is not None:
            print(f"run {run_id} is completed (its log is a tombstone): nothing to flush")
            return 0
        count = wal.unacked_count
        if count == 0:
            kept = "; the log keeps its token's sha256 (no engine was asked)" if replacing else ""
            print(f"run {run_id}: nothing to deliver (every row is acked){kept}")
            return 0
        credentials = grpc.ssl_channel_credentials(root_certificates=ca) if ca else None
        # The same roots for https discovery; the channel reuses this client.
        verify: ssl.SSLContext | bool = True
        if ca is not None:
            verify = ssl.create_default_context(cadata=ca.decode("ascii", "replace"))
        via = ""
        if args.http_addr is not None:
            # The channel's proxy policy (the environment's proxy, as the stream).
            http, proxy = discovery_client(args.http_addr, verify=verify)
            via = f" via proxy {proxy.shown}" if proxy is not None else ""
        else:
            http = httpx.AsyncClient(follow_redirects=False, trust_env=False, verify=verify)
        try:
            with _flush_logging():
                if replacing:
                    logger.warning(
                        "run %s: --replace-token: flushing with a token other than the one "
                        "%s was started with (their sha256 differ); its sha256 is stored in "
                        "the log only once an engine accepts it",
                        run_id,
                        path,
                    )
                grpc_addr = args.grpc_addr
                if grpc_addr is None:
                    # Any answer, then checked here: one outside --allowed-host
                    # is refused at once rather than asked again until the timeout.
                    grpc_addr = await _discover_until(http, args.http_addr, None, deadline, via)
                    if grpc_addr is None:
                        err("flush", f"run {run_id}: no engine address within {args.timeout:g} s")
                        return 1
                    _check_allowed(
                        grpc_addr, allowed, f"discovery at {args.http_addr} named {grpc_addr}"
                    )
                remaining_ms = max(1.0, (deadline - loop.time()) * 1000)
                try:
                    with warnings.catch_warnings():
                        # Said above as a CLI warning naming --allowed-host.
                        warnings.simplefilter("ignore", InsecureDiscoveryWarning)
                        config = GrpcChannelConfig(
                            grpc_addr=grpc_addr,
                            http_addr=args.http_addr,
                            http_client=http if args.http_addr else None,
                            run_id=run_id,
                            correlation_id=meta.correlation_id,
                            run_token=token,
                            wal_dir=path.parent,
                            credentials=credentials,
                            tls_server_name=args.tls_server_name,
                            allowed_hosts=allowed,
                            max_receive_message_bytes=args.max_receive_message_bytes,
                            connect_timeout_ms=int(min(_FLUSH_CONNECT_TIMEOUT_MS, remaining_ms))
                            or 1,
                        )
                except ValueError as exc:
                    raise _Refused(str(exc)) from None
                channel = open_channel(
                    config, log=wal, token_hash_when="accepted" if replacing else "open"
                )
                handed_over = True
                try:
                    try:
                        await channel.handshake(
                            meta.connector_version or "",
                            meta.harness_name or "",
                            meta.harness_version or "",
                        )
                    except EngineUnavailableError:
                        pass  # the channel keeps dialing until the deadline
                    except RunCompletedError:
                        if wal.completed:  # its Done was this log's: the ack was lost
                            what = "it applied this log's Done; the log is now a tombstone"
                        else:
                            # It applied a Done and every seq before it: never advise a re-send.
                            what = (
                                f"it applied a Done and every seq before it, so the "
                                f"{count} row(s) in this log may already be applied (an older "
                                "copy of the log?); nothing was re-sent: do not re-import "
                                "them ('walchannel inspect' says what to do)"
                            )
                        err("flush", f"run {run_id}: the engine says the run is completed: {what}")
                        return 1
                    except EngineBehindError:
                        # The channel logged why (above): nothing can be delivered there.
                        err("flush", f"run {run_id}: the engine is behind this log ('failed')")
                        return 1
                    except WriterFencedError as exc:
                        # Another writer has the run: nothing of this log goes there.
                        raise _Refused(str(exc)) from None
                    delivered = await _wait_delivered(channel, deadline)
                    failed = channel.state is ChannelState.FAILED
                    last_error = channel.stats().last_error
                    # Read before close() closes the log: did an engine take the new token?
                    token_stored = not replacing or _token_matches(wal.meta(), token)
                finally:
                    await channel.close()
        finally:
            await http.aclose()
    finally:
        if not handed_over:
            wal.close()
    acked, high = wal.last_acked_seq, wal.high_water
    if not token_stored:
        err(
            "flush",
            f"run {run_id}: no engine accepted the token given with --replace-token; "
            "the log keeps the sha256 of the token it was started with",
        )
    if not delivered:
        why = f": {last_error}" if last_error else ""
        if last_error and "UNAUTHENTICATED" in last_error and not replacing:
            why += (
                " (the engine refuses this token: if the log was started with a wrong "
                "token, flush with the right one and --replace-token)"
            )
        if receive_limit_in(last_error) is not None:
            # The channel's text says "raise it in the config": flush's is a flag.
            why += (
                f" (flush's receive limit is {args.max_receive_message_bytes} bytes: raise it "
                "with --max-receive-message-bytes N, N at least the message's size)"
            )
        if failed:
            err("flush", f"run {run_id}: the channel stopped (acked up to seq {acked}){why}")
        else:
            err(
                "flush",
                f"run {run_id}: not all rows were acked within {args.timeout:g} s "
                f"(acked up to seq {acked} of {high}); last error{why or ': none'}",
            )
        return 1
    done = "; Done delivered: the log is now a tombstone" if wal.completed else ""
    print(f"flushed run {run_id}: {count} row(s) delivered, acked up to seq {acked}{done}")
    return 0


# -- flush -----------------------------------------------------------------------------

_FLUSH_EXAMPLES = """\
examples:
  RUN_TOKEN=... walchannel flush ~/.local/state/walchannel/run-42.wal.sqlite3 \\
      --grpc-addr engine.internal:50051 --token-env RUN_TOKEN --ca-file ca.pem
  vault read -field=token secret/runs/run-42 | \\
      walchannel flush run-42.wal.sqlite3 --http-addr https://engines.internal
  WALCHANNEL_RUN_TOKEN=... walchannel flush run-42.wal.sqlite3 \\
      --grpc-addr engine.internal:50051 --replace-token   # started with a wrong token

The token comes from --token-env VAR, else $WALCHANNEL_RUN_TOKEN when it is
set, else standard input (never an argument), and must match the sha256
stored in the log, unless --replace-token is given (a log started with a
wrong token: the new sha256 is stored once the engine accepts the
handshake; refused, the old one stays). --allowed-host holds --grpc-addr and every discovery
answer: an engine outside is never dialled. flush takes the log's owner
lock for its whole run, re-sends the stored handshake and every unacked
row. 'walchannel inspect' prints the command for an orphaned run, with the
address the log recorded. Exit 0 when all is acked, 1 when not within
--timeout (or the engine says the run is completed or is behind), 2 when
refused (owner alive, wrong token, no stored handshake, corrupt log, an
engine address outside --allowed-host) or on bad usage.
"""


def add_flush(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walchannel flush`` to ``sub``: its options, examples and exit codes."""
    p = sub.add_parser(
        "flush",
        help="deliver an orphaned run's unacked rows to an engine",
        description=(
            "Deliver the unacked rows of an orphaned run's log to an engine, speaking\n"
            "for the harness with its stored handshake. Never deletes a log."
        ),
        epilog=_FLUSH_EXAMPLES,
        formatter_class=RAW,
    )
    p.add_argument("log", metavar="LOG", help="the log file, <run_id>.wal.sqlite3")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--grpc-addr", metavar="A", help="the engine's gRPC address, host:port")
    where.add_argument(
        "--http-addr",
        metavar="H",
        help="the engine's base URL; the gRPC address comes from GET H/grpc-address",
    )
    p.add_argument(
        "--token-env",
        metavar="VAR",
        help="read the run token from this environment variable (default: "
        "$WALCHANNEL_RUN_TOKEN when it is set, else standard input)",
    )
    p.add_argument(
        "--replace-token",
        action="store_true",
        help="the log was started with a wrong token: flush with this one instead "
        "(a WARNING; its sha256 replaces the stored one once the engine accepts it)",
    )
    p.add_argument(
        "--ca-file",
        metavar="F",
        help="PEM root certificates to check the engine's TLS certificate (default: plaintext)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="HOST",
        help="a host name or IP network flush may dial, as --grpc-addr or a discovery "
        "answer (repeat for more; default: any)",
    )
    p.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="the name to check the engine's certificate against when dialing an IP",
    )
    p.add_argument(
        "--max-receive-message-bytes",
        type=positive_int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        metavar="N",
        help="the largest message the engine may send (bytes); raise it when flush says "
        f"a down message exceeded it (default: {DEFAULT_MAX_MESSAGE_BYTES})",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_FLUSH_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up when not all is acked by then (default: {DEFAULT_FLUSH_TIMEOUT_S:g})",
    )
    p.set_defaults(handler=flush_command)
