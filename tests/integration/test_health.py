"""Health that tells the truth: NOT_SERVING while the store cannot be reached and SERVING again
once it can (a real PostgreSQL database that stops taking connections); and on SIGTERM,
NOT_SERVING at once while a new connection's calls are still answered for the drain period."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.server import start_server
from identity_server.settings import Settings
from tests.conftest import PG_ADMIN_URL, pg_admin, serve_process

T = 10.0
CLI = Path(sys.executable).parent / "identity-server"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health_of(port: int) -> int:
    """The overall health, asked on a new connection (as a load balancer's probe does)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=T)
        return int(reply.status)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def own_database() -> Iterator[str]:
    """A PostgreSQL database of its own, which the test can close to new connections."""
    admin = pg_admin()
    name = f"identity_health_{uuid.uuid4().hex[:10]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield name
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s", (name,))
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.mark.postgres
def test_health_is_not_serving_while_the_store_cannot_be_reached(own_database: str) -> None:
    import psycopg

    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{own_database}"
    running = start_server(Settings(db_url=url, port=0))
    try:
        assert health_of(running.port) == SERVING
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{own_database}" ALLOW_CONNECTIONS false')
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND pid <> pg_backend_pid()", (own_database,))
            wait_for(lambda: health_of(running.port) == NOT_SERVING, "NOT_SERVING")
            admin.execute(f'ALTER DATABASE "{own_database}" ALLOW_CONNECTIONS true')
        wait_for(lambda: health_of(running.port) == SERVING, "SERVING again")
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            reply = pb_grpc.IdentityServiceStub(channel).Resolve(
                pb.ResolveRequest(mention="Back Again", entity_type="tool"), timeout=T)
            assert reply.created
    finally:
        running.stop(grace=1.0)


def test_sigterm_drains_with_health_not_serving_while_calls_are_answered(
        tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDENTITY_")}
    env["IDENTITY_DRAIN_SECONDS"] = "3"
    args = [str(CLI), "serve", "--port", "0", "--db", f"sqlite:///{tmp_path / 'drain.sqlite'}"]
    with serve_process(args, env=env) as (proc, port):
        assert health_of(port) == SERVING
        started = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        wait_for(lambda: health_of(port) == NOT_SERVING, "NOT_SERVING after SIGTERM", 2.0)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # a new connection
            reply = pb_grpc.IdentityServiceStub(channel).Resolve(
                pb.ResolveRequest(mention="Still Here", entity_type="tool"), timeout=T)
            assert reply.created
        assert time.monotonic() - started < 3.0, "the drain ended before the checks"
        assert proc.wait(timeout=T) == 0
        assert time.monotonic() - started >= 3.0  # the whole drain, then the graceful stop
        assert proc.stderr is not None
        assert "draining" in proc.stderr.read()
