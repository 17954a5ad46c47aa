"""Building and running the gRPC server: IdentityService, health checking and reflection."""

from __future__ import annotations

import asyncio
import collections
import logging
import signal
import socket
import threading
from collections.abc import Callable, Coroutine
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2

from identity_server import core
from identity_server.access import AccessPolicy
from identity_server.domain import TypeVocabulary
from identity_server.errors import StartupError
from identity_server.handlers import SERVICE, add_identity_service, add_service
from identity_server.loop_work import on_pool
from identity_server.metrics import Metrics, MetricsServer
from identity_server.reconcile import Reconciler, ReconcileServer, build_app
from identity_server.service import IdentityService, ServiceConfig
from identity_server.servicer import IdentityServicer
from identity_server.settings import MAX_MESSAGE_BYTES, Settings
from identity_server.store import open_store

logger = logging.getLogger(__name__)
T = TypeVar("T")

SERVICE_NAME = SERVICE.full_name
SIGNAL_POLL_S = 0.2  # how often the main thread wakes to run a pending signal's handler
STORE_PROBE_S = 1.0  # how often health asks the store whether it answers
STORE_PROBE_TIMEOUT_S = 10.0

# Shared by the server and the benchmarks' echo baseline, so both run the same gRPC stack.
GRPC_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),  # a port in use is an error, not silently shared
]


def grpc_options(settings: Settings) -> list[tuple[str, int]]:
    """GRPC_OPTIONS, with SO_REUSEPORT on for `--workers` N > 1: every worker binds the port
    its supervisor chose, and the kernel spreads connections among them."""
    if settings.workers == 1:
        return GRPC_OPTIONS
    return [(name, 1 if name == "grpc.so_reuseport" else value) for name, value in GRPC_OPTIONS]


REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def build_service(settings: Settings) -> IdentityService:
    """The use-case layer over the configured store (also used by the CLI's import command)."""
    store = (open_store(settings.db_url, synchronous=settings.sqlite_synchronous)
             if settings.db_url.startswith("sqlite") else open_store(settings.db_url))
    config = ServiceConfig(
        vocabulary=TypeVocabulary.of(settings.types, strict=settings.strict_types),
        max_mention_length=settings.max_mention_length,
        max_batch_size=settings.max_batch_size,
        promote_after_papers=settings.promote_after_papers,
        batch_reply_ttl_seconds=settings.batch_reply_ttl_seconds,
    )
    return IdentityService(store, config, core=core.use(settings.core))


class EventLoopThread:
    """An asyncio event loop on its own thread: the gRPC server's (the caller's thread, the
    embedded server's job or a test, stays free), or a tool's (benchmarks.loop_profile)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-loop",
                                        daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run coroutine on the loop and wait for its result here."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        """Cancel what still runs on the loop (as asyncio.run does), then stop and close it."""
        if self.loop.is_closed():
            return
        self.run(_cancel_remaining_tasks())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _cancel_remaining_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class RunningServer:
    """A started server; `stop` flips health to NOT_SERVING, then drains calls for `grace`."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service: IdentityService
    servicer: IdentityServicer
    settings: Settings
    _loop: EventLoopThread
    _handlers: futures.ThreadPoolExecutor
    metrics_server: MetricsServer | None = None
    reconcile_server: ReconcileServer | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the server's handlers run on (for tools that observe it)."""
        return self._loop.loop

    def reload_tokens(self) -> None:
        """Read the tokens file and IDENTITY_TOKENS again (SIGHUP); on an error the tokens in
        force stay, and the error is logged."""
        try:
            self.servicer.access = access_policy(self.settings)
        except StartupError as e:
            logger.error("tokens not reloaded, the previous ones stay in force: %s", e)
            return
        logger.info("tokens reloaded: %s", describe_access(self.servicer.access))

    def stop_serving(self) -> None:
        """Health NOT_SERVING (every service), while calls are still taken: the drain."""
        if not self._loop.loop.is_closed():
            self._loop.run(self.health.enter_graceful_shutdown())

    def stop(self, grace: float | None = 5.0) -> None:
        """Idempotent: a second call returns at once."""
        if self._loop.loop.is_closed():
            return
        self.stop_serving()
        self.servicer.stopping = True
        self._loop.run(self.server.stop(grace))
        self._loop.close()
        # Work still queued belongs to calls that are over: dropped. A write under way is
        # waited for by service.close() (the store's write lock), each queued one is not.
        self._handlers.shutdown(wait=False, cancel_futures=True)
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.reconcile_server is not None:
            self.reconcile_server.close()
        self.service.close()
        logger.info("server on port %d stopped", self.port)

    def wait(self) -> None:
        """Block until the server stops."""
        if not self._loop.loop.is_closed():
            self._loop.run(self.server.wait_for_termination())


