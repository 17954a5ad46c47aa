"""Generated data for the benchmarks: identity stores of N entities, mention mixes, papers.

Stores are written through the store's own interface (`identity_server.store`: a write
transaction's `insert_entities` and `put_names_of`, a large part at a time), holding exactly what
the server loads, so a million entities take seconds (importing them through the service, with
its change feed and import merges, would take minutes). Built stores are cached under
`<out>/stores/`, keyed by size and seed; benchmarks that write use a copy.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.names import (
    NameRecord,
    case_variant,
    names,
    new_name,
    punctuation_variant,
    typo_variant,
)
from identity_server.domain import Entity, NameKind, NameRow, Status
from identity_server.store import open_store

logger = logging.getLogger(__name__)

SEED = 20240601
CHUNK = 50_000


def entity_id(ordinal: int) -> str:
    """Authority-style ids (never the provisional prefix)."""
    return f"E{ordinal:09d}"


def store_path(out: Path, n: int, seed: int = SEED) -> Path:
    return out / "stores" / f"identity-{n}-{seed}.sqlite"


def build_store(out: Path, n: int, seed: int = SEED) -> Path:
    """The cached store of n generated canonical entities (built when missing)."""
    path = store_path(out, n, seed)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".building")
    tmp.unlink(missing_ok=True)
    started = time.perf_counter()
    store = open_store(f"sqlite:///{tmp}")
    try:
        now = time.time()
        entities: list[Entity] = []
        rows: list[tuple[str, NameRow]] = []

        def flush() -> None:
            with store.write() as tx:
                tx.insert_entities(entities, now=now)
                tx.put_names_of(rows)
            entities.clear()
            rows.clear()

        for i, rec in enumerate(names(n, seed=seed), start=1):
            eid = entity_id(i)
            entities.append(Entity(eid, rec.entity_type, Status.CANONICAL, i))
            rows.append((eid, NameRow(rec.display, NameKind.NAME.value, 0, "authority")))
            if rec.alias is not None:
                rows.append((eid, NameRow(rec.alias, NameKind.ALIAS.value, 1, "authority")))
            if len(entities) >= CHUNK:
                flush()
        flush()
    finally:
        store.close()
    if Path(f"{tmp}-wal").exists():  # the last connection's close checkpoints and removes it
        raise RuntimeError(f"{tmp}: the store left its WAL behind; not cached")
    tmp.rename(path)
    logger.info("built store of %d entities in %.1f s: %s", n, time.perf_counter() - started, path)
    return path


def copy_store(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(str(dst) + suffix).unlink(missing_ok=True)
    shutil.copyfile(src, dst)
    return dst


@dataclass(frozen=True, slots=True)
class Stored:
    """An entity of a generated store, as sampled for mentions."""

    entity_id: str
    entity_type: str
    name: str
    alias: str | None


def sample_entities(db: Path, n_entities: int, k: int, *, seed: int) -> list[Stored]:
    """k distinct random entities of the store (by ordinal), with their name and alias."""
    rng = random.Random(f"sample-{seed}-{k}")
    ordinals = rng.sample(range(1, n_entities + 1), min(k, n_entities))
    store = open_store(f"sqlite:///{db}")
    try:
        with store.read() as tx:
            found = tx.load_entities(entity_id(i) for i in ordinals)
    finally:
        store.close()
    out: list[Stored] = []
    for i in ordinals:
        e = found[entity_id(i)]
        alias = next((n.display for n in e.names if n.kind is NameKind.ALIAS), None)
        out.append(Stored(e.entity_id, e.entity_type, e.name, alias))
    return out


KINDS = ("exact", "case", "punctuation", "alias", "typo", "new")


def mention_of(kind: str, e: Stored, rng: random.Random) -> tuple[str, str] | None:
    """A mention of entity e that should resolve with match kind `kind` (None: e cannot)."""
    if kind == "exact":
        return e.name, e.entity_type
    if kind == "case":
        return case_variant(e.name), e.entity_type
    if kind == "punctuation":
        return punctuation_variant(e.name), e.entity_type
    if kind == "alias":
        return (e.alias, e.entity_type) if e.alias else None
    if kind == "typo":
        t = typo_variant(e.name, rng)
        return (t, e.entity_type) if t else None
    if kind == "new":
        return new_name(rng)
    raise ValueError(kind)


def mention_mix(pool: Sequence[Stored], count: int, weights: dict[str, float], *,
                seed: int) -> list[tuple[str, str, str]]:
    """count (text, type, intended kind) mentions, kinds drawn by weight, entities from pool."""
    return [(text, etype, kind) for text, etype, kind, _ in
            mention_mix_of(pool, count, weights, seed=seed)]


def mention_mix_of(pool: Sequence[Stored], count: int, weights: dict[str, float], *,
                   seed: int) -> list[tuple[str, str, str, Stored]]:
    """mention_mix with the entity each mention was drawn from (unrelated for "new" ones)."""
    rng = random.Random(f"mix-{seed}-{count}")
    kinds = list(weights)
    out: list[tuple[str, str, str, Stored]] = []
    while len(out) < count:
        kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
        entity = rng.choice(pool)
        m = mention_of(kind, entity, rng)
        if m is not None:
            out.append((m[0], m[1], kind, entity))
    return out


def mentions_of_kind(pool: Sequence[Stored], kind: str, count: int, *,
                     seed: int) -> list[tuple[str, str]]:
    return [(t, ty) for t, ty, _ in mention_mix(pool, count, {kind: 1.0}, seed=seed)]


PREDICATES = ("uses", "evaluated on", "makes use of", "improves_on", "part of", "outperforms",
              "related to", "inspired by", "affiliated with", "located in", "authored")
PAPER_MIX = {"exact": 0.35, "case": 0.08, "punctuation": 0.06, "alias": 0.06, "typo": 0.05,
             "recurring_new": 0.40}


def papers(pool: Sequence[Stored], n: int, *, seed: int, mentions_per_paper: int = 25,
           relationships_per_paper: int = 15) -> Iterator[dict[str, object]]:
    """Papers in the input shape of SPEC section 6. Entities recur across papers (a skewed draw
    from pool); 40% of mentions name things no store holds, from a recurring pool of new names."""
    rng = random.Random(f"papers-{seed}")
    fresh = [new_name(rng) for _ in range(max(100, n * 2))]
    kinds = list(PAPER_MIX)
    weights = [PAPER_MIX[k] for k in kinds]
    for p in range(n):
        mentions: list[dict[str, object]] = []
        while len(mentions) < mentions_per_paper:
            kind = rng.choices(kinds, weights)[0]
            if kind == "recurring_new":
                text, etype = fresh[int(rng.paretovariate(1.1) * 3) % len(fresh)]
            else:
                e = pool[int(rng.paretovariate(1.1) * 5) % len(pool)]
                m = mention_of(kind, e, rng)
                if m is None:
                    continue
                text, etype = m
            at = len(mentions) * 48
            mentions.append({"id": f"m{len(mentions)}", "text": text, "type": etype,
                             "span": [at, at + len(text)]})
        rels = []
        for r in range(relationships_per_paper):
            a, b = rng.sample(range(mentions_per_paper), 2)
            rels.append({"subject": f"m{a}", "predicate": rng.choice(PREDICATES),
                         "object": f"m{b}", "confidence": round(rng.uniform(0.3, 1.0), 3),
                         "evidence": {"span": [r * 120, r * 120 + 80],
                                      "quote": f"In this work, m{a} {rng.choice(PREDICATES)} m{b} "
                                               f"(sentence {r} of paper {p})."}})
        yield {"paper_id": f"bench-{seed}-{p:07d}", "revision": "1", "mentions": mentions,
               "relationships": rels}


def write_papers(out: Path, store: Path, n_entities: int, n: int, seed: int = SEED) -> Path:
    """The cached JSON Lines file of n papers over the store's entities."""
    path = out / "papers" / f"papers-{n}-{n_entities}-{seed}.jsonl"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    pool = sample_entities(store, n_entities, min(20_000, n_entities), seed=seed)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for paper in papers(pool, n, seed=seed):
            fh.write(json.dumps(paper, ensure_ascii=False) + "\n")
    tmp.rename(path)
    return path


def read_paper_batches(path: Path) -> list[tuple[str, list[tuple[str, str]]]]:
    """(paper id, [(text, type)]) per line: the ResolveBatch calls ingest makes for the file."""
    out = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            p = json.loads(line)
            out.append((p["paper_id"], [(m["text"], m["type"]) for m in p["mentions"]]))
    return out


__all__ = [
    "KINDS",
    "NameRecord",
    "Stored",
    "build_store",
    "copy_store",
    "mention_mix",
    "mentions_of_kind",
    "papers",
    "read_paper_batches",
    "sample_entities",
    "store_path",
    "write_papers",
]
