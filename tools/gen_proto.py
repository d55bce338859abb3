"""Regenerate walchannel/_proto from proto/engine_channel.proto and proto/down_lenient.proto.

Usage: python tools/gen_proto.py   (or `make proto`)

Uses grpcio-tools (pinned exactly in pyproject.toml, since the generated code
carries its version) and mypy-protobuf for the .pyi stubs, then rewrites the
generated absolute import into a package-relative one so the modules work
from inside `walchannel._proto`. tests/test_contract.py fails when the
committed output is stale.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "walchannel" / "_proto"
NAME = "engine_channel"
LENIENT = "down_lenient"


def generate(out_dir: Path = OUT_DIR) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            f"--mypy_out={out_dir}",
            f"--mypy_grpc_out={out_dir}",
            str(PROTO_DIR / f"{NAME}.proto"),
        ],
        check=True,
    )
    for path in (
        out_dir / f"{NAME}_pb2_grpc.py",
        out_dir / f"{NAME}_pb2_grpc.pyi",
        out_dir / f"{NAME}_pb2.pyi",
    ):
        text = path.read_text()
        text = re.sub(
            rf"^import {NAME}_pb2 as (\w+)$",
            rf"from . import {NAME}_pb2 as \1",
            text,
            flags=re.MULTILINE,
        )
        path.write_text(text)
    # The lenient reading of a DownMessage (no service: messages only).
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={out_dir}",
            f"--mypy_out={out_dir}",
            str(PROTO_DIR / f"{LENIENT}.proto"),
        ],
        check=True,
    )
    shutil.copyfile(PROTO_DIR / f"{NAME}.proto", out_dir / f"{NAME}.proto")
    init = out_dir / "__init__.py"
    if not init.exists():
        init.write_text('"""Generated protobuf and gRPC modules (see tools/gen_proto.py)."""\n')


if __name__ == "__main__":
    generate()
    print(f"generated {OUT_DIR.relative_to(ROOT)}")
