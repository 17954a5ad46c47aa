"""Ingest on Dask distributed: the input split by paper id into buckets, one task a bucket.

The driver (the ``ingest run`` process) reads the input once and writes each line to its bucket's
staging file (ingest.staging), then submits one Dask task a bucket. A task runs the single-process
pipeline (``run_job``, with ``GraphSink``) over its bucket's lines into a shard of its own, calling
the identity server over gRPC with the client and settings the single-process job uses, and then
publishes the shard's tables for the catalog's views (ingest.catalog). A task therefore has the
single-process job's guarantees on its shard: whole papers per transaction, reruns that write
nothing, revisions closed and never deleted, rejects with their reasons. A worker killed mid-task
leaves whole papers behind; Dask runs the task again on another worker (or a rerun of the job
does), and ``ResolveBatch``'s idempotence gives it the replies the killed task got.

The driver does no ingest work itself: it holds the embedded identity server (when there is no
``--server``), adds up the tasks' summaries and shows progress by bucket.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from identity_client import IdentityClient, RetryPolicy
from ingest.catalog import Layout, publish_shard
from ingest.pipeline import JobError, JobOptions, Resolver, Summary, run_job
from ingest.read import InputError
from ingest.sink import GraphSink, SinkError
from ingest.staging import read_staged, stage, staging_path

if TYPE_CHECKING:
    import distributed

logger = logging.getLogger(__name__)

PROGRESS_EVENT_EVERY_S = 2.0  # how often a task tells the driver its lines done, at most
# Deadlines of the driver's own calls to Dask: reaching the scheduler, and a scheduler given
# with --scheduler having at least one worker to run the tasks.
CONNECT_TIMEOUT_S = 30.0
WORKERS_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ClientSettings:
    """How a task reaches the identity server: what ``ingest run`` builds its client from
    (ingest.cli ``_client``), with the token read and the TLS roots loaded by the driver, so a
    worker needs neither file."""

    address: str
    deadline_seconds: float
    retry_budget_seconds: float
    admin_token: str | None = None
    token: str | None = None
    tls_roots: bytes | None = None


class TaskClient(Resolver, Protocol):
    """What a task needs of the identity server's client (IdentityClient has it)."""

    @property
    def retries(self) -> int: ...

    def close(self) -> None: ...


def task_client(settings: ClientSettings) -> TaskClient:
    """The identity server's client, built as ``ingest run`` builds it."""
    return IdentityClient(
        settings.address,
        policy=RetryPolicy(deadline_seconds=settings.deadline_seconds,
                           budget_seconds=settings.retry_budget_seconds),
        admin_token=settings.admin_token,
        token=settings.token,
        root_certificates=settings.tls_roots,
    )


@dataclass(frozen=True)
class ClusterOptions:
    """``scheduler``: a running Dask scheduler's address; None starts a local cluster of
    ``workers`` processes, one thread each, on 127.0.0.1."""

    scheduler: str | None = None
    workers: int = 2


@dataclass(frozen=True)
class BucketTask:
    """One task: ingest bucket ``bucket`` from its staging file into its shard, then publish."""

    bucket: int
    layout: Layout
    staging: Path
    base_dir: str  # the driver's working directory: relative input paths are relative to it
    options: JobOptions
    client: ClientSettings
    # Called as the task's papers are done (after each group it writes, and for each paper
    # found written already) with the bucket and the papers done so far; tests kill a worker
    # here. It must be importable where the workers run.
    after_write: Callable[[int, int], object] | None = None
    # The Dask event topic the task reports its lines done on, for the driver's progress, and
    # how often at most.
    topic: str = ""
    progress_every_s: float = PROGRESS_EVENT_EVERY_S


@dataclass(frozen=True)
class BucketResult:
    bucket: int
    summary: Summary
    retries: int
    published: bool


