"""A LocalEngine on an event loop in a background thread, for tests that run their own loops."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from walchannel.testing.engine import LocalEngine

T = TypeVar("T")


class EngineThread:
    """A started LocalEngine serving from a loop of its own in a daemon thread."""

    def __init__(self, **kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.engine = LocalEngine(**kw)
        self.run(self.engine.start())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine's loop and return its result (30 s bound)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.run(self.engine.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
