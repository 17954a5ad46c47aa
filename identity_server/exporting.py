"""The entity table out: every entity of a store with its names, status and redirect, as JSON
Lines or Parquet (`identity-server export`), to join the graph in DuckDB with entity names.

A JSON Lines export of canonical entities is also an authority file: `id`, `name`, `type` and
`aliases` are the import's fields (the others it ignores), so importing it into a fresh store
gives the same entities back. Provisional ids are not an authority's: the import refuses them,
and a merged entity is exported with the entity it redirects to, not as one to import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from identity_server.domain import Entity, NameKind
from identity_server.store import SqlStore

FORMATS = ("jsonl", "parquet")
PARQUET_ROWS = 50_000  # rows a Parquet row group holds (memory stays flat over millions)


def entity_record(e: Entity) -> dict[str, Any]:
    return {
        "id": e.entity_id,
        "name": e.name if e.names else "",
        "type": e.entity_type,
        "aliases": [n.display for n in e.names if n.kind is NameKind.ALIAS],
        "status": e.status.value,
        "placeholder": e.placeholder,
        "redirect_to": e.redirect_to,
        "surface_forms": [n.display for n in e.names if n.kind is NameKind.SURFACE],
    }


def records(store: SqlStore) -> Iterator[dict[str, Any]]:
    """Every entity of the store, in id order, read in one snapshot."""
    with store.read() as tx:
        for entity in tx.iter_all_entities():
            yield entity_record(entity)


def export_jsonl(store: SqlStore, out: IO[str], progress: Callable[[int], object]) -> int:
    count = 0
    for record in records(store):
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        count += 1
        if count % 10_000 == 0:
            progress(10_000)
    progress(count % 10_000)
    return count


def export_parquet(store: SqlStore, path: Path, progress: Callable[[int], object]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("id", pa.string()), ("name", pa.string()), ("type", pa.string()),
        ("aliases", pa.list_(pa.string())), ("status", pa.string()), ("placeholder", pa.bool_()),
        ("redirect_to", pa.string()), ("surface_forms", pa.list_(pa.string())),
    ])
    count = 0
    partial = path.with_name(path.name + ".partial")
    with pq.ParquetWriter(partial, schema) as writer:
        chunk: list[dict[str, Any]] = []
        for record in records(store):
            chunk.append(record)
            if len(chunk) >= PARQUET_ROWS:
                writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
                count += len(chunk)
                progress(len(chunk))
                chunk = []
        if chunk or not count:
            writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
            count += len(chunk)
            progress(len(chunk))
    partial.replace(path)  # whole or not at all: a reader never sees half a file
    return count


__all__ = ["FORMATS", "entity_record", "export_jsonl", "export_parquet", "records"]
