"""The graph of the distributed job: a DuckDB catalog of views over its shards' published tables.

DuckDB lets one process write a file and nobody else open it meanwhile, so the catalog never opens
a shard. Each task writes its bucket into a shard of its own (an ordinary graph file, written by
``GraphSink``), then publishes the shard's papers, mentions, relationships and rejects as Parquet
files, each written under a temporary name and renamed into place. The catalog, ``--db PATH``, is a
DuckDB file whose ``papers``, ``mentions``, ``relationships`` and ``rejects`` are views reading
those Parquet files by absolute path and glob, and which holds the tables ``ingest sync`` writes
(``redirects``, ``possibly_same_as``, ``sync_state``, ``feed_anchor``) and the views over them
that ``SCHEMA_SQL`` defines, under today's names. A plain ``duckdb.connect(PATH)`` reads it from
any directory, also while shards are being written. Layout, beside the catalog::

    PATH                         the catalog
    PATH.shards/shards/          bucket-NNNN.duckdb: one shard a bucket
    PATH.shards/published/       bucket-NNNN/<table>.parquet, and _empty/ (no rows: a glob
                                 that matches nothing would fail the views before any shard)
    PATH.shards/staging/         the running job's input, split by bucket
    PATH.shards/run.lock         held by the running job
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import duckdb

from ingest.sink import SCHEMA_SQL, SCHEMA_VERSION, SinkError, refuse_sqlite

logger = logging.getLogger(__name__)

# The tables each shard publishes; the rest of the graph's tables live in the catalog itself.
SHARD_TABLES = ("papers", "mentions", "relationships", "rejects")
_EMPTY = "_empty"
_FINGERPRINT = "fingerprint"


@dataclass(frozen=True)
class Layout:
    """Where a catalog keeps its shards, their published tables and a run's staging files."""

    db: Path  # absolute

    @classmethod
    def of(cls, db: str | Path) -> Layout:
        return cls(Path(os.path.abspath(db)))

    @property
    def root(self) -> Path:
        return self.db.with_name(self.db.name + ".shards")

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    @property
    def published(self) -> Path:
        return self.root / "published"

    def shard(self, bucket: int) -> Path:
        return self.root / "shards" / f"bucket-{bucket:04d}.duckdb"

    def publication(self, bucket: int) -> Path:
        return self.published / f"bucket-{bucket:04d}"


def _sql_text(value: str | Path) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def kind_of(db: Path) -> Literal["catalog", "graph", "new"]:
    """What the file at ``db`` is, from its own tables: a catalog of shards, a single-file graph,
    or nothing yet (absent, or a DuckDB file without tables). A file ingest did not write is
    refused, as GraphSink refuses it."""
    if not db.exists():
        return "new"
    refuse_sqlite(db)  # which DuckDB would open through an extension it downloads
    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.Error as e:
        raise SinkError(f"cannot open graph database {db}: {e}") from e
    try:
        tables = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables").fetchall()}
    finally:
        con.close()
    if not tables:
        return "new"
    if "schema_info" not in tables:
        raise SinkError(f"{db} is not a graph database written by ingest (it has no schema_info "
                        f"table, and holds {', '.join(sorted(tables)[:5])}"
                        f"{', ...' if len(tables) > 5 else ''}): give ingest a file of its own")
    return "catalog" if "catalog_info" in tables else "graph"


def is_catalog(db: Path) -> bool:
    """Whether ``db`` is a catalog of shards; False for anything else, which the caller's own
    opening then judges (and reports)."""
    try:
        return kind_of(db) == "catalog"
    except SinkError:
        return False