def _tls_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """The TLS credentials, read before the store is opened so a typo costs no index build;
    with a client CA, clients must present a certificate it signed (mutual TLS)."""
    if not (settings.tls_cert or settings.tls_key):
        if settings.tls_client_ca:
            raise StartupError("--tls-client-ca needs TLS on (--tls-cert and --tls-key)")
        return None
    if not (settings.tls_cert and settings.tls_key):
        raise StartupError("TLS needs both --tls-cert and --tls-key")
    try:
        key, cert = Path(settings.tls_key).read_bytes(), Path(settings.tls_cert).read_bytes()
    except OSError as e:
        raise StartupError(f"cannot read the TLS certificate or key: {e}") from e
    try:
        client_ca = Path(settings.tls_client_ca).read_bytes() if settings.tls_client_ca else None
    except OSError as e:
        raise StartupError(f"cannot read the client CA certificates: {e}") from e
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


def access_policy(settings: Settings) -> AccessPolicy:
    return AccessPolicy.load(tokens_file=settings.tokens_file, tokens=settings.tokens,
                             admin_token=settings.admin_token)


def describe_access(access: AccessPolicy) -> str:
    counts = collections.Counter(role for _, role in access.tokens)
    listed = ", ".join(f"{n} {role.name.lower()}" for role, n in sorted(counts.items()))
    return f"{len(access.tokens)} tokens ({listed})" if access.tokens else "no tokens"


def _warn_if_open(settings: Settings, access: AccessPolicy, tls: bool, listen: str) -> None:
    """Say at start who may write: anyone who can reach the port, unless tokens say
    otherwise; louder when that is anyone on the network, in clear text."""
    if access.enforcing:
        logger.info("access by role: %s", describe_access(access))
        return
    loopback = settings.host in ("127.0.0.1", "::1", "localhost") or settings.host.startswith(
        "127.")
    message = (f"no reader or writer tokens: anyone who can reach {listen} may resolve and "
               "write (set --tokens-file or IDENTITY_TOKENS)")
    if loopback:
        logger.info("%s", message)
    elif not tls:
        logger.warning("%s; it listens beyond this machine WITHOUT TLS: tokens and data "
                       "cross the network in clear", message)
    else:
        logger.warning("%s", message)


def check_listen_address(host: str, port: int) -> None:
    """Refuse, with the system's reason, an address this machine cannot listen on (a port in
    use, a host that is not one of its addresses or does not resolve), before the store is
    opened and the index built: seconds to minutes at millions of entities. A port taken
    between this check and the server's own bind is still refused there."""
    if port == 0:
        return
    listen = address(host, port)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise StartupError(f"cannot listen on {listen}: {e.strerror}") from e
    reasons = []
    for family, kind, proto, _, sockaddr in found:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
                probe.bind(sockaddr)
                return
        except OSError as e:
            reasons.append(e.strerror or str(e))
    raise StartupError(f"cannot listen on {listen}: {'; '.join(dict.fromkeys(reasons))}")


def start_server(settings: Settings, *, service: IdentityService | None = None) -> RunningServer:
    """Start serving on settings.host:settings.port (0 picks a free port; see .port)."""
    credentials = _tls_credentials(settings)
    access = access_policy(settings)
    if service is None and settings.workers == 1:  # with workers, the supervisor checked
        check_listen_address(settings.host, settings.port)
    own_service = service is None
    service = service or build_service(settings)
    try:
        return _start(settings, service, credentials, access)
    except BaseException:
        if own_service:
            service.close()
        raise


def _start(settings: Settings, service: IdentityService,
           credentials: grpc.ServerCredentials | None, access: AccessPolicy) -> RunningServer:
    loop = EventLoopThread()
    handlers = futures.ThreadPoolExecutor(max_workers=settings.max_workers,
                                          thread_name_prefix="rpc")
    try:
        return loop.run(_serve(settings, service, credentials, access, loop, handlers))
    except BaseException:
        loop.close()
        handlers.shutdown(wait=False)
        raise


