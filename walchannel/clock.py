"""The clocks walchannel reads: monotonic for durations, wall for records, boot time for ages.

A seam: production reads the system clocks (:data:`SYSTEM_CLOCK`); the
simulator (``tools/sim.py``) plugs in virtual ones that follow its event
loop's time, so a schedule never reads a real clock.

- :meth:`Clock.monotonic_ms` measures durations inside a process (acks
  coalescing, backoff, the watchdog): it never jumps when NTP steps the wall
  clock. Its origin is arbitrary; only differences mean anything.
- :meth:`Clock.wall_s` is the Unix time (seconds) stored in the log and
  compared with ``hard_deadline``, the run token's wall-clock expiry.
- :meth:`Clock.boot_s` and :meth:`Clock.boot_id` date a row so that
  another process (``walchannel inspect``) can tell its age across a
  wall-clock step: ``CLOCK_BOOTTIME`` counts from the boot (suspend
  included, unlike ``CLOCK_MONOTONIC``), and the boot id
  (``/proc/sys/kernel/random/boot_id``) says which boot a reading belongs
  to. Two readings compare only within one boot; across a reboot, on
  another host, or without a boot id, ages fall back to the wall clock (the
  systemd journal stores its entries' times the same way).
"""

from __future__ import annotations

import time
from typing import Final, Protocol

__all__ = ["BOOT_ID_PATH", "SYSTEM_CLOCK", "Clock", "SystemClock", "age_s"]

#: Where Linux says which boot this is (a random UUID per boot).
BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"


class Clock(Protocol):
    """The clocks a channel and its log read (see the module doc)."""

    def monotonic_ms(self) -> float:
        """Monotonic time in ms (arbitrary origin)."""
        ...

    def wall_s(self) -> float:
        """Wall-clock Unix time in seconds."""
        ...

    def boot_s(self) -> float:
        """Seconds since this boot (``CLOCK_BOOTTIME``), suspend included."""
        ...

    def boot_id(self) -> str | None:
        """This boot's id, or None where the system does not say."""
        ...


class SystemClock:
    """The system's clocks: ``time.monotonic()``, ``time.time()``, ``CLOCK_BOOTTIME``."""

    def __init__(self) -> None:
        self._boot_id: str | None = None
        self._boot_id_read = False
        # CLOCK_BOOTTIME is Linux's; elsewhere the monotonic clock stands in
        # (it stops during suspend), with no boot id: ages use the wall clock.
        self._boottime = getattr(time, "CLOCK_BOOTTIME", None)

    def monotonic_ms(self) -> float:
        """``time.monotonic()`` in ms."""
        return time.monotonic() * 1000.0

    def wall_s(self) -> float:
        """``time.time()``."""
        return time.time()

    def boot_s(self) -> float:
        """``clock_gettime(CLOCK_BOOTTIME)`` (``time.monotonic()`` where it does not exist)."""
        if self._boottime is None:
            return time.monotonic()
        return time.clock_gettime(self._boottime)

    def boot_id(self) -> str | None:
        """The boot id of :data:`BOOT_ID_PATH`, read once; None when it cannot be read."""
        if not self._boot_id_read:
            self._boot_id_read = True
            if self._boottime is not None:
                try:
                    # Bytes, decoded here: a text file would look its codec
                    # up, an import that needs a descriptor of its own.
                    with open(BOOT_ID_PATH, "rb") as file:
                        self._boot_id = file.read().decode("ascii").strip() or None
                except (OSError, ValueError):
                    self._boot_id = None
        return self._boot_id


def age_s(
    clock: Clock,
    *,
    wall_at: float,
    boot_at: float | None,
    boot_id: str | None,
) -> float:
    """How old a record is (seconds, never negative), across wall-clock steps when it can.

    Within the boot that made it (``boot_id`` is this boot's and ``boot_at``
    was read then), the age is boot time elapsed; otherwise (another boot,
    another host, a record from before boot times were stored) it is wall
    time elapsed, which a wall-clock step distorts.

    Args:
        clock: the clocks to read now.
        wall_at: the record's wall-clock time (unix seconds).
        boot_at: its ``CLOCK_BOOTTIME`` reading (seconds), or None.
        boot_id: the boot ``boot_at`` belongs to, or None.
    """
    now_boot_id = clock.boot_id()
    if boot_at is not None and boot_id is not None and boot_id == now_boot_id:
        return max(0.0, clock.boot_s() - boot_at)
    return max(0.0, clock.wall_s() - wall_at)


#: The clock of every channel and log unless a test or the simulator passes another.
SYSTEM_CLOCK: Final = SystemClock()
