"""Goal 1: batched resolution against the echo service's ResolveBatch.

ResolveBatch requests of 1, 10, 100 and 1,000 mentions, each with its own context id (so evidence
is recorded and no reply is replayed), mix: 70% existing names (40% exact, 10% case, 10%
punctuation, 10% alias), 15% single typos, 15% new names. The same requests go to the identity
server (a separate `identity-server serve` process over the large store) and to the echo service
(same gRPC stack, canned replies), from `concurrency` caller threads. Each round sends fresh
mentions; the figure is the median of the rounds' items/s.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.common import Row, drive, fmt_rate, median
from benchmarks.data import Stored, mention_mix
from benchmarks.grpc_load import Client, batch_requests

MIX = {"exact": 0.40, "case": 0.10, "punctuation": 0.10, "alias": 0.10, "typo": 0.15,
       "new": 0.15}
GOAL_SIZE = 100
GOAL_RATIO = 0.5


def measure(client: Client, pool: Sequence[Stored], *, size: int, items: int, rounds: int,
            concurrency: int, tag: str, time_cap_s: float) -> dict[str, object]:
    per_round: list[float] = []
    errors = 0
    for r in range(rounds):
        mentions = mention_mix(pool, max(items, size * concurrency), MIX,
                               seed=size * 1000 + r)
        requests = batch_requests(mentions, size, f"bench-batch-{tag}-{size}-{r}")
        result = drive(client.resolve_batch, requests, concurrency=concurrency,
                       time_cap_s=time_cap_s)
        errors += result.errors
        per_round.append(result.completed * size / result.elapsed_s)
    return {"items_per_s": median(per_round), "rounds": per_round, "errors": errors}


def run(server: Client, echo: Client, pool: Sequence[Stored], *, n_entities: int,
        sizes: Sequence[int], items: int, rounds: int, concurrency: int, run_tag: str,
        time_cap_s: float = 30.0) -> list[Row]:
    # Warm both up (connections, code paths) with mentions not used below.
    warm = batch_requests(mention_mix(pool, 200, MIX, seed=99), 20, f"bench-warm-{run_tag}")
    drive(server.resolve_batch, warm, concurrency=concurrency)
    drive(echo.resolve_batch, warm, concurrency=concurrency)
    out = []
    for size in sizes:
        got = measure(server, pool, size=size, items=items, rounds=rounds,
                      concurrency=concurrency, tag=f"{run_tag}-srv", time_cap_s=time_cap_s)
        base = measure(echo, pool, size=size, items=items, rounds=rounds,
                       concurrency=concurrency, tag=f"{run_tag}-echo", time_cap_s=time_cap_s)
        ratio = float(got["items_per_s"]) / float(base["items_per_s"])  # type: ignore[arg-type]
        goal = size == GOAL_SIZE
        out.append(Row(
            f"1 batch {size}",
            f"ResolveBatch of {size}, 70/15/15 mix, context id, {n_entities:,} entities, "
            f"{concurrency} callers",
            fmt_rate(float(got["items_per_s"]), " items/s"),  # type: ignore[arg-type]
            f"echo {fmt_rate(float(base['items_per_s']), ' items/s')}",  # type: ignore[arg-type]
            ratio, f">= {GOAL_RATIO}x echo" if goal else "report",
            ratio >= GOAL_RATIO if goal else None,
            {"server": got, "echo": base}))
    return out