async def _serve(settings: Settings, service: IdentityService,
                 credentials: grpc.ServerCredentials | None, access: AccessPolicy,
                 loop: EventLoopThread, handlers: futures.ThreadPoolExecutor) -> RunningServer:
    """Build and start the server on the loop's thread (aio objects belong to their loop)."""
    server = grpc.aio.server(migration_thread_pool=handlers, options=grpc_options(settings))
    metrics = Metrics(service) if settings.metrics_port is not None else None
    servicer = IdentityServicer(service, access=access, blocking=handlers,
                                max_followers=max(1, settings.max_workers // 4),
                                max_imports=max(1, settings.max_workers // 4), metrics=metrics,
                                max_queued_mentions=settings.max_queued_mentions)
    add_identity_service(servicer, server)
    # The asyncio servicers: a Watch stream or a reflection stream holds no thread.
    health_servicer = health.aio.HealthServicer()
    add_service(health_servicer, server, health_pb2.DESCRIPTOR.services_by_name["Health"],
                health_pb2)
    # Reflection under both names tools ask for: grpcio-reflection serves only v1alpha, whose
    # messages are v1's on the wire (v1 is v1alpha made stable), so its servicer answers both.
    reflector = reflection.aio.ReflectionServicer(
        (SERVICE_NAME, health.SERVICE_NAME, REFLECTION_V1, reflection.SERVICE_NAME))
    reflection_service = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
    add_service(reflector, server, reflection_service, reflection_pb2)
    add_service(reflector, server, reflection_service, reflection_pb2, full_name=REFLECTION_V1)
    listen = address(settings.host, settings.port)
    try:
        port = (server.add_secure_port(listen, credentials) if credentials is not None
                else server.add_insecure_port(listen))
    except RuntimeError:  # grpcio raises "Failed to bind" where older versions returned 0
        port = 0
    if port == 0:
        raise StartupError(f"cannot listen on {listen}: the port is in use, or the address "
                           f"is not one of this machine's")
    metrics_server = None
    if metrics is not None and settings.metrics_port is not None:
        metrics_server = metrics.serve(settings.host, settings.metrics_port)
    try:
        await server.start()
    except BaseException:
        if metrics_server is not None:
            metrics_server.close()
        raise
    if metrics_server is not None:
        logger.info("metrics on http://%s/metrics", address(settings.host, metrics_server.port))
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    # Kept by the loop until it closes (EventLoopThread.close cancels it).
    _STORE_WATCHES.add(asyncio.get_running_loop().create_task(
        _watch_store(health_servicer, service)))
    logger.info("identity server listening on %s (store %s)", address(settings.host, port),
                service.store.url.split("@")[-1])
    _warn_if_open(settings, access, credentials is not None, address(settings.host, port))
    running = RunningServer(server, port, health_servicer, service, servicer, settings, loop,
                            handlers, metrics_server)
    if settings.reconcile_port is not None:
        try:
            running.reconcile_server = ReconcileServer(
                build_app(Reconciler(service, lambda: servicer.access)), settings.host,
                settings.reconcile_port)
        except BaseException:
            await server.stop(0)
            if metrics_server is not None:
                metrics_server.close()
            raise
        logger.info("reconciliation (OpenRefine) at http://%s/reconcile",
                    address(settings.host, running.reconcile_server.port))
    return running


_STORE_WATCHES: set[asyncio.Task[None]] = set()


def _store_answers(service: IdentityService) -> None:
    with service.store.read() as tx:
        tx.max_seq()


async def _watch_store(health_servicer: health.aio.HealthServicer,
                       service: IdentityService) -> None:
    """Health tells the truth about the store: NOT_SERVING while it cannot be read, SERVING
    again once it can. (Once the server is shutting down, health stays NOT_SERVING.) The probe
    has a thread of its own: calls that fill the blocking pool must not pass for an outage."""
    serving = True
    prober = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-probe")
    try:
        while True:
            await asyncio.sleep(STORE_PROBE_S)
            try:
                await asyncio.wait_for(on_pool(prober, _store_answers, service),
                                       STORE_PROBE_TIMEOUT_S)
                answers, cause = True, ""
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure means the store does not answer
                answers, cause = False, f"{type(e).__name__}: {e}"
            if answers == serving:
                continue
            serving = answers
            if answers:
                logger.warning("the store answers again: health SERVING")
            else:
                logger.error("the store does not answer (%s): health NOT_SERVING", cause)
            status = (health_pb2.HealthCheckResponse.SERVING if answers
                      else health_pb2.HealthCheckResponse.NOT_SERVING)
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, status)
    finally:
        prober.shutdown(wait=False, cancel_futures=True)
        task = asyncio.current_task()
        if task is not None:
            _STORE_WATCHES.discard(task)


def address(host: str, port: int) -> str:
    """host:port as gRPC and its clients take it (an IPv6 host in brackets: `[::1]:50051`)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def serve_until_signalled(running: RunningServer, grace: float,
                          ready: Callable[[], object] = lambda: None,
                          drain: float = 0.0) -> None:
    """Call `ready` once SIGTERM, Ctrl-C and SIGHUP are ours (so a supervisor that signals as
    soon as it is told the port gets a graceful stop), block until SIGTERM or Ctrl-C comes,
    then shut down: after SIGTERM, `drain` seconds of NOT_SERVING health while calls are still
    taken (load balancers and readiness probes see it and stop sending), then the graceful
    stop, which lets calls under way finish within `grace`. Ctrl-C skips the drain. SIGHUP
    reads the tokens again."""
    stop = threading.Event()
    reload = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal %d: shutting down", signum)
        received.append(signum)
        stop.set()

    def on_hangup(_signum: int, _frame: FrameType | None) -> None:
        reload.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    try:
        ready()
        # Waited in slices: a signal that lands on one of gRPC's threads only marks itself
        # pending for the main thread, which runs the handler when it next wakes; an unbounded
        # wait would never wake (seen: a server that ignored SIGTERM under load).
        while not stop.wait(SIGNAL_POLL_S):
            if reload.is_set():
                reload.clear()
                running.reload_tokens()
        if drain > 0 and received and received[0] == signal.SIGTERM:
            running.stop_serving()
            logger.info("draining: health NOT_SERVING, calls still taken for %.1f s", drain)
            stop.clear()
            stop.wait(drain)  # a second signal ends the drain early
    finally:
        running.stop(grace)