"""Goal 1: batched resolution against the echo service's ResolveBatch.

ResolveBatch requests of 1, 10, 100 and 1,000 mentions, each with its own context id (so evidence
is recorded and no reply is replayed), mix: 70% existing names (40% exact, 10% case, 10%
punctuation, 10% alias), 15% single typos, 15% new names. The same requests go to the identity
server (a separate `identity-server serve` process over the large store) and to the echo service
(same gRPC stack, canned replies), from `concurrency` caller threads, in rounds alternating
between the two. Each round sends fresh mentions; the figures are the medians of the rounds'
items/s, the ratio the median of the rounds' ratios.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import LoadResult, Row, cpu_medians, drive, fmt_rate, median
from benchmarks.data import Stored, mention_mix, mention_mix_of
from benchmarks.grpc_load import Client, batch_requests
from benchmarks.writes import Rows
from identity_server.store import Tx, open_store

MIX = {"exact": 0.40, "case": 0.10, "punctuation": 0.10, "alias": 0.10, "typo": 0.15,
       "new": 0.15}
GOAL_SIZE = 100
GOAL_RATIO = 0.5


def side_by_side(server: Client, echo: Client, pool: Sequence[Stored], *, size: int,
                 items: int, rounds: int, concurrency: int, tag: str,
                 time_cap_s: float) -> tuple[dict[str, object], dict[str, object], float]:
    """Rounds alternating between the server and the echo, each round fresh mentions (the same
    for both) under fresh context ids; the ratio is the median of the rounds' ratios, so drift
    between rounds cancels."""
    results: dict[str, list[LoadResult]] = {"server": [], "echo": []}
    for r in range(rounds):
        mentions = mention_mix(pool, max(items, size * concurrency), MIX,
                               seed=size * 1000 + r)
        for side, client in (("server", server), ("echo", echo)):
            requests = batch_requests(mentions, size, f"bench-batch-{tag}-{side}-{size}-{r}")
            results[side].append(drive(client.resolve_batch, requests, concurrency=concurrency,
                                       time_cap_s=time_cap_s, server_pid=client.pid))

    def rates(side: str) -> list[float]:
        return [res.completed * size / res.elapsed_s for res in results[side]]

    def summary(side: str) -> dict[str, object]:
        """Medians over rounds of items/s and of CPU µs per item (the server process, and this
        one's load threads)."""
        return {"items_per_s": median(rates(side)), "rounds": rates(side),
                "errors": sum(res.errors for res in results[side]),
                **cpu_medians(results[side], size, per="item")}

    ratio = median([g / b for g, b in zip(rates("server"), rates("echo"), strict=True)])
    return summary("server"), summary("echo"), ratio


def run(server: Client, echo: Client, pool: Sequence[Stored], *, n_entities: int,
        sizes: Sequence[int], items: int, rounds: int, concurrency: int, run_tag: str,
        time_cap_s: float = 30.0) -> list[Row]:
    # Warm both up (connections, code paths) with mentions not used below.
    warm = batch_requests(mention_mix(pool, 200, MIX, seed=99), 20, f"bench-warm-{run_tag}")
    drive(server.resolve_batch, warm, concurrency=concurrency)
    drive(echo.resolve_batch, warm, concurrency=concurrency)
    out = []
    for size in sizes:
        got, base, ratio = side_by_side(server, echo, pool, size=size, items=items,
                                        rounds=rounds, concurrency=concurrency, tag=run_tag,
                                        time_cap_s=time_cap_s)
        goal = size == GOAL_SIZE
        out.append(Row(
            f"1 batch {size}",
            f"ResolveBatch of {size}, 70/15/15 mix, context id, {n_entities:,} entities, "
            f"{concurrency} callers, rounds alternating with the echo (ratio: median of the "
            f"rounds')",
            f"{fmt_rate(float(got['items_per_s']), ' items/s')}, "  # type: ignore[arg-type]
            f"server CPU {got['server_cpu_us_per_item']:,.0f} µs/item",
            f"echo {fmt_rate(float(base['items_per_s']), ' items/s')}, "  # type: ignore[arg-type]
            f"{base['server_cpu_us_per_item']:,.0f} µs/item",
            ratio, f">= {GOAL_RATIO}x echo" if goal else "report",
            ratio >= GOAL_RATIO if goal else None,
            {"server": got, "echo": base}))
    return out


# -- goal 1's floor: the store's own writes ---------------------------------------------------------

class _BatchWrites:
    """The rows one ResolveBatch with a context id writes, every decision made in advance: those
    of its mentions (`benchmarks.writes`), an evidence row per mention, and the stored reply."""

    def __init__(self, context: str, mentions: Sequence[tuple[str, str, str, Stored]],
                 first_ordinal: int, first_seq: int, now: float) -> None:
        self.context = context
        self.rows = Rows()
        reply = []
        for text, etype, kind, stored in mentions:
            entity_id = self.rows.add(text, etype, kind, stored.entity_id,
                                      ordinal=first_ordinal + len(self.rows.entities),
                                      seq=first_seq + len(self.rows.changes), now=now,
                                      context_id=context)
            reply.append({"id": entity_id, "kind": kind, "status": "canonical", "created": False,
                          "matched": stored.name, "candidates": [entity_id], "linked": []})
        self.reply = json.dumps(reply, ensure_ascii=False)
        self.request_hash = hashlib.sha256(f"{context}{mentions}".encode()).hexdigest()

    def write(self, tx: Tx, now: float) -> None:
        self.rows.write(tx, now)
        tx.put_batch_reply(self.request_hash, self.reply, now=now)


def store_floor(db: Path, pool: Sequence[Stored], *, n_entities: int, size: int, items: int,
                rounds: int, echo_items_per_s: float) -> Row:
    """The identity store's own cost under goal 1: the rows ResolveBatch requests of `size`
    write (same mix), every decision precomputed, written through the server's store layer
    (same statements and connection settings) in one transaction per request, from one thread
    with no gRPC and no matching. Its items/s against the echo batch's is the most any matching
    code on this store could reach."""
    store = open_store(f"sqlite:///{db}")
    try:
        with store.read() as tx:
            seq = tx.max_seq() + 1
        ordinal = n_entities + 1
        per_round: list[float] = []
        for r in range(rounds):
            mentions = mention_mix_of(pool, max(items, size), MIX, seed=size * 1000 + 500 + r)
            now = time.time()
            batches = []
            for start in range(0, len(mentions), size):
                batch = _BatchWrites(f"bench-floor-{r}-{start}", mentions[start:start + size],
                                     ordinal, seq, now)
                ordinal += len(batch.rows.entities)
                seq += len(batch.rows.changes)
                batches.append(batch)
            began = time.perf_counter()
            for batch in batches:
                with store.write() as tx:
                    batch.write(tx, now)
            per_round.append(len(mentions) / (time.perf_counter() - began))
    finally:
        store.close()
    got = median(per_round)
    ratio = got / echo_items_per_s
    return Row(
        "1 batch floor",
        f"the store's writes alone for ResolveBatch of {size} (same mix; evidence, surface "
        f"forms, new entities, change feed, reply), decisions precomputed, one transaction a "
        f"request, no gRPC: the most matching code on this store could reach",
        fmt_rate(got, " items/s"), f"echo {fmt_rate(echo_items_per_s, ' items/s')}", ratio,
        "report", None, {"items_per_s": got, "rounds": per_round})
