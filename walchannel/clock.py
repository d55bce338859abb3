"""The clocks walchannel reads: monotonic time for durations, wall time for records.

A seam: production reads the system clocks (:data:`SYSTEM_CLOCK`); the
simulator (``tools/sim.py``) plugs in virtual ones that follow its event
loop's time, so a schedule never reads a real clock.

- :meth:`Clock.monotonic_ms` measures durations (acks coalescing, backoff,
  the watchdog): it never jumps when NTP steps the wall clock. Its origin
  is arbitrary; only differences mean anything.
- :meth:`Clock.wall_s` is the Unix time (seconds) stored in the log and
  compared with ``hard_deadline``, the run token's wall-clock expiry.
"""

from __future__ import annotations

import time
from typing import Final, Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


class Clock(Protocol):
    """The clocks a channel reads (see the module doc)."""

    def monotonic_ms(self) -> float:
        """Monotonic time in ms (arbitrary origin)."""
        ...

    def wall_s(self) -> float:
        """Wall-clock Unix time in seconds."""
        ...


class SystemClock:
    """The system's clocks: ``time.monotonic()`` and ``time.time()``."""

    def monotonic_ms(self) -> float:
        """``time.monotonic()`` in ms."""
        return time.monotonic() * 1000.0

    def wall_s(self) -> float:
        """``time.time()``."""
        return time.time()


#: The clock of every channel unless a test or the simulator passes another.
SYSTEM_CLOCK: Final = SystemClock()
