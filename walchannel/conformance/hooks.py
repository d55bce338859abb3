"""The shell commands through which the conformance kit drives an engine it does not know.

Each hook runs as ``sh -c COMMAND`` with a timeout, its inputs in the
environment (and, for ``--register``, one JSON line on stdin); exit 0 is
success. Their stderr is shown when they fail, with the run token masked.
docs/conformance.md gives the contract of each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from dataclasses import dataclass
from typing import Any

__all__ = ["HookError", "Hooks"]


class HookError(Exception):
    """A hook could not run, timed out, exited non-zero or printed what cannot be read."""


@dataclass(frozen=True)
class Hooks:
    """The hooks given (None: not given; the checks that need it are skipped).

    Attributes:
        register: registers a run (required).
        restart: kills the engine without warning and starts it on the same store.
        applied: prints what the engine applied for a run, one JSON object a line.
        stop: makes the engine issue a run's ``Stop``.
        decide: makes the engine decide an approval request.
        timeout_s: the bound on each hook's run (seconds).
    """

    register: str
    restart: str | None = None
    applied: str | None = None
    stop: str | None = None
    decide: str | None = None
    timeout_s: float = 60.0

    def given(self, name: str) -> bool:
        """Whether the hook ``name`` was given."""
        return getattr(self, name) is not None

    async def run(
        self, name: str, env: dict[str, str], *, stdin: str = "", secret: str = ""
    ) -> str:
        """Run hook ``name`` with ``env`` added; return its stdout.

        Raises:
            HookError: naming the hook, its exit status and its stderr's end
                (``secret`` masked), or the timeout.
        """
        command = getattr(self, name)
        assert command is not None, name
        try:
            proc = await asyncio.create_subprocess_exec(
                "sh",
                "-c",
                command,
                env={**os.environ, **env},
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                # Its own process group: on a timeout, whatever the hook started goes
                # too (a child holding the pipes would keep the hook "running").
                start_new_session=True,
            )
        except OSError as exc:
            raise HookError(f"--{name}: cannot run sh: {exc}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), self.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.communicate()
            raise HookError(
                f"--{name} did not finish within {self.timeout_s:.0f} s (--hook-timeout): {command}"
            ) from None
        if proc.returncode != 0:
            said = " | ".join(err.decode(errors="replace").strip().splitlines())
            if secret:
                said = said.replace(secret, "***")
            raise HookError(
                f"--{name} exited {proc.returncode}: {command}"
                + (f"; its stderr: {said[-2000:]}" if said else "")
            )
        return out.decode(errors="replace")


def json_lines(name: str, text: str) -> list[dict[str, Any]]:
    """The JSON objects of ``text``, one a line (blank lines skipped).

    Raises:
        HookError: a line is not a JSON object (naming the hook and the line).
    """
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise HookError(
                f"--{name} printed line {number} that is not a JSON object: {line[:200]!r}"
            )
        rows.append(row)
    return rows
