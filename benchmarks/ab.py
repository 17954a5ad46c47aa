"""Two versions of the identity server side by side: this checkout's and another checkout's.

A full suite run before a change and another after it differ by the host's drift as much as by
the change (figures move by a third within the hour on these hosts). Here both servers run at
once, each over its own copy of one generated store, and each round drives the same fresh
requests through both, in alternating order; the ratio is the median of the rounds' ratios. The
other checkout needs a venv of its own with the project installed (`OTHER/.venv`).

    .venv/bin/python -m benchmarks.ab --other ../before --n 1000000 --load unary
    .venv/bin/python -m benchmarks.ab --other ../before --load batch --size 1000 --callers 4
    .venv/bin/python -m benchmarks.ab --other . --other-core reference --load batch

`--this-core` and `--other-core` set a side's IDENTITY_CORE (the last line compares this
checkout's compiled core with its reference core).

Loads: `unary` (goal 2's mix, fresh mentions), `reads` (the same mentions resolved once before
the round, untimed), `mostly-reads` (95% of the round resolved before it, 5% fresh mentions that
write), `batch` (ResolveBatch of --size with fresh context ids, goal 1's mix).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_batch import MIX as BATCH_MIX
from benchmarks.bench_unary import MIX as UNARY_MIX
from benchmarks.common import ROOT, ServerProcess, drive, median
from benchmarks.data import Stored, build_store, copy_store, mention_mix, sample_entities
from benchmarks.grpc_load import Client, batch_requests, unary_requests
from identity_server.core import CHOICES

CALL_TIME_CAP_S = 30.0


def server(checkout: Path, store: Path, copy: Path, core: str | None) -> ServerProcess:
    copy_store(store, copy)
    env = {**os.environ, "IDENTITY_CORE": core} if core else None
    return ServerProcess([str(checkout / ".venv" / "bin" / "identity-server"), "--log-level",
                          "warning", "serve", "--db", f"sqlite:///{copy}", "--port", "0"],
                         name=checkout.name, env=env)


def rounds_of(load: str, pool: Sequence[Stored], *, size: int,
              r: int) -> tuple[list[Any], list[Any], str]:
    """One round's untimed warm-up requests, timed requests and the client method to call."""
    if load == "batch":
        mentions = mention_mix(pool, max(2000, size * 4), BATCH_MIX, seed=5000 + r)
        return [], batch_requests(mentions, size, f"ab-{time.time()}-{r}"), "resolve_batch"
    if load == "unary":
        return [], unary_requests(mention_mix(pool, 3000, UNARY_MIX, seed=1000 + r)), "resolve"
    seen = mention_mix(pool, 2850 if load == "mostly-reads" else 3000, UNARY_MIX, seed=1000 + r)
    timed = list(seen)
    if load == "mostly-reads":
        writing = [m for m in mention_mix(pool, 1000, UNARY_MIX, seed=90_000 + r)
                   if m[2] not in ("exact", "alias")]
        timed += writing[:150]
        random.Random(r).shuffle(timed)
    return unary_requests(seen), unary_requests(timed), "resolve"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--other", type=Path, required=True, help="the other checkout")
    ap.add_argument("--n", type=int, default=1_000_000, help="entities in the store")
    ap.add_argument("--load", choices=("unary", "reads", "mostly-reads", "batch"),
                    default="unary")
    ap.add_argument("--size", type=int, default=100, help="mentions a batch (--load batch)")
    ap.add_argument("--callers", type=int, help="concurrent callers (default 16; batch 4)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--this-core", choices=CHOICES, help="IDENTITY_CORE of this side's server")
    ap.add_argument("--other-core", choices=CHOICES, help="IDENTITY_CORE of the other side's")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out")
    args = ap.parse_args()
    callers = args.callers or (4 if args.load == "batch" else 16)
    units = args.size if args.load == "batch" else 1
    store = build_store(args.out, args.n)
    pool = sample_entities(store, args.n, 20_000, seed=5)
    work = args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    sides = {"this": ROOT, "other": args.other.resolve()}
    rates: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    with server(sides["this"], store, work / "ab-this.sqlite", args.this_core) as a, \
            server(sides["other"], store, work / "ab-other.sqlite", args.other_core) as b, \
            Client(a.address, a.pid) as this, Client(b.address, b.pid) as other:
        clients = {"this": this, "other": other}
        for r in range(args.rounds):
            order = ("this", "other") if r % 2 == 0 else ("other", "this")
            warm, timed, method = rounds_of(args.load, pool, size=args.size, r=r)
            for side in order:
                call: Callable[[Any], Any] = getattr(clients[side], method)
                if warm:
                    drive(call, warm, concurrency=callers, time_cap_s=CALL_TIME_CAP_S)
            for side in order:
                call = getattr(clients[side], method)
                got = drive(call, timed, concurrency=callers, time_cap_s=CALL_TIME_CAP_S,
                            server_pid=clients[side].pid)
                rates[side].append(got.completed * units / got.elapsed_s)
                cpu[side].append(got.cpu_us_each(units)[0])
            print(f"round {r}: this/other {rates['this'][-1] / rates['other'][-1]:.3f}",
                  file=sys.stderr)
    ratios = [x / y for x, y in zip(rates["this"], rates["other"], strict=True)]
    unit = "items" if units > 1 else "calls"
    print(f"{args.load}{f' {args.size}' if units > 1 else ''}, {callers} callers, {args.n:,} "
          f"entities: this {median(rates['this']):,.0f} {unit}/s ({median(cpu['this']):.0f} us "
          f"server CPU each), other {median(rates['other']):,.0f} {unit}/s "
          f"({median(cpu['other']):.0f} us); this / other: {median(ratios):.3f} (rounds "
          f"{', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()