def ingest_bucket(task: BucketTask) -> BucketResult:
    """The Dask task: the single-process pipeline over one bucket, into its shard."""
    shard = task.layout.shard(task.bucket)
    done = 0
    reported = time.monotonic()

    def wrote(n: int) -> None:
        nonlocal done, reported
        done += n
        if task.topic and time.monotonic() - reported >= task.progress_every_s:
            reported = time.monotonic()
            _report(task.topic, task.bucket, done)
        if task.after_write is not None:
            task.after_write(task.bucket, done)

    try:
        shard.parent.mkdir(parents=True, exist_ok=True)
        lines = read_staged(staging_path(task.staging, task.bucket), base_dir=task.base_dir)
        with GraphSink(shard) as sink, closing(task_client(task.client)) as client:
            summary = run_job((), sink=sink, resolver=client, options=task.options,
                              progress=wrote, lines=lines)
            retries = client.retries
        published = publish_shard(task.layout, task.bucket)
    except (JobError, SinkError, InputError, OSError, ValueError) as e:
        # Rebuilt from its message on the driver's side, naming the bucket it failed in.
        raise JobError(f"bucket {task.bucket} (shard {shard}): {e}") from e
    return BucketResult(task.bucket, summary, retries, published)


def _report(topic: str, bucket: int, lines: int) -> None:
    """Tells the driver, through the scheduler, how many of its lines the bucket has done."""
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:  # not on a Dask worker (called directly): nobody to tell
        return
    worker.log_event(topic, {"bucket": bucket, "lines": lines})


class LinesProgress:
    """The lines done of every bucket (from the tasks' events while they run, and whole when a
    task ends) and the buckets done, handed to the caller's progress as they change:
    ``progress(lines_done, lines_total, buckets_done, buckets_total)``. The events arrive on the
    Dask client's thread, the ends on the driver's: both under one lock."""

    def __init__(self, staged: Sequence[int],
                 progress: Callable[[int, int, int, int], object] | None) -> None:
        self._staged = list(staged)
        self._lines = [0] * len(staged)
        self._ended = 0
        self._progress = progress
        self._lock = threading.Lock()

    def event(self, event: tuple[float, Any]) -> None:
        msg = event[1]
        with self._lock:
            bucket = int(msg["bucket"])
            self._lines[bucket] = max(self._lines[bucket], min(int(msg["lines"]),
                                                                self._staged[bucket]))
            self._tell()

    def ended(self, bucket: int) -> None:
        with self._lock:
            self._lines[bucket] = self._staged[bucket]
            self._ended += 1
            self._tell()

    def _tell(self) -> None:
        if self._progress is not None:
            self._progress(sum(self._lines), sum(self._staged), self._ended, len(self._staged))


def add_up(summaries: Sequence[Summary]) -> Summary:
    """The tasks' summaries as one (counts summed; elapsed time is the caller's to set)."""
    total = Summary()
    for s in summaries:
        for f in fields(Summary):
            if f.name != "elapsed_seconds":
                setattr(total, f.name, getattr(total, f.name) + getattr(s, f.name))
    return total


def run_distributed(
    files: Sequence[Path],
    *,
    layout: Layout,
    buckets: int,
    options: JobOptions,
    client: ClientSettings,
    cluster: ClusterOptions,
    progress: Callable[[int, int, int, int], object] | None = None,
    staging_progress: Callable[[int], object] | None = None,
    after_write: Callable[[int, int], object] | None = None,
    progress_every_s: float = PROGRESS_EVENT_EVERY_S,
) -> tuple[Summary, int]:
    """Ingests ``files`` into the catalog's shards, one Dask task a bucket; returns the tasks'
    summaries added up (elapsed: this call's wall-clock time) and their retried calls.
    ``progress(lines_done, lines_total, buckets_done, buckets)`` as the tasks go (each reports
    its lines done now and then, and all of them when it ends); ``staging_progress(lines)`` as
    the input is read.

    The caller holds the catalog's run lock (ingest.catalog.run_lock): staging is this run's.
    Raises JobError when a bucket fails; the buckets done stay done, and a rerun completes the
    rest."""
    started = time.monotonic()
    shutil.rmtree(layout.staging, ignore_errors=True)  # what a killed run left behind
    try:
        counts = stage(files, layout.staging, buckets, vocabulary=options.vocabulary,
                       limits=options.limits, progress=staging_progress)
        logger.info("staged %d lines into %d buckets (largest %d)", sum(counts), buckets,
                    max(counts, default=0))
        base_dir = os.getcwd()
        topic = f"ingest-progress-{uuid.uuid4().hex[:8]}"
        tasks = [BucketTask(b, layout, layout.staging, base_dir, options, client, after_write,
                            topic, progress_every_s) for b in range(buckets)]
        lines = LinesProgress(counts, progress)
        with dask_client(cluster) as dask:
            dask.subscribe_topic(topic, lines.event)  # type: ignore[no-untyped-call]
            try:
                results = _run_tasks(dask, tasks, lines)
            finally:
                dask.unsubscribe_topic(topic)  # type: ignore[no-untyped-call]
    finally:
        shutil.rmtree(layout.staging, ignore_errors=True)
    summary = add_up([r.summary for r in results])
    summary.elapsed_seconds = time.monotonic() - started
    logger.info("distributed job done: %s (%d buckets republished)", summary,
                sum(r.published for r in results))
    return summary, sum(r.retries for r in results)


