"""The numbered checks of ``walchannel conformance``: one duty each (SPEC "Engine duties").

Each check makes fresh runs, speaks to the engine through :class:`Probe`
(raw up-messages), and ends by passing (with a detail), failing
(:class:`Failed`: what was expected, what came) or being skipped for a hook
it needs. docs/conformance.md has the table of checks and the broken engine
each is proven on.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import grpc
import httpx

from walchannel._proto import engine_channel_pb2 as pb
from walchannel.conformance.hooks import HookError, Hooks, json_lines
from walchannel.conformance.probe import Ended, Probe, Target

__all__ = ["CHECKS", "Check", "Failed", "Kit"]

#: How long a handshake's answer may take (seconds): the client's connect bound.
ANSWER_S: Final = 5.0
#: How long an ack may take after what it covers (seconds): coalescing allowed.
ACK_S: Final = 2.0
#: How long the engine may take to end a call it must end (seconds).
END_S: Final = 5.0
#: The tries of "acks never run ahead of the store".
DURABLE_TRIES: Final = 3
#: The SPEC section every duty is in.
DUTIES: Final = 'SPEC "Wire contract", "Engine duties the client relies on"'


class Failed(Exception):
    """The engine did not do what the duty says: ``expected``, and what it did."""

    def __init__(self, expected: str, got: str) -> None:
        super().__init__(f"expected {expected}; got {got}")
        self.expected = expected
        self.got = got


def said(got: object, within_s: float) -> str:
    """What came, in words: an ack, the call's end, or nothing in time."""
    if got is None:
        return f"nothing within {within_s:.0f} s"
    if isinstance(got, Ended):
        return f"the call ended {got}"
    if isinstance(got, int):
        return f"Ack({got})"
    return str(got)


def expect(ok: bool, expected: str, got: str) -> None:
    """Fail the check unless ``ok``."""
    if not ok:
        raise Failed(expected, got)


@dataclass
class Run:
    """A run the kit registered: its id and token."""

    run_id: str
    token: str


@dataclass
class Kit:
    """What every check works with: the engine, the hooks, a writer id of the kit's own.

    Args:
        target: the engine (moved by :meth:`restart` when its address changes).
        hooks: the hooks given.
        http_addr: the engine's discovery base URL, or None.
    """

    target: Target
    hooks: Hooks
    http_addr: str | None = None
    writer: str = field(default_factory=lambda: f"conformance-{secrets.token_hex(4)}")

    async def new_run(self, check_id: str) -> Run:
        """Register a fresh run through ``--register`` (the hook may name its own run and token)."""
        run = Run(
            f"conformance-{check_id.replace('.', '-')}-{secrets.token_hex(4)}",
            "tok-" + secrets.token_urlsafe(24),
        )
        out = await self.hooks.run(
            "register",
            {"WALCHANNEL_RUN_ID": run.run_id, "WALCHANNEL_RUN_TOKEN": run.token},
            stdin=json.dumps({"run_id": run.run_id, "token": run.token}) + "\n",
            secret=run.token,
        )
        for row in json_lines("register", out):
            if isinstance(row.get("run_id"), str) and isinstance(row.get("token"), str):
                run = Run(row["run_id"], row["token"])
        return run

    def probe(self, run: Run, *, token: str | None = None) -> Probe:
        """A call for ``run`` (with another token: to be refused)."""
        return Probe(self.target, run.run_id, token or run.token)

    async def answered(self, probe: Probe, writer: str | None = None, **kw: object) -> int:
        """Handshake on ``probe`` as ``writer`` (the kit's) and return the answer ``h``.

        Raises:
            Failed: no ``Ack`` within :data:`ANSWER_S`.
        """
        await probe.handshake(writer or self.writer, **kw)  # type: ignore[arg-type]
        got = await probe.ack(ANSWER_S)
        expect(
            isinstance(got, int),
            f"an Ack answering the handshake within {ANSWER_S:.0f} s",
            said(got, ANSWER_S),
        )
        assert isinstance(got, int)
        return got

    async def restart(self) -> None:
        """``--restart``, then find the engine: printed, discovered, or where it was."""
        out = await self.hooks.run("restart", {})
        addr = None
        for line in reversed(out.splitlines()):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = line
            addr = row.get("grpc_addr") if isinstance(row, dict) else row
            break
        if not isinstance(addr, str) and self.http_addr is not None:
            addr = await self._discover()
        if isinstance(addr, str) and addr:
            self.target = Target(addr, self.target.credentials, self.target.server_name)

    async def _discover(self) -> str:
        url = self.http_addr.rstrip("/") + "/grpc-address"  # type: ignore[union-attr]
        async with httpx.AsyncClient(timeout=ANSWER_S) as client:
            for _ in range(20):
                try:
                    answer = await client.get(url)
                    if answer.status_code == 200 and answer.text.strip():
                        return answer.text.strip()
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.25)
        raise HookError(f"after --restart, {url} gave no address")

    async def applied(self, run: Run) -> list[dict[str, object]]:
        """``--applied``: what the engine applied for ``run``, in order."""
        out = await self.hooks.run("applied", {"WALCHANNEL_RUN_ID": run.run_id})
        return json_lines("applied", out)


