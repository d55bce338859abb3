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


def plain_payload(value: object, path: str) -> dict[str, Any]:
    """Check a payload and return it as plain ``dict``/``list`` values.

    The checked value itself is returned when it is already made of
    ``dict``, ``list`` and ``tuple`` containers (the common case, no copy);
    other mappings are copied into plain dicts so protobuf and msgpack take
    them.

    Args:
        value: the payload; must be a mapping with ``str`` keys.
        path: the name of the payload in errors, e.g. ``"finding"``.

    Returns:
        The payload as a ``dict``.

    Raises:
        PayloadError: as :func:`check_payload`.
    """
    if check_payload(value, path):
        return _plain(value)  # type: ignore[no-any-return]
    return value  # type: ignore[return-value]


def _plain(value: Any) -> Any:
    # Only called after check_payload, so recursion is bounded by MAX_DEPTH.
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def check_payload(value: object, path: str) -> bool:
    """Check that ``value`` is a JSON-like mapping that can travel as a Struct.

    Args:
        value: the payload; must be a mapping with ``str`` keys.
        path: the name of the payload in errors, e.g. ``"finding"``.

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
    # (container, its path, its depth); depth-first without recursion.
    stack: list[tuple[Any, str, int]] = [(value, path, 1)]
    while stack:
        container, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise PayloadError(where, f"containers nested deeper than {MAX_DEPTH} levels")
        if isinstance(container, Mapping):
            foreign = foreign or not isinstance(container, dict)
            items: Any = container.items()
        else:
            items = enumerate(container)
        for key, item in items:
            if isinstance(container, Mapping):
                if not isinstance(key, str):
                    raise PayloadError(
                        f"{where}[{key!r}]",
                        f"key must be a string, got {type(key).__name__}",
                    )
                check_text(key, child_path(where, key))
            sub = child_path(where, key)
            if item is None or isinstance(item, bool):
                continue
            if isinstance(item, str):
                check_text(item, sub)
            elif isinstance(item, int):
                if not -MAX_SAFE_INT <= item <= MAX_SAFE_INT:
                    raise PayloadError(sub, "integer outside ±2^53 cannot travel as a double")
            elif isinstance(item, float):
                if not math.isfinite(item):
                    raise PayloadError(sub, f"{item!r} is not a finite number")
            elif isinstance(item, (Mapping, list, tuple)):
                stack.append((item, sub, depth + 1))
            else:
                raise PayloadError(sub, f"{type(item).__name__} is not JSON-like")
    return foreign
