"""``walchannel conformance``: the engine kit's command (:mod:`walchannel.conformance`).

SPEC "Operating tools"; docs/conformance.md.
"""

from __future__ import annotations

import argparse

from walchannel.cli.common import (
    RAW,
    positive_float,
)
from walchannel.cli.logs import (
    err,
)

_CONFORMANCE_EXAMPLES = """\
examples:
  walchannel conformance --grpc-addr engine:50051 --register ./register.sh
  walchannel conformance --grpc-addr 127.0.0.1:50051 --http-addr http://127.0.0.1:8080 \\
      --register "$E register --store s.db" --restart "$E restart --store s.db ..." \\
      --applied "$E applied --store s.db" --junit conformance.xml

Numbered checks, one duty of SPEC "Engine duties the client relies on" each,
sent with raw up-messages on fresh runs of its own. Hooks are shell commands
(sh -c): --register gets WALCHANNEL_RUN_ID and WALCHANNEL_RUN_TOKEN (and one
JSON line {"run_id","token"} on stdin); --restart kills the engine without
warning and starts it on the same store; --applied prints what was applied
for $WALCHANNEL_RUN_ID, one JSON object a line; --stop issues a Stop
($WALCHANNEL_STOP_REASON); --decide decides $WALCHANNEL_REQUEST_ID
($WALCHANNEL_APPROVED true/false). A check whose hook is missing is skipped.
Target one engine instance: behind a balancer, stream and restart checks
depend on routing. docs/conformance.md lists the checks.

Exit 0 when no check failed, 1 when one did, 2 on bad usage or a hook that
cannot run.
"""


def add_conformance(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walchannel conformance`` to ``sub``: its options, examples and exit codes."""
    p = sub.add_parser(
        "conformance",
        help="check that an engine keeps the duties the client relies on",
        description="Check, case by numbered case, that an engine keeps its duties.",
        epilog=_CONFORMANCE_EXAMPLES,
        formatter_class=RAW,
    )
    p.add_argument("--grpc-addr", required=True, metavar="HOST:PORT", help="the engine")
    p.add_argument("--http-addr", metavar="URL", help="its discovery (found again after --restart)")
    p.add_argument("--register", required=True, metavar="CMD", help="registers a run")
    for hook, what in (
        ("restart", "kills the engine without warning and starts it on the same store"),
        ("applied", "prints what the engine applied for $WALCHANNEL_RUN_ID"),
        ("stop", "makes the engine issue the run's Stop"),
        ("decide", "makes the engine decide an approval request"),
    ):
        p.add_argument(f"--{hook}", metavar="CMD", help=what)
    p.add_argument("--only", metavar="ID[,ID...]", help="run only these checks")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
    p.add_argument("--hook-timeout", type=positive_float, default=60.0, metavar="SECONDS")
    p.add_argument("--ca-file", metavar="F", help="PEM roots to check the engine's TLS certificate")
    p.add_argument("--tls-server-name", metavar="NAME", help="the name its certificate holds")
    p.set_defaults(handler=_cmd_conformance)


def _cmd_conformance(args: argparse.Namespace) -> int:
    import asyncio

    from walchannel.conformance import (
        Hooks,
        Kit,
        Result,
        Target,
        UnreachableError,
        reach,
        run_checks,
    )
    from walchannel.conformance.report import junit, summary, text_lines, to_json
    from walchannel.runner.run import tls_credentials

    credentials = None
    if args.ca_file is not None:
        try:
            credentials = tls_credentials(args.ca_file)
        except OSError as exc:
            err("conformance", f"--ca-file {args.ca_file}: cannot be read: {exc.strerror or exc}")
            return 2
    kit = Kit(
        Target(args.grpc_addr, credentials, args.tls_server_name),
        Hooks(
            args.register,
            args.restart,
            args.applied,
            args.stop,
            args.decide,
            timeout_s=args.hook_timeout,
        ),
        args.http_addr,
    )
    only = [i.strip() for i in args.only.split(",") if i.strip()] if args.only else []
    report = None
    if args.junit is not None:
        try:  # now, not after the run: a path that cannot be written wastes nothing
            report = open(args.junit, "wb")  # noqa: SIM115 (written and closed below)
        except OSError as exc:
            err("conformance", f"--junit {args.junit}: cannot be written: {exc.strerror or exc}")
            return 2

    async def checks() -> list[Result]:
        await reach(kit.target)
        return await run_checks(kit, only)

    try:
        results = asyncio.run(checks())
    except ValueError as exc:
        err("conformance", f"--only: {exc}")
        return 2
    except UnreachableError as exc:
        err("conformance", f"{exc}; no check was run")
        return 2
    finally:
        if report is not None and not report.closed:
            report.close()
    if args.json:
        print(to_json(results))
    else:
        print(f"walchannel conformance: {args.grpc_addr}")
        for line in text_lines(results):
            print(line)
        print(summary(results))
    if args.junit is not None:
        with open(args.junit, "wb") as f:
            f.write(junit(results))
    errors = [r for r in results if r.verdict == "ERROR"]
    if errors:
        err("conformance", f"check {errors[0].check.id}: {errors[0].detail}; the checks stopped")
        return 2
    return 1 if any(r.verdict == "FAIL" for r in results) else 0
