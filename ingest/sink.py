"""All DuckDB I/O of the ingest service: schema, views, bulk writes, transactions, sync state.

The DuckDB file is the job's cursor: each transaction holds whole papers (the papers row with its
mentions, relationships and rejects), so a job killed at any point leaves only whole papers behind,
and a rerun skips every paper whose content hash is already stored. Writes go in bulk through Arrow
tables; rows are never inserted one by one. Table and column names are a public interface (people
query them with SQL; see docs/ingest.md): add columns, never rename.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import duckdb
import pyarrow as pa

from identity_client import ChangeEvent, Entity, Link, Resolution
from ingest.validate import CheckedPaper, LineReject, Reject

logger = logging.getLogger(__name__)

# 2: recorded_at columns are timestamps, not text; entity_names (see _upgrade).
SCHEMA_VERSION = 2

_SPAN_SQL = 'STRUCT("start" BIGINT, "end" BIGINT)'
_COUNTS_SQL = ("STRUCT(mentions INTEGER, relationships INTEGER, rejects INTEGER, "
               "new_entities INTEGER, matched_entities INTEGER)")

SCHEMA_SQL = f"""
CREATE TABLE IF NOT EXISTS schema_info (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS papers (
    paper_id VARCHAR NOT NULL,
    revision VARCHAR NOT NULL,
    content_hash VARCHAR NOT NULL,
    source VARCHAR,
    counts {_COUNTS_SQL},
    is_current BOOLEAN NOT NULL,
    superseded_by VARCHAR,
    ingested_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS mentions (
    paper_id VARCHAR NOT NULL,
    revision VARCHAR NOT NULL,
    content_hash VARCHAR NOT NULL,
    mention_id VARCHAR NOT NULL,
    mention_index INTEGER NOT NULL,
    text VARCHAR NOT NULL,
    entity_type VARCHAR NOT NULL,
    entity_id VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    match_kind VARCHAR NOT NULL,
    created BOOLEAN NOT NULL,
    resolved_type VARCHAR,
    display_form VARCHAR,
    matched_name VARCHAR,
    span {_SPAN_SQL},
    is_current BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS relationships (
    relationship_id VARCHAR NOT NULL,
    paper_id VARCHAR NOT NULL,
    revision VARCHAR NOT NULL,
    content_hash VARCHAR NOT NULL,
    relationship_index INTEGER NOT NULL,
    subject_mention_id VARCHAR NOT NULL,
    subject_id VARCHAR NOT NULL,
    predicate VARCHAR NOT NULL,
    raw_predicate VARCHAR NOT NULL,
    inverted BOOLEAN NOT NULL,
    object_mention_id VARCHAR NOT NULL,
    object_id VARCHAR NOT NULL,
    confidence DOUBLE NOT NULL,
    evidence_span {_SPAN_SQL},
    evidence_quote VARCHAR,
    valid_from TIMESTAMPTZ NOT NULL,
    valid_to TIMESTAMPTZ,
    closed_in_revision VARCHAR
);
CREATE TABLE IF NOT EXISTS rejects (
    reject_id VARCHAR NOT NULL,
    paper_id VARCHAR,
    revision VARCHAR,
    content_hash VARCHAR,
    position VARCHAR NOT NULL,
    item VARCHAR NOT NULL,
    reason VARCHAR NOT NULL,
    raw VARCHAR,
    ingested_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS redirects (
    from_id VARCHAR NOT NULL,
    to_id VARCHAR NOT NULL,
    merged_into VARCHAR NOT NULL,
    sequence BIGINT NOT NULL,
    recorded_at TIMESTAMPTZ
);
CREATE TABLE IF NOT EXISTS possibly_same_as (
    entity_id VARCHAR NOT NULL,
    other_id VARCHAR NOT NULL,
    sequence BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS sync_state (
    feed VARCHAR NOT NULL,
    last_sequence BIGINT NOT NULL
);
-- The last change synced, as the identity store recorded it: a store that does not hold this
-- change at this sequence number is not the one the graph's ids came from.
CREATE TABLE IF NOT EXISTS feed_anchor (
    feed VARCHAR NOT NULL,
    sequence BIGINT NOT NULL,
    entity_id VARCHAR NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL
);
-- What the identity server calls each entity the graph refers to (`ingest sync` fills it):
-- its name, type, status and aliases, as of the feed position `sequence`.
CREATE TABLE IF NOT EXISTS entity_names (
    entity_id VARCHAR NOT NULL,
    name VARCHAR NOT NULL,
    entity_type VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    aliases VARCHAR[] NOT NULL,
    sequence BIGINT NOT NULL
);
CREATE OR REPLACE VIEW mentions_resolved AS
    SELECT m.*, COALESCE(r.to_id, m.entity_id) AS resolved_id
    FROM mentions m LEFT JOIN redirects r ON r.from_id = m.entity_id;
CREATE OR REPLACE VIEW relationships_resolved AS
    SELECT rel.*,
           COALESCE(rs.to_id, rel.subject_id) AS resolved_subject_id,
           COALESCE(ro.to_id, rel.object_id) AS resolved_object_id
    FROM relationships rel
    LEFT JOIN redirects rs ON rs.from_id = rel.subject_id
    LEFT JOIN redirects ro ON ro.from_id = rel.object_id;
CREATE OR REPLACE VIEW graph_edges AS
    SELECT relationship_id, paper_id, revision,
           resolved_subject_id AS subject_id, predicate, resolved_object_id AS object_id,
           confidence, raw_predicate, subject_mention_id, object_mention_id, evidence_quote
    FROM relationships_resolved
    -- A merge that joined an edge's two ends leaves no edge: ingest rejects a self-loop.
    WHERE valid_to IS NULL AND resolved_subject_id <> resolved_object_id;
CREATE OR REPLACE VIEW entities AS
    WITH seen AS (
        SELECT resolved_id, display_form, resolved_type, paper_id
        FROM mentions_resolved WHERE is_current),
    by_spelling AS (
        SELECT resolved_id, display_form, count(*) AS n FROM seen GROUP BY ALL),
    by_type AS (
        SELECT resolved_id, resolved_type, count(*) AS n FROM seen GROUP BY ALL),
    -- The most frequent spelling and type; a tie goes to the first in sort order, so the view
    -- answers the same on the same data.
    named AS (
        SELECT resolved_id, first(display_form ORDER BY n DESC, display_form) AS name
        FROM by_spelling GROUP BY resolved_id),
    typed AS (
        SELECT resolved_id, first(resolved_type ORDER BY n DESC, resolved_type) AS entity_type
        FROM by_type GROUP BY resolved_id)
    SELECT seen.resolved_id AS entity_id,
           any_value(named.name) AS name,
           any_value(typed.entity_type) AS entity_type,
           count(*) AS mention_count,
           count(DISTINCT paper_id) AS paper_count,
           list(DISTINCT display_form ORDER BY display_form) AS spellings,
           -- The identity server's own name for it, as of the last `ingest sync`.
           any_value(en.name) AS server_name,
           any_value(en.status) AS status,
           any_value(en.aliases) AS aliases
    FROM seen JOIN named USING (resolved_id) JOIN typed USING (resolved_id)
    LEFT JOIN entity_names en ON en.entity_id = seen.resolved_id
    GROUP BY seen.resolved_id;
"""
# The tables and views SCHEMA_SQL makes: a graph opened read-only must have them all.
_SCHEMA_NAMES = tuple(re.findall(r"CREATE (?:TABLE IF NOT EXISTS|OR REPLACE VIEW) (\w+)",
                                 SCHEMA_SQL))

# Spans arrive as ``Span`` named tuples (or None), which Arrow reads as this struct as they are.
_SPAN_TYPE = pa.struct([("start", pa.int64()), ("end", pa.int64())])
_TS = pa.timestamp("us", tz="UTC")

PAPERS_SCHEMA = pa.schema([
    ("paper_id", pa.string()), ("revision", pa.string()), ("content_hash", pa.string()),
    ("source", pa.string()),
    ("counts", pa.struct([("mentions", pa.int32()), ("relationships", pa.int32()),
                          ("rejects", pa.int32()), ("new_entities", pa.int32()),
                          ("matched_entities", pa.int32())])),
    ("is_current", pa.bool_()), ("superseded_by", pa.string()),
    ("ingested_at", _TS),
])
MENTIONS_SCHEMA = pa.schema([
    ("paper_id", pa.string()), ("revision", pa.string()), ("content_hash", pa.string()),
    ("mention_id", pa.string()), ("mention_index", pa.int32()), ("text", pa.string()),
    ("entity_type", pa.string()), ("entity_id", pa.string()), ("status", pa.string()),
    ("match_kind", pa.string()), ("created", pa.bool_()), ("resolved_type", pa.string()),
    ("display_form", pa.string()), ("matched_name", pa.string()), ("span", _SPAN_TYPE),
    ("is_current", pa.bool_()),
])
RELATIONSHIPS_SCHEMA = pa.schema([
    ("relationship_id", pa.string()), ("paper_id", pa.string()), ("revision", pa.string()),
    ("content_hash", pa.string()), ("relationship_index", pa.int32()),
    ("subject_mention_id", pa.string()), ("subject_id", pa.string()),
    ("predicate", pa.string()), ("raw_predicate", pa.string()), ("inverted", pa.bool_()),
    ("object_mention_id", pa.string()), ("object_id", pa.string()),
    ("confidence", pa.float64()), ("evidence_span", _SPAN_TYPE),
    ("evidence_quote", pa.string()), ("valid_from", _TS), ("valid_to", _TS),
    ("closed_in_revision", pa.string()),
])
REJECTS_SCHEMA = pa.schema([
    ("reject_id", pa.string()), ("paper_id", pa.string()), ("revision", pa.string()),
    ("content_hash", pa.string()), ("position", pa.string()), ("item", pa.string()),
    ("reason", pa.string()), ("raw", pa.string()), ("ingested_at", _TS),
])
REDIRECTS_SCHEMA = pa.schema([
    ("from_id", pa.string()), ("to_id", pa.string()), ("merged_into", pa.string()),
    ("sequence", pa.int64()), ("recorded_at", _TS),
])
CLOSE_SCHEMA = pa.schema([
    ("paper_id", pa.string()), ("revision", pa.string()), ("content_hash", pa.string()),
])
ENTITY_NAMES_SCHEMA = pa.schema([
    ("entity_id", pa.string()), ("name", pa.string()), ("entity_type", pa.string()),
    ("status", pa.string()), ("aliases", pa.list_(pa.string())), ("sequence", pa.int64()),
])
LINKS_SCHEMA = pa.schema([
    ("entity_id", pa.string()), ("other_id", pa.string()), ("sequence", pa.int64()),
])


class SinkError(Exception):
    """The graph database could not be opened or written (wraps the DuckDB error)."""


@dataclass(frozen=True, slots=True)
class ResolvedPaper:
    """A checked paper with one resolution per mention (same order as ``paper.mentions``)."""

    paper: CheckedPaper
    resolutions: tuple[Resolution, ...]


@dataclass
class WriteOutcome:
    """What one write did, paper by paper."""

    ingested: int = 0
    changed: int = 0
    unchanged: int = 0
    rejected_items: int = 0
    rejected_lines: int = 0
    lines_rejected_before: int = 0  # bad the same way in an earlier run: their rows are there
    new_entities: int = 0
    matched_entities: int = 0
    relationships: int = 0

    def add(self, other: WriteOutcome) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def _stable_position(position: str) -> str:
    """``file:line`` with the file made absolute, so reruns from another directory match."""
    path, _, line = position.rpartition(":")
    return f"{os.path.abspath(path)}:{line}" if path else position


def _reject_id(*parts: str | None) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update((part or "").encode("utf-8", errors="surrogatepass"))
        h.update(b"\x1f")
    return h.hexdigest()[:32]


@dataclass
class _Pending:
    """One paper's rows, kept until the transaction so a later revision in the same group can
    close them before they are written."""

    resolved: ResolvedPaper
    is_current: bool = True
    closed_in: str | None = None
    superseded_by: str | None = None
    # Entities the paper's earlier revisions resolved to. The server answers a batch it has seen
    # (same paper, same mentions) with its first reply, `created` included: a new revision with
    # the same mentions creates nothing, and its rows must not say it did.
    earlier_ids: frozenset[str] = frozenset()


def _table(schema: pa.Schema, columns: Sequence[Sequence[Any] | pa.Array[Any]]) -> pa.Table:
    """One Arrow table from one list (or ready array) per column of ``schema``."""
    return pa.Table.from_arrays(
        [col if isinstance(col, pa.Array) else pa.array(col, type=field.type)
         for field, col in zip(schema, columns, strict=True)],
        schema=schema)


class _Rows:
    """Rows collected as tuples (cheap to append), turned into one Arrow table per write."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.rows: list[tuple[Any, ...]] = []

    def add(self, *values: Any) -> None:
        self.rows.append(values)

    def __bool__(self) -> bool:
        return bool(self.rows)

    def table(self) -> pa.Table:
        columns = list(zip(*self.rows, strict=True)) if self.rows else [
            () for _ in self.schema.names]
        return pa.table({name: pa.array(col, type=self.schema.field(name).type)
                         for name, col in zip(self.schema.names, columns, strict=True)},
                        schema=self.schema)


def refuse_sqlite(path: Path) -> None:
    """DuckDB opens a SQLite file through an extension it would download: name the mistake
    (an identity store given as the graph) instead."""
    try:
        with path.open("rb") as fh:
            magic = fh.read(16)
    except OSError:
        return  # a new graph, or a path DuckDB will report on
    if magic == b"SQLite format 3\0":
        raise SinkError(f"{path} is a SQLite database (an identity store?), not a DuckDB graph: "
                        f"give --db the graph file")


class GraphSink:
    """The one writer of one DuckDB file. Not thread-safe: use it from one thread."""

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        """Open (creating its tables) the graph at path; read_only: open an existing graph
        without writing anything (refusing a DuckDB file that ingest did not write)."""
        self.path = str(path)
        refuse_sqlite(Path(path))
        try:
            self._con = duckdb.connect(self.path, read_only=read_only)
        except duckdb.Error as e:
            raise SinkError(f"cannot open graph database {self.path}: {e}") from e
        try:
            tables = {r[0] for r in self._con.execute(
                "SELECT table_name FROM information_schema.tables").fetchall()}
            if tables and "schema_info" not in tables:
                # Someone else's database: creating ingest's tables and views in it would
                # replace any of its own that share their names.
                raise SinkError(
                    f"{self.path} is not a graph database written by ingest (it has no "
                    f"schema_info table, and holds {', '.join(sorted(tables)[:5])}"
                    f"{', ...' if len(tables) > 5 else ''}): give ingest a file of its own")
            if read_only:
                if not tables:
                    raise SinkError(f"{self.path} is not a graph database written by ingest "
                                    "(it has no schema_info table)")
                missing = sorted(set(_SCHEMA_NAMES) - tables)
                if missing:
                    raise SinkError(
                        f"{self.path} was written by an older ingest (it lacks "
                        f"{', '.join(missing)}): `ingest sync --db {self.path}` brings it "
                        "up to date")
                return
            self._con.execute(SCHEMA_SQL)
            if not self._con.execute("SELECT count(*) FROM schema_info").fetchall()[0][0]:
                self._con.execute("INSERT INTO schema_info VALUES (?)", [SCHEMA_VERSION])
            self._upgrade()
        except duckdb.Error as e:
            self._con.close()
            raise SinkError(f"cannot open graph database {self.path}: {e}") from e
        except SinkError:
            self._con.close()
            raise

    def _upgrade(self) -> None:
        """Brings a graph of schema version 1 up to date, in one transaction: its recorded_at
        columns held the server's RFC 3339 text."""
        version = self._con.execute("SELECT max(version) FROM schema_info").fetchall()[0][0]
        if version >= SCHEMA_VERSION:
            return
        self._con.begin()
        for table in ("redirects", "feed_anchor"):
            self._con.execute(f"ALTER TABLE {table} ALTER recorded_at SET DATA TYPE TIMESTAMPTZ "
                              "USING CAST(recorded_at AS TIMESTAMPTZ)")
        self._con.execute("UPDATE schema_info SET version = ?", [SCHEMA_VERSION])
        self._con.commit()

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads ---------------------------------------------------------------------------------

    def known_hashes(self, paper_ids: Iterable[str]) -> dict[str, set[str]]:
        """Every stored content hash (all revisions) of the given papers."""
        try:
            return self._stored(paper_ids)[0]
        except duckdb.Error as e:
            raise SinkError(f"cannot read papers from {self.path}: {e}") from e

    def _stored(self, paper_ids: Iterable[str]) -> tuple[dict[str, set[str]], set[str]]:
        """(paper id -> all stored content hashes, ids that have a current revision)."""
        ids = pa.table({"paper_id": pa.array(sorted(set(paper_ids)), pa.string())})
        known: dict[str, set[str]] = {}
        current: set[str] = set()
        if ids.num_rows == 0:
            return known, current
        self._con.register("_ids", ids)
        try:
            rows = self._con.execute(
                "SELECT p.paper_id, p.content_hash, p.is_current FROM papers p "
                "JOIN _ids USING (paper_id)").fetchall()
        finally:
            self._con.unregister("_ids")
        for pid, h, is_current in rows:
            known.setdefault(pid, set()).add(h)
            if is_current:
                current.add(pid)
        return known, current

    def mention_sequences(self, paper_id: str) -> set[tuple[tuple[str, str], ...]]:
        """The mentions (text, type) of each stored revision of a paper, in order."""
        try:
            rows = self._con.execute(
                "SELECT content_hash, text, entity_type FROM mentions WHERE paper_id = ? "
                "ORDER BY content_hash, mention_index", [paper_id]).fetchall()
        except duckdb.Error as e:
            raise SinkError(f"cannot read mentions from {self.path}: {e}") from e
        by_revision: dict[str, list[tuple[str, str]]] = {}
        for content_hash, text, etype in rows:
            by_revision.setdefault(content_hash, []).append((text, etype))
        return {tuple(mentions) for mentions in by_revision.values()}

    def _entities_of(self, paper_id: str) -> frozenset[str]:
        """The entities every stored revision of a paper resolved to."""
        rows = self._con.execute(
            "SELECT DISTINCT entity_id FROM mentions WHERE paper_id = ?", [paper_id]).fetchall()
        return frozenset(r[0] for r in rows)

    def last_sequence(self, feed: str = "identity") -> int:
        rows = self._con.execute(
            "SELECT max(last_sequence) FROM sync_state WHERE feed = ?", [feed]).fetchall()
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def feed_anchor(self, feed: str = "identity") -> tuple[int, str, datetime] | None:
        """(sequence, entity id, recorded at) of the last change synced, if recorded."""
        rows = self._con.execute(
            "SELECT sequence, entity_id, recorded_at FROM feed_anchor WHERE feed = ? "
            "ORDER BY sequence DESC LIMIT 1", [feed]).fetchall()
        return (int(rows[0][0]), str(rows[0][1]), rows[0][2]) if rows else None

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Runs a read-only query (used by ``stats`` and tests)."""
        try:
            rows: list[tuple[Any, ...]] = self._con.execute(sql, params or []).fetchall()
            return rows
        except duckdb.Error as e:
            raise SinkError(f"query failed on {self.path}: {e}") from e

    # -- writes --------------------------------------------------------------------------------

    def write(self, items: Sequence[ResolvedPaper | LineReject]) -> WriteOutcome:
        """Writes a group of papers and rejected lines, in order, in one transaction.

        A paper whose content hash is already stored (any revision) is skipped; a paper with a new
        content hash closes its current revision (relationships get ``valid_to``, mentions and
        the papers row stop being current) and adds the new one.
        """
        now = datetime.now(UTC)
        outcome = WriteOutcome()
        try:
            self._con.begin()
            known, current = self._stored(
                x.paper.paper_id for x in items if isinstance(x, ResolvedPaper))
            stored_ids = set(known)
            pending: list[_Pending] = []
            pending_current: dict[str, _Pending] = {}
            close_db = _Rows(CLOSE_SCHEMA)
            rejects = _Rows(REJECTS_SCHEMA)
            line_rejects: list[str] = []
            for item in items:
                if isinstance(item, LineReject):
                    # Each rejected line is its own row (a paper sent twice, bad the same way,
                    # is two lines to fix), and the same row again on a rerun.
                    rid = (_reject_id("paper-line", item.paper_id, item.content_hash, item.reason,
                                      _stable_position(item.position))
                           if item.paper_id is not None
                           else _reject_id("line", _stable_position(item.position), item.raw,
                                           item.reason))
                    rejects.add(rid, item.paper_id, None, item.content_hash, item.position, "",
                                item.reason, item.raw, now)
                    line_rejects.append(rid)
                    continue
                paper = item.paper
                pid = paper.paper_id
                if paper.content_hash in known.get(pid, set()):
                    outcome.unchanged += 1
                    continue
                if pid in pending_current:
                    earlier = pending_current[pid]
                    earlier.is_current = False
                    earlier.closed_in = paper.revision
                    earlier.superseded_by = paper.content_hash
                    outcome.changed += 1
                elif pid in current:
                    close_db.add(pid, paper.revision, paper.content_hash)
                    current.discard(pid)
                    outcome.changed += 1
                known.setdefault(pid, set()).add(paper.content_hash)
                earlier_ids: frozenset[str] = frozenset()
                if any(r.created for r in item.resolutions):
                    if pid in pending_current:
                        earlier = pending_current[pid]
                        earlier_ids = earlier.earlier_ids | {
                            r.entity_id for r in earlier.resolved.resolutions}
                    elif pid in stored_ids:
                        earlier_ids = self._entities_of(pid)
                entry = _Pending(item, earlier_ids=earlier_ids)
                pending.append(entry)
                pending_current[pid] = entry
                outcome.ingested += 1
                self._add_rejects(rejects, paper, paper.rejects, now)
                outcome.rejected_items += len(paper.rejects)
            outcome.lines_rejected_before = self._stored_rejects(line_rejects)
            outcome.rejected_lines = len(line_rejects) - outcome.lines_rejected_before
            if close_db:
                self._close(close_db, now)
            if pending:
                self._insert_papers(pending, now, outcome)
            if rejects:
                self._insert_rejects(rejects.table())
            if pending:  # after this group's own rejects: the same content may be among them
                self._clear_refusals(pending)
            self._con.commit()
        except duckdb.Error as e:
            self._rollback()
            raise SinkError(f"cannot write to {self.path}: {e}") from e
        except BaseException:
            self._rollback()
            raise
        return outcome

    def _rollback(self) -> None:
        try:
            self._con.rollback()
        except duckdb.Error:
            logger.debug("rollback after a failed write also failed", exc_info=True)

    @staticmethod
    def _add_rejects(rows: _Rows, paper: CheckedPaper, items: Iterable[Reject],
                     now: datetime) -> None:
        for r in items:
            rows.add(_reject_id("item", paper.paper_id, paper.content_hash, r.item, r.reason),
                     paper.paper_id, paper.revision, paper.content_hash, paper.position, r.item,
                     r.reason, r.raw, now)

    def _close(self, close: _Rows, now: datetime) -> None:
        self._con.register("_close", close.table())
        try:
            self._con.execute(
                "UPDATE relationships SET valid_to = ?, closed_in_revision = c.revision "
                "FROM _close c WHERE relationships.paper_id = c.paper_id "
                "AND relationships.valid_to IS NULL", [now])
            self._con.execute(
                "UPDATE mentions SET is_current = false FROM _close c "
                "WHERE mentions.paper_id = c.paper_id AND mentions.is_current")
            self._con.execute(
                "UPDATE papers SET is_current = false, superseded_by = c.content_hash "
                "FROM _close c WHERE papers.paper_id = c.paper_id AND papers.is_current")
        finally:
            self._con.unregister("_close")

    def _insert_papers(self, pending: list[_Pending], now: datetime,
                       outcome: WriteOutcome) -> None:
        """Builds the three tables column by column: per paper, a few list extends."""
        papers = _Rows(PAPERS_SCHEMA)
        m_cols: list[list[Any]] = [[] for _ in MENTIONS_SCHEMA.names]
        (m_paper, m_revision, m_hash, m_id, m_index, m_text, m_type, m_entity, m_status,
         m_kind, m_created, m_rtype, m_display, m_matched, m_span, m_current) = m_cols
        r_cols: list[list[Any]] = [[] for _ in RELATIONSHIPS_SCHEMA.names]
        (r_id, r_paper, r_revision, r_hash, r_index, r_subject, r_subject_id, r_predicate,
         r_raw, r_inverted, r_object, r_object_id, r_confidence, r_span, r_quote, _valid_from,
         r_to, r_closed_in) = r_cols
        for entry in pending:
            paper = entry.resolved.paper
            resolutions = entry.resolved.resolutions
            n_mentions = len(paper.mentions)
            n_rels = len(paper.relationships)
            if len(resolutions) != n_mentions:
                raise ValueError(f"paper {paper.paper_id}: {len(resolutions)} resolutions for "
                                 f"{n_mentions} mentions")
            new = 0
            ids: dict[str, str] = {}
            if n_mentions:
                index, mention_id, text, etype, span = zip(*paper.mentions, strict=True)
                (entity_id, status, kind, created, rtype, _name, matched, display, _candidates,
                 _possibly, _scores) = zip(*resolutions, strict=True)
                if entry.earlier_ids:
                    created = tuple(c and e not in entry.earlier_ids
                                    for c, e in zip(created, entity_id, strict=True))
                new = sum(created)
                ids = dict(zip(mention_id, entity_id, strict=True))
                m_paper += [paper.paper_id] * n_mentions
                m_revision += [paper.revision] * n_mentions
                m_hash += [paper.content_hash] * n_mentions
                m_id += mention_id
                m_index += index
                m_text += text
                m_type += etype
                m_entity += entity_id
                m_status += status
                m_kind += kind
                m_created += created
                m_rtype += rtype
                m_display += display
                m_matched += matched
                m_span += span
                m_current += [entry.is_current] * n_mentions
            matched_count = n_mentions - new
            outcome.new_entities += new
            outcome.matched_entities += matched_count
            outcome.relationships += n_rels
            papers.add(
                paper.paper_id, paper.revision, paper.content_hash, paper.position,
                {"mentions": n_mentions, "relationships": n_rels,
                 "rejects": len(paper.rejects), "new_entities": new,
                 "matched_entities": matched_count},
                entry.is_current, entry.superseded_by, now)
            if n_rels:
                (index, rid, subject, obj, predicate, raw, inverted, confidence, span,
                 quote) = zip(*paper.relationships, strict=True)
                r_id += rid
                r_paper += [paper.paper_id] * n_rels
                r_revision += [paper.revision] * n_rels
                r_hash += [paper.content_hash] * n_rels
                r_index += index
                r_subject += subject
                r_subject_id += map(ids.__getitem__, subject)
                r_predicate += predicate
                r_raw += raw
                r_inverted += inverted
                r_object += obj
                r_object_id += map(ids.__getitem__, obj)
                r_confidence += confidence
                r_span += span
                r_quote += quote
                r_to += [None if entry.is_current else now] * n_rels
                r_closed_in += [entry.closed_in] * n_rels
        self._append("papers", papers.table())
        if m_paper:
            self._append("mentions", _table(MENTIONS_SCHEMA, m_cols))
        if r_id:
            valid_from = pa.repeat(pa.scalar(now, type=_TS), len(r_id))
            columns: list[list[Any] | pa.Array[Any]] = list(r_cols)
            columns[RELATIONSHIPS_SCHEMA.get_field_index("valid_from")] = valid_from
            self._append("relationships", _table(RELATIONSHIPS_SCHEMA, columns))

    def _append(self, name: str, table: pa.Table) -> None:
        self._con.register("_new", table)
        try:
            columns = ", ".join(f'"{c}"' for c in table.schema.names)
            self._con.execute(f"INSERT INTO {name} ({columns}) SELECT {columns} FROM _new")
        finally:
            self._con.unregister("_new")

    def _clear_refusals(self, pending: list[_Pending]) -> None:
        """A paper stored now is no longer a rejected line: the whole-paper reject of the same
        content that an earlier run recorded (the server refused it then, e.g. while failing)
        goes, so a run after a failure ends like one clean run. Only a refusal can be such a
        reject: the input's own checks would reject the same content again."""
        stored = pa.table({
            "paper_id": pa.array([e.resolved.paper.paper_id for e in pending], pa.string()),
            "content_hash": pa.array([e.resolved.paper.content_hash for e in pending],
                                     pa.string())})
        self._con.register("_stored_now", stored)
        try:
            self._con.execute(
                "DELETE FROM rejects USING _stored_now s WHERE rejects.item = '' "
                "AND rejects.paper_id = s.paper_id AND rejects.content_hash = s.content_hash")
        finally:
            self._con.unregister("_stored_now")

    def _stored_rejects(self, reject_ids: Sequence[str]) -> int:
        """How many of these rejected lines an earlier run already recorded (a rerun counts
        them apart, as it counts unchanged papers apart from ingested ones)."""
        if not reject_ids:
            return 0
        rows = self._con.execute(
            "SELECT count(*) FROM rejects WHERE reject_id IN (SELECT unnest(?::VARCHAR[]))",
            [list(reject_ids)]).fetchall()
        return int(rows[0][0])

    def _insert_rejects(self, table: pa.Table) -> None:
        self._con.register("_new", table)
        try:
            columns = ", ".join(f'"{c}"' for c in table.schema.names)
            self._con.execute(
                f"INSERT INTO rejects ({columns}) SELECT {columns} FROM "
                "(SELECT *, row_number() OVER (PARTITION BY reject_id) AS _n FROM _new) n "
                "WHERE n._n = 1 AND n.reject_id NOT IN (SELECT reject_id FROM rejects)")
        finally:
            self._con.unregister("_new")

    # -- sync ----------------------------------------------------------------------------------

    def ids_to_name(self, touched: Iterable[str]) -> list[str]:
        """The entities the graph refers to (current mentions, through redirects) whose names
        are not stored yet, or were `touched` by changes since: what `ingest sync` asks for."""
        rows = self._con.execute(
            "WITH touched AS (SELECT unnest(?::VARCHAR[]) AS entity_id) "
            "SELECT DISTINCT m.resolved_id FROM mentions_resolved m "
            "LEFT JOIN entity_names n ON n.entity_id = m.resolved_id "
            "WHERE m.is_current AND (n.entity_id IS NULL "
            "OR m.resolved_id IN (SELECT entity_id FROM touched)) ORDER BY 1",
            [sorted(set(touched))]).fetchall()
        return [r[0] for r in rows]

    def store_entity_names(self, entities: Sequence[Entity], sequence: int) -> None:
        """Replaces the stored names of these entities with the server's, in one transaction."""
        rows = _Rows(ENTITY_NAMES_SCHEMA)
        for e in entities:
            rows.add(e.entity_id, e.name, e.entity_type, str(e.status), list(e.aliases), sequence)
        try:
            self._con.begin()
            self._con.execute("DELETE FROM entity_names WHERE entity_id IN "
                              "(SELECT unnest(?::VARCHAR[]))", [[e.entity_id for e in entities]])
            if rows:
                self._append("entity_names", rows.table())
            self._con.commit()
        except duckdb.Error as e:
            self._rollback()
            raise SinkError(f"cannot store entity names in {self.path}: {e}") from e

    def apply_changes(self, changes: Sequence[ChangeEvent], links: Sequence[Link] | None,
                      *, last_sequence: int = 0, feed: str = "identity",
                      anchor: ChangeEvent | None = None) -> int:
        """Stores merges as redirects (chains resolved), the open links, the feed position and
        the change it stands at (``anchor``: the store's change at that sequence number).

        Returns the number of new merges. One transaction, so a killed sync is simply redone.
        """
        merges = [c for c in changes if c.kind == "merged" and c.entity_id and c.other_id]
        try:
            self._con.begin()
            direct: dict[str, tuple[str, int, datetime]] = {
                row[0]: (row[1], row[2], row[3]) for row in self._con.execute(
                    "SELECT from_id, merged_into, sequence, recorded_at FROM redirects"
                ).fetchall()
            }
            for c in merges:
                direct[c.entity_id] = (c.other_id, c.sequence, c.recorded_at)
            rows = _Rows(REDIRECTS_SCHEMA)
            for source, (into, seq, at) in sorted(direct.items()):
                target, hops = into, 0
                while target in direct and target != source and hops < len(direct):
                    target = direct[target][0]
                    hops += 1
                rows.add(source, target, into, seq, at)
            if merges:
                self._con.execute("DELETE FROM redirects")
                if rows:
                    self._append("redirects", rows.table())
            if links is not None:
                stored = self._con.execute(
                    "SELECT entity_id, other_id, sequence FROM possibly_same_as ORDER BY ALL"
                ).fetchall()
                fresh = sorted((x.entity_id, x.other_id, x.sequence) for x in links)
                if stored != fresh:
                    self._con.execute("DELETE FROM possibly_same_as")
                    link_rows = _Rows(LINKS_SCHEMA)
                    for a, b, seq in fresh:
                        link_rows.add(a, b, seq)
                    if link_rows:
                        self._append("possibly_same_as", link_rows.table())
            before = self.last_sequence(feed)
            last = max([before, last_sequence, *(c.sequence for c in changes)])
            if last != before:
                self._con.execute("DELETE FROM sync_state WHERE feed = ?", [feed])
                self._con.execute("INSERT INTO sync_state VALUES (?, ?)", [feed, last])
            if anchor is not None and anchor.sequence == last:
                self._con.execute("DELETE FROM feed_anchor WHERE feed = ?", [feed])
                self._con.execute("INSERT INTO feed_anchor VALUES (?, ?, ?, ?)",
                                  [feed, anchor.sequence, anchor.entity_id, anchor.recorded_at])
            self._con.commit()
        except duckdb.Error as e:
            self._rollback()
            raise SinkError(f"cannot store redirects in {self.path}: {e}") from e
        return len(merges)
