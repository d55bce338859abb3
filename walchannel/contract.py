"""The wire contract shipped inside the package (SPEC "Wire contract").

``proto/engine_channel.proto`` is copied into ``walchannel/_proto`` next to
the code generated from it (``tools/gen_proto.py``), so the wheel carries the
exact contract its code was made from.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

__all__ = ["load_engine_messages", "load_engine_proto", "proto_path"]


def proto_path() -> str:
    """Return the path of the shipped ``engine_channel.proto``."""
    return str(Path(__file__).resolve().parent / "_proto" / "engine_channel.proto")


def load_engine_messages() -> ModuleType:
    """Return the generated ``engine_channel_pb2`` module alone: the messages, without grpc.

    For code that builds or reads ``UpMessage``/``DownMessage`` without a
    gRPC server or channel (a simulated engine, a recorder of streams).
    """
    return importlib.import_module("walchannel._proto.engine_channel_pb2")


def load_engine_proto() -> tuple[ModuleType, ModuleType]:
    """Return the generated ``(engine_channel_pb2, engine_channel_pb2_grpc)`` modules.

    The second imports grpc. The messages have no proto package, so their
    names (``UpMessage``, ``Ack``, …) are global in protobuf's descriptor
    pool: a process cannot load another .proto that defines the same names.
    """
    pb2 = importlib.import_module("walchannel._proto.engine_channel_pb2")
    pb2_grpc = importlib.import_module("walchannel._proto.engine_channel_pb2_grpc")
    return pb2, pb2_grpc
