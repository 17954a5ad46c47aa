"""Prometheus metrics of one server process, served over HTTP on a port of their own
(`--metrics-port`). docs/operations.md lists them with their meaning.

Counters and histograms are updated by the servicer as calls end; the gauges that describe the
store (open links, the change feed's sequence, the index's lag behind it) are read when
Prometheus scrapes. Each server has a registry of its own, so several servers in one process
(tests, the embedded ingest job) never share counts. No label takes unbounded values: methods,
status codes and match kinds only.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from identity_server.errors import StartupError
from identity_server.service import ItemError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from identity_server.service import IdentityService, ResolveResult

logger = logging.getLogger(__name__)

# Call latencies from a lookup answered by the index (tens of µs) to a batch of thousands.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                   0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LOCK_BUCKETS = (0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
                30.0)
BATCH_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
SERVICE = "identity.v1.IdentityService"
UNARY = "unary"
_TYPES = {"ListChanges": "server_stream", "ImportAuthority": "client_stream"}


class Metrics:
    """The server's metrics and their registry."""

    def __init__(self, service: IdentityService) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # The gRPC calls under the names and labels of the grpc-ecosystem's Prometheus
        # interceptors (go-grpc-prometheus, py-grpc-prometheus), which dashboards expect.
        self.started = Counter("grpc_server_started", "RPCs started on the server.",
                               ["grpc_service", "grpc_method", "grpc_type"], registry=r)
        self.calls = Counter("grpc_server_handled", "RPCs completed on the server, by status "
                             "code.", ["grpc_service", "grpc_method", "grpc_type", "grpc_code"],
                             registry=r)
        self.latency = Histogram("grpc_server_handling_seconds",
                                 "Time from an RPC's start to its reply.",
                                 ["grpc_service", "grpc_method", "grpc_type"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.batch_items = Histogram("identity_resolve_batch_items",
                                     "Mentions a ResolveBatch carries.", buckets=BATCH_BUCKETS,
                                     registry=r)
        self.outcomes = Counter("identity_resolve_outcomes", "Resolved mentions by match kind "
                                "(EXACT, CASE, PUNCTUATION, ALIAS, TYPO, AMBIGUOUS, NEW) and "
                                "refused ones (ERROR).", ["match_kind"], registry=r)
        self.created = Counter("identity_entities_created", "Entities created by resolves "
                               "(new names and placeholders).", registry=r)
        self.lock_wait = Histogram("identity_store_write_lock_wait_seconds",
                                   "Time a write waited for the store's write lock.",
                                   buckets=LOCK_BUCKETS, registry=r)
        self.lock_hold = Histogram("identity_store_write_lock_hold_seconds",
                                   "Time a committed write held the store's write lock, from "
                                   "granted to committed.", buckets=LOCK_BUCKETS, registry=r)
        r.register(_StoreCollector(service))
        service.store.lock_wait_observer = self.lock_wait.observe
        service.store.lock_hold_observer = self.lock_hold.observe

    def record_start(self, method: str) -> None:
        self.started.labels(SERVICE, method, _TYPES.get(method, UNARY)).inc()

    def record_call(self, method: str, code: str, seconds: float) -> None:
        kind = _TYPES.get(method, UNARY)
        self.calls.labels(SERVICE, method, kind, code).inc()
        self.latency.labels(SERVICE, method, kind).observe(seconds)

    def record_results(self, results: Iterable[ResolveResult | ItemError]) -> None:
        """Outcomes of one reply's mentions, added a kind at a time."""
        kinds: Tally[str] = Tally()
        created = 0
        for r in results:
            if isinstance(r, ItemError):
                kinds["ERROR"] += 1
                continue
            kinds[r.match_kind.value] += 1
            created += r.created
        for kind, n in kinds.items():
            self.outcomes.labels(kind).inc(n)
        if created:
            self.created.inc(created)

    def serve(self, host: str, port: int) -> MetricsServer:
        """Serve /metrics over HTTP on host:port (0: a free port)."""
        try:
            httpd, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise StartupError(f"cannot serve metrics on {host}:{port}: {e.strerror}") from e
        return MetricsServer(httpd, thread)


class MetricsServer:
    """The HTTP server of /metrics; `close` stops it."""

    def __init__(self, httpd: WSGIServer, thread: Any) -> None:
        self._httpd = httpd
        self._thread = thread
        self.port: int = httpd.server_address[1]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class _StoreCollector(Collector):
    """Gauges read at each scrape: from the store and from the index."""

    def __init__(self, service: IdentityService) -> None:
        self._service = service

    def describe(self) -> Sequence[Any]:
        return []  # collected on each scrape; nothing to describe in advance

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        live = self._service.live
        index_seq = live.seq
        yield GaugeMetricFamily("identity_index_entities",
                                "Entities in this process's name index.",
                                value=len(live.index))
        yield GaugeMetricFamily("identity_index_change_sequence",
                                "The change feed's sequence this process's index has caught up to.",
                                value=index_seq)
        yield CounterMetricFamily("identity_write_groups_rewritten",
                                  "Write groups rolled back and written again, deciding under the "
                                  "store's lock: a mention decided before it no longer decided "
                                  "the same under it.",
                                  value=self._service.guesses_missed)
        try:
            with self._service.store.read() as tx:
                store_seq = tx.max_seq()
                open_links = tx.count_open_links()
        except Exception as e:  # noqa: BLE001 - a scrape reports the store down, never fails
            logger.warning("metrics: the store could not be read: %s", e)
            yield GaugeMetricFamily("identity_store_up", "1 when the store answered the scrape.",
                                    value=0)
            return
        yield GaugeMetricFamily("identity_store_up", "1 when the store answered the scrape.",
                                value=1)
        yield GaugeMetricFamily("identity_change_feed_sequence",
                                "The store's last change-feed sequence number.",
                                value=store_seq)
        yield GaugeMetricFamily("identity_index_lag_changes",
                                "Changes in the store that this process's index has not read "
                                "yet (written by other processes, or just committed).",
                                value=max(0, store_seq - index_seq))
        yield GaugeMetricFamily("identity_possibly_same_as_open",
                                "possibly_same_as links awaiting a curator's decision.",
                                value=open_links)


__all__ = ["Metrics", "MetricsServer"]
