"""Send through a channel while RLIMIT_FSIZE makes the disk "full", then free it.

Usage: python disk_full_child.py WAL_DIR RUN_ID GRPC_ADDR (token in $HARNESS_TOKEN).
CPython ignores SIGXFSZ, so SQLite sees writes past the limit fail as a full
disk. Prints one JSON line: seqs returned, write errors seen, the first
error text and whether it named the log path.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
from pathlib import Path

from walchannel import GrpcChannelConfig, GrpcEngineChannel, WalWriteError


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


async def main() -> int:
    wal_dir, run_id, grpc_addr = sys.argv[1:4]
    config = GrpcChannelConfig(
        grpc_addr=grpc_addr,
        run_id=run_id,
        correlation_id="c",
        run_token=os.environ["HARNESS_TOKEN"],
        wal_dir=wal_dir,
    )
    seqs: list[int] = []
    errors: list[WalWriteError] = []
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "disk-full", "1")
        largest = max(p.stat().st_size for p in Path(wal_dir).iterdir())
        # Room for a few pages more than the files hold now.
        resource.setrlimit(resource.RLIMIT_FSIZE, (largest + 64 * 1024, hard))
        pad = "x" * 2000
        for i in range(400):
            try:
                seqs.append(ch.send_finding({"n": i, "pad": pad}))
            except WalWriteError as exc:
                errors.append(exc)
                if len(errors) >= 3:
                    break
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space returns
        for i in range(400, 420):
            seqs.append(ch.send_finding({"n": i, "pad": pad}))
        ok = await ch.send_done("completed", len(seqs), [], "")
    print(
        json.dumps(
            {
                "seqs": seqs,
                "write_errors": len(errors),
                "first_error": str(errors[0]) if errors else "",
                "path_in_error": bool(errors) and errors[0].path.endswith(".wal.sqlite3"),
                "done": ok,
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
