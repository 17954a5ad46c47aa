"""Goal 5: ingest of generated papers against the same ResolveBatch calls alone, and DuckDB.

`ingest run` (a child process, default concurrency) ingests N papers of 25 mentions and 15
relationships into a fresh DuckDB file, once with its embedded identity server and once against a
separate `identity-server serve` process; its own summary gives papers/s (server start-up
excluded). The baseline sends the same per-paper ResolveBatch calls (paper id as context), with
the same concurrency, through the same client class, to a server started the same way over a
fresh copy of the same store: papers/s of resolution alone. The writer's ceiling is a DuckDB bulk
insert of the same rows (papers, mentions, relationships) with ids precomputed. Peak RSS of the
ingest process (with its worker, when the server is embedded) is sampled over the run, to show
it stays flat as the batch grows.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    VENV_BIN,
    Row,
    RssSampler,
    child_env,
    fmt_bytes,
    fmt_rate,
    identity_server,
    median,
)
from benchmarks.data import copy_store, read_paper_batches

logger = logging.getLogger("benchmarks")

GOAL_RATIO = 0.7
RATE = re.compile(r"rate:\s+([0-9.]+) papers/s")


def _concurrency(separate: bool) -> int:
    """ingest's default papers in flight for this mode (passed to both sides explicitly)."""
    from ingest.settings import Settings

    return Settings(server="127.0.0.1:1" if separate else None).effective_concurrency()


