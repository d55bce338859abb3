"""Test doubles and a real local engine for harness authors (SPEC "Test doubles").

- :class:`LocalEngine`: a real ``grpc.aio`` engine on loopback fulfilling
  every engine duty, with an in-memory or shared SQLite store.
- :class:`EngineStore`: that store, readable from any process.
- :class:`InMemoryEngineChannel`: an ``EngineChannel`` that keeps what it gets.
- :class:`FaultProxy`: a loopback TCP proxy that injects network faults.

Names load lazily (PEP 562): importing this package loads no grpc.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "EngineStore": "walchannel.testing.store",
    "FaultProxy": "walchannel.testing.proxy",
    "InMemoryEngineChannel": "walchannel.testing.memory",
    "LocalEngine": "walchannel.testing.engine",
}

__all__ = ["EngineStore", "FaultProxy", "InMemoryEngineChannel", "LocalEngine"]

if TYPE_CHECKING:
    from walchannel.testing.engine import LocalEngine
    from walchannel.testing.memory import InMemoryEngineChannel
    from walchannel.testing.proxy import FaultProxy
    from walchannel.testing.store import EngineStore


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'walchannel.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
