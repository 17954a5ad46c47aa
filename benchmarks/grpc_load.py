"""gRPC clients of the benchmarks: one channel per target, calls with timeouts, request builders."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

import grpc
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from benchmarks.common import CALL_TIMEOUT_S
from identity_server.server import GRPC_OPTIONS


class Client:
    """A channel and stub to one server (identity or echo), with the server's message limits;
    `pid`, the server's process when known (its CPU time is read around each load)."""

    def __init__(self, address: str, pid: int | None = None) -> None:
        self.pid = pid
        self.channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        grpc.channel_ready_future(self.channel).result(timeout=CALL_TIMEOUT_S)
        self.stub = pb_grpc.IdentityServiceStub(self.channel)

    def resolve(self, request: pb.ResolveRequest) -> pb.ResolveResponse:
        return self.stub.Resolve(request, timeout=CALL_TIMEOUT_S)

    def resolve_batch(self, request: pb.ResolveBatchRequest) -> pb.ResolveBatchResponse:
        reply = self.stub.ResolveBatch(request, timeout=CALL_TIMEOUT_S)
        if len(reply.results) != len(request.mentions):
            raise RuntimeError("short batch reply")
        return reply

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def batch_requests(mentions: Sequence[tuple[str, str, str]], size: int,
                   context_prefix: str) -> list[pb.ResolveBatchRequest]:
    """Consecutive mentions in batches of `size`, each batch with its own context (paper) id."""
    out = []
    for i in range(0, len(mentions) - size + 1, size):
        out.append(pb.ResolveBatchRequest(
            context_id=f"{context_prefix}-{i // size}",
            mentions=[pb.Mention(mention=t, entity_type=ty) for t, ty, _ in mentions[i:i + size]],
        ))
    return out


def unary_requests(mentions: Sequence[tuple[str, str, str]]) -> list[pb.ResolveRequest]:
    return [pb.ResolveRequest(mention=t, entity_type=ty) for t, ty, _ in mentions]