def run_ingest(papers: Path, work: Path, *, store: Path | None, server: str | None,
               timeout_s: float) -> dict[str, Any]:
    """`ingest run` as a child process; papers/s from its summary, RSS sampled meanwhile."""
    db = work / f"graph-{'embedded' if server is None else 'separate'}.duckdb"
    for suffix in ("", ".wal"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    argv = [str(VENV_BIN / "ingest"), "run", str(papers), "--db", str(db), "--no-progress",
            "--concurrency", str(_concurrency(server is not None))]
    argv += ["--server", server] if server else ["--identity-db", f"sqlite:///{store}"]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=work)
    with RssSampler(proc.pid, every=0.1) as rss:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    wall = time.perf_counter() - started
    m = RATE.search(out)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"ingest failed ({proc.returncode}): {err[-1500:]}")
    samples = rss.samples
    end = samples[-1][0] if samples else 0.0

    def rss_between(lo: float, hi: float) -> float:
        return median([r for t, r, _ in samples if lo * end <= t <= hi * end])

    return {"papers_per_s": float(m.group(1)), "wall_s": wall, "summary": out.strip(),
            "peak_rss": rss.peak, "rss_2nd_quarter": rss_between(0.25, 0.5),
            "rss_4th_quarter": rss_between(0.75, 1.0),
            "rss_timeline": [(round(t, 1), r)
                             for t, r, _ in samples[:: max(1, len(samples) // 40)]]}


def run_calls(papers: Path, *, store: Path | None, server: str | None,
              timeout_s: float) -> dict[str, Any]:
    """The baseline child: the same ResolveBatch calls alone."""
    argv = [sys.executable, "-m", "benchmarks.bench_ingest", "--calls", str(papers),
            "--concurrency", str(_concurrency(server is not None))]
    argv += ["--server", server] if server else ["--embedded-db", f"sqlite:///{store}"]
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                          env=child_env())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"ResolveBatch baseline failed: {proc.stderr[-1500:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def calls_child(papers: Path, *, server: str | None, embedded_db: str | None,
                concurrency: int) -> dict[str, Any]:
    from identity_client import IdentityClient, RetryPolicy

    batches = read_paper_batches(papers)
    running = None
    if server is None:
        from identity_server.server import start_server
        from identity_server.settings import Settings

        running = start_server(Settings(db_url=embedded_db or "", port=0))
        server = f"127.0.0.1:{running.port}"
    try:
        with IdentityClient(server, policy=RetryPolicy(deadline_seconds=30.0,
                                                       budget_seconds=60.0)) as client:
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                done = sum(1 for _ in pool.map(lambda b: client.resolve_batch(b[0], b[1]),
                                               batches))
            elapsed = time.perf_counter() - started
    finally:
        if running is not None:
            running.stop(grace=1.0)
    return {"papers": done, "elapsed_s": elapsed, "papers_per_s": done / elapsed}


def duckdb_ceiling(papers: Path, work: Path, *, group: int = 500) -> dict[str, Any]:
    """Bulk insert of the rows ingest writes (ids precomputed) into a fresh DuckDB file."""
    from datetime import UTC, datetime

    import duckdb
    import pyarrow as pa

    from ingest.sink import MENTIONS_SCHEMA, PAPERS_SCHEMA, RELATIONSHIPS_SCHEMA, SCHEMA_SQL

    now = datetime.now(UTC)
    # Rows as column -> value; each table takes the columns of ingest's own Arrow schemas, so a
    # column added to the sink is filled with NULL here rather than breaking the baseline.
    rows: list[tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]] = []
    with papers.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            p = json.loads(line)
            common = {"paper_id": p["paper_id"], "revision": p.get("revision", "1"),
                      "content_hash": f"hash{n:08d}"}
            ids = {m["id"]: f"E{abs(hash((m['text'], m['type']))) % 10**9:09d}"
                   for m in p["mentions"]}
            pr = [{**common, "source": str(n), "is_current": True, "ingested_at": now,
                   "counts": {"mentions": len(p["mentions"]),
                              "relationships": len(p["relationships"]), "rejects": 0,
                              "new_entities": 0, "matched_entities": len(p["mentions"])}}]
            mr = [{**common, "mention_id": m["id"], "mention_index": i, "text": m["text"],
                   "entity_type": m["type"], "entity_id": ids[m["id"]], "status": "canonical",
                   "match_kind": "exact", "created": False, "resolved_type": m["type"],
                   "display_form": m["text"], "matched_name": m["text"],
                   "span": {"start": m["span"][0], "end": m["span"][1]}, "is_current": True}
                  for i, m in enumerate(p["mentions"])]
            rr = [{**common, "relationship_id": f"{p['paper_id']}-r{i}", "relationship_index": i,
                   "subject_mention_id": r["subject"], "subject_id": ids[r["subject"]],
                   "predicate": r["predicate"], "raw_predicate": r["predicate"],
                   "inverted": False, "object_mention_id": r["object"],
                   "object_id": ids[r["object"]], "confidence": float(r["confidence"]),
                   "evidence_span": {"start": r["evidence"]["span"][0],
                                     "end": r["evidence"]["span"][1]},
                   "evidence_quote": r["evidence"]["quote"], "valid_from": now}
                  for i, r in enumerate(p["relationships"])]
            rows.append((pr, mr, rr))
    db = work / "graph-ceiling.duckdb"
    for suffix in ("", ".wal"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    con = duckdb.connect(str(db))
    con.execute(SCHEMA_SQL)

    def table(schema: pa.Schema, data: list[dict[str, Any]]) -> pa.Table:
        return pa.table({name: pa.array([d.get(name) for d in data],
                                        type=schema.field(name).type)
                         for name in schema.names}, schema=schema)

    started = time.perf_counter()
    for i in range(0, len(rows), group):
        chunk = rows[i:i + group]
        con.begin()
        for name, schema, k in (("papers", PAPERS_SCHEMA, 0), ("mentions", MENTIONS_SCHEMA, 1),
                                ("relationships", RELATIONSHIPS_SCHEMA, 2)):
            con.register("_new", table(schema, [r for c in chunk for r in c[k]]))
            cols = ", ".join(f'"{c}"' for c in schema.names)
            con.execute(f"INSERT INTO {name} ({cols}) SELECT {cols} FROM _new")
            con.unregister("_new")
        con.commit()
    elapsed = time.perf_counter() - started
    con.close()
    return {"papers_per_s": len(rows) / elapsed, "elapsed_s": elapsed}


def run_pair(papers: Path, store: Path, work: Path, *, separate: bool, timeout_s: float,
             baseline_first: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """One ingest run and its baseline back to back (the baseline first when asked), each
    over a fresh copy of the store."""

    def ingest() -> dict[str, Any]:
        if separate:
            with identity_server(copy_store(store, work / "ingest-separate.sqlite")) as srv:
                return run_ingest(papers, work, store=None, server=srv.address,
                                  timeout_s=timeout_s)
        return run_ingest(papers, work, store=copy_store(store, work / "ingest-embedded.sqlite"),
                          server=None, timeout_s=timeout_s)

    def calls() -> dict[str, Any]:
        if separate:
            with identity_server(copy_store(store, work / "calls-separate.sqlite")) as srv:
                return run_calls(papers, store=None, server=srv.address, timeout_s=timeout_s)
        return run_calls(papers, store=copy_store(store, work / "calls-embedded.sqlite"),
                         server=None, timeout_s=timeout_s)

    if baseline_first:
        base = calls()
        return ingest(), base
    got = ingest()
    return got, calls()


def run(papers: Path, store: Path, work: Path, *, n_papers: int, timeout_s: float,
        repeats: int = 1, deadline: float | None = None) -> list[Row]:
    """Each mode's ingest and baseline run as back-to-back pairs, `repeats` times, modes
    interleaved, every other pair baseline first (ABBA: a drift of the host's speed during the
    pairs biases them in opposite ways); a mode's ratio is the median of its pairs' ratios.

    `deadline` (a `time.perf_counter()` value): a repeat after the first runs only if it would
    end before the deadline, taking as long as the longest repeat so far; on a slow host the
    suite keeps its time limit with fewer pairs, and the rows say how many ran."""
    papers, store, work = papers.resolve(), store.resolve(), work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"ceiling": duckdb_ceiling(papers, work)}
    pairs: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {"embedded": [],
                                                                     "separate": []}
    repeat_s = 0.0
    for repeat in range(repeats):
        if repeat and deadline is not None and time.perf_counter() + repeat_s > deadline:
            logger.info("ingest: %d of %d pairs a mode (another would end past the suite's "
                        "time budget)", repeat, repeats)
            break
        began = time.perf_counter()
        for mode, runs in pairs.items():
            runs.append(run_pair(papers, store, work, separate=mode == "separate",
                                 timeout_s=timeout_s, baseline_first=repeat % 2 == 1))
        repeat_s = max(repeat_s, time.perf_counter() - began)
    ran = len(pairs["embedded"])
    cut = f" ({ran} of {repeats}: the time budget)" if ran < repeats else ""
    out = []
    for mode, what in (("embedded", "embedded server"), ("separate", "separate server process")):
        ratios = [g["papers_per_s"] / b["papers_per_s"] for g, b in pairs[mode]]
        got = median([g["papers_per_s"] for g, _ in pairs[mode]])
        base = median([b["papers_per_s"] for _, b in pairs[mode]])
        ratio = median(ratios)
        res[mode] = pairs[mode][0][0]  # the first run's RSS readings stand for the mode
        out.append(Row(
            f"5 ingest {mode}", f"`ingest run`, {n_papers:,} papers (25 mentions, 15 rels), "
            f"{what}, concurrency {_concurrency(mode == 'separate')}; median of {ran} "
            f"ingest/baseline pairs{cut}",
            fmt_rate(got, " papers/s"), f"ResolveBatch alone {fmt_rate(base, ' papers/s')}",
            ratio, f">= {GOAL_RATIO}x", ratio >= GOAL_RATIO,
            {"pair_ratios": ratios, "ingest": [g for g, _ in pairs[mode]],
             "calls": [b for _, b in pairs[mode]]}))
    ceiling = res["ceiling"]["papers_per_s"]
    got = median([g["papers_per_s"] for g, _ in pairs["separate"]])
    out.append(Row(
        "5 writer ceiling", "DuckDB bulk insert of the same rows, ids precomputed (ceiling)",
        fmt_rate(got, " papers/s") + " ingest (separate)",
        f"DuckDB {fmt_rate(ceiling, ' papers/s')}", got / ceiling, "report", None,
        res["ceiling"]))
    sep = res["separate"]
    flat = sep["rss_4th_quarter"] / sep["rss_2nd_quarter"]
    out.append(Row(
        "5 ingest memory", "RSS of the ingest process (separate server): median over the last "
        "quarter of the run vs the second quarter; peak",
        f"{fmt_bytes(sep['rss_4th_quarter'])}, peak {fmt_bytes(sep['peak_rss'])} "
        f"(embedded, job and worker: peak {fmt_bytes(res['embedded']['peak_rss'])})",
        f"2nd quarter {fmt_bytes(sep['rss_2nd_quarter'])}", flat, "flat (<= 1.25x)",
        flat <= 1.25,
        {"separate_timeline": sep["rss_timeline"],
         "embedded_timeline": res["embedded"]["rss_timeline"]}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=Path, required=True)
    parser.add_argument("--server")
    parser.add_argument("--embedded-db")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    result = calls_child(args.calls, server=args.server, embedded_db=args.embedded_db,
                         concurrency=args.concurrency)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
