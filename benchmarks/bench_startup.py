"""Goal 4: start-up - building the in-memory index from the store.

Two figures at the large store size: the in-process build of the identity service (timed in the
core benchmark's child, `build_service`, which loads every entity into the NameIndex), and the
time until a separate `identity-server serve` process prints `listening on`. The baseline is the
floor of any loader: reading the same entity and name rows with plain sqlite3 (fetchall, no
objects built).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Row, median

GOAL_S = 30.0


def raw_read_s(db: Path, repeats: int = 2) -> float:
    """Median seconds to fetch every entities row and every names row with sqlite3."""
    times = []
    for _ in range(repeats):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        t = time.perf_counter()
        con.execute("SELECT * FROM entities ORDER BY entity_id").fetchall()
        con.execute("SELECT entity_id, display, kind, position FROM names "
                    "ORDER BY entity_id").fetchall()
        times.append(time.perf_counter() - t)
        con.close()
    return median(times)


def rows(n: int, core_point: dict[str, Any] | None, serve_startup_s: float | None,
         raw_s: float) -> list[Row]:
    out = []
    if core_point is not None and core_point.get("fit"):
        build = float(core_point["build_s"])
        out.append(Row(
            "4 start-up build", f"IdentityService index built from the store, {n:,} entities",
            f"{build:.1f} s", f"sqlite3 read of the rows {raw_s:.1f} s", build / raw_s,
            f"< {GOAL_S:.0f} s", build < GOAL_S, {"build_s": build, "raw_read_s": raw_s}))
    if serve_startup_s is not None:
        out.append(Row(
            "4 start-up serve", f"`identity-server serve` to `listening on`, {n:,} entities",
            f"{serve_startup_s:.1f} s", f"sqlite3 read of the rows {raw_s:.1f} s",
            serve_startup_s / raw_s, f"< {GOAL_S:.0f} s", serve_startup_s < GOAL_S,
            {"serve_startup_s": serve_startup_s}))
    return out
