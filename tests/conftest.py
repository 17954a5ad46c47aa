"""Fixtures shared by the identity-server tests: a service on a real SQLite file, a real server."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.server import RunningServer, build_service, start_server
from identity_server.service import IdentityService
from identity_server.settings import Settings

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
ADMIN_TOKEN = "test-admin-token"
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


# Runs the command that follows with SIGINT's default action, which Python turns into
# KeyboardInterrupt; a process started with SIGINT ignored (a shell's background job, some CI
# runners) passes that on. Not `preexec_fn`: Python code between fork and exec can deadlock in a
# process with other threads (here the stub server's). Once, on a slow host, the job had not
# called the server after 20 s; that hazard is the likely cause.
WITH_SIGINT = [sys.executable, "-c", (
    "import os, signal, sys; "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])")]


def signal_a_thread_other_than_main(pid: int, signum: int) -> None:
    """Deliver signum to one of process pid's threads that is not its main thread (tgkill),
    where a process-wide signal may land under load; skip where libc lacks tgkill."""
    import ctypes

    tgkill = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)
    if tgkill is None:
        pytest.skip("libc has no tgkill")
    others = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    assert others, "the process runs threads besides its main one"
    assert tgkill(pid, others[-1], signum) == 0, os.strerror(ctypes.get_errno())


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return sqlite_url(tmp_path / "identity.sqlite")


@pytest.fixture
def service(db_url: str) -> Iterator[IdentityService]:
    """The use-case layer on a fresh SQLite file (no gRPC)."""
    svc = build_service(Settings(db_url=db_url))
    yield svc
    svc.close()


@pytest.fixture
def server(db_url: str) -> Iterator[RunningServer]:
    """A real gRPC server on a free loopback port, with an admin token."""
    running = start_server(Settings(db_url=db_url, port=0, admin_token=ADMIN_TOKEN))
    yield running
    running.stop(grace=1.0)


@pytest.fixture
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.Channel) -> pb_grpc.IdentityServiceStub:
    return pb_grpc.IdentityServiceStub(channel)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh schema in the `test` database, dropped afterwards."""
    try:
        import psycopg

        conn = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except Exception as e:  # any failure to connect means "no PostgreSQL here"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but PostgreSQL at 127.0.0.1:5432 does not answer: {e}")
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432 ({e}); set CI to make this a failure")
    schema = f"identity_test_{uuid.uuid4().hex[:12]}"
    with conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield (
                "postgresql+psycopg://postgres@127.0.0.1:5432/test"
                f"?options=-csearch_path%3D{schema}"
            )
        finally:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