@contextmanager
def dask_client(cluster: ClusterOptions) -> Iterator[distributed.Client]:
    """A Dask client of the scheduler at ``cluster.scheduler``, or of a local cluster started
    here (closed on the way out, however the job ends)."""
    import distributed  # here: only this engine pays for importing Dask

    with ExitStack() as stack:
        if cluster.scheduler is None:
            try:
                # The scheduler serves HTTP (health, metrics) whatever the dashboard: on a free
                # loopback port, never its default of every address's 8787.
                local = distributed.LocalCluster(  # type: ignore[no-untyped-call]
                    n_workers=cluster.workers, threads_per_worker=1, processes=True,
                    host="127.0.0.1", dashboard_address="127.0.0.1:0")
            except Exception as e:
                raise JobError(f"cannot start a local Dask cluster of {cluster.workers} "
                               f"workers: {e}") from e
            stack.enter_context(local)
            target: str | distributed.LocalCluster = local
            where = f"the local Dask cluster ({cluster.workers} workers)"
        else:
            target = cluster.scheduler
            where = f"the Dask scheduler at {cluster.scheduler}"
        try:
            dask = stack.enter_context(distributed.Client(  # type: ignore[no-untyped-call]
                target, timeout=CONNECT_TIMEOUT_S, set_as_default=False))
        except (OSError, TimeoutError) as e:
            raise JobError(f"cannot reach {where} within {CONNECT_TIMEOUT_S:g} s: {e}") from e
        if cluster.scheduler is not None:
            try:
                dask.wait_for_workers(1, timeout=WORKERS_TIMEOUT_S)
            except TimeoutError as e:
                raise JobError(f"{where} has had no worker for {WORKERS_TIMEOUT_S:g} s: start "
                               "`dask worker` processes against it") from e
        logger.info("running on %s", where)
        yield dask


def _run_tasks(dask: distributed.Client, tasks: Sequence[BucketTask],
               progress: LinesProgress) -> list[BucketResult]:
    """Submits the tasks and gathers their results as they end; the first failure (or Ctrl-C)
    cancels the rest."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    run = uuid.uuid4().hex[:8]
    futures = [dask.submit(ingest_bucket, t, key=f"ingest-bucket-{t.bucket:04d}-{run}",
                           pure=False) for t in tasks]
    bucket_of = {f.key: t.bucket for f, t in zip(futures, tasks, strict=True)}
    results: list[BucketResult] = []
    try:
        # The client's own loop: it is not Dask's default client (set_as_default=False).
        for future in as_completed(futures, loop=dask.loop):  # type: ignore[no-untyped-call]
            bucket = bucket_of[future.key]
            try:
                result: BucketResult = future.result()
            except JobError:
                raise
            except KilledWorker as e:
                raise JobError(f"bucket {bucket}: the workers running it died too often "
                               f"({e}); rerun to continue") from e
            except Exception as e:
                raise JobError(f"bucket {bucket} failed: {type(e).__name__}: {e}") from e
            results.append(result)
            progress.ended(bucket)
    except BaseException:
        dask.cancel(futures)  # type: ignore[no-untyped-call]
        raise
    return results
