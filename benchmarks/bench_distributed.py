"""Issue 50: `ingest run --engine dask` on a local cluster of 1 and of 2 workers, each beside the
single-process job (`--engine local`) measured in the same run.

Three jobs, back to back, over the same generated corpus (benchmarks.data's `write_papers`, as
bench_ingest's) and against a separate identity server, as bench_ingest's "separate" mode runs
one: `identity-server serve` over a fresh copy of the 100k-entity store for each job, so every
job starts from the same store state, and a fresh graph path for each job. Each job is `ingest
run` as a child process with ingest's default concurrency for a separate server (each Dask task
runs the single-process pipeline with it); papers/s comes from the job's own summary (the
distributed job's counts staging the input and starting the local cluster too). The distributed
job's wall time is split from its log (`-v --log-format json`): staging the input into buckets,
starting the local cluster, the tasks (to the last bucket's progress record) and closing the
cluster.

On one machine the identity server, the job's driver, the Dask scheduler, the workers and their
nannies share the cores, so the figures show the engine's overhead, not the gain of a cluster of
machines.

Run on its own (the figures go to RESULTS.md's section when `--write-results` is given):
`python -m benchmarks.bench_distributed [--quick] [--write-results]`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_ingest import RATE, _concurrency
from benchmarks.common import (
    VENV_BIN,
    Row,
    alone_parser,
    fmt_rate,
    identity_server,
    run_alone,
)
from benchmarks.data import build_store, copy_store, write_papers

logger = logging.getLogger(__name__)

N_ENTITIES = 100_000
SECTION = "## Ingest on Dask distributed (issue 50)"
JOBS = (("local", None), ("dask-1", 1), ("dask-2", 2))  # (name, Dask workers)
INGESTED = re.compile(r"papers ingested:\s+([0-9]+)")
ELAPSED = re.compile(r"elapsed_seconds=([0-9.]+)")


def profile(quick: bool) -> dict[str, int]:
    """Papers in the corpus: each of the three jobs ingests all of them."""
    return {"papers": 1_000 if quick else 10_000}


def run_job(papers: Path, store: Path, work: Path, name: str, workers: int | None, *,
            timeout_s: float) -> dict[str, Any]:
    """One `ingest run` (local, or dask with `workers`) against a server over a fresh copy of
    the store, into a fresh graph; its papers/s, wall time and (dask) the split of its time."""
    db = work / f"graph-{name}.duckdb"
    shards = Path(str(db) + ".shards")

    def clean() -> None:
        for suffix in ("", ".wal"):
            Path(str(db) + suffix).unlink(missing_ok=True)
        shutil.rmtree(shards, ignore_errors=True)

    clean()
    argv = [str(VENV_BIN / "ingest"), "-v", "--log-format", "json", "run", str(papers),
            "--db", str(db), "--concurrency", str(_concurrency(True))]
    if workers is not None:
        argv += ["--engine", "dask", "--workers", str(workers)]
    try:
        with identity_server(copy_store(store, work / f"identity-{name}.sqlite")) as srv:
            argv += ["--server", srv.address]
            started = time.perf_counter()
            proc = subprocess.run(argv, check=False, capture_output=True, text=True,
                                  timeout=timeout_s, cwd=work)
            wall = time.perf_counter() - started
    finally:
        clean()
        for suffix in ("", "-wal", "-shm"):
            (work / f"identity-{name}.sqlite{suffix}").unlink(missing_ok=True)
    rate, ingested = RATE.search(proc.stdout), INGESTED.search(proc.stdout)
    if proc.returncode != 0 or rate is None or ingested is None:
        raise RuntimeError(f"ingest ({name}) failed ({proc.returncode}): {proc.stderr[-1500:]}")
    got: dict[str, Any] = {"papers_per_s": float(rate.group(1)), "wall_s": wall,
                           "papers": int(ingested.group(1)), "summary": proc.stdout.strip()}
    if workers is not None:
        got["split_s"] = split(proc.stderr)
    return got


def split(log: str) -> dict[str, float] | None:
    """The distributed job's time from its JSON log: staging, cluster start, tasks, cluster
    stop (None when a record is missing)."""
    at: dict[str, float] = {}
    elapsed = None
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
            t = dt.datetime.fromisoformat(rec["time"]).timestamp()
        except (ValueError, KeyError):
            continue
        event, source = str(rec.get("event", "")), rec.get("logger")
        if source == "ingest.distributed" and event.startswith("staged "):
            at["staged"] = t
        elif source == "ingest.distributed" and event.startswith("running on "):
            at["running"] = t
        elif source == "ingest.progress" and rec.get("buckets_done") == rec.get("buckets_total"):
            at["tasks_done"] = t
        elif source == "ingest.distributed" and event.startswith("distributed job done"):
            at["done"] = t
            m = ELAPSED.search(event)
            elapsed = float(m.group(1)) if m else None
    if elapsed is None or len(at) < 4:
        return None
    start = at["done"] - elapsed
    return {"staging": at["staged"] - start, "cluster_start": at["running"] - at["staged"],
            "tasks": at["tasks_done"] - at["running"],
            "cluster_stop": at["done"] - at["tasks_done"], "total": elapsed}


# -- the suite's rows --------------------------------------------------------------------------

def run(out: Path, *, quick: bool, timeout_s: float = 900.0) -> list[Row]:
    """The three jobs, local first, then 1 and 2 Dask workers; the rows of the two ratios."""
    n_papers = profile(quick)["papers"]
    out = out.resolve()
    store = build_store(out, N_ENTITIES)
    papers = write_papers(out, store, N_ENTITIES, n_papers)
    work = out / "work" / "distributed"
    work.mkdir(parents=True, exist_ok=True)
    jobs: dict[str, dict[str, Any]] = {}
    try:
        for name, workers in JOBS:
            jobs[name] = run_job(papers, store, work, name, workers, timeout_s=timeout_s)
            logger.info("distributed: %s %.1f papers/s (%.1f s wall)", name,
                        jobs[name]["papers_per_s"], jobs[name]["wall_s"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows(jobs, n_papers)


def rows(jobs: dict[str, dict[str, Any]], n_papers: int) -> list[Row]:
    local = jobs["local"]["papers_per_s"]
    load = (f"`ingest run`, {n_papers:,} papers (25 mentions, 15 rels), separate server process "
            f"(a fresh copy of the {N_ENTITIES:,}-entity store a job), concurrency "
            f"{_concurrency(True)}")
    out = []
    for name, workers in JOBS[1:]:
        job = jobs[name]
        assert workers is not None
        parts = job.get("split_s")
        where = "" if parts is None else (
            f" (staging {parts['staging']:.2f} s, cluster start {parts['cluster_start']:.1f} s, "
            f"tasks {parts['tasks']:.1f} s, cluster stop {parts['cluster_stop']:.1f} s)")
        label = f"{workers} worker{'s' if workers > 1 else ''}"
        out.append(Row(
            f"6 ingest dask {label} / local",
            f"{load}: `--engine dask`, a local cluster of {label}, vs `--engine local` in the "
            "same run (server, driver, workers and load on the same cores)",
            fmt_rate(job["papers_per_s"], " papers/s") + where,
            f"local {fmt_rate(local, ' papers/s')}", job["papers_per_s"] / local, "report",
            None, {**job, "workers": workers, "local": jobs["local"]}))
    return out


def section(rows_json: Sequence[dict[str, Any]], machine: dict[str, str], date: str) -> str:
    """RESULTS.md's section on this benchmark, from its rows (as results.json keeps them)."""
    found = [r for r in rows_json if r["benchmark"].startswith("6 ingest dask")]
    lines = [SECTION, ""]
    if not found:
        return "\n".join([*lines, "Not measured in this run.", ""])
    local = found[0]["data"]["local"]
    n_papers = local["papers"]
    lines += [
        (f"Run {date} on {machine['nproc']} cores ({machine['cpu']}): the identity server "
        "(SQLite, a fresh copy of the 100k store a job), the job's driver, the Dask scheduler, "
        "the workers and their nannies share these cores, so the figures show what the engine "
        "costs, not what a cluster of machines gains. `benchmarks/bench_distributed.py` "
        "(README: what it measures)."),
        "",
        "| job | papers/s | / local | wall time of the child | split of the job's time |",
        "|---|---|---|---|---|",
        (f"| `--engine local`, {n_papers:,} papers | {local['papers_per_s']:,.0f} | 1.00x | "
        f"{local['wall_s']:.1f} s | - |"),
    ]
    for r in found:
        d = r["data"]
        parts = d.get("split_s")
        where = "-" if parts is None else (
            f"staging {parts['staging']:.2f} s, cluster start {parts['cluster_start']:.1f} s, "
            f"tasks {parts['tasks']:.1f} s ({d['papers'] / parts['tasks']:,.0f} papers/s), "
            f"cluster stop {parts['cluster_stop']:.1f} s")
        label = f"{d['workers']} worker{'s' if d['workers'] > 1 else ''}"
        lines.append(f"| `--engine dask`, {label} | {d['papers_per_s']:,.0f} | "
                     f"{r['ratio']:.2f}x | {d['wall_s']:.1f} s | {where} |")
    lines += [
        "",
        ("Papers/s is the job's own summary: papers over the job's time, which for the "
        "distributed job counts staging the input and starting and closing the local cluster; "
        "the wall time of the child adds the process's start (imports), the check of the "
        "server's store and the closing sync. The tasks' papers/s is the papers over the tasks' "
        "time alone."),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    args = alone_parser("python -m benchmarks.bench_distributed", __doc__).parse_args()
    run_alone(args, title=SECTION, out_name="distributed.json", run=run, section=section)


if __name__ == "__main__":
    main()
