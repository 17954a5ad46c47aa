"""The embedded job's worker process: the same graph as one process makes, and either side
ending ends the other without losing what was written."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from identity_client import IdentityClient, RetryPolicy
from ingest.cli import _in_worker, _job
from ingest.pipeline import JobOptions, Summary, run_job
from ingest.settings import Settings
from ingest.sink import GraphSink
from ingest.testing import synthetic_papers
from ingest.worker import JobWorker, WorkerFailed
from tests.conftest import WITH_SIGINT

pytestmark = pytest.mark.skipif(importlib.util.find_spec("identity_server.server") is None,
                                reason="identity_server.server is not there yet")

POLICY = RetryPolicy(deadline_seconds=10, budget_seconds=10, initial_backoff=0.02)


@contextmanager
def embedded(store: Path) -> Iterator[IdentityClient]:
    """A real identity server in this process, as the embedded job runs it, and its client."""
    from identity_server.server import start_server
    from identity_server.settings import Settings as ServerSettings

    running = start_server(ServerSettings(db_url=f"sqlite:///{store}", port=0))
    try:
        with IdentityClient(f"127.0.0.1:{running.port}", policy=POLICY) as client:
            yield client
    finally:
        running.stop(grace=0.5)


def corpus(tmp_path: Path, jsonl: Callable[..., Path], n: int = 120) -> Path:
    papers: list[Any] = list(synthetic_papers(n, mentions_per_paper=6, relationships_per_paper=4,
                                              seed=23))
    papers.insert(n // 3, "{broken")  # a line rejected whole
    papers[n // 2]["relationships"].append({"subject": "m0", "predicate": "uses",
                                            "object": "m0"})  # an item rejected
    papers.append(dict(papers[10], revision="v2"))  # a revision in the same job
    return jsonl(tmp_path / "corpus.jsonl", papers)


def in_worker(db: Path, files: list[Path], client: IdentityClient, *,
              started: Callable[[JobWorker], None] | None = None) -> Summary:
    options = JobOptions(concurrency=1, group_papers=50)
    settings = Settings(db=db, progress=False)
    with JobWorker(_job, (db, files, options, None, settings), log_level=30) as worker:
        if started is not None:
            started(worker)
        summary: Summary = worker.run(client, options.concurrency)
        return summary


def test_the_job_runs_in_a_worker_beside_an_embedded_server_reading_files(
        tmp_path: Path) -> None:
    papers = tmp_path / "p.jsonl"
    papers.write_text("")
    assert _in_worker(Settings(db=tmp_path / "g.duckdb"), [papers])
    assert not _in_worker(Settings(db=tmp_path / "g.duckdb", server="127.0.0.1:1"), [papers])
    assert not _in_worker(Settings(db=tmp_path / "g.duckdb"), [Path("/dev/stdin")])


def test_a_job_in_its_worker_makes_the_graph_one_process_makes(
        tmp_path: Path, jsonl: Callable[..., Path], snapshot: Callable[..., Any]) -> None:
    """The same papers, the same fresh store, one paper in flight: the same ids (the server's
    calls come in the same order), the same rejects, the same summary."""
    files = [corpus(tmp_path, jsonl)]
    with embedded(tmp_path / "one.sqlite") as client, \
            GraphSink(tmp_path / "one.duckdb") as sink:
        here = run_job(files, sink=sink, resolver=client, options=JobOptions(concurrency=1))
    with embedded(tmp_path / "two.sqlite") as client:
        there = in_worker(tmp_path / "two.duckdb", files, client)
    assert (there.ingested, there.rejected_lines, there.rejected_items, there.new_entities,
            there.relationships) == (here.ingested, here.rejected_lines, here.rejected_items,
                                     here.new_entities, here.relationships)
    assert there.ingested == 121 and there.rejected_lines == 1 and there.rejected_items >= 1
    expected = snapshot(tmp_path / "one.duckdb")
    got = snapshot(tmp_path / "two.duckdb")
    for table in expected:
        assert got[table] == expected[table], f"table {table} differs"
    assert got["mentions"]  # ids were compared, not two empty tables


def test_a_worker_killed_mid_job_is_reported_and_a_rerun_completes_the_graph(
        tmp_path: Path, jsonl: Callable[..., Path], snapshot: Callable[..., Any]) -> None:
    files = [corpus(tmp_path, jsonl, n=1500)]
    with embedded(tmp_path / "clean.sqlite") as client:
        started = time.monotonic()
        in_worker(tmp_path / "clean.duckdb", files, client)
        duration = time.monotonic() - started
    expected = snapshot(tmp_path / "clean.duckdb")

    db = tmp_path / "killed.duckdb"
    with embedded(tmp_path / "killed.sqlite") as client:
        def kill_soon(worker: JobWorker) -> None:
            assert worker.pid is not None
            threading.Timer(duration / 2, os.kill, (worker.pid, signal.SIGKILL)).start()

        with pytest.raises(WorkerFailed, match=r"stopped \(killed by SIGKILL\) before the job ended"):
            in_worker(db, files, client, started=kill_soon)
    with embedded(tmp_path / "killed.sqlite") as client:  # the job's client was aborted
        rerun = in_worker(db, files, client)
    assert rerun.unchanged > 0  # the papers written before the kill stayed
    got = snapshot(db)
    for table in expected:
        if table != "papers":  # ingested_at aside, the graph is the clean run's
            assert got[table] == expected[table], f"table {table} differs"
    assert len(got["papers"]) == len(expected["papers"])


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(c) for c in text.split()]


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":  # exited, waiting for its parent (gone too) to be reaped
            return True
        time.sleep(0.05)
    return False


def _ingest(tmp_path: Path, files: Path, db: Path) -> subprocess.Popen[bytes]:
    """`ingest run` with the embedded server, in its own process group; stderr to job.log."""
    with (tmp_path / "job.log").open("wb") as log:
        return subprocess.Popen(
            [*WITH_SIGINT, sys.executable, "-m", "ingest.cli", "run", str(files), "--db",
             str(db), "--identity-db", f"sqlite:///{tmp_path / 'identity.sqlite'}",
             "--no-progress"],
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)


def _log(tmp_path: Path) -> str:
    return (tmp_path / "job.log").read_text(errors="replace")


def _worker_of(proc: subprocess.Popen[bytes]) -> int:
    """The job's worker: the child of the `ingest run` process that multiprocessing spawned to
    run a target (its other child is multiprocessing's resource tracker)."""
    for _ in range(400):
        for child in _children(proc.pid):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if b"spawn_main" in cmdline:
                return child
        time.sleep(0.05)
    pytest.fail("no worker process appeared")


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["SIGKILL to the job's process", "Ctrl-C"])
def test_the_worker_ends_with_the_job_and_a_rerun_completes_it(
        tmp_path: Path, jsonl: Callable[..., Path], snapshot: Callable[..., Any],
        stop: str) -> None:
    files = corpus(tmp_path, jsonl, n=3000)  # several seconds: still running at the signal
    db = tmp_path / "graph.duckdb"
    proc = _ingest(tmp_path, files, db)
    worker = _worker_of(proc)
    time.sleep(1.5)
    if stop == "Ctrl-C":
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole process group
        assert proc.wait(timeout=60) == 130, _log(tmp_path)
        assert "interrupted; rerun the same command to continue" in _log(tmp_path)
    else:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    assert _gone(worker, within_s=20), "the worker outlived the job's process"
    rerun = _ingest(tmp_path, files, db)
    assert rerun.wait(timeout=300) == 0, _log(tmp_path)
    assert len(snapshot(db)["papers"]) == 3001


