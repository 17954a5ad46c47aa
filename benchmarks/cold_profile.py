"""Count what a Resolve costs with the core's caches cold, under callgrind's cache simulation.

`bench_cold` times the handler cold on the machine, which drifts by a third within the hour;
this counts it: instructions, and misses of a simulated 32 KiB L1 and 2 MiB L2 (the last level
simulated, so its misses are what a served call pays for going out to L3). The same code and
inputs give the same counts whatever else the machine does, so two versions of the code can be
compared to a few percent. Each unit of work runs inside `sys.call_tracing`, the only
function whose cost callgrind collects (`--toggle-collect`); before each, a sweep of 4 MiB
(not collected) evicts what the previous one left in the simulated caches.

    out=benchmarks/out/cold.callgrind
    valgrind --tool=callgrind --cache-sim=yes --I1=32768,8,64 --D1=49152,12,64 \\
        --LL=2097152,16,64 --toggle-collect=sys_call_tracing --callgrind-out-file=$out \\
        .venv/bin/python -m benchmarks.cold_profile run --store STORE --n N --work mix
    .venv/bin/python -m benchmarks.cold_profile summary $out

STORE is a generated store (`benchmarks/out/stores/identity-100000-20240601.sqlite` after a
run); it is copied before any write. `--work`: `mix` (the goal-2 mix, writes two to a
transaction as at 16 callers), one kind of mention (`exact`, `case`, `punctuation`, `alias`,
`typo`, `new`), or `tx` (a store write transaction of one row). The summary prints, per unit,
instructions, L1 and L2 misses, and an estimate in cycles: instructions + 12 a L1 miss + 60 a
L2 miss (this host's L2 and L3 latencies, roughly). Under valgrind, building a 100k index
takes about a minute; 400 units about another.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

SWEEP_BYTES = 4 << 20
L1_MISS_CYCLES = 12
L2_MISS_CYCLES = 60


def run(store: Path, n: int, work: str, units: int) -> None:
    from benchmarks.bench_cold import handler
    from benchmarks.bench_unary import MIX
    from benchmarks.data import mention_mix, sample_entities
    from identity_server.server import build_service
    from identity_server.settings import Settings

    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "store.sqlite"
        shutil.copyfile(store, copy)
        service = build_service(Settings(db_url=f"sqlite:///{copy}"))
        pool = sample_entities(store, n, 20_000, seed=3)
        resolve, flush = handler(service)

        def write_row(i: int) -> None:
            with service.store.write() as tx:
                tx.put_batch_reply(f"cold-{i}", "[]", now=0.0)

        step: Any
        warm: list[Any]
        items: list[Any]
        if work == "tx":
            step, warm, items = write_row, list(range(-50, 0)), list(range(units))
        else:
            weights = MIX if work == "mix" else {work: 1.0}
            step = resolve
            warm = mention_mix(pool, 50, weights, seed=11)
            items = mention_mix(pool, units, weights, seed=12)
        for item in warm:
            step(item)
        sweep = bytes(SWEEP_BYTES)
        for item in items:
            sweep.count(b"\x01")  # reads every byte: evicts what the last unit left
            sys.call_tracing(step, (item,))
        flush()
        service.close()
    print(f"units {units}", file=sys.stderr)


def summary(out: Path, units: int) -> str:
    events: list[str] = []
    totals: list[int] = []
    for line in out.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")):
            totals = [int(x) for x in line.split()[1:]]
            break
    got = dict(zip(events, totals, strict=False))
    l1 = got.get("I1mr", 0) + got.get("D1mr", 0) + got.get("D1mw", 0)
    l2 = got.get("ILmr", 0) + got.get("DLmr", 0) + got.get("DLmw", 0)
    cycles = got.get("Ir", 0) + L1_MISS_CYCLES * l1 + L2_MISS_CYCLES * l2
    return (f"per unit: {got.get('Ir', 0) / units:,.0f} instructions, {l1 / units:,.0f} L1 "
            f"misses, {l2 / units:,.0f} L2 misses (instructions {got.get('ILmr', 0) / units:,.0f}"
            f"), ~{cycles / units:,.0f} cycles")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="the measured work (run it under valgrind)")
    r.add_argument("--store", type=Path, required=True)
    r.add_argument("--n", type=int, required=True, help="the store's entity count")
    r.add_argument("--work", default="mix",
                   choices=("mix", "tx", "exact", "case", "punctuation", "alias", "typo", "new"))
    r.add_argument("--units", type=int, default=400)
    s = sub.add_parser("summary", help="per-unit counts from callgrind's output file")
    s.add_argument("out", type=Path)
    s.add_argument("--units", type=int, default=400)
    args = parser.parse_args()
    if args.command == "run":
        run(args.store, args.n, args.work, args.units)
    else:
        print(summary(args.out, args.units))


if __name__ == "__main__":
    main()
