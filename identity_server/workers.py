"""`identity-server serve --workers N`: N server processes on one port, under one supervisor.

Each worker is a whole server (its own index, gRPC server, health and drain), started with the
`spawn` method (a process that has imported gRPC is never forked), and binds the one port with
SO_REUSEPORT, so the kernel spreads new connections among the workers. Their answers equal some
one-at-a-time order of the calls because the store serialises writes across processes (SPEC
section 2): N > 1 therefore needs a store they all share, a SQLite file or PostgreSQL.

This process, the supervisor, picks the port and holds it until every worker has bound it,
forwards SIGTERM, SIGINT and SIGHUP to the workers and waits for them; it exits 0 when every
worker stopped cleanly after a signal, 1 otherwise. A worker that ends while nobody asked it to
is logged and the others are stopped as on SIGTERM (drained, then stopped), rather than
restarted: a crash, the OOM killer or a kill usually strikes its replacement too (each costing
an index build, CPU the others need), and the process manager above (systemd, Kubernetes)
restarts a failed service with backoff and alerts, where a restart in here would hide it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError

from identity_server.command_line import configure_logging, how_it_ended, log_format
from identity_server.errors import IdentityError, InvalidArgument, StartupError
from identity_server.settings import Settings

logger = logging.getLogger(__name__)

POLL_S = 0.2  # how often the supervisor wakes to look at its workers and pending signals
# Once the workers are told to stop, how long beyond their drain and grace they get before they
# are killed (closing the store waits for a write under way).
STOP_MARGIN_S = 30.0
START_STOP_S = 10.0  # after a failed start, how long the other workers get to end
_STOPS = (signal.SIGTERM, signal.SIGINT)


def check_workers(settings: Settings) -> None:
    """Refuse, saying what to do instead, the settings N > 1 workers cannot serve."""
    n = settings.workers
    if n == 1:
        return
    if not hasattr(socket, "SO_REUSEPORT"):
        raise InvalidArgument(f"--workers {n} needs SO_REUSEPORT, which this system lacks: run "
                              "one `serve` process a port instead (they may share the store)")
    if sqlite_in_memory(settings.db_url):
        raise InvalidArgument(
            f"--workers {n} needs a store all the workers share (a SQLite file or PostgreSQL), "
            f"but {settings.db_url} is SQLite in memory: a database per process")
    # One port can show one process's metrics, and the reconciliation server binds its port
    # without SO_REUSEPORT: refused rather than half served (docs/scaling.md).
    if settings.metrics_port is not None:
        raise InvalidArgument(
            f"--metrics-port (IDENTITY_METRICS_PORT) with --workers {n}: each worker keeps its "
            "own counts, and one metrics port would show one worker's; for metrics, run "
            "single-process `serve` commands on the store, each with its own --port and "
            "--metrics-port")
    if settings.reconcile_port is not None:
        raise InvalidArgument(
            f"--reconcile-port (IDENTITY_RECONCILE_PORT) with --workers {n}: the "
            "reconciliation endpoint is served by a single process; run it as a `serve` of its "
            "own on the same store (its own --port and --reconcile-port)")


def sqlite_in_memory(url: str) -> bool:
    """Whether url is a SQLite database in memory (`sqlite://`, `:memory:`, or a `file:` URI
    with mode=memory), which no two processes can share."""
    if not url.startswith("sqlite"):
        return False
    try:
        parsed = make_url(url)
    except ArgumentError:
        return False
    database = parsed.database or ""
    mode = parsed.query.get("mode", "")
    modes = mode if isinstance(mode, tuple) else (mode,)
    return database in ("", ":memory:") or database.startswith("file::memory:") or (
        "memory" in modes)


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """A socket bound to host:port with SO_REUSEPORT (port 0: a free port), not listening: it
    keeps the port for the workers until they have bound it too. A port any other socket holds
    is refused first, whether or not that socket allows sharing."""
    from identity_server.server import address, check_listen_address

    check_listen_address(host, port)
    listen = address(host, port)
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise StartupError(f"cannot listen on {listen}: {e.strerror}") from e
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(sockaddr)
    except OSError as e:
        sock.close()
        raise StartupError(f"cannot listen on {listen}: {e.strerror or e}") from e
    return sock, int(sock.getsockname()[1])


class _Worker:
    def __init__(self, number: int, process: BaseProcess, conn: Connection) -> None:
        self.number = number
        self.process = process
        self.conn = conn
        self.ready = False
        self.reported = False  # its end has been logged

    def signal(self, signum: int) -> None:
        pid = self.process.pid
        if pid is not None and self.process.exitcode is None:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:  # ended meanwhile: its sentinel tells
                pass


def serve_workers(settings: Settings, *, ready: Callable[[int], object]) -> int:
    """Run settings.workers server processes on one port until SIGTERM or Ctrl-C; `ready` is
    told the port once every worker serves and handles signals. The exit status: 0 when every
    worker stopped cleanly after a signal, else 1."""
    check_workers(settings)
    n = settings.workers
    _create_tables(settings.db_url)  # once, here: N workers creating them at once would race
    reserved, port = reserve_port(settings.host, settings.port)
    worker_settings = settings.model_copy(update={"port": port})
    context = multiprocessing.get_context("spawn")  # never fork a process that imported gRPC
    level, fmt = logging.getLogger().level, log_format()
    workers: list[_Worker] = []
    received: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if signum in _STOPS:
            received.append(signum)
        for w in workers:
            w.signal(signum)

    previous = {s: signal.signal(s, forward) for s in (*_STOPS, signal.SIGHUP)}
    try:
        with reserved:
            for number in range(1, n + 1):
                if received:
                    break
                ours, theirs = context.Pipe()
                process = context.Process(
                    target=_worker_main, name=f"identity-server-{number}",
                    args=(number, n, theirs, worker_settings, level, fmt))
                process.start()
                theirs.close()
                workers.append(_Worker(number, process, ours))
            _wait_until_ready(workers, n, received)
        # Every worker has bound the port (the reserving socket is closed): it is theirs.
        if not received:
            logger.info("%d server processes on port %d (pids %s)", n, port,
                        ", ".join(str(w.process.pid) for w in workers))
            ready(port)
        return _supervise(workers, n, received, settings)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for w in workers:
            if w.process.exitcode is None:
                w.process.kill()
                w.process.join()
            w.conn.close()


def _create_tables(db_url: str) -> None:
    from identity_server.store import open_store

    open_store(db_url).close()


def _wait_until_ready(workers: list[_Worker], n: int, received: list[int]) -> None:
    """Wait until every worker says it serves; a worker that fails to start stops the others
    and its error is raised here (StartupError or InvalidArgument, as a single server's)."""
    while not received and not all(w.ready for w in workers):
        waiting = [w for w in workers if not w.ready]
        by_object: dict[Any, _Worker] = {w.conn: w for w in waiting}
        by_object.update({w.process.sentinel: w for w in waiting})
        for obj in wait(list(by_object), timeout=POLL_S):
            w = by_object[obj]
            if w.ready:
                continue
            message: tuple[Any, ...] | None = None
            if obj is w.conn:
                try:
                    message = w.conn.recv()
                except (EOFError, OSError):
                    message = None
            if message is not None and message[0] == "ready":
                w.ready = True
                continue
            if message is None and w.process.exitcode is None:
                w.process.join(START_STOP_S)
            _stop_after_failed_start(workers)
            where = f"server process {w.number} of {n}"
            if message is not None and message[0] == "failed":
                error = InvalidArgument if message[1] == "setting" else StartupError
                raise error(f"{message[2]} ({where})")
            raise StartupError(f"{where} (pid {w.process.pid}) ended before it served "
                               f"({how_it_ended(w.process.exitcode)}); its log is above")


def _stop_after_failed_start(workers: list[_Worker]) -> None:
    """Stop every worker at once: Ctrl-C's stop, without a drain (nothing was announced)."""
    for w in workers:
        w.signal(signal.SIGINT)
    deadline = time.monotonic() + START_STOP_S
    for w in workers:
        w.process.join(max(0.0, deadline - time.monotonic()))


def _supervise(workers: list[_Worker], n: int, received: list[int], settings: Settings) -> int:
    """Wait until every worker has ended; stop the others when one ends unasked. Returns the
    exit status."""
    deadline: float | None = None
    failed = False
    while True:
        for w in workers:
            if w.process.exitcode is None or w.reported:
                continue
            w.reported = True
            ended = f"server process {w.number} of {n} (pid {w.process.pid}) ended"
            if not received:  # unasked: stop the rest, as on SIGTERM
                failed = True
                logger.error("%s unexpectedly (%s): stopping the others",
                             ended, how_it_ended(w.process.exitcode))
                received.append(signal.SIGTERM)
                for other in workers:
                    other.signal(signal.SIGTERM)
            elif w.process.exitcode != 0:
                failed = True
                logger.error("%s with %s", ended, how_it_ended(w.process.exitcode))
        alive = [w for w in workers if w.process.exitcode is None]
        if not alive:
            return 1 if failed else 0
        if received and deadline is None:
            deadline = (time.monotonic() + settings.drain_seconds + settings.grace_seconds
                        + STOP_MARGIN_S)
        if deadline is not None and time.monotonic() > deadline:
            for w in alive:
                logger.error("server process %d of %d (pid %s) has not stopped: killed",
                             w.number, n, w.process.pid)
                w.process.kill()
                w.process.join()
            failed = True
            continue
        wait([w.process.sentinel for w in alive], timeout=POLL_S)


def _worker_main(number: int, n: int, conn: Connection, settings: Settings, level: int,
                 fmt: str) -> None:
    """One worker: a whole server on the shared port, serving until SIGTERM or Ctrl-C."""
    configure_logging(level, fmt)
    from identity_server.server import serve_until_signalled, start_server

    logger.info("server process %d of %d (pid %d) starting", number, n, os.getpid())
    try:
        running = start_server(settings)
    except StartupError as e:
        _tell(conn, ("failed", "startup", str(e)))
        sys.exit(1)
    except IdentityError as e:  # the store cannot be opened, say
        _tell(conn, ("failed", "setting", str(e)))
        sys.exit(2)
    threading.Thread(target=_stop_when_supervisor_ends, args=(conn,), name="supervisor-watch",
                     daemon=True).start()
    serve_until_signalled(running, settings.grace_seconds,
                          ready=lambda: _tell(conn, ("ready", running.port)),
                          drain=settings.drain_seconds)


def _tell(conn: Connection, message: tuple[Any, ...]) -> None:
    try:
        conn.send(message)
    except OSError:  # the supervisor is gone; its watch stops this worker
        pass


def _stop_when_supervisor_ends(conn: Connection) -> None:
    """A worker never outlives its supervisor (killed, say): the pipe's end is its cue to stop
    as on SIGTERM."""
    try:
        while True:
            conn.recv()
    except (EOFError, OSError):
        os.kill(os.getpid(), signal.SIGTERM)
