"""A child that appends and acks on a run log, reporting each step on stdout.

Usage: python log_child.py WAL_DIR RUN_ID SEED [KILL_POINT KILL_STEP]

Lines: ``begin <n> <marker-json>`` before a commit, ``commit <first> <last>
<marker-json>`` after it, ``acked <seq>`` after an ack is stored. With a
kill point the child SIGKILLs itself there at step KILL_STEP; without one
the parent kills it at a random moment.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys

from walchannel.log import RunLog

POINTS = ("before_commit", "after_commit", "before_ack", "after_ack", "after_open")


def die_if(point: str, step: int, kill_point: str | None, kill_step: int) -> None:
    if point == kill_point and step >= kill_step:
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    wal_dir, run_id, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kill_point = sys.argv[4] if len(sys.argv) > 4 else None
    kill_step = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    rng = random.Random(seed)
    wal = RunLog.open(wal_dir, run_id, correlation_id="c")
    out = sys.stdout
    print(f"opened {wal.next_seq} {wal.last_acked_seq}", file=out, flush=True)
    die_if("after_open", kill_step, kill_point, kill_step)
    marker = (wal.progress or {}).get("m", 0)
    step = 0
    while True:
        step += 1
        if rng.random() < 0.7 or wal.unacked_count == 0:
            n = rng.choice((1, 1, 1, 3, 17))
            marker += 1
            progress = {"m": marker} if rng.random() < 0.6 else None
            print(f"begin {n} {json.dumps(progress)}", file=out, flush=True)
            die_if("before_commit", step, kill_point, kill_step)
            items = [("finding", {"fields": {"m": marker, "i": i}}) for i in range(n)]
            seqs = wal.append_many(items, progress=progress)
            die_if("after_commit", step, kill_point, kill_step)
            print(f"commit {seqs[0]} {seqs[-1]} {json.dumps(progress)}", file=out, flush=True)
        else:
            target = rng.randint(wal.last_acked_seq, wal.next_seq - 1)
            die_if("before_ack", step, kill_point, kill_step)
            wal.ack(target)
            die_if("after_ack", step, kill_point, kill_step)
            print(f"acked {target}", file=out, flush=True)


if __name__ == "__main__":
    main()
