"""Errors in families, each with ``retriable`` (issue 59): the tree drawn in
``walchannel/errors.py`` is the classes' tree, and the runner's exit codes follow
``retriable``."""

from __future__ import annotations

import inspect
import re

import walchannel.errors as errors
from walchannel.runner.exits import NOT_RETRIABLE, ExitCode
from walchannel.runner.run import _code_for

FAMILIES = (
    errors.ConfigurationError,
    errors.PayloadError,
    errors.EngineRefusedError,
    errors.TransportError,
    errors.LogError,
)


def _classes() -> dict[str, type[errors.WalchannelError]]:
    return {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, errors.WalchannelError)
    }


def test_the_tree_drawn_in_errors_py_is_the_classes_tree() -> None:
    drawn: dict[str, str] = {}  # class -> parent, as drawn
    retriable: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        m = re.match(r"^    ((?:│   |    )*)(?:├── |└── )?([A-Z]\w+)(.*)$", line)
        if not m or not m.group(2).endswith(("Error",)):
            continue
        depth = len(m.group(1)) // 4 + (0 if m.group(2) == "WalchannelError" else 1)
        name = m.group(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            drawn[name] = stack[-1][1]
        stack.append((depth, name))
        if re.search(r"\s\*\s", m.group(3) + " "):
            retriable.add(name)
    classes = _classes()
    assert set(drawn) | {"WalchannelError"} == set(classes), set(classes) ^ set(drawn)
    for name, parent in drawn.items():
        assert classes[name].__mro__[1].__name__ == parent, (name, parent)
    assert retriable == {n for n, c in classes.items() if c.retriable}


def test_every_error_is_in_one_family() -> None:
    for name, cls in _classes().items():
        if cls is errors.WalchannelError or cls in FAMILIES:
            continue
        assert sum(issubclass(cls, f) for f in FAMILIES) == 1, name


def test_the_runners_exit_codes_follow_retriable() -> None:
    codes = {
        errors.WriterFencedError: _code_for(
            errors.WriterFencedError("x", run_id="r", path="p", writer_id=None)
        ),
        errors.WalLockedError: _code_for(errors.WalLockedError("x", path="p")),
        errors.WalWriteError: _code_for(errors.WalWriteError("x", path="p")),
        errors.WalCorruptError: _code_for(errors.WalCorruptError("p", "r")),
        errors.WalLocationError: _code_for(errors.WalLocationError("x", path="p")),
        errors.EngineBehindError: _code_for(errors.EngineBehindError("x")),
        errors.RunExpiredError: _code_for(errors.RunExpiredError("x")),
        # From the runner's first-answer wait (SPEC "The runner"), not _code_for:
        errors.RunRefusedError: ExitCode.REFUSED,
        errors.EngineUnavailableError: ExitCode.NO_ENGINE,
    }
    for cls, code in codes.items():
        assert cls.retriable == (code not in NOT_RETRIABLE), (cls.__name__, code)