def open_catalog(db: Path, buckets: int | None, *, default_buckets: int = 16) -> tuple[Layout, int]:
    """Creates the catalog at ``db`` or brings an existing one up to date (its views re-pointed
    at its shards' directory, so a catalog moved with that directory still reads); returns its
    layout and its number of buckets. ``buckets`` None: the catalog's own, or the default for a
    new one; a number that differs from the catalog's is refused, since a paper's revisions
    must land in the bucket that holds its earlier ones."""
    kind = kind_of(db)
    if kind == "graph":
        raise SinkError(f"{db} is a single-file graph (written by `ingest run --engine local`), "
                        "not a catalog of shards: run it with --engine local, or give "
                        "--engine dask a new graph file")
    layout = Layout.of(db)
    try:
        con = duckdb.connect(str(layout.db))
    except duckdb.Error as e:
        raise SinkError(f"cannot open graph database {db}: {e}") from e
    try:
        stored = (con.execute("SELECT buckets FROM catalog_info").fetchall()
                  if kind == "catalog" else [])
        if stored and buckets is not None and buckets != stored[0][0]:
            raise SinkError(
                f"{db} is split into {stored[0][0]} buckets, and this run asks for {buckets}: "
                f"a paper's revisions must land in the bucket that holds its earlier ones. "
                f"Rerun with --buckets {stored[0][0]} (or without --buckets), or write to a "
                f"new graph file")
        count = stored[0][0] if stored else (buckets or default_buckets)
        _write_empty_tables(layout.published / _EMPTY)
        con.begin()
        if kind == "new":
            con.execute("CREATE TABLE schema_info (version INTEGER NOT NULL)")
            con.execute("INSERT INTO schema_info VALUES (?)", [SCHEMA_VERSION])
            con.execute("CREATE TABLE catalog_info (buckets INTEGER NOT NULL, "
                        "shards VARCHAR NOT NULL)")
            con.execute("INSERT INTO catalog_info VALUES (?, ?)", [count, str(layout.root)])
        else:
            con.execute("UPDATE catalog_info SET shards = ?", [str(layout.root)])
        for table in SHARD_TABLES:
            files = _sql_text(layout.published / "*" / f"{table}.parquet")
            # By name: a shard published before a column was added still reads (NULL there).
            con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM "
                        f"read_parquet({files}, union_by_name = true)")
        con.execute(SCHEMA_SQL)  # the sync tables and the views over all of them
        con.commit()
    except duckdb.Error as e:
        raise SinkError(f"cannot set up the catalog {db}: {e}") from e
    finally:
        con.close()
    return layout, int(count)


def _write_empty_tables(directory: Path) -> None:
    """Each shard table with no rows, as this version of ingest defines it, so that columns
    added since show (a file left as it was when it is the same)."""
    directory.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    try:
        con.execute(SCHEMA_SQL)
        for table in SHARD_TABLES:
            _copy_out(con, table, directory, unless_same=True)
    finally:
        con.close()


def _copy_out(con: duckdb.DuckDBPyConnection, table: str, directory: Path, *,
              unless_same: bool = False) -> None:
    """One table to ``directory/<table>.parquet``, written aside and renamed: a reader sees the
    old file or the new one, never half a file. ``unless_same``: an identical file is kept."""
    final = directory / f"{table}.parquet"
    partial = directory / f"{table}.parquet.partial"
    con.execute(f"COPY (SELECT * FROM {table}) TO {_sql_text(partial)} (FORMAT parquet)")
    if unless_same and final.exists() and final.read_bytes() == partial.read_bytes():
        partial.unlink()
        return
    os.replace(partial, final)


def publish_shard(layout: Layout, bucket: int) -> bool:
    """Publishes the shard's tables where the catalog's views read them, unless what is
    published already is the shard as it stands (a rerun that changed nothing rewrites
    nothing). Returns whether it published.

    Kill-safe: the fingerprint of what was published is written last, so a task killed half way
    through leaves a fingerprint that no longer matches, and its rerun publishes again."""
    shard = layout.shard(bucket)
    out = layout.publication(bucket)
    marker = out / _FINGERPRINT
    try:
        con = duckdb.connect(str(shard), read_only=True)
    except duckdb.Error as e:
        raise SinkError(f"cannot open shard {shard}: {e}") from e
    try:
        fingerprint = _fingerprint(con)
        if (marker.exists() and marker.read_text(encoding="utf-8") == fingerprint
                and all((out / f"{t}.parquet").exists() for t in SHARD_TABLES)):
            return False
        out.mkdir(parents=True, exist_ok=True)
        for table in SHARD_TABLES:
            _copy_out(con, table, out)
    except duckdb.Error as e:
        raise SinkError(f"cannot publish shard {shard} to {out}: {e}") from e
    finally:
        con.close()
    partial = out / f"{_FINGERPRINT}.partial"
    partial.write_text(fingerprint, encoding="utf-8")
    os.replace(partial, marker)
    return True


def _fingerprint(con: duckdb.DuckDBPyConnection) -> str:
    """Row count and an order-free hash of every row of each shard table: any write (a paper
    added, a revision closed, a reject added or cleared) changes it."""
    parts = []
    for table in SHARD_TABLES:
        n, h = con.execute(f"SELECT count(*), bit_xor(hash(t)) FROM {table} t").fetchall()[0]
        parts.append(f"{table}:{n}:{h or 0}")
    return " ".join(parts)


@contextmanager
def run_lock(layout: Layout) -> Iterator[None]:
    """One distributed job at a time per catalog (the catalog itself is not held open during the
    run, so that readers can open it): an advisory lock, released when the job's process ends,
    however it ends."""
    layout.root.mkdir(parents=True, exist_ok=True)
    path = layout.root / "run.lock"
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise SinkError(f"another `ingest run` is writing {layout.db} (it holds {path}); "
                            "wait for it to end") from e
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
