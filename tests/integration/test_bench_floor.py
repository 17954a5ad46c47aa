"""Goal 2's store floor (benchmarks/echo.py's StoreWrites) stores what the identity server would
for a listed mention, once, on its first Resolve, and nothing for a mention it does not list:
the floor's figure only means something if it writes what the server writes."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.echo import StoreWrites
from identity_server.server import build_service
from identity_server.settings import Settings


def test_the_floor_writes_a_listed_mentions_rows_once(tmp_path: Path) -> None:
    db = tmp_path / "identity.sqlite"
    service = build_service(Settings(db_url=f"sqlite:///{db}"))
    stored = service.resolve("Mem-Castle", "method")  # a provisional entity, as in a store
    service.close()
    listed = tmp_path / "writes.jsonl"
    listed.write_text("".join(json.dumps(m) + "\n" for m in (
        ["mem castle", "method", "case", stored.entity_id],
        ["Quorvex  Suite", "dataset", "new", ""],
        ["mem castle", "method", "case", stored.entity_id],  # listed twice: stored once
    )), encoding="utf-8")

    floor = StoreWrites(db, listed)
    try:
        for _ in range(2):  # the second Resolve of each finds its form recorded: no write
            floor.write("mem castle", "method")
            floor.write("Quorvex  Suite", "dataset")
            floor.write("Mem-Castle", "method")  # not listed: reads only
        with floor.store.read() as tx:
            forms = [r.display for r in tx.name_rows(stored.entity_id)]
            changes = [(c.kind, c.entity_id) for c in tx.changes_after(0)]
            new_id = changes[-1][1]
            new_names = [(r.display, r.kind) for r in tx.name_rows(new_id)]
            new_entity = tx.load_entities([new_id])[new_id]
    finally:
        floor.store.close()

    assert forms == ["Mem-Castle", "mem castle"]
    assert changes == [("created", stored.entity_id),
                       ("surface_form_added", stored.entity_id),
                       ("created", new_id)]
    assert new_names == [("Quorvex Suite", "name")]  # the display form, as the server stores it
    assert new_entity.entity_type == "dataset" and new_entity.ordinal == 2
