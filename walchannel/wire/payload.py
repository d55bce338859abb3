"""JSON-like payload checks: refuse what can never be delivered, naming where it is.

``Event.payload``, ``FindingDraft.fields`` and ``ApprovalRequest.details``
travel as ``google.protobuf.Struct``, which stores every number as a double
and whose decoder has a recursion limit; the ``progress=`` marker is stored
as JSON. So a payload is refused with :class:`~walchannel.errors.PayloadError`
before it is logged and before a seq is used (SPEC "Payloads") when it holds:

- a key that is not a ``str``;
- an ``int`` outside ±2^53 (a double cannot hold it exactly);
- a NaN or infinite ``float``;
- ``bytes``, sets, datetimes or any other object that is not JSON-like;
- a string that is not valid UTF-8 (a lone surrogate);
- containers nested deeper than :data:`MAX_DEPTH` levels.

The walk is iterative, so a 10,000-level payload is refused without a
``RecursionError``. The encoded-size rule lives in the channel, which knows
``max_message_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from walchannel.errors import PayloadError

__all__ = [
    "MAX_DEPTH",
    "MAX_SAFE_INT",
    "MAX_VALUES",
    "check_payload",
    "check_text",
    "child_path",
    "plain_payload",
]

#: Deepest container nesting accepted; the payload mapping itself is level 1.
#: 32 levels of Struct/Value pairs stay well inside protobuf's default
#: recursion limit of 100 when decoded inside an ``UpMessage``.
MAX_DEPTH = 32

#: Largest integer magnitude a double holds exactly (2^53).
MAX_SAFE_INT = 2**53
#: Values a payload may hold unless the caller says otherwise: a Struct value
#: takes at least 2 bytes, so more than half of the default 4 MiB
#: ``max_message_bytes`` (``walchannel.config``) could never travel.
MAX_VALUES = 2 * 1024 * 1024


def child_path(path: str, key: object) -> str:
    """Return the path of ``key`` inside the container at ``path``.

    Identifier-like keys read as ``a.b``; other keys and list indexes as
    ``a["x y"]`` and ``a[3]``.
    """
    if isinstance(key, int):
        return f"{path}[{key}]"
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


def check_text(value: object, path: str) -> None:
    """Check that ``value`` is a ``str`` that encodes as UTF-8.

    Raises:
        PayloadError: not a ``str``, or it holds a lone surrogate.
    """
    if not isinstance(value, str):
        raise PayloadError(path, f"expected a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(
            path, f"string is not valid UTF-8 (lone surrogate at index {exc.start})"
        ) from None


def plain_payload(value: object, path: str, *, max_values: int = MAX_VALUES) -> dict[str, Any]:
    """Check a payload and return it as plain ``dict``/``list`` values.

    The checked value itself is returned when it is already made of
    ``dict``, ``list`` and ``tuple`` containers (the common case, no copy);
    other mappings are copied into plain dicts so protobuf and msgpack take
    them.

    Args:
        value: the payload; must be a mapping with ``str`` keys.
        path: the name of the payload in errors, e.g. ``"finding"``.
        max_values: as in :func:`check_payload`.

    Returns:
        The payload as a ``dict``.

    Raises:
        PayloadError: as :func:`check_payload`.
    """
    if check_payload(value, path, max_values=max_values):
        return _plain(value)  # type: ignore[no-any-return]
    return value  # type: ignore[return-value]


def _plain(value: Any) -> Any:
    # Only called after check_payload, so recursion is bounded by MAX_DEPTH.
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _path(root: str, trail: tuple[object, ...]) -> str:
    where = root
    for key in trail:
        where = child_path(where, key)
    return where


def _check_utf8(text: str, root: str, trail: tuple[object, ...]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(
            _path(root, trail), f"string is not valid UTF-8 (lone surrogate at index {exc.start})"
        ) from None


def check_payload(value: object, path: str, *, max_values: int = MAX_VALUES) -> bool:
    """Check that ``value`` is a JSON-like mapping that can travel as a Struct.

    Args:
        value: the payload; must be a mapping with ``str`` keys.
        path: the name of the payload in errors, e.g. ``"finding"``.
        max_values: refuse a payload holding more values than this,
            counting a container as often as it is referenced: a few lists
            sharing each other can stand for billions of values, which the
            walk would never finish. The channel passes its
            ``max_message_bytes // 2`` (a Struct value takes at least 2 bytes).

    Returns:
        True when the payload holds a mapping that is not a ``dict`` (so
        :func:`plain_payload` must copy it), else False.

    Raises:
        PayloadError: naming the path of the first bad value and why
            (SPEC "Payloads").
    """
    if not isinstance(value, Mapping):
        raise PayloadError(path, f"expected a mapping, got {type(value).__name__}")
    foreign = False
    budget = max_values
    # (container, the keys leading to it, its depth); depth-first without
    # recursion. Paths are spelled out only for an error: this runs on every send.
    stack: list[tuple[Any, tuple[object, ...], int]] = [(value, (), 1)]
    while stack:
        container, trail, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise PayloadError(
                _path(path, trail), f"containers nested deeper than {MAX_DEPTH} levels"
            )
        budget -= len(container)
        if budget < 0:
            raise PayloadError(
                path,
                f"more than {max_values} values (a shared container counts each "
                "time it appears): it could never travel within the size bound",
            )
        is_map = isinstance(container, Mapping)
        if is_map:
            foreign = foreign or not isinstance(container, dict)
            items: Any = container.items()
        else:
            items = enumerate(container)
        for key, item in items:
            if is_map:
                if type(key) is not str and not isinstance(key, str):
                    raise PayloadError(
                        f"{_path(path, trail)}[{key!r}]",
                        f"key must be a string, got {type(key).__name__}",
                    )
                if not key.isascii():
                    _check_utf8(key, path, (*trail, key))
            kind = type(item)
            if kind is str:
                if not item.isascii():
                    _check_utf8(item, path, (*trail, key))
            elif kind is int:
                if not -MAX_SAFE_INT <= item <= MAX_SAFE_INT:
                    raise PayloadError(
                        _path(path, (*trail, key)),
                        "integer outside ±2^53 cannot travel as a double",
                    )
            elif kind is float:
                if not math.isfinite(item):
                    raise PayloadError(
                        _path(path, (*trail, key)), f"{item!r} is not a finite number"
                    )
            elif item is None or kind is bool:
                continue
            elif kind is dict or kind is list or kind is tuple:
                stack.append((item, (*trail, key), depth + 1))
            else:
                _check_other(item, path, (*trail, key), depth, stack)
    return foreign


def _check_other(
    item: object,
    root: str,
    trail: tuple[object, ...],
    depth: int,
    stack: list[tuple[Any, tuple[object, ...], int]],
) -> None:
    """The slow path: subclasses of the JSON types and other mappings or sequences."""
    if isinstance(item, bool):
        return
    if isinstance(item, str):
        if not item.isascii():
            _check_utf8(item, root, trail)
    elif isinstance(item, int):
        if not -MAX_SAFE_INT <= item <= MAX_SAFE_INT:
            raise PayloadError(
                _path(root, trail), "integer outside ±2^53 cannot travel as a double"
            )
    elif isinstance(item, float):
        if not math.isfinite(item):
            raise PayloadError(_path(root, trail), f"{item!r} is not a finite number")
    elif isinstance(item, (Mapping, list, tuple)):
        stack.append((item, trail, depth + 1))
    else:
        raise PayloadError(_path(root, trail), f"{type(item).__name__} is not JSON-like")
