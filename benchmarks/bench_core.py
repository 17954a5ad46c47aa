"""Goal 3: the matching core alone (no gRPC), and the in-process index build of goal 4.

For each entity count N, a child process opens the generated store of N entities, builds the
identity service (timed: that is the start-up of goal 4; its RSS delta is the index's memory),
then times `matching.decide` over the service's NameIndex - the public entry point of the rules -
for mentions of each match kind. The typo lookup's cost is the median time of one `decide` call
for a single-typo mention (rules 1-3 miss, rule 4 finds it). The baseline is the naive typo
lookup: `rapidfuzz.process.extract` over the keys of every name, Levenshtein distance <= 1.

The child can run under an address-space cap (RLIMIT_AS) and reports "did not fit" instead of
taking the machine down.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    Row,
    child_env,
    fmt_bytes,
    fmt_rate,
    fmt_us,
    median,
    proc_status,
)

KIND_LABELS = ("exact", "case", "punctuation", "alias", "typo", "new")
GB = 1 << 30


def run_child(db: Path, n: int, *, per_kind: int, repeats: int, scan_queries: int,
              cap_bytes: int | None, timeout_s: float,
              reference: tuple[Path, int] | None = None) -> dict[str, Any]:
    """Runs the measurement in a child process; returns its JSON (or why it failed).
    `reference`: (store, entity count) of a small index whose typo cost the child measures
    too, in rounds alternating with its own (the flat-cost ratio's same-run baseline)."""
    argv = [sys.executable, "-m", "benchmarks.bench_core", "--db", str(db), "--n", str(n),
            "--per-kind", str(per_kind), "--repeats", str(repeats),
            "--scan-queries", str(scan_queries)]
    if reference is not None and reference[1] < n:
        argv += ["--reference-db", str(reference[0]), "--reference-n", str(reference[1])]
    if cap_bytes:
        argv += ["--cap-bytes", str(cap_bytes)]
    started = time.perf_counter()
    try:
        proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                              env=child_env())
    except subprocess.TimeoutExpired:
        return {"n": n, "fit": False, "error": f"timed out after {timeout_s:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = proc.stderr.strip().splitlines()[-3:]
        return {"n": n, "fit": False,
                "error": f"child exited {proc.returncode}: {' | '.join(tail)}",
                "wall_s": time.perf_counter() - started}
    out: dict[str, Any] = json.loads(lines[-1])
    out["wall_s"] = time.perf_counter() - started
    return out


def _typo_mentions(db: Path, n: int, per_kind: int) -> dict[str, list[tuple[str, str]]]:
    from benchmarks.data import mentions_of_kind, sample_entities

    pool = sample_entities(db, n, min(n, 5000), seed=3)
    return {k: mentions_of_kind(pool, k, per_kind, seed=7) for k in KIND_LABELS}


def typo_side_by_side(index: Any, typo: list[tuple[str, str]], reference: tuple[Path, int],
                      *, per_kind: int, repeats: int) -> dict[str, float]:
    """Typo decide() over `index` and over a small reference index built here, in alternating
    rounds (each timed pass after an untimed one), so both medians come from the same minutes
    of this machine (single figures drift by a third between runs here, more than the effect
    measured)."""
    from identity_server.matching import decide
    from identity_server.normalize import display_form
    from identity_server.server import build_service
    from identity_server.settings import Settings

    ref_db, ref_n = reference
    ref_service = build_service(Settings(db_url=f"sqlite:///{ref_db}"))
    try:
        sides = {"main": (index, [(display_form(t), ty) for t, ty in typo]),
                 "reference": (ref_service.index, [
                     (display_form(t), ty)
                     for t, ty in _typo_mentions(ref_db, ref_n, per_kind)["typo"]])}
        times: dict[str, list[int]] = {"main": [], "reference": []}
        for _ in range(repeats):
            for side in ("reference", "main"):
                idx, displays = sides[side]
                for d, ty in displays:  # warm: the other index has just had the caches
                    decide(idx, d, ty)
                for d, ty in displays:
                    a = time.perf_counter_ns()
                    decide(idx, d, ty)
                    times[side].append(time.perf_counter_ns() - a)
    finally:
        ref_service.close()
    main_us = median([x / 1000 for x in times["main"]])
    ref_us = median([x / 1000 for x in times["reference"]])
    return {"reference_n": ref_n, "typo_us": main_us, "reference_typo_us": ref_us,
            "ratio": main_us / ref_us}


def measure(db: Path, n: int, *, per_kind: int, repeats: int, scan_queries: int,
            reference: tuple[Path, int] | None = None) -> dict[str, Any]:
    """In the child: build the service, then time decide() per kind and the rapidfuzz scan."""
    import gc
    import sqlite3

    from identity_server.matching import decide
    from identity_server.normalize import display_form, key
    from identity_server.server import build_service
    from identity_server.settings import Settings

    mentions = _typo_mentions(db, n, per_kind)
    gc.collect()
    rss0 = proc_status().get("VmRSS", 0)
    t0 = time.perf_counter()
    service = build_service(Settings(db_url=f"sqlite:///{db}"))
    build_s = time.perf_counter() - t0
    gc.collect()
    status = proc_status()
    index_bytes = status.get("VmRSS", 0) - rss0
    index = service.index

    rates: dict[str, float] = {}
    kinds_seen: dict[str, dict[str, int]] = {}
    typo_ns: list[int] = []
    for kind, items in mentions.items():
        displays = [(display_form(t), ty) for t, ty in items]
        seen: dict[str, int] = {}
        for d, ty in displays:
            v = decide(index, d, ty).match_kind.value
            seen[v] = seen.get(v, 0) + 1
        kinds_seen[kind] = seen
        per_round = []
        for _ in range(repeats):
            t = time.perf_counter()
            for text, ty in items:
                decide(index, display_form(text), ty)
            per_round.append(len(items) / (time.perf_counter() - t))
        rates[kind] = median(per_round)
        if kind == "typo":
            for _ in range(repeats):
                for d, ty in displays:
                    a = time.perf_counter_ns()
                    decide(index, d, ty)
                    typo_ns.append(time.perf_counter_ns() - a)
    typo_us = median([x / 1000 for x in typo_ns])
    # The server's own high-water mark: the rapidfuzz baseline below loads every key again.
    server_peak_rss = proc_status().get("VmHWM", 0)
    side_by_side = (typo_side_by_side(index, mentions["typo"], reference, per_kind=per_kind,
                                      repeats=repeats) if reference is not None else None)
    runtime = runtime_anchors(index, mentions, repeats=repeats)

    scan_us = float("nan")
    if scan_queries:
        from rapidfuzz import process
        from rapidfuzz.distance import Levenshtein

        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        keys = [key(d) for (d,) in con.execute(
            "SELECT display FROM names WHERE kind IN ('name', 'alias')")]
        con.close()
        queries = [key(display_form(t)) for t, _ in mentions["typo"][:scan_queries]]
        times: list[float] = []
        for q in queries:
            began = time.perf_counter()
            process.extract(q, keys, scorer=Levenshtein.distance, score_cutoff=1, limit=None)
            times.append((time.perf_counter() - began) * 1e6)
        scan_us = median(times)
        del keys
    return {
        "n": n, "fit": True, "build_s": build_s, "index_bytes": index_bytes,
        "bytes_per_entity": index_bytes / n,
        "peak_rss": max(runtime["peak_before"], proc_status().get("VmHWM", 0)),
        "server_peak_rss": server_peak_rss,
        "rates": rates, "kinds_seen": kinds_seen, "typo_us": typo_us,
        "typo_p99_us": sorted(typo_ns)[int(0.99 * (len(typo_ns) - 1))] / 1000 if typo_ns else 0,
        "scan_us": scan_us, "scan_queries": scan_queries, "per_kind": per_kind,
        "runtime": runtime, "side_by_side": side_by_side,
    }


def _reset_peak_rss() -> bool:
    """Reset this process's VmHWM (Linux: `5` into /proc/self/clear_refs); False if refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


RUNTIME_ANCHORS = 50_000  # the service's default pack threshold (ServiceConfig.typo_pack_at)


def runtime_anchors(index: Any, mentions: dict[str, list[tuple[str, str]]], *,
                    repeats: int) -> dict[str, float]:
    """Entities created after start-up: what their typo anchors cost in the overlay, and what a
    background pack of them costs (the service's own steps: set aside, build, install, release).
    Typo decide() is timed with them in the overlay and after the pack."""
    import gc

    from benchmarks.names import names as generated_names
    from identity_server.domain import Entity, Name, NameKind, Status
    from identity_server.matching import decide
    from identity_server.normalize import display_form

    typo = [(display_form(t), ty) for t, ty in mentions["typo"]]

    def typo_decide_us() -> float:
        times = []
        for _ in range(repeats):
            for d, ty in typo:
                a = time.perf_counter_ns()
                decide(index, d, ty)
                times.append(time.perf_counter_ns() - a)
        return median([x / 1000 for x in times])

    made = list(generated_names(RUNTIME_ANCHORS, seed=11, new=True))  # absent from the store
    first = index.max_ordinal + 1
    gc.collect()
    rss0 = proc_status().get("VmRSS", 0)
    for i, record in enumerate(made):
        index.put(Entity(f"prov_rt{i}", record.entity_type, Status.PROVISIONAL, first + i,
                         names=(Name(record.display, NameKind.NAME, 0),)))
    gc.collect()
    rss_overlay = proc_status().get("VmRSS", 0)
    with_overlay_us = typo_decide_us()
    peak_before = proc_status().get("VmHWM", 0)
    peak_reset = _reset_peak_rss()  # so VmHWM below is the pack's own high-water mark
    before_pack = proc_status().get("VmRSS", 0)
    t = time.perf_counter()
    pack = index.begin_typo_pack()
    index.build_typo_pack(pack)
    built = proc_status().get("VmHWM" if peak_reset else "VmRSS", 0)
    installed = index.install_typo_pack(pack)
    pack_s = time.perf_counter() - t
    pack.release()
    del pack
    gc.collect()
    rss_packed = proc_status().get("VmRSS", 0)
    return {
        "anchors": len(made), "installed": installed, "pack_s": pack_s,
        "peak_before": peak_before, "scratch_is_peak": peak_reset,
        "overlay_bytes_per_entity": (rss_overlay - rss0) / len(made),
        "packed_bytes_per_entity": (rss_packed - rss0) / len(made),
        "build_scratch_bytes": max(0, built - before_pack),
        "typo_us_overlay": with_overlay_us, "typo_us_packed": typo_decide_us(),
    }


def rows(points: list[dict[str, Any]], *, at: int, point_10m: dict[str, Any] | None) -> list[Row]:
    """Table rows of goal 3 from the child results (`at`: the size of the per-kind rows)."""
    ok = {p["n"]: p for p in points if p.get("fit")}
    out: list[Row] = []
    main = ok.get(at)
    if main is None:
        return [Row("3 core", "matching core", "failed", "", None, "", False,
                    {"points": points})]
    scan_rate = float("nan") if math.isnan(main["scan_us"]) else 1e6 / main["scan_us"]
    for kind in KIND_LABELS:
        rate = main["rates"][kind]
        out.append(Row(
            f"3 core {kind}", f"decide() over NameIndex, {kind} mentions, {at:,} entities",
            fmt_rate(rate, " resolves/s"), f"rapidfuzz scan {fmt_rate(scan_rate, '/s')}",
            None if math.isnan(scan_rate) else rate / scan_rate, "report", None,
            {"rate": rate, "kinds_seen": main["kinds_seen"][kind]}))
    sizes = sorted(ok)
    smallest = ok[sizes[0]]
    largest = point_10m if point_10m and point_10m.get("fit") else ok[sizes[-1]]
    costs = ", ".join(f"{p['n']:,}: {fmt_us(p['typo_us'])}" + _recorded(p) for p in
                      [ok[s] for s in sizes] + ([point_10m] if point_10m and
                                                 point_10m.get("fit") else []))
    side = largest.get("side_by_side")
    if side:  # both figures from one child, in alternating rounds
        flat = side["ratio"]
        measures = (f"median µs per typo decide() by entity count; ratio: {largest['n']:,} vs "
                    f"{side['reference_n']:,} entities timed side by side in one process")
        baseline = (f"{side['reference_n']:,}: {fmt_us(side['reference_typo_us'])} beside "
                    f"{largest['n']:,}: {fmt_us(side['typo_us'])}{_recorded(largest)}")
        smallest_n = side["reference_n"]
    else:
        flat = largest["typo_us"] / smallest["typo_us"]
        measures = "median µs per typo decide() by entity count"
        baseline = f"{smallest['n']:,}: {fmt_us(smallest['typo_us'])}"
        smallest_n = smallest["n"]
    out.append(Row(
        "3 typo cost flat", measures, costs, baseline, flat,
        f"{largest['n']:,}/{smallest_n:,} <= 2x", flat <= 2.0,
        {"typo_us": {p["n"]: p["typo_us"] for p in ok.values()}, "side_by_side": side}))
    speedup = main["scan_us"] / main["typo_us"]
    out.append(Row(
        "3 typo vs scan", f"typo decide() vs rapidfuzz full scan, {at:,} entities",
        fmt_us(main["typo_us"]), f"scan {fmt_us(main['scan_us'])}", speedup, ">= 1000x",
        speedup >= 1000))
    runtime = main.get("runtime")
    if runtime:
        out.append(Row(
            "3 runtime anchors",
            f"{runtime['anchors']:,} entities created after start-up ({at:,} entities): RSS each "
            "with their typo anchors in the overlay, then after the background pack; pack time "
            "and scratch memory; typo decide() before and after",
            f"{fmt_bytes(runtime['packed_bytes_per_entity'])}/entity packed, pack "
            f"{runtime['pack_s']:.1f} s (+{fmt_bytes(runtime['build_scratch_bytes'])} scratch), "
            f"typo {fmt_us(runtime['typo_us_overlay'])} -> {fmt_us(runtime['typo_us_packed'])}",
            f"{fmt_bytes(runtime['overlay_bytes_per_entity'])}/entity in the overlay",
            runtime["packed_bytes_per_entity"] / runtime["overlay_bytes_per_entity"],
            "report", None, runtime))
    per_entity = main["bytes_per_entity"]
    if point_10m is not None and point_10m.get("fit"):
        whole = point_10m.get("server_peak_rss", point_10m["peak_rss"])
        figure = (f"{fmt_bytes(per_entity)}/entity; 10M peak RSS {fmt_bytes(whole)} "
                  "(built and resolving, before the scan baseline)")
    elif point_10m is not None:
        whole = float("inf")
        figure = (f"{fmt_bytes(per_entity)}/entity; 10M did not fit "
                  f"({point_10m.get('error', '')[:60]})")
    else:
        whole = main["peak_rss"] - main["index_bytes"] + per_entity * 10_000_000
        figure = f"{fmt_bytes(per_entity)}/entity; 10M projected {fmt_bytes(whole)}"
    out.append(Row(
        "3 memory", f"RSS of the built index per entity ({at:,}); whole server at 10M",
        figure, "8 GB", whole / (8 * GB) if whole != float("inf") else None,
        "10M fits in 8 GB", whole <= 8 * GB,
        {"bytes_per_entity": per_entity}))
    return out


def _recorded(point: dict[str, Any]) -> str:
    """Where a point comes from an earlier run (the recorded 10M point), that run's date."""
    return f" (run of {point['recorded']})" if point.get("recorded") else ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--per-kind", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scan-queries", type=int, default=10)
    parser.add_argument("--cap-bytes", type=int, default=0)
    parser.add_argument("--reference-db", type=Path)
    parser.add_argument("--reference-n", type=int, default=0)
    args = parser.parse_args()
    reference = (args.reference_db, args.reference_n) if args.reference_db else None
    if args.cap_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (args.cap_bytes, args.cap_bytes))
    try:
        result = measure(args.db, args.n, per_kind=args.per_kind, repeats=args.repeats,
                         scan_queries=args.scan_queries, reference=reference)
    except MemoryError:
        result = {"n": args.n, "fit": False,
                  "error": f"MemoryError under a {args.cap_bytes / GB:.0f} GB address-space cap",
                  "peak_rss": proc_status().get("VmHWM", 0)}
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
