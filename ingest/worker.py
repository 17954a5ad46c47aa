"""The job's own work in a worker process, beside an embedded identity server.

With the server embedded, the job's reading, checking and writing and the server's matching are
Python in one process, under one GIL: every millisecond spent parsing a line is one the server
waits. So the embedded job runs its pipeline (``run_job``: read, validate, resolve, write) in a
worker process, and the job's own process, which holds the server (SPEC section 6), answers the
worker's ResolveBatch calls through its client. Over the pipe go only a paper's mentions one way
and their outcomes the other.

The job's process answers calls in the order they arrive, with as many threads as the job has
papers in flight: a job with one paper in flight makes the same ids in the same order as it
would in one process. Either side ending ends the other: the worker's pipe closing fails its
calls in flight (so its job stops, keeping whole papers), and a worker that dies is reported
with its exit code.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, Protocol, Self

from identity_client import BatchOutcome, IdentityError, ServerUnavailable
from identity_server.command_line import configure_logging, how_it_ended
from ingest.pipeline import (
    Earlier,
    JobError,
    mention_pairs,
    paper_outcomes,
    refused_paper,
    settle_paper,
    wait_interruptibly,
)
from ingest.read import InputError
from ingest.sink import ResolvedPaper, SinkError
from ingest.validate import CheckedPaper, LineReject
from ingest.vocabulary import VocabularyError

logger = logging.getLogger(__name__)

_STOP_GRACE_S = 10.0  # how long an interrupted worker gets to finish its cleanup

# What a worker may fail with, sent back as the error itself (each is rebuilt from its message)
# for the command line to report as it would in one process; anything else is a crash.
_PASSED_ON = (JobError, SinkError, InputError, VocabularyError)


class Answerer(Protocol):
    """What the job's process answers calls with (IdentityClient satisfies it)."""

    def resolve_batch(self, context_id: str, mentions: Sequence[tuple[str, str]], *,
                      lookup_only: bool = False) -> BatchOutcome: ...

    def abort(self) -> None: ...


def _gone() -> ServerUnavailable:
    return ServerUnavailable("ResolveBatch", "UNAVAILABLE",
                             "the job's process (and its embedded identity server) went away")


class WorkerFailed(Exception):
    """The worker process stopped without a result (killed, out of memory, a crash)."""


class PipeResolver:
    """The worker's resolver (pipeline.ResolvesAhead): each paper, as it is read, goes to the
    job's process at once, so the server always has the next papers queued while this process
    parses and writes; its outcomes come back to a thread that settles the paper."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()  # the papers waiting
        self._send_lock = threading.Lock()
        self._pending: dict[int, tuple[Future[ResolvedPaper | LineReject], CheckedPaper]] = {}
        self._next = 0
        self._closed: IdentityError | None = None
        self._reader = threading.Thread(target=self._read_replies, name="ingest-replies",
                                        daemon=True)
        self._reader.start()

    def submit_paper(self, paper: CheckedPaper, *,
                     earlier: Earlier) -> Future[ResolvedPaper | LineReject]:
        future: Future[ResolvedPaper | LineReject] = Future()
        if not paper.mentions:
            future.set_result(ResolvedPaper(paper, ()))
            return future
        with self._lock:
            if self._closed is not None:
                future.set_exception(self._closed)
                return future
            call = self._next
            self._next += 1
            self._pending[call] = (future, paper)
        try:
            with self._send_lock:
                _send(self._conn, ("resolve", call, paper.paper_id, mention_pairs(paper),
                                   earlier))
        except OSError:
            self._fail_all(_gone())
        return future

    def abort(self) -> None:
        """The job stops: the job's process cancels its calls, and the waiting papers fail."""
        with self._send_lock:
            try:
                _send(self._conn, ("abort",))
            except OSError:
                pass
        self._fail_all(IdentityError("ResolveBatch", "CANCELLED", "the job was interrupted"))

    def report(self, message: tuple[Any, ...]) -> None:
        """The job's end (its summary, its error) for the job's process."""
        with self._send_lock:
            _send(self._conn, message)

    def _read_replies(self) -> None:
        while True:
            try:
                reply = _recv(self._conn)
            except (EOFError, OSError):
                self._fail_all(_gone())
                return
            with self._lock:
                waiting = self._pending.pop(reply[1], None)
            if waiting is None:  # answered after an abort failed it
                continue
            future, paper = waiting
            try:
                if reply[0] == "outcome":
                    settled: ResolvedPaper | LineReject = settle_paper(paper, reply[2])
                else:
                    settled = refused_paper(paper, _rebuild_error(*reply[2:]))
            except Exception as e:  # noqa: BLE001 - a fatal code, the server gone, or a bug:
                # the paper fails with it (a reader that died would leave the job waiting)
                _settle(future, e)
            else:
                _settle(future, settled)

    def _fail_all(self, error: IdentityError) -> None:
        with self._lock:
            self._closed = self._closed or error
            pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            _settle(future, error)


