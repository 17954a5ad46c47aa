"""Metrics read over HTTP from a real server, before and after a known set of calls: the counters
move by exactly the calls made; the gauges read the store."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc
from prometheus_client.parser import text_string_to_metric_families

from identity_server.errors import StartupError
from identity_server.server import RunningServer, start_server
from identity_server.settings import Settings

T = 10.0
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def measured(tmp_path: Path) -> Iterator[RunningServer]:
    running = start_server(Settings(db_url=f"sqlite:///{tmp_path / 'm.sqlite'}", port=0,
                                    metrics_port=0))
    yield running
    running.stop(grace=1.0)


def scrape(running: RunningServer) -> tuple[Samples, str]:
    assert running.metrics_server is not None
    url = f"http://127.0.0.1:{running.metrics_server.port}/metrics"
    with urllib.request.urlopen(url, timeout=T) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, text


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_move_by_exactly_the_calls_made(measured: RunningServer) -> None:
    before, _ = scrape(measured)
    with grpc.insecure_channel(f"127.0.0.1:{measured.port}") as channel:
        stub = pb_grpc.IdentityServiceStub(channel)
        for text in ("Maria", "Mario", "maria"):  # new, new (weak typo: a link), case
            stub.Resolve(pb.ResolveRequest(mention=text, entity_type="person"), timeout=T)
        stub.ResolveBatch(pb.ResolveBatchRequest(context_id="W1", mentions=[
            pb.Mention(mention="Maria", entity_type="person"),
            pb.Mention(mention="Quorbex Engine", entity_type="tool"),
            pb.Mention(mention="", entity_type="tool"),  # refused: empty
        ]), timeout=T)
        with pytest.raises(grpc.RpcError):
            stub.GetEntity(pb.GetEntityRequest(entity_id="nope"), timeout=T)
        changes = list(stub.ListChanges(pb.ListChangesRequest(), timeout=T))
    after, text = scrape(measured)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    service = {"grpc_service": "identity.v1.IdentityService"}

    def handled(method: str, code: str, kind: str = "unary") -> float:
        return moved("grpc_server_handled_total", grpc_method=method, grpc_code=code,
                     grpc_type=kind, **service)

    assert handled("Resolve", "OK") == 3
    assert handled("ResolveBatch", "OK") == 1
    assert handled("GetEntity", "NOT_FOUND") == 1
    assert handled("ListChanges", "OK", "server_stream") == 1
    assert moved("grpc_server_started_total", grpc_method="Resolve", grpc_type="unary",
                 **service) == 3
    assert moved("grpc_server_handling_seconds_count", grpc_method="Resolve",
                 grpc_type="unary", **service) == 3
    every = sum(v for (name, _), v in after.items() if name == "grpc_server_handled_total")
    assert every - sum(v for (name, _), v in before.items()
                       if name == "grpc_server_handled_total") == 6  # and no other call
    assert moved("identity_resolve_batch_items_count") == 1
    assert moved("identity_resolve_batch_items_sum") == 3
    outcomes = "identity_resolve_outcomes_total"
    assert moved(outcomes, match_kind="NEW") == 3  # Maria, Mario, Quorbex Engine
    assert moved(outcomes, match_kind="CASE") == 1
    assert moved(outcomes, match_kind="EXACT") == 1
    assert moved(outcomes, match_kind="ERROR") == 1
    assert moved("identity_entities_created_total") == 3
    assert moved("identity_store_write_lock_wait_seconds_count") >= 1
    # Every write that waited for the lock held it: the same count, each hold a real time.
    held = moved("identity_store_write_lock_hold_seconds_count")
    assert held == moved("identity_store_write_lock_wait_seconds_count")
    assert moved("identity_store_write_lock_hold_seconds_sum") > 0
    assert moved("identity_write_groups_rewritten_total") == 0
    # The gauges read the store as it is now.
    assert value(after, "identity_change_feed_sequence") == changes[-1].change.sequence
    assert value(after, "identity_possibly_same_as_open") == 1  # Maria ~ Mario
    assert value(after, "identity_index_entities") == 3
    assert value(after, "identity_store_up") == 1
    # Conventions: base units, _total counters, no mention or id in any label.
    assert "Maria" not in text and "Quorbex" not in text


def test_no_metrics_port_serves_no_metrics(tmp_path: Path) -> None:
    running = start_server(Settings(db_url=f"sqlite:///{tmp_path / 'n.sqlite'}", port=0))
    try:
        assert running.metrics_server is None
    finally:
        running.stop(grace=0)


def test_a_metrics_port_in_use_is_a_clear_start_up_error(measured: RunningServer,
                                                         tmp_path: Path) -> None:
    assert measured.metrics_server is not None
    with pytest.raises(StartupError, match="cannot serve metrics on 127.0.0.1"):
        start_server(Settings(db_url=f"sqlite:///{tmp_path / 'o.sqlite'}", port=0,
                              metrics_port=measured.metrics_server.port))