CheckFn = Callable[[Kit, str], Awaitable[str]]


@dataclass(frozen=True)
class Check:
    """One numbered check.

    Attributes:
        id: e.g. ``"2.1"``.
        duty: the duty checked, in one line.
        needs: the hooks it needs besides ``--register`` (missing: SKIP).
        run: the check; returns the detail said on PASS, raises :class:`Failed`.
        section: where SPEC states the duty.
    """

    id: str
    duty: str
    needs: tuple[str, ...]
    run: CheckFn
    section: str = DUTIES


CHECKS: list[Check] = []


def check(id: str, duty: str, *needs: str) -> Callable[[CheckFn], CheckFn]:
    def add(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(id, duty, needs, fn))
        return fn

    return add


async def rows_acked(probe: Probe, first: int, last: int) -> None:
    """Write findings ``first..last`` and wait for an ack covering them."""
    for seq in range(first, last + 1):
        await probe.finding(seq, n=seq)
    got = await probe.ack_reaching(last, ACK_S)
    expect(isinstance(got, list), f"an ack reaching {last} within {ACK_S:.0f} s", said(got, ACK_S))


async def ends_with(probe: Probe, code: grpc.StatusCode, text: str, what: str) -> Ended:
    """Wait for the call to end with ``code`` and details holding ``text``."""
    got = await probe.end(END_S)
    want = f"{what}: the call ends {code.name}" + (f" naming {text!r}" if text else "")
    expect(
        isinstance(got, Ended) and got.code == code and text in got.details,
        f"{want} within {END_S:.0f} s",
        said(got, END_S),
    )
    assert isinstance(got, Ended)
    return got


# -- 1. the handshake's answer -----------------------------------------------------------


