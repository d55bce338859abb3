"""The harness ``tools/chaos_runner.py`` runs: ``walchannel run chaos_runner_harness:Harness``.

Item ``i`` of ``$RUNNER_ITEMS`` gives ``i % 5`` findings, each keyed by its
content ``(item, n)`` so the audit can count them against the engine's store;
each scan takes ``$RUNNER_PACE_S`` (a sleep: the scanner's own time) and adds
one ``scan.item`` event to the item's transaction.
"""

from __future__ import annotations

import os
import time
from typing import Any


class Harness:
    name = "chaos-runner"
    version = "1"

    def __init__(self) -> None:
        self.count = int(os.environ["RUNNER_ITEMS"])
        self.pace = float(os.environ.get("RUNNER_PACE_S", "0"))

    def work(self) -> list[str]:
        return [f"item-{i:05}" for i in range(self.count)]

    def scan(self, item: str, ctx: Any) -> list[dict[str, Any]]:
        if self.pace:
            time.sleep(self.pace)
        i = int(item.rsplit("-", 1)[1])
        ctx.event("scan.item", {"item": item})
        return [{"item": item, "n": n} for n in range(i % 5)]

    def coverage(self) -> list[str]:
        return [f"{self.count} items"]
