"""Fixtures shared by the identity-server tests: a service on a real SQLite file, a real server."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

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


def read_line(stream: IO[str], timeout: float) -> str:
    """A line of a process's output, or the test fails after `timeout` s (never hangs)."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"no line from the server within {timeout} s")


@contextmanager
def serve_process(args: Sequence[str], *, env: dict[str, str],
                  stderr: Any = subprocess.PIPE) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`identity-server ... serve --port 0 ...` as a process of its own: yields it and the port
    its `listening on` line names; at the end it is killed if still running (by its PID) and
    its pipes are closed."""
    proc = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env=env)
    try:
        assert proc.stdout is not None
        line = read_line(proc.stdout, 20.0)
        match = re.fullmatch(r"listening on \S+:(\d+)\s*", line)
        assert match, line
        yield proc, int(match.group(1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


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


def pg_admin() -> Any:
    """An autocommit connection to the `test` database (a psycopg Connection); skips the test
    where PostgreSQL does not answer, and fails it there when CI is set."""
    try:
        import psycopg

        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except Exception as e:  # any failure to connect means "no PostgreSQL here"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but PostgreSQL at 127.0.0.1:5432 does not answer: {e}")
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432 ({e}); set CI to make this a failure")


def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh store's URL for a test parametrized by backend: a SQLite file in tmp_path, or
    (marking the test `postgres`) a schema of its own in PostgreSQL."""
    if backend == "postgres":
        request.applymarker(pytest.mark.postgres)
        url: str = request.getfixturevalue("pg_url")
        return url
    return f"sqlite:///{tmp_path / 'store.sqlite'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh schema in the `test` database, dropped afterwards."""
    conn = pg_admin()
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
