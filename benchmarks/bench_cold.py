"""Goal 2's bound: what the Resolve handler costs with the core's caches cold, as served.

A served call's handler runs after the gRPC stack, the kernel's networking and (on a 2-core
machine) the load generator have had the core: the handler's code and data have left the
core's private caches. A loop that resolves back to back in-process keeps them warm, and so
understates what a served call costs by several times. Here one child process over a copy of
the goal's store times the Resolve handler's work per call (the service's public resolve path,
`prepare_one` and `start`; each write its own transaction, as a lone caller's; the reply built
and serialized), warm and with the caches swept (SWEEP_L2S times the core's L2 cache read between
calls, not timed), for the goal-2 mix and for a read (an exact name), a first-seen form (a case
variant, which records a surface form) and a new name alone. The echo's handler (its canned
reply built and serialized) is timed the same way. Figures are net of the timer's own cost,
measured the same way.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, Row, child_env, median

KINDS: dict[str, dict[str, float] | None] = {
    "goal mix": None,  # bench_unary.MIX
    "read (exact)": {"exact": 1.0},
    "first-seen form (case)": {"case": 1.0},
    "new name": {"new": 1.0},
}
SWEEP_L2S = 2
GROUP = 1  # writes a transaction: a lone caller's, each write committed on its own


def l2_bytes() -> int:
    """The core's L2 cache (sysfs), or 2 MiB where the kernel does not say."""
    try:
        for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
            if (index / "level").read_text().strip() == "2":
                size = (index / "size").read_text().strip()
                scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1], 1)
                return int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return 2 << 20


def run(db: Path, n: int, work: Path, *, calls: int, passes: int,
        timeout_s: float = 600) -> Row:
    """Measure in a child over a copy of the store `db` of n entities; one report row."""
    from benchmarks.data import copy_store

    copy = copy_store(db, work / "cold.sqlite")
    argv = [sys.executable, "-m", "benchmarks.bench_cold", "--db", str(copy), "--source-db",
            str(db), "--n", str(n), "--calls", str(calls), "--passes", str(passes)]
    try:
        proc = subprocess.run(argv, check=False, capture_output=True, text=True,
                              timeout=timeout_s, cwd=ROOT, env=child_env())
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        error = "" if lines else " | ".join(proc.stderr.strip().splitlines()[-3:])
    except subprocess.TimeoutExpired:
        lines, error = [], f"timed out after {timeout_s:.0f} s"
    if not lines:
        return Row("2 handler cold", "the Resolve handler in-process, warm and cold caches",
                   f"failed: {error}", "", None, "report", None)
    out: dict[str, Any] = json.loads(lines[-1])
    ours, echo = out["ours"], out["echo"]
    mix = ours["goal mix"]
    kinds = "; ".join(f"{k} {v['warm_us']:.0f} -> {v['cold_us']:.0f}"
                      for k, v in ours.items() if k != "goal mix")
    return Row(
        "2 handler cold",
        f"the Resolve handler's work per call in-process ({n:,} entities; writes {GROUP} a "
        f"transaction; reply serialized), warm vs with {out['sweep_bytes'] >> 20} MiB read "
        f"between calls (caches cold, as a served call finds them); ratio: cold / warm, "
        f"goal mix",
        f"goal mix {mix['warm_us']:.0f} µs warm, {mix['cold_us']:.0f} µs cold; {kinds} µs",
        f"echo's handler {echo['warm_us']:.1f} µs warm, {echo['cold_us']:.1f} µs cold",
        mix["cold_us"] / mix["warm_us"], "report", None, out)


def handler(service: Any) -> tuple[Callable[[tuple[str, str, str]], None], Callable[[], None]]:
    """Resolve's handler (servicer.Resolve) without gRPC, over an IdentityService's public
    resolve path: `resolve(mention)` is checked and parsed, answered from the index or written
    through the write queue (at once: nothing else is queued), and its reply serialized;
    `flush()` has nothing left to write."""
    from identity_server.servicer import resolve_response

    def resolve(m: tuple[str, str, str]) -> None:
        outcome = service.start(service.prepare_one(m[0], m[1]), may_wait=False)
        reply = outcome if hasattr(outcome, "results") else outcome.result()
        resolve_response(reply.results[0]).SerializeToString()

    def flush() -> None:
        return None

    return resolve, flush


def measure(db: Path, source: Path, n: int, *, calls: int, passes: int) -> dict[str, Any]:
    """In the child: build the service, then time each kind's handler work warm and cold, in
    passes alternating the two, on fresh mentions each pass (writes change what repeats do)."""
    from benchmarks.bench_unary import MIX
    from benchmarks.data import mention_mix, sample_entities
    from benchmarks.echo import canned
    from identity_server.server import build_service
    from identity_server.settings import Settings

    service = build_service(Settings(db_url=f"sqlite:///{db}"))
    pool = sample_entities(source, n, 20_000, seed=5)
    sweep = bytes(SWEEP_L2S * l2_bytes())

    def cool() -> None:
        sweep.count(b"\x01")  # reads every byte: what the core cached before is evicted

    def timed(work: Callable[[Any], object], items: Sequence[Any], cold: bool) -> float:
        """Mean thread CPU µs of work(item), net of the timer's own cost."""
        clock = time.thread_time
        spent = idle = 0.0
        for item in items:
            if cold:
                cool()
            t0 = clock()
            t1 = clock()
            work(item)
            t2 = clock()
            idle += t1 - t0
            spent += t2 - t1
        return (spent - idle) / len(items) * 1e6

    resolve, flush = handler(service)

    ours: dict[str, dict[str, float]] = {}
    seed = 0
    for label, weights in KINDS.items():
        got: dict[str, list[float]] = {"warm": [], "cold": []}
        for p in range(passes):
            for mode in (("warm", "cold") if p % 2 == 0 else ("cold", "warm")):
                seed += 1
                items = mention_mix(pool, calls, weights or MIX, seed=90_000 + seed)
                got[mode].append(timed(resolve, items, mode == "cold"))
                flush()
        ours[label] = {"warm_us": median(got["warm"]), "cold_us": median(got["cold"])}
    items = mention_mix(pool, calls, MIX, seed=99_999)
    echo = {f"{mode}_us": median([timed(lambda m: canned(m[0], m[1]).SerializeToString(),
                                        items, mode == "cold") for _ in range(passes)])
            for mode in ("warm", "cold")}
    service.close()
    return {"n": n, "calls": calls, "passes": passes, "group": GROUP,
            "sweep_bytes": len(sweep), "ours": ours, "echo": echo}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", type=Path, required=True, help="a copy of the store: written")
    parser.add_argument("--source-db", type=Path, required=True, help="the store, sampled")
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    result = measure(args.db, args.source_db, args.n, calls=args.calls, passes=args.passes)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
