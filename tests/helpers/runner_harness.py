"""A harness for the runner's process tests: ``walchannel run runner_harness:Harness``.

Item ``i`` of ``$RUNNER_ITEMS`` gives ``i % 3`` findings keyed by content
(``$RUNNER_FINDINGS`` each, when set);
each scan sleeps ``$RUNNER_PACE_S``; the items in ``$RUNNER_FAIL`` (commas)
raise. It writes ``scanned <item>`` to stdout as each scan starts, so a test
knows where a killed run was.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


class Harness:
    name = "runner-test"
    version = "1"

    def __init__(self) -> None:
        self.count = int(os.environ.get("RUNNER_ITEMS", "20"))
        self.pace = float(os.environ.get("RUNNER_PACE_S", "0"))
        self.fail = {int(i) for i in os.environ.get("RUNNER_FAIL", "").split(",") if i}
        each = os.environ.get("RUNNER_FINDINGS")
        self.each = int(each) if each else None

    def work(self) -> list[str]:
        return [f"item-{i:04}" for i in range(self.count)]

    def scan(self, item: str, ctx: Any) -> list[dict[str, Any]]:
        print(f"scanned {item}", file=sys.stdout, flush=True)
        if self.pace:
            time.sleep(self.pace)
        i = int(item.rsplit("-", 1)[1])
        if i in self.fail:
            raise RuntimeError(f"{item}: the scanner crashed")
        ctx.event("scan.item", {"item": item})
        return [{"item": item, "n": n} for n in range(i % 3 if self.each is None else self.each)]

    def coverage(self) -> list[str]:
        return [f"{self.count} items"]
