"""Report row: what a much-mentioned entity's new spelling costs as its spellings pile up.

In a large corpus one entity can gather thousands of spellings: every case or punctuation form
seen for the first time converges on it and is recorded as a surface form. Here, in-process (no
gRPC) on a fresh store that also holds a placeholder (writes look for placeholders near what
they change), one entity takes case variants of its name one at a time through
`IdentityService.resolve`, each a first-seen spelling that is written. The figure is the median
time of such a resolve once the entity has 5,000 spellings; the baseline is the same entity at
100, in the same run. A ratio near 1 means the cost does not grow with the entity's spellings.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from benchmarks.common import Row, fmt_us, median
from identity_server.domain import MatchKind
from identity_server.server import build_service
from identity_server.settings import Settings

SPELLINGS = (100, 5_000)  # the baseline's count, then the figure's
WINDOW = 50  # resolves timed at each count
NAME = "Severe Acute Respiratory Syndrome Coronavirus"


def run(work: Path, seed: int = 7) -> Row:
    db = work / "spellings.sqlite"
    for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        stale.unlink(missing_ok=True)
    service = build_service(Settings(db_url=f"sqlite:///{db}"))
    timings: dict[int, list[float]] = {n: [] for n in SPELLINGS}
    try:
        service.resolve("Mercury", "other")
        planet = service.resolve("Mercury Planet", "other")
        service.add_alias(planet.entity_id, "Mercury")
        if service.resolve("mercury", "other").match_kind is not MatchKind.AMBIGUOUS:
            raise RuntimeError("the placeholder was not made")
        entity = service.resolve(NAME, "other").entity_id
        rng = random.Random(seed)
        seen = {NAME}
        recorded = 0  # spellings the entity has besides its name
        while recorded < SPELLINGS[-1] + WINDOW:
            spelling = "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in NAME)
            if spelling in seen:
                continue
            seen.add(spelling)
            started = time.perf_counter()
            got = service.resolve(spelling, "other")
            took = time.perf_counter() - started
            if got.entity_id != entity or got.match_kind is not MatchKind.CASE:
                raise RuntimeError(f"{spelling!r} resolved to {got.entity_id} ({got.match_kind})")
            for n in SPELLINGS:
                if n <= recorded < n + WINDOW:
                    timings[n].append(took)
            recorded += 1
    finally:
        service.close()
    small, large = (median(timings[n]) * 1e6 for n in SPELLINGS)
    return Row(
        "3 much-mentioned spelling",
        f"in-process Resolve of a first-seen case form of one entity (written as a surface form), "
        f"median of {WINDOW}, once it has {SPELLINGS[-1]:,} spellings, against the same at "
        f"{SPELLINGS[0]:,} (a placeholder in the store)",
        f"{fmt_us(large)} at {SPELLINGS[-1]:,} spellings", f"{fmt_us(small)} at {SPELLINGS[0]:,}",
        large / small, "report", None,
        {"median_us": {str(n): median(timings[n]) * 1e6 for n in SPELLINGS}})
