"""The wire contract: the shipped .proto and the committed generated code are current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import grpc_tools
from google.protobuf import descriptor_pb2

from conftest import ROOT
from walchannel import contract
from walchannel._proto import engine_channel_pb2 as pb


def compiled_descriptor(
    tmp_path: Path, name: str = "engine_channel.proto"
) -> descriptor_pb2.FileDescriptorProto:
    out = tmp_path / f"{name}.pb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto'}",
            f"--descriptor_set_out={out}",
            str(ROOT / "proto" / name),
        ],
        check=True,
    )
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (fd,) = [f for f in fds.file if f.name == name]
    # protoc fills json_name in descriptor sets; the Python generator leaves it out.
    for message in fd.message_type:
        for field in message.field:
            field.ClearField("json_name")
    return fd


def test_committed_code_matches_the_proto(tmp_path: Path) -> None:
    committed = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    assert committed == compiled_descriptor(tmp_path), (
        "walchannel/_proto is stale: run `make proto` (tools/gen_proto.py)"
    )


def test_shipped_proto_is_the_one_in_proto_dir() -> None:
    shipped = Path(contract.proto_path())
    assert shipped.is_file()
    assert shipped.read_bytes() == (ROOT / "proto" / "engine_channel.proto").read_bytes()


def test_no_package_method_path_and_field_numbers() -> None:
    assert pb.DESCRIPTOR.package == ""
    service = pb.DESCRIPTOR.services_by_name["EngineChannel"]
    method = service.methods_by_name["Open"]
    assert method.full_name == "EngineChannel.Open"
    assert method.client_streaming and method.server_streaming
    up = {f.name: f.number for f in pb.UpMessage.DESCRIPTOR.fields}
    assert up == {
        "run_id": 1,
        "correlation_id": 2,
        "seq": 3,
        "handshake": 4,
        "event": 5,
        "finding": 6,
        "heartbeat": 7,
        "approval_request": 8,
        "done": 9,
        "progress": 10,
        "transaction": 11,
    }
    down = {f.name: f.number for f in pb.DownMessage.DESCRIPTOR.fields}
    assert down == {"stop": 1, "approval_decision": 2, "budget_update": 3, "ack": 4}
    # The resume point (SPEC "The engine keeps the resume point"): new fields, backward compatible.
    assert {f.name: f.number for f in pb.Ack.DESCRIPTOR.fields} == {"seq": 1, "resume": 2}
    resume = {f.name: f.number for f in pb.ResumePoint.DESCRIPTOR.fields}
    assert resume == {"marker": 1, "seq": 2, "row_digests": 3, "rows": 4}
    assert {f.name: f.number for f in pb.Progress.DESCRIPTOR.fields} == {
        "marker": 1,
        "row_digests": 2,
    }
    assert [o.name for o in pb.UpMessage.DESCRIPTOR.oneofs] == ["body"]


def test_load_engine_proto_gives_the_generated_modules() -> None:
    pb2, pb2_grpc = contract.load_engine_proto()
    assert pb2 is pb
    assert grpc.__version__ == pb2_grpc.GRPC_GENERATED_VERSION or hasattr(grpc, "__version__")
    assert hasattr(pb2_grpc, "EngineChannelStub")
    assert hasattr(pb2_grpc, "add_EngineChannelServicer_to_server")


def test_generator_pin_matches_the_generated_code() -> None:
    _, pb2_grpc = contract.load_engine_proto()
    pinned = [
        line
        for line in (ROOT / "pyproject.toml").read_text().splitlines()
        if "grpcio-tools==" in line
    ]
    assert pinned and pb2_grpc.GRPC_GENERATED_VERSION in pinned[0]
    assert Path(grpc_tools.__file__).is_file()


def test_the_lenient_down_message_mirrors_the_contracts(tmp_path: Path) -> None:
    """proto/down_lenient.proto reads what engine_channel.proto writes: numbers and wire types."""
    from google.protobuf.descriptor import FieldDescriptor
    from google.protobuf.struct_pb2 import Value

    from walchannel._proto import down_lenient_pb2 as lenient

    # string and bytes share a wire type (length-delimited), as do enum and int32 (varint).
    same_wire = {FieldDescriptor.TYPE_STRING: FieldDescriptor.TYPE_BYTES}
    same_wire[FieldDescriptor.TYPE_ENUM] = FieldDescriptor.TYPE_INT32

    def mirror(strict: Any, loose: Any, seen: set[str]) -> None:
        if strict.full_name in seen:
            return
        seen.add(strict.full_name)
        fields = {f.number: f for f in strict.fields}
        assert {f.number for f in loose.fields} == set(fields), strict.full_name
        for field in loose.fields:
            want = fields[field.number]
            assert field.name == want.name, (strict.full_name, field.name)
            assert field.type == same_wire.get(want.type, want.type), (strict.full_name, field.name)
            if want.message_type is not None:
                mirror(want.message_type, field.message_type, seen)

    mirror(pb.DownMessage.DESCRIPTOR, lenient.DownMessage.DESCRIPTOR, set())
    assert {f.name for f in Value.DESCRIPTOR.fields} == {
        f.name for f in lenient.Value.DESCRIPTOR.fields
    }
    # The committed module is the proto's.
    committed = descriptor_pb2.FileDescriptorProto.FromString(lenient.DESCRIPTOR.serialized_pb)
    assert committed == compiled_descriptor(tmp_path, "down_lenient.proto"), (
        "walchannel/_proto is stale: run `make proto`"
    )
