"""The driver's events and actions against the executor and the docs (issue 60).

Structure, read from the code and docs/design.md: every action has a
performer in the executor, the design note's tables are the code's, and a
part that feeds the driver itself feeds only events that ask for nothing.
The driver's answers to each event are tested in tests/test_driver.py.
"""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import walchannel.core.driver as wd
from walchannel.config import GrpcChannelConfig
from walchannel.core import actions as act
from walchannel.core import events as ev
from walchannel.core.driver import ChannelState as S
from walchannel.core.driver import Driver
from walchannel.log.state import LogState


def streaming() -> Driver:
    """A driver over ten rows whose stream is up and every row written."""
    log: Any = SimpleNamespace(state=LogState("r", 11, 0, None, None, False))
    config = GrpcChannelConfig(
        grpc_addr="127.0.0.1:1", run_id="r", correlation_id="c", run_token="t"
    )
    d = Driver(config, log, failed_mark=False, now_ms=0.0)
    d.handle(ev.LoopStarted())
    assert act.StartStream(1) in d.handle(ev.Answered(0, 0.0))
    while (seq := d.next_to_write()) is not None:
        d.handle(ev.Writing(seq))
        d.handle(ev.Written(seq))
    return d


def test_the_executor_performs_every_action_the_driver_can_give() -> None:
    from walchannel.channel.connection import ConnectionLoop

    actions = set(typing.get_args(act.Action))
    performers = ConnectionLoop._performers.__code__.co_names
    assert {a.__name__ for a in actions} <= set(performers), "an action no one performs"
    assert {name for name in act.__all__ if name[0].isupper() and not name.isupper()} - {
        "Action"
    } == {a.__name__ for a in actions}


# -- docs/design.md's tables are the code's ----------------------------------------------------

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def _table(title: str) -> list[list[str]]:
    """The rows of the first table under ``### {title}`` in docs/design.md, cells stripped."""
    text = DESIGN.read_text().split(f"\n### {title}\n", 1)[1]
    rows = [line for line in text.split("\n#")[0].splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]
    return [row for row in cells[1:] if not set(row[0]) <= {"-"}]


def _names(cell: str) -> list[str]:
    """The class names a cell gives in backticks (``Answered(high, now_ms)`` is ``Answered``)."""
    messages = {"Done", "Ack", "Stop"}  # the wire's messages, not classes
    return [
        m for m in re.findall(r"`([A-Z][A-Za-z]+)", cell) if not m.isupper() and m not in messages
    ]


def test_design_md_shows_every_event_and_every_action_and_nothing_else() -> None:
    events = {e.__name__ for e in typing.get_args(ev.Event)}
    actions = {a.__name__ for a in typing.get_args(act.Action)}
    rows = _table("Events")
    assert {n for row in rows for n in _names(row[0])} == events
    answered = {n for row in rows for n in _names(row[2])}
    assert answered <= actions, answered - actions
    assert {n for row in _table("Actions") for n in _names(row[0])} == actions
    assert {n for row in _table("Actions") for n in _names(row[2])} <= events


def test_design_md_state_table_is_the_drivers() -> None:
    table = {}
    for old, new in _table("States"):
        table[S[old.strip("`")]] = frozenset(S[n] for n in re.findall(r"`([A-Z]+)`", new))
    assert table == wd._LEGAL


def test_events_fed_outside_the_executor_are_ones_that_ask_for_nothing() -> None:
    # Only ConnectionLoop.feed performs actions; a part that hands the driver
    # an event itself may hand it only one whose handler answers nothing.
    package = Path(wd.__file__).resolve().parents[1]
    fed = set()
    for path in package.rglob("*.py"):
        if path.name in ("driver.py", "connection.py"):
            continue
        fed |= set(re.findall(r"\.handle\(ev\.(\w+)\(", path.read_text()))
    assert fed == {"ErrorSeen", "RowsCommitted", "BacklogDated"}
    d = streaming()
    for event in (ev.ErrorSeen("x"), ev.RowsCommitted(1, 0.0), ev.BacklogDated(((1, 0.0),))):
        assert d.handle(event) == ()
    for name in fed:
        source = inspect.getsource(d._handlers[getattr(ev, name)])
        returns = re.findall(r"return (.+)", source)
        assert returns == ["_NOTHING"], (name, returns)
