"""The echo baseline: IdentityService's Resolve and ResolveBatch answering a canned reply.

Same proto, same gRPC server (grpc.aio, handlers on the event loop), same grpcio options
(identity_server.server.GRPC_OPTIONS) and the same handler thread pool size
(Settings().max_workers) as the identity server, and a reply of the same shape and size
as a real one (an entity id, status, kind, two candidates, the names, the type and the mention's
display form), but no matching and no store: it measures the ceiling of the gRPC stack itself.

Run as its own process like the real server: `python -m benchmarks.echo --port 0` prints
`listening on 127.0.0.1:PORT` and serves until SIGTERM. `--busy-us N` makes each mention cost N
µs of pure Python first: what any handler work of that size costs the stack (goal 2's bound).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from concurrent import futures
from typing import Any

import grpc
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.server import GRPC_OPTIONS
from identity_server.settings import Settings

_BUSY_S = 0.0  # --busy-us: pure-Python work per mention before the canned reply


def canned(mention: str, entity_type: str) -> pb.ResolveResponse:
    """A reply shaped like a converged resolve of `mention`."""
    if _BUSY_S:
        end = time.perf_counter() + _BUSY_S
        while time.perf_counter() < end:  # holds the GIL, as a Python handler's own work does
            pass
    return pb.ResolveResponse(
        entity_id="E000123456", status=pb.CANONICAL, match_kind=pb.EXACT, created=False,
        candidates=["E000123456"], name=mention, matched_name=mention,
        entity_type=entity_type or "other", display_form=mention,
    )


class EchoServicer(pb_grpc.IdentityServiceServicer):  # type: ignore[misc]
    """Answers on the event loop, as the server's Resolve answers a mention its index knows."""

    async def Resolve(self, request: pb.ResolveRequest,
                      context: grpc.aio.ServicerContext[Any, Any]) -> pb.ResolveResponse:
        return canned(request.mention, request.entity_type)

    async def ResolveBatch(self, request: pb.ResolveBatchRequest,
                           context: grpc.aio.ServicerContext[Any, Any]) -> pb.ResolveBatchResponse:
        out = pb.ResolveBatchResponse()
        for m in request.mentions:
            out.results.add().resolved.CopyFrom(canned(m.mention, m.entity_type))
        return out


async def start(port: int) -> tuple[grpc.aio.Server, int, futures.ThreadPoolExecutor]:
    """The echo on gRPC's asyncio server of the running loop, with the server's options and
    handler pool size, listening on 127.0.0.1:port (0: a free port); returns the server, its
    port and its pool (shut it down after the server stops)."""
    handlers = futures.ThreadPoolExecutor(max_workers=Settings().max_workers,
                                          thread_name_prefix="rpc")
    server = grpc.aio.server(migration_thread_pool=handlers, options=GRPC_OPTIONS)
    pb_grpc.add_IdentityServiceServicer_to_server(EchoServicer(), server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound, handlers


async def serve(port: int, stop: asyncio.Event) -> None:
    """The echo until `stop` is set."""
    server, bound, handlers = await start(port)
    print(f"listening on 127.0.0.1:{bound}", flush=True)
    await stop.wait()
    await server.stop(1.0)
    handlers.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description="echo baseline of IdentityService")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--busy-us", type=float, default=0.0,
                        help="microseconds of pure-Python work per mention before replying "
                             "(measures what a handler's own work costs the gRPC stack)")
    args = parser.parse_args()
    global _BUSY_S
    _BUSY_S = args.busy_us / 1e6

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(args.port, stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
