"""``walchannel conformance``: prove an engine keeps the duties the client relies on.

An engine team runs it against its own engine, as an HTTP/2 server team
runs h2spec: numbered checks, each tied to one duty of SPEC "Engine duties
the client relies on", PASS / FAIL / SKIP, a summary, ``--json`` and
``--junit``. docs/conformance.md is the guide; :data:`CHECKS` the list.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Final

from walchannel.conformance.checks import CHECKS, Check, Failed, Kit
from walchannel.conformance.hooks import HookError, Hooks
from walchannel.conformance.probe import Target, open_channel
from walchannel.conformance.report import Result

__all__ = [
    "CHECKS",
    "Check",
    "HookError",
    "Hooks",
    "Kit",
    "Result",
    "Target",
    "UnreachableError",
    "reach",
    "run_checks",
]

#: The bound on one check's time with the engine, whatever it does (seconds);
#: each hook the check runs adds its own bound (``--hook-timeout``).
CHECK_TIMEOUT_S: Final = 60.0
#: The most hooks one check runs (8.2: a register and a restart a try).
HOOKS_PER_CHECK: Final = 8
#: How long the engine's address may take to accept a connection (seconds).
REACH_S: Final = 5.0


class UnreachableError(Exception):
    """Nothing answers at the engine's address: a setup problem, not a duty broken."""


async def reach(target: Target) -> None:
    """Connect to ``target`` once (HTTP/2, and TLS when given) before any check.

    Raises:
        UnreachableError: no connection within :data:`REACH_S`, naming the address.
    """
    channel = open_channel(target)
    try:
        async with asyncio.timeout(REACH_S):
            await channel.channel_ready()
    except TimeoutError:
        state = channel.get_state()
        raise UnreachableError(
            f"nothing answers at {target.grpc_addr} within {REACH_S:.0f} s (the connection is"
            f" {state.name.lower()}): check --grpc-addr and that the engine runs"
            + (" (and its TLS: --ca-file, --tls-server-name)" if target.credentials else "")
        ) from None
    finally:
        await channel.close()


async def run_checks(kit: Kit, only: Sequence[str] = ()) -> list[Result]:
    """Run the checks (those in ``only``, if given) in order; one :class:`Result` each.

    Args:
        kit: the engine, the hooks.
        only: check ids to run (empty: all).

    Returns:
        The results, in the checks' order. A check that does not end within
        :data:`CHECK_TIMEOUT_S` fails saying so; a hook that fails makes
        its check ``ERROR``.

    Raises:
        ValueError: ``only`` names a check that does not exist.
    """
    known = {c.id for c in CHECKS}
    unknown = [i for i in only if i not in known]
    if unknown:
        raise ValueError(f"no check {', '.join(unknown)} (checks: {', '.join(sorted(known))})")
    results = []
    for check in CHECKS:
        if only and check.id not in only:
            continue
        missing = [h for h in check.needs if not kit.hooks.given(h)]
        if missing:
            results.append(Result(check, "SKIP", f"needs --{', --'.join(missing)}"))
            continue
        result = await _one(kit, check)
        results.append(result)
        if result.verdict == "ERROR":
            break  # a hook that cannot run: what follows would say the same, or mislead
    return results


async def _one(kit: Kit, check: Check) -> Result:
    started = time.monotonic()
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S + HOOKS_PER_CHECK * kit.hooks.timeout_s):
            detail = await check.run(kit, check.id)
    except Failed as exc:
        return Result(check, "FAIL", "", exc.expected, exc.got, time.monotonic() - started)
    except TimeoutError:
        took = time.monotonic() - started
        return Result(check, "FAIL", "", "the check to end within its bound",
                      f"it did not end in {took:.0f} s: the engine hangs", took)  # fmt: skip
    except HookError as exc:
        return Result(check, "ERROR", str(exc), seconds=time.monotonic() - started)
    return Result(check, "PASS", detail, seconds=time.monotonic() - started)
