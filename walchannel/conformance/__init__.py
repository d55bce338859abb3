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
from walchannel.conformance.probe import Target
from walchannel.conformance.report import Result

__all__ = ["CHECKS", "Check", "HookError", "Hooks", "Kit", "Result", "Target", "run_checks"]

#: The bound on one check, whatever the engine does (seconds).
CHECK_TIMEOUT_S: Final = 60.0


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
        results.append(await _one(kit, check))
    return results


async def _one(kit: Kit, check: Check) -> Result:
    started = time.monotonic()
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            detail = await check.run(kit, check.id)
    except Failed as exc:
        return Result(check, "FAIL", "", exc.expected, exc.got, time.monotonic() - started)
    except TimeoutError:
        return Result(check, "FAIL", "", f"the check to end within {CHECK_TIMEOUT_S:.0f} s",
                      "it did not: the engine hangs", time.monotonic() - started)  # fmt: skip
    except HookError as exc:
        return Result(check, "ERROR", str(exc), seconds=time.monotonic() - started)
    return Result(check, "PASS", detail, seconds=time.monotonic() - started)
