"""gRPC clients of the benchmarks: one channel per target, calls with timeouts, request builders."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

import grpc
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from benchmarks.common import CALL_TIMEOUT_S
from identity_server.server import GRPC_OPTIONS

SERVICE = "/identity.v1.IdentityService/"


class Client:
    """A channel to one server (identity or echo), with the server's message limits; `pid`, the
    server's process when known (its CPU time is read around each load).

    The load calls (`resolve`, `resolve_batch`) send requests serialized in advance and keep
    the replies as bytes, so that the client's CPU a call stays well below the echo's: the
    echo, not the load generator, is then the limit a ratio is measured against."""

    def __init__(self, address: str, pid: int | None = None) -> None:
        self.pid = pid
        self.channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        grpc.channel_ready_future(self.channel).result(timeout=CALL_TIMEOUT_S)
        self.stub = pb_grpc.IdentityServiceStub(self.channel)
        self._resolve: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self.channel.unary_unary(
            SERVICE + "Resolve")
        self._resolve_batch: grpc.UnaryUnaryMultiCallable[bytes, bytes] = (
            self.channel.unary_unary(SERVICE + "ResolveBatch"))

    def resolve(self, request: bytes) -> bytes:
        """A serialized ResolveRequest (`unary_requests`); the serialized reply."""
        reply: bytes = self._resolve(request, timeout=CALL_TIMEOUT_S)
        return reply

    def resolve_batch(self, request: bytes) -> bytes:
        """A serialized ResolveBatchRequest (`batch_requests`); the serialized reply."""
        reply: bytes = self._resolve_batch(request, timeout=CALL_TIMEOUT_S)
        if not reply:
            raise RuntimeError("empty batch reply")
        return reply

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def batch_requests(mentions: Sequence[tuple[str, str, str]], size: int,
                   context_prefix: str) -> list[bytes]:
    """Consecutive mentions in batches of `size`, each batch with its own context (paper) id,
    serialized."""
    out = []
    for i in range(0, len(mentions) - size + 1, size):
        out.append(pb.ResolveBatchRequest(
            context_id=f"{context_prefix}-{i // size}",
            mentions=[pb.Mention(mention=t, entity_type=ty) for t, ty, _ in mentions[i:i + size]],
        ).SerializeToString())
    return out


def unary_requests(mentions: Sequence[tuple[str, str, str]]) -> list[bytes]:
    """One serialized ResolveRequest a mention."""
    return [pb.ResolveRequest(mention=t, entity_type=ty).SerializeToString()
            for t, ty, _ in mentions]