def test_the_servers_refusals_cross_the_pipe_a_paper_rejected_or_the_job_stopped(
        tmp_path: Path, jsonl: Callable[..., Path], snapshot: Callable[..., Any]) -> None:
    """A refused paper is rejected in the worker with the server's reason; a code that says the
    whole job is wrong stops it, named, with the papers before it stored."""
    import grpc

    from ingest.pipeline import JobError
    from ingest.testing import serve_stub

    files = [jsonl(tmp_path / "c.jsonl", synthetic_papers(20, mentions_per_paper=4,
                                                          relationships_per_paper=2, seed=4))]
    with serve_stub() as stub, IdentityClient(stub.address, policy=POLICY) as client:
        stub.servicer.fail_next(1, grpc.StatusCode.INVALID_ARGUMENT)
        summary = in_worker(tmp_path / "refused.duckdb", files, client)
    assert (summary.ingested, summary.rejected_lines) == (19, 1)
    (reject,) = [r for r in snapshot(tmp_path / "refused.duckdb")["rejects"]
                 if "identity server refused the paper" in str(r)]
    assert "INVALID_ARGUMENT" in str(reject)

    with serve_stub() as stub, IdentityClient(stub.address, policy=POLICY) as client:
        stub.servicer.fail_next(1, grpc.StatusCode.PERMISSION_DENIED)
        with pytest.raises(JobError, match="PERMISSION_DENIED"):
            in_worker(tmp_path / "denied.duckdb", files, client)