@check("1.1", "a new run's handshake is answered Ack(0)")
async def _new_run(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        h = await kit.answered(p)
        expect(h == 0, "Ack(0)", f"Ack({h})")
    return "Ack(0)"


@check("1.2", "a handshake is answered Ack(h), h the highest seq applied")
async def _answer_h(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        await kit.answered(p)
        await rows_acked(p, 1, 3)
    async with kit.probe(run) as p:
        h = await kit.answered(p)
        expect(h == 3, "Ack(3) after rows 1..3 were acked", f"Ack({h})")
    return "Ack(3) after 3 rows"


# -- 2. acks -----------------------------------------------------------------------------


@check(
    "2.1",
    "acks on a stream never name a seq not yet sent on it, never go backwards, and come within 2 s",
)
async def _acks(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        last = await kit.answered(p)
        for seq in range(1, 21):
            await p.finding(seq, n=seq)
            if seq > 5 and seq < 20:
                continue  # 1..5 one at a time, then a burst
            got = await p.ack_reaching(seq, ACK_S)
            expect(
                isinstance(got, list),
                f"an ack reaching {seq} within {ACK_S:.0f} s",
                said(got, ACK_S),
            )
            assert isinstance(got, list)
            for ack in got:
                expect(ack <= p.top, f"acks at most {p.top}, the highest seq sent", f"Ack({ack})")
                expect(
                    ack >= last,
                    f"acks never below Ack({last}), one already received",
                    f"Ack({ack})",
                )
                last = ack
    return "20 rows, every ack within what was sent, none backwards"


@check("2.2", "a heartbeat is answered Ack(h)")
async def _heartbeat(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        await kit.answered(p)
        await rows_acked(p, 1, 2)
        await p.heartbeat()
        got = await p.ack(ACK_S)
        expect(got == 2, f"Ack(2) within {ACK_S:.0f} s", said(got, ACK_S))
    return "Ack(2)"


@check("2.3", "a duplicate (seq <= h) is acked and not applied; the stream goes on")
async def _duplicate(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        await kit.answered(p)
        await rows_acked(p, 1, 2)
        await p.finding(1, n=1, duplicate=True)
        got = await p.ack(ACK_S)
        expect(
            isinstance(got, int) and got >= 1,
            f"an Ack(h >= 1) within {ACK_S:.0f} s",
            said(got, ACK_S),
        )
        await rows_acked(p, 3, 3)
    if not kit.hooks.given("applied"):
        return "acked, the stream went on (not-applied unchecked: no --applied)"
    rows = await kit.applied(run)
    first = next((r for r in rows if r.get("seq") == 1), None)
    body = json.dumps(first.get("body") if first else None)
    expect(
        first is not None and "duplicate" not in body,
        "seq 1 applied as first sent",
        f"seq 1 applied as {body[:200]}",
    )
    return "acked, not applied, the stream went on"


# -- 3. order ------------------------------------------------------------------------------


@check(
    "3.1",
    'a gap (seq > h + 1) ends the stream FAILED_PRECONDITION "expected seq N", nothing applied',
)
async def _gap(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        await kit.answered(p)
        await rows_acked(p, 1, 1)
        await p.finding(3, n=3)
        await ends_with(p, grpc.StatusCode.FAILED_PRECONDITION, "expected seq 2", "seq 3 after 1")
    async with kit.probe(run) as p:
        h = await kit.answered(p)
        expect(h == 1, "Ack(1) after the gap: seq 3 not applied", f"Ack({h})")
    if kit.hooks.given("applied"):
        seqs = [r.get("seq") for r in await kit.applied(run)]
        expect(seqs == [1], "applied seqs [1]", f"applied seqs {seqs}")
    return "expected seq 2, nothing applied"


# -- 4. Done -------------------------------------------------------------------------------


@check("4.1", "Done is acked at once (within 2 s)")
async def _done_acked(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        await kit.answered(p)
        await rows_acked(p, 1, 1)
        await p.done(2)
        got = await p.ack_reaching(2, ACK_S)
        expect(isinstance(got, list), f"Ack(2) within {ACK_S:.0f} s", said(got, ACK_S))
    return "Ack(2)"


@check(
    "4.2",
    'a completed run refuses a second Done and a new handshake ("run completed by'
    ' writer W") and applies nothing after Done',
)
async def _completed(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        await kit.answered(p)
        await rows_acked(p, 1, 1)
        await p.done(2)
        await p.ack_reaching(2, ACK_S)
        await p.done(3)
        await ends_with(p, grpc.StatusCode.FAILED_PRECONDITION, "run completed", "a second Done")
    async with kit.probe(run) as p:
        await p.handshake(kit.writer)
        await ends_with(
            p,
            grpc.StatusCode.FAILED_PRECONDITION,
            f"run completed by writer {kit.writer}",
            "a handshake after Done",
        )
    if kit.hooks.given("applied"):
        seqs = [r.get("seq") for r in await kit.applied(run)]
        expect(seqs == [1, 2], "applied seqs [1, 2]", f"applied seqs {seqs}")
    return "both refused"


# -- 5. streams ----------------------------------------------------------------------------


@check("5.1", "a half-close ends the call OK, every row acked first")
async def _half_close(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        await kit.answered(p)
        for seq in (1, 2, 3):
            await p.finding(seq, n=seq)
        await p.half_close()
        got = await p.ack_reaching(3, ACK_S)
        expect(isinstance(got, list), f"Ack(3) within {ACK_S:.0f} s", said(got, ACK_S))
        await ends_with(p, grpc.StatusCode.OK, "", "a half-close")
    return "Ack(3), then OK"


@check("5.2", "a newer accepted stream of the run ends the older (ABORTED)")
async def _newer(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as older, kit.probe(run) as newer:
        await kit.answered(older)
        await kit.answered(newer)
        await ends_with(older, grpc.StatusCode.ABORTED, "", "the older stream")
    return "ABORTED"


@check("5.3", "a refused handshake ends no stream of the run")
async def _refused(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as live:
        await kit.answered(live)
        async with kit.probe(run, token="tok-wrong-" + secrets.token_hex(8)) as bad:
            await bad.handshake(kit.writer)
            await ends_with(bad, grpc.StatusCode.UNAUTHENTICATED, "", "a wrong token")
        async with kit.probe(run) as other:
            await other.handshake(kit.writer + "-other")
            await ends_with(
                other,
                grpc.StatusCode.FAILED_PRECONDITION,
                "owned by another writer",
                "another writer",
            )
        expect(live.ended is None, "the live stream goes on", said(live.ended, 0))
        await rows_acked(live, 1, 1)
    return "the live stream went on"


# -- 6. writers ----------------------------------------------------------------------------


@check("6.1", 'another writer is refused ("owned by another writer")')
async def _another(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        await kit.answered(p)
    async with kit.probe(run) as p:
        await p.handshake(kit.writer + "-other")
        await ends_with(
            p,
            grpc.StatusCode.FAILED_PRECONDITION,
            "owned by another writer",
            "another writer's handshake",
        )
    return "refused"


@check("6.2", 'the owner at a lower epoch is fenced ("writer fenced")')
async def _epoch(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        await kit.answered(p, epoch=2)
    async with kit.probe(run) as p:
        await p.handshake(kit.writer, epoch=1)
        await ends_with(
            p, grpc.StatusCode.FAILED_PRECONDITION, "writer fenced", "the owner at epoch 1 after 2"
        )
    return "fenced"


@check(
    "6.3",
    'take_over makes a writer the owner: the old stream ends "writer fenced",'
    " the old writer is refused after",
)
async def _take_over(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    new = kit.writer + "-new"
    async with kit.probe(run) as old:
        await kit.answered(old)
        await rows_acked(old, 1, 1)
        async with kit.probe(run) as taker:
            h = await kit.answered(taker, new, take_over=True)
            expect(h == 1, "the takeover answered Ack(1)", f"Ack({h})")
            await ends_with(
                old, grpc.StatusCode.FAILED_PRECONDITION, "writer fenced", "the old writer's stream"
            )
    async with kit.probe(run) as p:
        await p.handshake(kit.writer)
        got = await p.end(END_S)
        expect(
            isinstance(got, Ended) and got.code == grpc.StatusCode.FAILED_PRECONDITION,
            "the old writer's handshake refused FAILED_PRECONDITION",
            said(got, END_S),
        )
    return "taken over; the old writer fenced"


# -- 7. Stop and decisions -----------------------------------------------------------------


@check("7.1", "the run's Stop is re-sent after every handshake", "stop")
async def _stop(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        await kit.answered(p)
    await kit.hooks.run(
        "stop", {"WALCHANNEL_RUN_ID": run.run_id, "WALCHANNEL_STOP_REASON": "operator"}
    )
    for n in (1, 2):
        async with kit.probe(run) as p:
            await kit.answered(p)
            got = await _body(p, "stop")
            expect(
                got is not None, f"Stop within {ACK_S:.0f} s of handshake {n}'s answer", "no Stop"
            )
    return "Stop after both handshakes"


@check(
    "7.2",
    "decisions are re-sent after every handshake; a repeated request id gets the stored decision",
    "decide",
)
async def _decisions(kit: Kit, id: str) -> str:
    run = await kit.new_run(id)
    async with kit.probe(run) as p:
        await kit.answered(p)
        await p.approval(1, "conformance-r1")
        await p.ack_reaching(1, ACK_S)
    await kit.hooks.run(
        "decide",
        {
            "WALCHANNEL_RUN_ID": run.run_id,
            "WALCHANNEL_REQUEST_ID": "conformance-r1",
            "WALCHANNEL_APPROVED": "true",
        },
    )
    for n in (1, 2):
        async with kit.probe(run) as p:
            h = await kit.answered(p)
            got = await _body(p, "approval_decision")
            expect(
                got is not None
                and got.approval_decision.request_id == "conformance-r1"
                and got.approval_decision.approved,
                f"the decision (approved) within {ACK_S:.0f} s of handshake {n}'s answer",
                said(got, ACK_S),
            )
            if n == 2:
                await p.approval(h + 1, "conformance-r1")  # the same request, asked again
                again = await _body(p, "approval_decision")
                expect(
                    again is not None and again.approval_decision.approved,
                    "the stored decision for the repeated request",
                    said(again, ACK_S),
                )
    return "re-sent after both handshakes; the repeat answered"


async def _body(p: Probe, kind: str) -> pb.DownMessage | None:
    """The next down message of ``kind`` within :data:`ACK_S`, or None."""
    got = await p.next_of(kind, ACK_S)
    return got if isinstance(got, pb.DownMessage) else None


# -- 8. restarts ---------------------------------------------------------------------------


@check("8.1", "a restart keeps h, the owner, the completion (and Stop)", "restart")
async def _restart(kit: Kit, id: str) -> str:
    rows, done = await kit.new_run(id), await kit.new_run(id)
    async with kit.probe(rows) as p:
        await kit.answered(p)
        await rows_acked(p, 1, 3)
    async with kit.probe(done) as p:
        await kit.answered(p)
        await p.done(1)
        await p.ack_reaching(1, ACK_S)
    stopped = None
    if kit.hooks.given("stop"):
        stopped = await kit.new_run(id)
        await kit.hooks.run(
            "stop", {"WALCHANNEL_RUN_ID": stopped.run_id, "WALCHANNEL_STOP_REASON": "operator"}
        )
    await kit.restart()
    # Another writer first: an engine that forgot the owner would let it adopt the run.
    async with kit.probe(rows) as p:
        await p.handshake(kit.writer + "-other")
        await ends_with(
            p,
            grpc.StatusCode.FAILED_PRECONDITION,
            "owned by another writer",
            "another writer after the restart",
        )
    async with kit.probe(rows) as p:
        h = await kit.answered(p)
        expect(h == 3, "Ack(3) after the restart", f"Ack({h})")
    async with kit.probe(done) as p:
        await p.handshake(kit.writer)
        await ends_with(
            p,
            grpc.StatusCode.FAILED_PRECONDITION,
            "run completed",
            "a completed run after the restart",
        )
    if stopped is not None:
        async with kit.probe(stopped) as p:
            await kit.answered(p)
            expect(await _body(p, "stop") is not None, "Stop after the restart", "no Stop")
    return "h, owner and completion" + (" and Stop" if stopped is not None else "") + " kept"


@check("8.2", "acks never run ahead of the store: what was acked survives a restart", "restart")
async def _durable(kit: Kit, id: str) -> str:
    for _ in range(DURABLE_TRIES):
        run = await kit.new_run(id)
        acked = 0
        async with kit.probe(run) as p:
            await kit.answered(p)
            for seq in range(1, 51):
                await p.finding(seq, n=seq)
            got = await p.ack(ACK_S)
            expect(isinstance(got, int), f"an ack within {ACK_S:.0f} s", said(got, ACK_S))
            assert isinstance(got, int)
            acked = got
            await kit.restart()  # at once: what was acked must be in the store
        async with kit.probe(run) as p:
            h = await kit.answered(p)
            expect(
                h >= acked, f"Ack(h >= {acked}) after the restart: {acked} was acked", f"Ack({h})"
            )
    return f"no violation in {DURABLE_TRIES} tries"
