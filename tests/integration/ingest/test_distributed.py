"""`ingest run --engine dask`: buckets of papers on a local Dask cluster, the graph a catalog of
views over the shards. The same tables as the single-process job, kill-safe, rerun-safe, and
readable by anyone while shards are written."""

from __future__ import annotations

import copy
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import duckdb
import pytest

from identity_client import IdentityClient, RetryPolicy
from ingest.catalog import Layout, open_catalog, run_lock
from ingest.cli import main
from ingest.distributed import ClientSettings, ClusterOptions, run_distributed
from ingest.pipeline import JobOptions, sync_redirects
from ingest.sink import GraphSink
from ingest.staging import bucket_of
from ingest.testing import serve_stub, synthetic_papers
from tests.integration.ingest.conftest import TABLES, Snapshot, rows, take_snapshot

pytestmark = pytest.mark.slow

# Across buckets, papers reach the identity server in no set order, so which paper asked first
# about a name, and so *created* its entity, is not the single-process job's: `created`, the
# match kind that follows from it (`new`, or an exact or case match), the name it matched (the
# stub names an entity by its first spelling) and the paper's new/matched counts. The entity
# each mention resolved to is compared (stub ids are a function of type and name), and the
# entities created are compared as a set below.
ORDER_DEPENDENT = {"created", "match_kind", "matched_name", "counts"}
FAST = RetryPolicy(deadline_seconds=5.0, budget_seconds=20.0, initial_backoff=0.01)


