"""Concurrent resolves from many clients and two server processes equal a one-at-a-time order.

SPEC section 2: "concurrent resolves of one new mention create exactly one entity". Two real
server processes share one store; 32 client threads resolve the same 500 new, mutually unrelated
names in shuffled orders. Then `serve --workers N` (N processes on one port) on PostgreSQL: 1, 2
and 4 processes must put the same mentions into the same entities.
"""

from __future__ import annotations

import os
import random
import string
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc
from sqlalchemy import text

from identity_server.store import SqlStore
from tests.conftest import pg_admin

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
def server_process(db_url: str, workers: int = 1, *, drain_s: float = 5.0) -> Iterator[str]:
    """`identity-server serve --port 0 [--workers N]` in its own process; yields its address."""
    with tempfile.TemporaryFile("w+") as log, subprocess.Popen(
        [str(SERVER_BIN), "--log-level", "warning", "serve", "--db", db_url, "--port", "0",
         "--workers", str(workers)],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env={**os.environ, "IDENTITY_DRAIN_SECONDS": str(drain_s)},
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
    """CLIENTS clients, taking the servers' addresses in turn, each on the channel of its
    address."""
    channels = [grpc.insecure_channel(a) for a in addresses]
    return resolve_in_shuffled_orders(channels, names, CLIENTS, seed=0)


def resolve_in_shuffled_orders(channels: Sequence[grpc.Channel], names: Sequence[str],
                               clients: int, *, seed: int) -> list[dict[str, str]]:
    """`clients` threads, client i on channels[i % len(channels)], each resolving every name
    once, in its own shuffled order (seeded seed + i), under a paper of its own; each client's
    names to the ids it got. Closes the channels."""
    def client(i: int) -> dict[str, str]:
        stub = pb_grpc.IdentityServiceStub(channels[i % len(channels)])
        order = list(names)
        random.Random(seed + i).shuffle(order)
        return {name: stub.Resolve(pb.ResolveRequest(mention=name, entity_type="person",
                                                     context_id=f"paper-{i}"),
                                   timeout=60).entity_id
                for name in order}

    try:
        with ThreadPoolExecutor(clients) as pool:
            return list(pool.map(client, range(clients)))
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


@contextmanager
def pg_database() -> Iterator[str]:
    """A database of its own on the test server (the store-wide advisory lock is per database,
    so other tests' writes do not wait on this one's); dropped afterwards."""
    admin = pg_admin()
    name = f"identity_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def name_groups(n: int, seed: int) -> list[tuple[str, ...]]:
    """n groups of spellings of one name each: the name, its case and punctuation variants and
    a typo one edit from it (a swap of two letters of the surname). Whichever comes first, the
    others converge on it (rules 2-4), so one entity per group whatever the order."""
    groups = []
    for name in unrelated_names(n, seed=seed):
        first, last = name.split()
        typo = f"{first} {last[:3]}{last[4]}{last[3]}{last[5:]}"
        groups.append((name, name.upper(), f"{first}-{last}", typo))
    return groups


def partition(results: list[dict[str, str]]) -> set[frozenset[str]]:
    """The mentions grouped by the entity they resolved to (every client must agree)."""
    by_entity: dict[str, set[str]] = {}
    for mention in results[0]:
        ids = {r[mention] for r in results}
        assert len(ids) == 1, f"{mention!r} got {len(ids)} different ids: {sorted(ids)}"
        by_entity.setdefault(ids.pop(), set()).add(mention)
    return {frozenset(group) for group in by_entity.values()}


def resolve_on_one_port(address: str, mentions: Sequence[str], clients: int) -> list[dict[str, str]]:
    """Each client on its own connection (the kernel spreads connections among the workers on
    the port) resolves every mention once, in its own shuffled order, with a context."""
    # A local subchannel pool a channel: channels to one address would share one connection.
    channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(clients)]
    return resolve_in_shuffled_orders(channels, mentions, clients, seed=100)


@pytest.mark.slow
@pytest.mark.postgres
def test_one_two_and_four_worker_processes_make_the_same_entities() -> None:
    """`serve --workers N` for N = 1, 2, 4, each on a fresh PostgreSQL store, from 6 clients
    on 6 connections: the same partition of mentions into entities, one entity per group, a
    gapless feed, and every resolve's evidence counted once."""
    groups = name_groups(60, seed=13)
    mentions = [m for group in groups for m in group]
    expected = {frozenset(group) for group in groups}
    found: dict[int, set[frozenset[str]]] = {}
    for workers in (1, 2, 4):
        with pg_database() as db_url:
            with server_process(db_url, workers=workers, drain_s=0) as address:
                results = resolve_on_one_port(address, mentions, clients=6)
            found[workers] = partition(results)
            store = SqlStore(db_url)
            try:
                with store.read() as tx:
                    entities = tx.entity_count()
                    seqs = [c.seq for c in tx.changes_after(0)]
                    counted = dict(tx.conn.execute(text(
                        "SELECT context_id, SUM(count) FROM evidence GROUP BY context_id")).all())
            finally:
                store.close()
        assert entities == len(groups), f"{workers} processes made {entities} entities"
        # Each client's paper: every mention's evidence once, whether it was written before
        # the store's lock (a guess) or under it.
        assert counted == {f"paper-{i}": len(mentions) for i in range(6)}
        assert seqs == list(range(1, len(seqs) + 1)), "the change feed has gaps or reorderings"
    assert found[1] == expected
    assert found[2] == found[1]
    assert found[4] == found[1]
