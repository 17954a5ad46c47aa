"""`identity-server serve --workers N`: N server processes on one port under one supervisor.

Real processes on loopback: the workers all bind the port the supervisor chose and each takes
connections; SIGTERM stops them all with exit 0; a worker that dies takes the others down with
exit 1; what N > 1 cannot serve is refused before anything starts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.errors import InvalidArgument
from identity_server.settings import Settings
from identity_server.workers import check_workers
from tests.conftest import serve_process
from tests.integration.test_concurrency import pg_database

SERVER = str(Path(sys.executable).with_name("identity-server"))
FAST_STOP = {**os.environ, "IDENTITY_DRAIN_SECONDS": "0.2", "IDENTITY_GRACE_SECONDS": "1"}


def worker_pids(supervisor: int) -> list[int]:
    """The supervisor's worker processes (multiprocessing's spawned children; not its
    resource tracker)."""
    children = []
    for task in os.listdir(f"/proc/{supervisor}/task"):
        with open(f"/proc/{supervisor}/task/{task}/children", encoding="ascii") as fh:
            children += [int(pid) for pid in fh.read().split()]
    return sorted(pid for pid in children
                  if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes())


def tcp_inodes(port: int, state: str) -> set[str]:
    """Socket inodes of TCP sockets on local `port` in `state` (0A listening, 01 established),
    IPv4 and IPv6, from /proc/net."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as fh:
            next(fh)
            for line in fh:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                    found.add(fields[9])
    return found


def socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:["):-1])
    return out


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.slow
@pytest.mark.postgres
def test_two_workers_on_postgres_answer_on_one_port_and_stop_on_sigterm() -> None:
    with pg_database() as db_url, serve_process(
            [SERVER, "--log-level", "warning", "serve", "--db", db_url, "--port", "0",
             "--workers", "2"], env=FAST_STOP) as (proc, port):
        workers = worker_pids(proc.pid)
        assert len(workers) == 2, workers
        listening = tcp_inodes(port, "0A")
        for pid in workers:
            assert socket_inodes(pid) & listening, f"worker {pid} does not listen on {port}"
        # 16 connections (a subchannel pool each): the kernel spreads them over both workers.
        channels = [grpc.insecure_channel(f"127.0.0.1:{port}",
                                          options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(16)]
        try:
            ids = {pb_grpc.IdentityServiceStub(c).Resolve(
                pb.ResolveRequest(mention="Ada Lovelace", entity_type="person",
                                  context_id=f"paper-{i}"), timeout=30).entity_id
                for i, c in enumerate(channels)}
            assert len(ids) == 1, ids  # one entity, whichever process answered
            established = tcp_inodes(port, "01")
            for pid in workers:
                assert socket_inodes(pid) & established, f"worker {pid} took no connection"
        finally:
            for c in channels:
                c.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert all(gone(pid) for pid in workers)
        with pytest.raises(OSError):  # the port is closed
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


@pytest.mark.slow
def test_a_worker_that_dies_stops_the_others_and_the_supervisor_fails(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'identity.sqlite'}"
    with serve_process([SERVER, "serve", "--db", db, "--port", "0", "--workers", "2"],
                       env=FAST_STOP) as (proc, _port):
        first, second = worker_pids(proc.pid)
        os.kill(first, signal.SIGKILL)
        assert proc.wait(timeout=30) == 1
        assert proc.stderr is not None
        log = proc.stderr.read()
    assert gone(second)
    assert f"(pid {first}) ended unexpectedly (killed by SIGKILL): stopping the others" in log


@pytest.mark.slow
def test_a_worker_that_cannot_start_fails_the_whole_server(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    done = subprocess.run(
        [SERVER, "serve", "--db", f"sqlite:///{tmp_path / 'identity.sqlite'}", "--port", "0",
         "--workers", "2", "--tls-cert", str(missing), "--tls-key", str(missing)],
        check=False, capture_output=True, text=True, timeout=60,
        env=FAST_STOP)
    assert done.returncode == 1, done.stderr
    assert "cannot read the TLS certificate or key" in done.stderr
    assert "(server process " in done.stderr
    assert "listening on" not in done.stdout


def test_what_several_workers_cannot_serve_is_refused(tmp_path: Path) -> None:
    shared = f"sqlite:///{tmp_path / 'identity.sqlite'}"
    for settings, says in [
        (Settings(db_url="sqlite://", workers=2), "SQLite in memory"),
        (Settings(db_url="sqlite:///file::memory:?uri=true", workers=2), "SQLite in memory"),
        (Settings(db_url=shared, workers=2, metrics_port=0), "--metrics-port"),
        (Settings(db_url=shared, workers=3, reconcile_port=0), "--reconcile-port"),
    ]:
        with pytest.raises(InvalidArgument, match=says):
            check_workers(settings)
    check_workers(Settings(db_url=shared, workers=4))
    check_workers(Settings(db_url="sqlite://", metrics_port=0))  # one process: as before
    done = subprocess.run([SERVER, "serve", "--db", shared, "--workers", "2", "--metrics-port",
                           "9464"], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--metrics-port (IDENTITY_METRICS_PORT) with --workers 2" in done.stderr


def test_a_port_in_use_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            [SERVER, "serve", "--db", f"sqlite:///{tmp_path / 'identity.sqlite'}", "--port",
             str(port), "--workers", "2"], check=False, capture_output=True, text=True,
            timeout=60)
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "starting" not in done.stderr  # refused by the supervisor: no worker began
    assert time.monotonic() - started < 30
