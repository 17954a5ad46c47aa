"""Concurrent resolves from many clients and two server processes equal a one-at-a-time order.

SPEC section 2: "concurrent resolves of one new mention create exactly one entity". Two real
server processes share one store; 32 client threads resolve the same 500 new, mutually unrelated
names in shuffled orders.
"""

from __future__ import annotations

import random
import string
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.store import SqlStore

NAMES = 500
CLIENTS = 32
SERVER_BIN = Path(sys.executable).with_name("identity-server")


def unrelated_names(n: int, seed: int = 7) -> list[str]:
    """Random two-word names; keys 12+ letters apart by far more than one edit."""
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        first = "".join(rng.choices(string.ascii_lowercase, k=7)).capitalize()
        last = "".join(rng.choices(string.ascii_lowercase, k=8)).capitalize()
        out.add(f"{first} {last}")
    return sorted(out)


@contextmanager
def server_process(db_url: str) -> Iterator[str]:
    """`identity-server serve --port 0` in its own process; yields its address."""
    with tempfile.TemporaryFile("w+") as log, subprocess.Popen(
        [str(SERVER_BIN), "--log-level", "warning", "serve", "--db", db_url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("listening on "):
                log.seek(0)
                raise AssertionError(f"server did not start: {line!r} {log.read()}")
            yield line.split()[-1]
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.seek(0)
        assert proc.returncode == 0, f"server exited with {proc.returncode}: {log.read()}"


def run_clients(addresses: list[str], names: list[str]) -> list[dict[str, str]]:
    channels = [grpc.insecure_channel(a) for a in addresses]
    stubs = [pb_grpc.IdentityServiceStub(c) for c in channels]

    def client(i: int) -> dict[str, str]:
        stub = stubs[i % len(stubs)]
        order = names[:]
        random.Random(i).shuffle(order)
        seen: dict[str, str] = {}
        for name in order:
            reply = stub.Resolve(
                pb.ResolveRequest(mention=name, entity_type="person", context_id=f"paper-{i}"),
                timeout=60,
            )
            seen[name] = reply.entity_id
        return seen

    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            return list(pool.map(client, range(CLIENTS)))
    finally:
        for c in channels:
            c.close()


def check_one_entity_per_name(db_url: str, results: list[dict[str, str]], names: list[str]) -> None:
    for name in names:
        ids = {r[name] for r in results}
        assert len(ids) == 1, f"{name!r} got {len(ids)} different ids: {sorted(ids)}"
    store = SqlStore(db_url)
    try:
        with store.read() as tx:
            assert tx.entity_count() == len(names)
            seqs = [c.seq for c in tx.changes_after(0)]
    finally:
        store.close()
    assert seqs == list(range(1, len(seqs) + 1)), "the change feed has gaps or reorderings"


@pytest.mark.slow
def test_two_processes_on_one_sqlite_file(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    names = unrelated_names(NAMES)
    with server_process(db_url) as a, server_process(db_url) as b:
        results = run_clients([a, b], names)
    check_one_entity_per_name(db_url, results, names)


@pytest.mark.slow
@pytest.mark.postgres
def test_two_processes_on_one_postgres_database(pg_url: str) -> None:
    names = unrelated_names(NAMES, seed=11)
    with server_process(pg_url) as a, server_process(pg_url) as b:
        results = run_clients([a, b], names)
    check_one_entity_per_name(pg_url, results, names)
