"""A call's request id: the caller's x-request-id (or a new one) comes back in trailing metadata
and is in the call's log line, with the peer; ingest names each paper's calls by the paper."""

from __future__ import annotations

import logging
import re

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_client import IdentityClient, request_id_of
from identity_server.server import RunningServer

T = 10.0


def _trailing_id(call: grpc.Call) -> str:
    return dict(call.trailing_metadata() or ())["x-request-id"]  # type: ignore[arg-type]


def test_the_request_id_comes_back_and_is_logged(server: RunningServer,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="identity_server.servicer")
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.IdentityServiceStub(channel)
        _, call = stub.Resolve.with_call(pb.ResolveRequest(mention="Ada", entity_type="person"),
                                         timeout=T, metadata=(("x-request-id", "paper:W42"),))
        assert _trailing_id(call) == "paper:W42"
        _, made = stub.Resolve.with_call(pb.ResolveRequest(mention="Ada", entity_type="person"),
                                         timeout=T)
        assert re.fullmatch(r"[0-9a-f]{12}-[0-9a-f]+", _trailing_id(made))
        with pytest.raises(grpc.RpcError) as failed:  # a failed call names its id too
            stub.GetEntity(pb.GetEntityRequest(entity_id="nope"), timeout=T,
                           metadata=(("x-request-id", "paper:W43"),))
        assert _trailing_id(failed.value) == "paper:W43"  # type: ignore[arg-type]
    lines = [r for r in caplog.records if getattr(r, "request_id", None) == "paper:W42"]
    assert len(lines) == 1
    line = lines[0]
    assert line.method == "Resolve" and line.code == "OK"  # type: ignore[attr-defined]
    assert line.peer.startswith("ipv4:127.0.0.1:")  # type: ignore[attr-defined]
    assert "request_id=paper:W42" in line.getMessage()


def test_ingest_names_a_papers_calls_by_the_paper(server: RunningServer,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="identity_server.servicer")
    with IdentityClient(f"127.0.0.1:{server.port}") as client:
        client.resolve_batch("W 7/é", [("Grace Hopper", "person")])
    ids = {getattr(r, "request_id", None) for r in caplog.records
           if getattr(r, "method", None) == "ResolveBatch"}
    assert ids == {request_id_of("W 7/é")} == {"paper:W%207%2F%C3%A9"}
