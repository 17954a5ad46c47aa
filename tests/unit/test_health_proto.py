"""proto/grpc/health/v1/health.proto, shipped for clients in other languages, describes the
health service the server answers: the same messages, fields and methods as the descriptor of
grpcio-health-checking, which serves it."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_health_proto_is_the_served_one(tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools is in the dev extra")
    out = tmp_path / "health.pb"
    assert protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"--descriptor_set_out={out}",
                        str(ROOT / "proto" / "grpc" / "health" / "v1" / "health.proto")]) == 0
    shipped = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    served = descriptor_pb2.FileDescriptorProto()
    health_pb2.DESCRIPTOR.CopyToProto(served)
    for message in shipped.message_type:  # protoc fills in json_name; the runtime leaves it out
        for field in message.field:
            field.ClearField("json_name")
        for nested in message.nested_type:
            for field in nested.field:
                field.ClearField("json_name")
    assert shipped.package == served.package == "grpc.health.v1"
    assert list(shipped.message_type) == list(served.message_type)
    assert list(shipped.service) == list(served.service)
    assert shipped.options == served.options
