"""The echo baseline: IdentityService's Resolve and ResolveBatch answering a canned reply.

Same proto, same gRPC server (grpc.aio, handlers on the event loop), same grpcio options
(identity_server.server.GRPC_OPTIONS) and the same handler thread pool size
(Settings().max_workers) as the identity server, and a reply of the same shape and size
as a real one (an entity id, status, kind, two candidates, the names, the type and the mention's
display form), but no matching and no store: it measures the ceiling of the gRPC stack itself.

Run as its own process like the real server: `python -m benchmarks.echo --port 0` prints
`listening on 127.0.0.1:PORT` and serves until SIGTERM. `--busy-us N` makes each mention cost N
µs of pure Python first: what any handler work of that size costs the stack (goal 2's bound).

`--store DB --writes FILE` makes it goal 2's store floor: FILE lists the mentions that write
(JSON lines `[text, entity_type, kind, entity_id]`, kinds as `benchmarks.writes`), and the
first Resolve of each writes that mention's rows into DB (a copy of a generated store) through
the server's store layer, in a transaction of its own on the event loop, as the server writes an
uncontended Resolve, before the canned reply. The rows are built at start-up, so a call pays
the store's work alone: no matching and no bookkeeping.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from benchmarks.writes import Rows
from identity_server.server import GRPC_OPTIONS
from identity_server.settings import Settings
from identity_server.store import open_store

_BUSY_S = 0.0  # --busy-us: pure-Python work per mention before the canned reply


class StoreWrites:
    """Goal 2's store floor: the rows each listed mention writes, stored on its first Resolve."""

    def __init__(self, db: Path, listed: Path) -> None:
        self.store = open_store(f"sqlite:///{db}")
        with self.store.read() as tx:
            seq = tx.max_seq() + 1
            ordinal = int(tx.conn.exec_driver_sql(
                "SELECT coalesce(max(ordinal), 0) FROM entities").scalar_one()) + 1
        self.now = time.time()
        self.pending: dict[tuple[str, str], Rows] = {}
        for line in listed.read_text(encoding="utf-8").splitlines():
            text, entity_type, kind, entity_id = json.loads(line)
            if (text, entity_type) in self.pending:  # listed again: written once, as the server would
                continue
            rows = self.pending[text, entity_type] = Rows()
            rows.add(text, entity_type, kind, entity_id, ordinal=ordinal, seq=seq, now=self.now)
            ordinal += len(rows.entities)
            seq += len(rows.changes)

    def write(self, mention: str, entity_type: str) -> None:
        rows = self.pending.pop((mention, entity_type), None)
        if rows is not None:
            with self.store.write(wait=False) as tx:  # the sole writer: never waits
                rows.write(tx, self.now)


_WRITES: StoreWrites | None = None  # --store and --writes


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
        if _WRITES is not None:
            _WRITES.write(request.mention, request.entity_type)
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
    if _WRITES is not None:
        _WRITES.store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="echo baseline of IdentityService")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--busy-us", type=float, default=0.0,
                        help="microseconds of pure-Python work per mention before replying "
                             "(measures what a handler's own work costs the gRPC stack)")
    parser.add_argument("--store", type=Path, help="a generated store to write into (with --writes)")
    parser.add_argument("--writes", type=Path, help="the mentions whose first Resolve writes")
    args = parser.parse_args()
    if (args.store is None) != (args.writes is None):
        parser.error("--store and --writes go together")
    global _BUSY_S, _WRITES
    _BUSY_S = args.busy_us / 1e6
    if args.store is not None:
        _WRITES = StoreWrites(args.store, args.writes)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(args.port, stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