def _settle(future: Future[ResolvedPaper | LineReject],
            outcome: ResolvedPaper | LineReject | BaseException) -> None:
    """Completes the future unless the job already cancelled it."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:  # cancelled (or failed by an abort) meanwhile
        pass


def _send(conn: Connection, message: tuple[Any, ...]) -> None:
    # pickle's C pickler at once: Connection.send's ForkingPickler costs more a message
    conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _error_fields(e: IdentityError) -> tuple[bool, str, str, str, int | None]:
    return isinstance(e, ServerUnavailable), e.method, e.code, e.message, e.batch_limit


def _rebuild_error(unavailable: bool, method: str, code: str, message: str,
                   batch_limit: int | None) -> IdentityError:
    cls = ServerUnavailable if unavailable else IdentityError
    return cls(method, code, message, batch_limit=batch_limit)


def _worker_main(conn: Connection, log_level: int, log_format: str, target: Callable[..., Any],
                 args: tuple[Any, ...]) -> None:
    """The worker process: wait for the go, run ``target(resolver, *args)``, report its end."""
    configure_logging(log_level, log_format)  # its lines as the job's process writes them
    try:
        go = _recv(conn)
    except (EOFError, OSError, KeyboardInterrupt):
        return
    if go != ("start",):
        return
    resolver = PipeResolver(conn)
    try:
        result = target(resolver, *args)
    except KeyboardInterrupt:
        _report(resolver, ("interrupted",))
        return
    except Exception as e:
        if isinstance(e, _PASSED_ON):  # the job's process says what went wrong
            logger.debug("the job failed in its worker", exc_info=True)
            _report(resolver, ("failed", e))
        else:
            logger.exception("the job's worker failed")
            _report(resolver, ("crashed", f"{type(e).__name__}: {e}"))
        return
    _report(resolver, ("done", result))


def _report(resolver: PipeResolver, message: tuple[Any, ...]) -> None:
    try:
        resolver.report(message)
    except OSError:  # the job's process is gone: nobody to tell
        pass


class JobWorker:
    """A worker process started early (its imports overlap the embedded server's start-up) that
    runs ``target(resolver, *args)`` once ``run`` is called, its calls answered by ``answerer``."""

    def __init__(self, target: Callable[..., Any], args: tuple[Any, ...], *,
                 log_level: int, log_format: str = "text") -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process running gRPC
        self._conn, theirs = context.Pipe()
        self._process = context.Process(target=_worker_main, name="ingest-job", daemon=True,
                                        args=(theirs, log_level, log_format, target, args))
        self._process.start()
        theirs.close()
        self._send_lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()  # a worker still waiting for its go, or for calls, sees the end
        self._process.join(timeout=_STOP_GRACE_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def run(self, answerer: Answerer, concurrency: int) -> Any:
        """Starts the job and answers its calls until it ends; returns its result or raises
        its error (KeyboardInterrupt when it was interrupted)."""
        end: Future[Any] = Future()
        _send(self._conn, ("start",))
        with ThreadPoolExecutor(max_workers=concurrency,
                                thread_name_prefix="ingest-answer") as pool:
            reader = threading.Thread(target=self._dispatch, args=(answerer, pool, end),
                                      name="ingest-calls", daemon=True)
            reader.start()
            try:
                return wait_interruptibly(end)
            except BaseException:
                answerer.abort()  # calls in flight end now instead of running to their deadline
                pool.shutdown(wait=False, cancel_futures=True)
                self._stop()
                raise

    def _dispatch(self, answerer: Answerer, pool: ThreadPoolExecutor, end: Future[Any]) -> None:
        """The worker's messages, read as they come: its papers go to the answering threads in
        the order they arrive; its last message ends ``end``."""
        while True:
            try:
                message = _recv(self._conn)
            except (EOFError, OSError):
                self._process.join(timeout=_STOP_GRACE_S)
                end.set_exception(WorkerFailed(
                    f"the job's worker process stopped ({how_it_ended(self._process.exitcode)}) "
                    "before the job ended"))
                return
            kind = message[0]
            if kind == "resolve":
                try:
                    pool.submit(self._answer, answerer, *message[1:])
                except RuntimeError:  # the job stopped here (Ctrl-C): nothing more to answer
                    return
                continue
            if kind == "abort":
                answerer.abort()
                continue
            if kind == "done":
                end.set_result(message[1])
            elif kind == "failed":
                end.set_exception(message[1])
            elif kind == "crashed":
                end.set_exception(WorkerFailed(f"the job's worker process failed: {message[1]}"))
            else:  # "interrupted"
                end.set_exception(KeyboardInterrupt())
            return

    def _answer(self, answerer: Answerer, call: int, paper_id: str,
                mentions: list[tuple[str, str]], earlier: Earlier) -> None:
        try:
            reply: tuple[Any, ...] = (
                "outcome", call, paper_outcomes(answerer, paper_id, mentions,
                                                earlier=earlier))
        except IdentityError as e:
            reply = ("error", call, *_error_fields(e))
        except Exception as e:  # a bug answering must not leave the worker waiting forever
            logger.exception("answering the job's worker failed")
            reply = ("error", call,
                     *_error_fields(IdentityError("ResolveBatch", "INTERNAL", str(e))))
        with self._send_lock:
            try:
                _send(self._conn, reply)
            except OSError:  # the worker is gone; the reader reports it
                pass

    def _stop(self) -> None:
        """The job stops here (Ctrl-C, an error): the worker is interrupted too, unless it
        already was (Ctrl-C reaches the whole process group), and given time to clean up."""
        self._process.join(timeout=1.0)
        if self._process.is_alive() and self._process.pid is not None:
            os.kill(self._process.pid, signal.SIGINT)
            self._process.join(timeout=_STOP_GRACE_S)
