"""Overload is refused early: once the writing calls waiting hold the server's limit of
mentions, another writing call gets RESOURCE_EXHAUSTED at once, with a retry hint, and writes
nothing; lookup-only calls are still answered; ingest's client waits and retries."""

from __future__ import annotations

import sqlite3
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_client import IdentityClient, RetryPolicy
from identity_server.server import start_server
from identity_server.settings import Settings

T = 20.0


def batch(context: str, *names: str) -> pb.ResolveBatchRequest:
    return pb.ResolveBatchRequest(context_id=context, mentions=[
        pb.Mention(mention=n, entity_type="tool") for n in names])


def test_writes_beyond_the_limit_are_refused_at_once_and_lookups_still_answered(
        tmp_path: Path) -> None:
    db = tmp_path / "busy.sqlite"
    running = start_server(Settings(db_url=f"sqlite:///{db}", port=0, max_queued_mentions=3))
    blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    pool = futures.ThreadPoolExecutor(max_workers=2)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.IdentityServiceStub(channel)
            stub.Resolve(pb.ResolveRequest(mention="Known Tool", entity_type="tool"), timeout=T)
            blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            waiting = pool.submit(stub.ResolveBatch, batch("W1", "Alpha One", "Beta Two"),
                                  timeout=T)
            time.sleep(0.5)  # the first batch now waits for the lock, its 2 mentions counted
            started = time.monotonic()
            try:
                stub.ResolveBatch(batch("W2", "Gamma Three", "Delta Four"), timeout=T)
                raise AssertionError("a batch beyond the limit was taken")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "2 mentions are waiting to be written (limit 3)" in (e.details() or "")
                hint = dict(e.trailing_metadata() or ())  # type: ignore[attr-defined]
                assert int(hint["retry-after-ms"]) >= 100
            assert time.monotonic() - started < 2.0  # refused early, not after waiting
            looked = stub.Resolve(pb.ResolveRequest(mention="known tool", entity_type="tool",
                                                    lookup_only=True), timeout=T)
            assert looked.match_kind == pb.CASE  # a lookup is answered meanwhile
            blocker.execute("ROLLBACK")
            assert len(waiting.result(timeout=T).results) == 2
            names = {r[0] for r in sqlite3.connect(db).execute("SELECT display FROM names")}
            assert "Alpha One" in names and "Gamma Three" not in names  # the refused wrote nothing
    finally:
        if blocker.in_transaction:
            blocker.execute("ROLLBACK")
        blocker.close()
        pool.shutdown(wait=True)
        running.stop(grace=1.0)


def test_ingest_client_comes_back_when_a_busy_server_says(tmp_path: Path) -> None:
    db = tmp_path / "retry.sqlite"
    running = start_server(Settings(db_url=f"sqlite:///{db}", port=0, max_queued_mentions=1))
    blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    pool = futures.ThreadPoolExecutor(max_workers=1)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel, \
                IdentityClient(f"127.0.0.1:{running.port}",
                               policy=RetryPolicy(budget_seconds=30)) as client:
            stub = pb_grpc.IdentityServiceStub(channel)
            blocker.execute("BEGIN IMMEDIATE")
            first = pool.submit(stub.ResolveBatch, batch("W1", "First Tool"), timeout=T)
            time.sleep(0.5)
            threading.Timer(1.0, lambda: blocker.execute("ROLLBACK")).start()
            outcome = client.resolve_batch("W2", [("Second Tool", "tool")])  # retried
            assert first.result(timeout=T).results[0].resolved.created
            assert outcome.outcomes[0].created  # type: ignore[union-attr]
            assert client.retries >= 1
    finally:
        if blocker.in_transaction:
            blocker.execute("ROLLBACK")
        blocker.close()
        pool.shutdown(wait=True)
        running.stop(grace=1.0)