def corpus(directory: Path, jsonl: Callable[..., Path], n: int = 48) -> Path:
    """Two files: papers, a revision of one of them in the same file and two of another in the
    next (applied in input order), lines rejected whole (bad JSON, no paper id, bad mentions)
    and items rejected (a self-loop)."""
    directory.mkdir()
    papers: list[Any] = list(synthetic_papers(n, mentions_per_paper=6, relationships_per_paper=4,
                                              seed=41))
    papers[20]["relationships"].append({"subject": "m0", "predicate": "uses", "object": "m0"})

    def revised(paper: dict[str, Any], revision: str) -> dict[str, Any]:
        new = copy.deepcopy(paper)
        new["revision"] = revision
        new["mentions"][0]["text"] += f" ({revision})"
        new["relationships"] = new["relationships"][1:]
        return new

    first = papers[:n // 2] + [revised(papers[3], "v2")]
    first.insert(5, "{not json")
    first.insert(9, json.dumps({"mentions": [], "relationships": []}))
    first.insert(12, {"paper_id": "bad-mentions", "mentions": {}, "relationships": []})
    second = papers[n // 2:] + [revised(papers[7], "v2"), revised(revised(papers[7], "v2"), "v3")]
    second.insert(2, "[1, 2]")
    jsonl(directory / "a.jsonl", first)
    jsonl(directory / "b.jsonl", second)
    return directory


def graph(db: Path) -> Snapshot:
    """Every table's rows, sorted, without wall-clock and order-dependent columns."""
    return take_snapshot(db, leave_out=ORDER_DEPENDENT)


def created_once(db: Path) -> list[tuple[Any, ...]]:
    """The entities the graph saw created: each once, whichever paper created it."""
    return rows(db, "SELECT entity_id, count(*) FROM mentions WHERE created GROUP BY ALL "
                    "ORDER BY ALL")


def summary_of(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(path.read_text())
    for timing in ("elapsed_seconds", "papers_per_second"):
        record.pop(timing)
    return record


def dask_run(papers: Path, db: Path, address: str, *extra: str) -> list[str]:
    return ["run", str(papers), "--db", str(db), "--server", address, "--engine", "dask",
            "--no-progress", *extra]


def test_two_workers_make_the_tables_the_single_process_job_makes(
        tmp_path: Path, jsonl: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    papers = corpus(tmp_path / "in", jsonl)
    single, catalog = tmp_path / "single.duckdb", tmp_path / "catalog.duckdb"
    with serve_stub() as stub:
        assert main(["run", str(papers), "--db", str(single), "--server", stub.address,
                     "--no-progress", "--summary-json", str(tmp_path / "single.json")]) == 0
    with serve_stub() as stub:  # a fresh store: the same entities to create
        assert main(dask_run(papers, catalog, stub.address, "--workers", "2", "--buckets", "4",
                             "--summary-json", str(tmp_path / "dask.json"))) == 0
    assert "papers ingested:   51 (3 changed revisions)" in capsys.readouterr().out
    assert summary_of(tmp_path / "dask.json") == summary_of(tmp_path / "single.json")
    expected, got = graph(single), graph(catalog)
    for table in TABLES:
        assert got[table] == expected[table], table
    assert created_once(catalog) == created_once(single)
    assert rows(catalog, "SELECT count(*) FROM mentions WHERE created <> (match_kind = 'new')"
                ) == [(0,)]
    # Rejected lines keep their reasons and positions; a paper's revisions closed in order.
    assert rows(catalog, f"SELECT reason LIKE '%JSON%' FROM rejects WHERE position = "
                         f"'{papers / 'a.jsonl'}:6'") == [(True,)]
    assert rows(catalog, "SELECT revision FROM papers WHERE paper_id = "
                         "'synthetic-41-0000007' AND is_current") == [("v3",)]
    assert sorted(p.name for p in Layout.of(catalog).published.iterdir()) == [
        "_empty", "bucket-0000", "bucket-0001", "bucket-0002", "bucket-0003"]


def die_once(marker: Path, bucket: int, papers_done: int) -> None:
    """Kills the worker running the first task to write a group (claiming the marker first, so
    only once): a worker lost mid-task, with whole papers in its shard and more to come."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os._exit(9)


def read_while_writing(catalog: Path, report: Path, bucket: int, papers_done: int) -> None:
    """In a task, its shard open for writing: another process, in another directory, reads the
    catalog (and cannot open the shard). Once, whichever task gets here first."""
    try:
        os.close(os.open(report, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    shard = Layout.of(catalog).shard(bucket)
    script = (
        "import duckdb, json, sys\n"
        f"con = duckdb.connect({str(catalog)!r}, read_only=True)\n"
        "papers = con.execute('SELECT count(*) FROM papers').fetchone()[0]\n"
        "edges = con.execute('SELECT count(*) FROM graph_edges').fetchone()[0]\n"
        "try:\n"
        f"    duckdb.connect({str(shard)!r}, read_only=True)\n"
        "    shard = 'opened'\n"
        "except duckdb.Error:\n"
        "    shard = 'locked'\n"
        "print(json.dumps([papers, edges, shard]))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=report.parent.parent, check=True,
                          text=True, capture_output=True, timeout=60)
    report.write_text(done.stdout)


def wait_for_the_driver(seen: Path, bucket: int, lines_done: int) -> None:
    """In a task, after its first group: wait until the driver has shown lines of this bucket
    as done while no bucket has ended (it writes `seen`), so the live progress is proved, not
    raced. Waits once, and gives up after a while: the test then fails on `seen` missing."""
    try:
        os.close(os.open(seen.with_name("waited"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    deadline = time.monotonic() + 20
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_driver_shows_lines_done_while_the_tasks_run(
        tmp_path: Path, jsonl: Callable[..., Path]) -> None:
    papers = corpus(tmp_path / "in", jsonl)
    seen = tmp_path / "seen"
    shown: list[tuple[int, int, int, int]] = []

    def progress(lines: int, total: int, done: int, buckets: int) -> None:
        shown.append((lines, total, done, buckets))
        if lines and not done:
            seen.touch()

    with serve_stub() as stub:
        options = JobOptions(concurrency=2, group_papers=3, flush_seconds=60)
        client = ClientSettings(stub.address, deadline_seconds=5, retry_budget_seconds=20)
        layout, buckets = open_catalog(tmp_path / "catalog.duckdb", 1)
        with run_lock(layout):
            run_distributed([papers], layout=layout, buckets=buckets, options=options,
                            client=client, cluster=ClusterOptions(workers=1),
                            after_write=partial(wait_for_the_driver, seen), progress=progress,
                            progress_every_s=0)
    assert seen.exists()
    total = shown[-1][1]
    assert shown[-1] == (total, total, 1, 1)
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(shown))  # never backwards


def test_a_worker_killed_mid_task_and_the_job_rerun_give_the_same_tables(
        tmp_path: Path, jsonl: Callable[..., Path]) -> None:
    papers = corpus(tmp_path / "in", jsonl)
    single, catalog = tmp_path / "single.duckdb", tmp_path / "catalog.duckdb"
    marker = tmp_path / "killed"
    with serve_stub() as stub:
        assert main(["run", str(papers), "--db", str(single), "--server", stub.address,
                     "--no-progress"]) == 0
    with serve_stub() as stub:
        options = JobOptions(concurrency=2, group_papers=3, flush_seconds=60)
        client = ClientSettings(stub.address, deadline_seconds=5, retry_budget_seconds=20)
        layout, buckets = open_catalog(catalog, 2)
        with run_lock(layout):
            summary, _ = run_distributed(
                [papers], layout=layout, buckets=buckets, options=options, client=client,
                cluster=ClusterOptions(workers=2), after_write=partial(die_once, marker))
        assert marker.exists()  # a worker died mid-task; Dask ran its bucket again
        # The one group the killed task had written (papers, and maybe a rejected line) is
        # found written when Dask runs its bucket again; the rest is ingested then.
        assert summary.unchanged + summary.lines_rejected_before == 3
        assert summary.ingested + summary.unchanged == 51
        report = tmp_path / "reader" / "report.json"
        report.parent.mkdir()
        with run_lock(layout):
            again, _ = run_distributed(
                [papers], layout=layout, buckets=buckets, options=options, client=client,
                cluster=ClusterOptions(workers=2),
                after_write=partial(read_while_writing, catalog, report))
        assert (again.ingested, again.unchanged) == (0, 51)
        # Read mid-task, its shard held by its writer: every paper published is there.
        papers_read, edges_read, shard = json.loads(report.read_text())
        assert (papers_read, shard) == (51, "locked") and edges_read > 0
        with GraphSink(catalog) as sink, IdentityClient(stub.address, policy=FAST) as c:
            sync_redirects(c, sink)
    expected, got = graph(single), graph(catalog)
    for table in TABLES:
        assert got[table] == expected[table], table
    assert created_once(catalog) == created_once(single)


def test_a_rerun_of_an_unchanged_input_changes_nothing_and_readers_need_no_shard(
        tmp_path: Path, jsonl: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    corpus(tmp_path / "in", jsonl)
    monkeypatch.chdir(tmp_path)  # the embedded server's store, and relative paths, here
    args = ["run", "in", "--db", "graph.duckdb", "--engine", "dask", "--workers", "2",
            "--buckets", "3", "--no-progress"]
    assert main(args) == 0  # no --server: the embedded one, which the tasks call on loopback
    assert "papers ingested:   51" in capsys.readouterr().out
    catalog = tmp_path / "graph.duckdb"
    published = sorted(Layout.of(catalog).published.rglob("*.parquet"))
    stamps = [p.stat().st_mtime_ns for p in published]
    con = duckdb.connect(str(catalog), read_only=True)
    before = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}
    con.close()
    # Positions are as the input was named, relative here, as the single-process job has them.
    assert rows(catalog, "SELECT position FROM rejects WHERE reason LIKE '%JSON%' "
                         "ORDER BY position LIMIT 1") == [("in/a.jsonl:6",)]

    assert main([*args[:-3], "--no-progress"]) == 0  # the catalog's own bucket count
    out = capsys.readouterr().out
    assert "papers ingested:   0" in out and "papers unchanged:  51" in out
    con = duckdb.connect(str(catalog), read_only=True)
    assert {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES} \
        == before  # wall-clock columns included: nothing was written
    con.close()
    assert [p.stat().st_mtime_ns for p in published] == stamps  # nor republished

    # A shard held open by its writer, as while its task runs: nobody else can open it, and
    # the catalog reads from another directory all the same, read-only or not.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with GraphSink(Layout.of(catalog).shard(0)):
        script = (
            "import duckdb, sys\n"
            "try:\n"
            f"    duckdb.connect({str(Layout.of(catalog).shard(0))!r}, read_only=True)\n"
            "    sys.exit('the shard opened while its writer held it')\n"
            "except duckdb.Error:\n"
            "    pass\n"
            "for read_only in (True, False):\n"
            f"    con = duckdb.connect({str(catalog)!r}, read_only=read_only)\n"
            "    print([con.execute(f'SELECT count(*) FROM {v}').fetchone()[0] for v in\n"
            "           ('papers', 'mentions', 'relationships', 'rejects', 'graph_edges',\n"
            "            'entities', 'mentions_resolved', 'relationships_resolved')])\n"
            "    con.close()\n")
        done = subprocess.run([sys.executable, "-c", script], cwd=elsewhere, text=True, check=False,
                              capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    counts = [json.loads(line) for line in done.stdout.splitlines()]
    assert counts[0] == counts[1] and counts[0][0] == 51  # 48 papers, 3 of them revised


def test_sync_and_stats_on_a_catalog_and_the_engines_keep_to_their_own_files(
        tmp_path: Path, jsonl: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    papers = corpus(tmp_path / "in", jsonl)
    catalog, single = tmp_path / "catalog.duckdb", tmp_path / "single.duckdb"
    with serve_stub(admin_token="t") as stub:
        assert main(["run", str(papers), "--db", str(catalog), "--server", stub.address,
                     "--engine", "dask", "--workers", "2", "--buckets", "2"]) == 0
        # Progress, on a stderr that is no terminal: a line now and then, and at the end.
        err = capsys.readouterr().err
        lines = sum(f.read_bytes().count(b"\n") for f in papers.iterdir())
        assert f"ingest: {lines} of {lines} lines done, 2 of 2 buckets (" in err
        source, target = _two_methods(catalog)
        with IdentityClient(stub.address, policy=FAST, admin_token="t") as client:
            client.merge(source, target)
        capsys.readouterr()
        assert main(["sync", "--db", str(catalog), "--server", stub.address]) == 0
        assert "new merges:   1" in capsys.readouterr().out
        assert rows(catalog, "SELECT from_id, to_id FROM redirects") == [(source, target)]
        assert rows(catalog, f"SELECT count(*) FROM mentions_resolved WHERE resolved_id = "
                             f"'{source}'") == [(0,)]
        assert main(["stats", "--db", str(catalog)]) == 0
        stats = capsys.readouterr().out
        assert "papers:          48 (51 revisions)" in stats
        assert "redirects:       1" in stats and "catalog:         2 buckets" in stats

        # The local engine refuses a catalog, the dask engine a single-file graph, and a
        # catalog refuses another bucket count: nothing written by any of them.
        assert main(["run", str(papers), "--db", str(catalog), "--server", stub.address,
                     "--no-progress"]) == 1
        assert "is a catalog of shards" in capsys.readouterr().err
        assert main(dask_run(papers, catalog, stub.address, "--buckets", "5")) == 1
        assert "is split into 2 buckets, and this run asks for 5" in capsys.readouterr().err
        assert main(["run", str(papers), "--db", str(single), "--server", stub.address,
                     "--no-progress"]) == 0
        assert main(dask_run(papers, single, stub.address)) == 1
        assert "is a single-file graph" in capsys.readouterr().err
        assert not Layout.of(single).root.exists()
    with pytest.raises(SystemExit) as usage:
        main(["run", str(papers), "--db", str(catalog), "--workers", "2"])
    assert usage.value.code == 2
    assert "--workers needs --engine dask" in capsys.readouterr().err


def _two_methods(db: Path) -> tuple[str, str]:
    (a,), (b,) = rows(db, "SELECT entity_id FROM entities WHERE entity_type = 'method' "
                          "ORDER BY paper_count DESC, entity_id LIMIT 2")
    return a, b


@pytest.mark.parametrize("paper_id", ["arXiv:1810.04805", "W2741809807", "3"])
def test_a_papers_bucket_is_the_same_in_every_process(paper_id: str) -> None:
    # Python's own hash of a string changes with each process (PYTHONHASHSEED): never that.
    script = f"from ingest.staging import bucket_of; print(bucket_of({paper_id!r}, 16))"
    out = subprocess.run([sys.executable, "-c", script], text=True, capture_output=True,
                         env={**os.environ, "PYTHONHASHSEED": "random"}, check=True).stdout
    assert int(out) == bucket_of(paper_id, 16)


def test_the_local_cluster_keeps_off_dasks_default_ports() -> None:
    """Dask's scheduler serves HTTP on every address's port 8787 unless told otherwise: the
    job's local cluster must start while another program holds that port, and its scheduler
    must listen on loopback."""
    from ingest.distributed import dask_client

    holder = socket.socket()
    try:
        holder.bind(("0.0.0.0", 8787))
        holder.listen()
    except OSError:
        holder.close()
        pytest.skip("port 8787 is taken already: the cluster's start below proves the same")
    try:
        with dask_client(ClusterOptions(workers=1)) as dask:
            info = dask.scheduler_info()
            assert info["address"].startswith("tcp://127.0.0.1:")
            assert 8787 not in info["services"].values()
            assert len(dask.run(os.getpid)) == 1
    finally:
        holder.close()
