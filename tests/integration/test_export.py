"""`identity-server export`: every entity out as JSON Lines or Parquet; an export of canonical
entities imports into a fresh store as the same entities."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from identity_server.cli import main
from identity_server.server import build_service
from identity_server.settings import Settings

AUTHORITY = [
    {"id": "Q1", "name": "Graph Attention Network", "type": "method", "aliases": ["GAT"]},
    {"id": "Q2", "name": "Ada Lovelace", "type": "person", "aliases": ["Augusta Ada King"]},
    {"id": "Q3", "name": "ImageNet", "type": "dataset"},
]


def _store(path: Path) -> str:
    url = f"sqlite:///{path}"
    service = build_service(Settings(db_url=url))
    try:
        assert not service.import_lines([json.dumps(r) for r in AUTHORITY], "jsonl").errors
        service.add_alias("Q3", "Image Net")
        service.resolve("imagenet", "dataset")  # a surface form
        service.resolve("Quorbex Engine", "tool")  # a provisional entity
    finally:
        service.close()
    return url


def _entities(url: str) -> dict[str, tuple[str, str, str, tuple[str, ...]]]:
    service = build_service(Settings(db_url=url))
    try:
        out = {}
        for e in service.index.entities():
            if e.status.value == "canonical":
                aliases = tuple(n.display for n in e.names if n.kind.value == "alias")
                out[e.entity_id] = (e.name, e.entity_type, e.status.value, aliases)
        return out
    finally:
        service.close()


def test_a_jsonl_export_imports_into_a_fresh_store_as_the_same_entities(
        tmp_path: Path) -> None:
    url = _store(tmp_path / "a.sqlite")
    out = tmp_path / "entities.jsonl"
    assert main(["export", str(out), "--db", url]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    by_id = {r["id"]: r for r in records}
    assert by_id["Q3"]["aliases"] == ["Image Net"] and by_id["Q3"]["surface_forms"] == ["imagenet"]
    provisional = [r for r in records if r["status"] == "provisional"]
    assert [r["name"] for r in provisional] == ["Quorbex Engine"]
    canonical = tmp_path / "canonical.jsonl"
    canonical.write_text("".join(json.dumps(r) + "\n" for r in records
                                 if r["status"] == "canonical"))
    fresh = f"sqlite:///{tmp_path / 'b.sqlite'}"
    assert main(["import", str(canonical), "--db", fresh]) == 0
    assert _entities(fresh) == _entities(url)


def test_a_parquet_export_holds_every_entity(tmp_path: Path) -> None:
    url = _store(tmp_path / "a.sqlite")
    out = tmp_path / "entities.parquet"
    assert main(["export", str(out), "--db", url]) == 0
    table = pq.read_table(out).to_pylist()
    assert {r["id"] for r in table} == {"Q1", "Q2", "Q3"} | {
        r["id"] for r in table if r["status"] == "provisional"}
    assert next(r for r in table if r["id"] == "Q1")["aliases"] == ["GAT"]
    assert not (tmp_path / "entities.parquet.partial").exists()


def test_export_of_a_store_that_is_not_there_says_so(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path / "x.jsonl"), "--db",
                 f"sqlite:///{tmp_path / 'missing.sqlite'}"]) == 2
    assert "no identity store at" in capsys.readouterr().err
    assert not (tmp_path / "missing.sqlite").exists()
