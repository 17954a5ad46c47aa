"""What both backends share: the row types, the transaction's statements (`Tx`), and the store's
skeleton (`SqlStore`): the engine and its tables, read and write transactions as context
managers, backend errors wrapped in `StoreUnavailable` with context.

Writers are serialised by the database itself (each backend's module says how). Inside that lock
the service first catches up with the change feed, so every decision is made on the latest
committed state; this is what makes concurrent calls from many server processes equal some
one-at-a-time order.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, cast

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    func,
    make_url,
    or_,
    select,
    update,
)
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from identity_server import json_text
from identity_server.domain import RETIRED, Entity, Name, NameKind, NameRow, Status
from identity_server.errors import StoreUnavailable
from identity_server.store import schema as t

logger = logging.getLogger(__name__)

CLOSE_WAIT_S = 5.0  # close() waits this long for a write in progress
# A wait that close() must be able to cut short is made in slices this long (SQLite's own busy
# wait cannot be interrupted), so a closing store keeps no thread waiting for long.
WAIT_SLICE_S = 0.25
# Stored values to enums by dict lookup: calling the Enum costs more than the row's other work.
_KINDS = {k.value: k for k in NameKind}
_STATUSES = {st.value: st for st in Status}


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """One event of the change feed."""

    seq: int
    kind: str
    entity_id: str
    other_id: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    recorded_at: float = 0.0


@dataclass(frozen=True, slots=True)
class LinkRow:
    a: str
    b: str
    state: str
    created_seq: int


def ordered_pair(x: str, y: str) -> tuple[str, str]:
    return (x, y) if x < y else (y, x)


# What a write transaction does before the store-wide lock: the papers (context ids) whose
# locks it holds meanwhile, and the work (see SqlStore.write).
BeforeLock = tuple[Collection[str], Callable[["Tx"], None]]


class WouldBlock(Exception):
    """A write asked not to wait would have had to (the caller then writes where it may wait)."""


class SqlStore:
    """The store over one database: owns the engine; hands out read transactions and write
    transactions holding the store-wide write lock. `SqlStore(url)` makes the store of the
    URL's backend, as `open_store(url)` does.

    A backend supplies its engine (`_create_engine`), its write transaction
    (`_write_transaction`) and how close() ends the writes under way (`_end_writes`). It may
    add what it needs once the tables exist (`_start`), prepare a read's connection
    (`_prepare_read`), name its driver's errors that mean the database is gone
    (`_unavailable_errors`), and tell commits apart (`commit_marker`, `commit_state`)."""

    is_sqlite: ClassVar[bool]
    # Whether a write transaction can do work before taking the store-wide lock (`write`'s
    # before_lock): PostgreSQL's lock is taken inside the transaction; SQLite's transaction
    # is the lock.
    locks_inside_transaction: ClassVar[bool]

    def __new__(cls, url: str, **options: Any) -> Self:
        backend = backend_for(url) if cls is SqlStore else cls
        return cast(Self, super().__new__(backend))  # a subclass's instance: still a Self

    def __init__(self, url: str, *, busy_timeout_s: float = 60.0) -> None:
        _check_url(url)
        self.url = url
        self._busy_timeout_s = busy_timeout_s
        self._closing = False
        # Told how long each write waited for the store's write lock, and how long each
        # committed write held it, from granted to committed (the metrics' histograms).
        self.lock_wait_observer: Callable[[float], None] | None = None
        self.lock_hold_observer: Callable[[float], None] | None = None
        try:
            self.engine: Engine = self._create_engine()
            t.metadata.create_all(self.engine)
            self._start()
        except SQLAlchemyError as e:
            raise cannot_open(url, e) from e

    # -- what a backend supplies -------------------------------------------------------------

    def _create_engine(self) -> Engine:
        raise NotImplementedError

    def _start(self) -> None:
        """What the store needs beside the engine, once the tables exist (it wraps its
        driver's errors with `cannot_open`)."""

    def _unavailable_errors(self) -> tuple[type[Exception], ...]:
        """The driver's errors that mean the database cannot be used, as statements run on the
        driver's own cursor raise them (SQLAlchemy wraps its own in DBAPIError)."""
        return ()

    def _prepare_read(self, conn: Connection) -> None:
        """Set up a pooled connection for a read transaction, before it begins."""

    def _write_transaction(self, wait: bool,
                           before_lock: BeforeLock | None) -> Iterator[Tx]:
        """A generator yielding one committed-on-success write transaction (see write())."""
        raise NotImplementedError

    def _observe_lock_wait(self, seconds: float) -> None:
        observer = self.lock_wait_observer
        if observer is not None:
            observer(seconds)

    def _observe_lock_hold(self, seconds: float) -> None:
        observer = self.lock_hold_observer
        if observer is not None:
            observer(seconds)

    def _end_writes(self) -> bool:
        """Stop writes waiting for the lock and give those under way CLOSE_WAIT_S to finish;
        whether they all did."""
        raise NotImplementedError

    # -- the interface -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the store; no write starts after this, and one waiting for another process's
        write lock gives up within a slice. A write in progress gets a few seconds to finish;
        one still running then is left to fail on its own."""
        self._closing = True
        self._close_engine()

    def _close_engine(self) -> bool:
        """End the writes (`_end_writes`), then close the engine's connections; whether the
        writes all ended in time."""
        finished = self._end_writes()
        if not finished:
            logger.warning("closing the store while a write is still under way after %.0f s",
                           CLOSE_WAIT_S)
        self.engine.dispose()
        return finished

    def commit_marker(self) -> bytes | None:
        """A value that changes whenever anything is committed, or None when the store cannot
        tell (then callers must look)."""
        return None

    def commit_state(self) -> tuple[bytes | None, int]:
        """(commit_marker(), the newest change-feed sequence number), where the number is at
        least as new as the commit the marker stands for: the marker is read first, so a commit
        made in between can only make the two look out of step (callers then look again),
        never make the marker look newer than the number."""
        with self.read() as tx:
            return None, tx.max_seq()

    def write(self, *, wait: bool = True,
              before_lock: BeforeLock | None = None) -> AbstractContextManager[Tx]:
        """A transaction holding the store-wide write lock; commits when the block succeeds.

        With wait=False it raises WouldBlock instead of waiting for the lock, before anything
        is done: this process's other writer, another process's write transaction (SQLite), or
        a network round trip per statement (PostgreSQL: never taken without waiting).

        `before_lock` (papers, work): work(tx) runs in the transaction before the store-wide
        lock is taken, holding instead a lock of each paper (context id) in `papers`, so the
        evidence rows of a paper are written by one transaction at a time. Where the store's
        lock is the transaction itself (SQLite), work runs first thing under it.

        The transaction itself is the context manager, not wrapped in another: every Resolve
        that writes opens one."""
        return self._transaction(write=True, wait=wait, before_lock=before_lock)

    def read(self) -> AbstractContextManager[Tx]:
        return self._transaction(write=False)

    @contextmanager
    def _transaction(self, *, write: bool, wait: bool = True,
                     before_lock: BeforeLock | None = None) -> Iterator[Tx]:
        try:
            # `yield from`: the backend's generator runs inside this one, so the transaction is
            # still a single context manager.
            yield from (self._write_transaction(wait, before_lock) if write
                        else self._read_transaction())
        except DBAPIError as e:
            if e.connection_invalidated or isinstance(e.orig, self._unavailable_errors()):
                raise StoreUnavailable(f"identity store error: {e.orig}") from e
            raise
        except self._unavailable_errors() as e:  # from a statement run on the driver's own cursor
            raise StoreUnavailable(f"identity store error: {e}") from e

    def _read_transaction(self) -> Iterator[Tx]:
        with self.engine.connect() as conn:
            self._prepare_read(conn)
            with conn.begin():
                yield Tx(conn, self.is_sqlite)


def backend_for(url: str) -> type[SqlStore]:
    """The store class of `url`'s backend: SQLite for a sqlite URL, else PostgreSQL, whose
    constructor refuses (as every store's does) a URL that is neither."""
    # Imported here: both modules import this one.
    from identity_server.store.postgres import PostgresStore
    from identity_server.store.sqlite import SqliteStore

    return SqliteStore if url.startswith("sqlite") else PostgresStore


def cannot_open(url: str, error: Exception) -> StoreUnavailable:
    """The error a store that cannot be opened raises, from what SQLAlchemy or a driver said."""
    cause = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    return StoreUnavailable(f"cannot open the identity store at {_safe(url)}: {cause}")


def _check_url(url: str) -> None:
    """Refuse, with what to write instead, a store URL that would fail deep inside SQLAlchemy
    (an unknown scheme, a driver that is not installed) or not fail at all: SQLite in memory
    is a database per connection, lost at exit."""
    forms = ("the identity store is SQLite (sqlite:///PATH) or PostgreSQL "
             "(postgresql://USER@HOST:PORT/DATABASE, through psycopg)")
    if "://" not in url:
        raise StoreUnavailable(f"the store URL {_safe(url)!r} has no scheme: {forms}")
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # create_engine names the problem
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite" and driver in ("", "pysqlite"):
        if parsed.host:
            raise StoreUnavailable(
                f"the store URL {url!r} names a host, not a file: a SQLite URL has three "
                f"slashes before a relative path (sqlite:///{parsed.host}), four before an "
                "absolute one")
        if parsed.database in (None, "", ":memory:"):
            raise StoreUnavailable(
                f"the store URL {url!r} names no file (SQLite in memory would be a database per "
                "connection, lost at exit): write sqlite:///identity.sqlite, say")
    elif backend in ("postgresql", "postgres") and driver in ("", "psycopg"):
        if backend == "postgres":
            raise StoreUnavailable(f"unsupported store URL {_safe(url)}: write postgresql://, "
                                   f"not postgres:// ({forms})")
    else:
        raise StoreUnavailable(f"unsupported store URL {_safe(url)}: {forms}")


def _safe(url: str) -> str:
    """The URL without a password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


class _Statements:
    """Statements built once per dialect, so SQLAlchemy compiles each only once.

    Those a resolve or a batch runs (names, evidence, entities, the change feed, links,
    placeholders, the stored reply) are plain SQL run on the driver's own cursor: the text is the
    same for SQLite and PostgreSQL (both have `ON CONFLICT ... DO UPDATE`), only the parameter
    style differs, and SQLAlchemy's per-statement layers cost more than the driver's work.
    Their parameters are positional, given as tuples in the order the statement names them:
    binding a row from a dict by name costs the driver more.
    """

    def __init__(self, is_sqlite: bool) -> None:
        mark = "?" if is_sqlite else "%s"  # a positional parameter in the driver's style

        def raw(table: str, columns: tuple[str, ...], tail: str = "") -> str:
            marks = ", ".join(mark for _ in columns)
            return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}){tail}"

        def equal(*columns: str) -> str:
            return " AND ".join(f"{c} = {mark}" for c in columns)

        self.upsert_names = raw(
            "names", ("entity_id", "display", "kind", "position", "source"),
            " ON CONFLICT (entity_id, display) DO UPDATE SET kind = excluded.kind,"
            " position = excluded.position, source = excluded.source",
        )
        self.add_evidence = raw(
            "evidence", ("entity_id", "context_id", "surface", "raw_type", "count"),
            " ON CONFLICT (entity_id, context_id, surface, raw_type)"
            " DO UPDATE SET count = evidence.count + excluded.count",
        )
        self.insert_entity = raw(
            "entities", ("entity_id", "ordinal", "entity_type", "status", "placeholder",
                         "redirect_to", "created_at"),
        )
        self.insert_changes = raw(
            "changes", ("seq", "kind", "entity_id", "other_id", "detail", "recorded_at")
        )
        # A new or ambiguous mention with candidates looks up and writes a link per candidate.
        self.upsert_link = raw(
            "links", ("a", "b", "state", "created_seq", "actor", "reason", "decided_at"),
            " ON CONFLICT (a, b) DO UPDATE SET state = excluded.state, actor = excluded.actor,"
            " reason = excluded.reason, decided_at = excluded.decided_at",
        )
        self.link = "SELECT a, b, state, created_seq FROM links WHERE " + equal("a", "b")
        # Every ambiguous mention looks up its placeholder; the first makes it.
        self.insert_placeholder = raw("placeholders", ("display", "entity_type", "entity_id"))
        self.placeholder = "SELECT entity_id FROM placeholders WHERE " + equal(
            "display", "entity_type")
        self.upsert_reply = raw(
            "batch_replies", ("request_hash", "reply", "created_at"),
            " ON CONFLICT (request_hash) DO UPDATE SET reply = excluded.reply,"
            " created_at = excluded.created_at",
        )
        self.changes_after = (
            select(t.changes).where(t.changes.c.seq > bindparam("after")).order_by(t.changes.c.seq)
        )
        # Every batch with a context asks this first, and nearly always gets nothing back.
        self.batch_reply = (
            f"SELECT reply FROM batch_replies WHERE {equal('request_hash')}"
            f" AND created_at >= {mark}"
        )
        # Every write transaction asks this first, and nearly always gets nothing back.
        self.changes_after_raw = (
            "SELECT seq, kind, entity_id, other_id, detail, recorded_at FROM changes"
            f" WHERE seq > {mark} ORDER BY seq"
        )


_STATEMENTS: dict[bool, _Statements] = {}


class Tx:
    """One transaction's operations. Every method is a small statement or two.

    After a SQLite write transaction commits, `commit_marker` is the store's commit marker as
    that commit left it, when it is known that no other commit came after it (else None)."""

    def __init__(self, conn: Connection, is_sqlite: bool, driver: Any = None) -> None:
        self.conn = conn
        self._raw = driver  # the driver's connection, when the caller has it at hand
        self.commit_marker: bytes | None = None
        self._is_sqlite = is_sqlite
        if is_sqlite not in _STATEMENTS:
            _STATEMENTS[is_sqlite] = _Statements(is_sqlite)
        self._sql = _STATEMENTS[is_sqlite]

    def _driver(self) -> Any:
        """The driver's own connection under this transaction (sqlite3 or psycopg)."""
        raw = self._raw or self.conn.connection.driver_connection
        assert raw is not None
        return raw

    def _driver_one(self, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The first row of a query on the driver connection, in this transaction."""
        cursor = self._driver().cursor()
        try:
            cursor.execute(sql, params)
            row: tuple[Any, ...] | None = cursor.fetchone()
            return row
        finally:
            cursor.close()

    def _driver_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """One statement for many rows on the driver connection, in this transaction."""
        cursor = self._driver().cursor()
        try:
            cursor.executemany(sql, rows)
        finally:
            cursor.close()

    # -- entities ------------------------------------------------------------------------------

    def load_entities(self, ids: Iterable[str]) -> dict[str, Entity]:
        wanted = list(set(ids))
        out: dict[str, Entity] = {}
        for chunk in _chunks(wanted, 500):
            rows = self.conn.execute(select(t.entities).where(t.entities.c.entity_id.in_(chunk)))
            entity_rows = {r.entity_id: r for r in rows}
            names: dict[str, list[Name]] = {eid: [] for eid in entity_rows}
            name_rows = self.conn.execute(
                select(t.names.c.entity_id, t.names.c.display, t.names.c.kind, t.names.c.position)
                .where(t.names.c.entity_id.in_(chunk))
                .where(t.names.c.kind != RETIRED)
            )
            for nr in name_rows:
                names[nr.entity_id].append(Name(nr.display, _KINDS[nr.kind], nr.position))
            for eid, r in entity_rows.items():
                out[eid] = _entity(r, names[eid])
        return out

    def iter_all_entities(self, batch: int = 50_000) -> Iterator[Entity]:
        """Every entity with its names, streamed in entity-id order (for start-up).

        Two ordered streams merged by id, read with plain driver cursors (start-up reads every
        row, and SQLAlchemy's row objects would double its cost). Ids are ordered by code point
        on both databases (PostgreSQL: the "C" collation), the order Python's `<` uses.
        """
        order = "entity_id" if self._is_sqlite else 'entity_id COLLATE "C"'
        entity_rows = self._stream(
            "SELECT entity_id, ordinal, entity_type, status, placeholder, redirect_to "
            f"FROM entities ORDER BY {order}", batch, "load_entities")
        name_rows = self._stream(
            "SELECT entity_id, display, kind, position FROM names "
            f"WHERE kind <> 'retired' ORDER BY {order}", batch, "load_names")
        kinds, statuses, loaded = _KINDS, _STATUSES, Entity.loaded  # locals: read once a row
        types: dict[str, str] = {}  # one string per type, not one per entity
        pending = next(name_rows, None)
        for eid, ordinal, entity_type, status_text, placeholder, redirect_to in entity_rows:
            entity_type = types.setdefault(entity_type, entity_type)
            found: list[Name] = []
            while pending is not None and pending[0] < eid:
                pending = next(name_rows, None)
            while pending is not None and pending[0] == eid:
                found.append(Name(pending[1], kinds[pending[2]], pending[3]))
                pending = next(name_rows, None)
            status = statuses[status_text]
            yield loaded(eid, entity_type, status, ordinal, bool(placeholder), redirect_to,
                         () if status is Status.MERGED else tuple(found))

    def _stream(self, sql: str, batch: int, name: str) -> Iterator[tuple[Any, ...]]:
        """Rows of one query in this transaction, fetched `batch` at a time."""
        raw = self._driver()
        # psycopg streams only from a named (server-side) cursor; sqlite3 always streams.
        cursor = raw.cursor() if self._is_sqlite else raw.cursor(name=name)
        try:
            cursor.execute(sql)
            while rows := cursor.fetchmany(batch):
                yield from rows
        finally:
            cursor.close()

    def insert_entities(self, entities: Sequence[Entity], *, now: float) -> None:
        if entities:
            self._driver_many(
                self._sql.insert_entity,
                [(e.entity_id, e.ordinal, e.entity_type, e.status.value, e.placeholder,
                  e.redirect_to, now) for e in entities],
            )

    def update_entity(self, entity_id: str, **values: Any) -> None:
        values = {k: (v.value if isinstance(v, Status) else v) for k, v in values.items()}
        self.conn.execute(
            update(t.entities).where(t.entities.c.entity_id == entity_id).values(**values)
        )

    def compress_redirects(self, source: str, target: str) -> list[str]:
        """Point everything that redirected to source at target; returns those ids."""
        ids = list(
            self.conn.scalars(
                select(t.entities.c.entity_id).where(t.entities.c.redirect_to == source)
            )
        )
        if ids:
            self.conn.execute(
                update(t.entities).where(t.entities.c.redirect_to == source).values(redirect_to=target)
            )
        return ids

    def merged_into(self, entity_id: str) -> list[str]:
        return list(
            self.conn.scalars(
                select(t.entities.c.entity_id).where(t.entities.c.redirect_to == entity_id)
            )
        )

    def entity_count(self) -> int:
        return int(self.conn.scalar(select(func.count()).select_from(t.entities)) or 0)

    # -- names ---------------------------------------------------------------------------------

    def name_rows(self, entity_id: str) -> list[NameRow]:
        rows = self.conn.execute(
            select(t.names.c.display, t.names.c.kind, t.names.c.position, t.names.c.source)
            .where(t.names.c.entity_id == entity_id)
            .order_by(t.names.c.position)
        )
        return [NameRow(r.display, r.kind, r.position, r.source) for r in rows]

    def put_names(self, entity_id: str, rows: Sequence[NameRow]) -> None:
        """Insert or overwrite (kind, position, source) of the given names of one entity."""
        self.put_names_of([(entity_id, r) for r in rows])

    def put_names_of(self, rows: Sequence[tuple[str, NameRow]]) -> None:
        if rows:
            self._driver_many(
                self._sql.upsert_names,
                [(eid, r.display, r.kind, r.position, r.source) for eid, r in rows],
            )

    def move_names(self, source: str, target: str, rows: Sequence[NameRow]) -> None:
        """Re-home a merged source's names on its target; rows carry the target's new kinds.

        The source's own rows stay, marked retired: nothing is deleted, and a merged entity has
        no names of its own.
        """
        self.conn.execute(
            update(t.names).where(t.names.c.entity_id == source).values(kind=RETIRED)
        )
        self.put_names(target, rows)

    # -- placeholders --------------------------------------------------------------------------

    def placeholder(self, display: str, entity_type: str) -> str | None:
        row = self._driver_one(self._sql.placeholder, (display, entity_type))
        return row[0] if row is not None else None

    def insert_placeholder(self, display: str, entity_type: str, entity_id: str) -> None:
        self._driver_many(self._sql.insert_placeholder, [(display, entity_type, entity_id)])

    def merged_placeholder_pairs(self, ids: Iterable[str] | None = None) -> dict[str, str]:
        """placeholder id -> its pair's display form, for the placeholders merged away (all of
        them, or those among ids)."""
        p, e = t.placeholders, t.entities
        query = (select(p.c.entity_id, p.c.display)
                 .join(e, e.c.entity_id == p.c.entity_id)
                 .where(e.c.status == Status.MERGED.value))
        if ids is None:
            return {r.entity_id: r.display for r in self.conn.execute(query)}
        out: dict[str, str] = {}
        for chunk in _chunks(list(ids), 500):
            rows = self.conn.execute(query.where(p.c.entity_id.in_(chunk)))
            out.update((r.entity_id, r.display) for r in rows)
        return out

    # -- links ---------------------------------------------------------------------------------

    def link(self, x: str, y: str) -> LinkRow | None:
        a, b = ordered_pair(x, y)
        r = self._driver_one(self._sql.link, (a, b))
        return LinkRow(*r) if r is not None else None

    def put_link(self, x: str, y: str, state: str, seq: int, *, actor: str | None = None,
                 reason: str | None = None, now: float | None = None) -> None:
        a, b = ordered_pair(x, y)
        self._driver_many(self._sql.upsert_link, [(a, b, state, seq, actor, reason, now)])

    def set_link_state(self, x: str, y: str, state: str) -> None:
        a, b = ordered_pair(x, y)
        self.conn.execute(
            update(t.links).where(t.links.c.a == a, t.links.c.b == b).values(state=state)
        )

    def links_of(self, entity_id: str) -> list[LinkRow]:
        """Open and distinct links touching one entity."""
        rows = self.conn.execute(
            select(t.links).where(
                or_(t.links.c.a == entity_id, t.links.c.b == entity_id),
                t.links.c.state.in_(("open", "distinct")),
            )
        )
        return [LinkRow(r.a, r.b, r.state, r.created_seq) for r in rows]

    def entity_ids_page(self, *, after: str, statuses: Sequence[str], entity_type: str,
                        limit: int) -> list[str]:
        """Entity ids after `after`, in id order, of these statuses (and type, when given)."""
        e = t.entities.c
        q = select(e.entity_id).where(e.status.in_(list(statuses)))
        if after:
            q = q.where(e.entity_id > after)
        if entity_type:
            q = q.where(e.entity_type == entity_type)
        return [r[0] for r in self.conn.execute(q.order_by(e.entity_id).limit(limit))]

    def count_open_links(self) -> int:
        """possibly_same_as links awaiting a curator (by the (state, created_seq) index)."""
        return int(self.conn.scalar(
            select(func.count()).select_from(t.links).where(t.links.c.state == "open")) or 0)

    def open_links(self, *, entity_id: str | None, after: tuple[int, str, str] | None,
                   limit: int) -> list[LinkRow]:
        q = select(t.links).where(t.links.c.state == "open")
        if entity_id:
            q = q.where(or_(t.links.c.a == entity_id, t.links.c.b == entity_id))
        if after is not None:
            seq, a, b = after
            q = q.where(
                or_(
                    t.links.c.created_seq > seq,
                    and_(t.links.c.created_seq == seq, t.links.c.a > a),
                    and_(t.links.c.created_seq == seq, t.links.c.a == a, t.links.c.b > b),
                )
            )
        q = q.order_by(t.links.c.created_seq, t.links.c.a, t.links.c.b).limit(limit)
        return [LinkRow(r.a, r.b, r.state, r.created_seq) for r in self.conn.execute(q)]

    # -- evidence ------------------------------------------------------------------------------

    def add_evidence(self, rows: dict[tuple[str, str, str, str], int]) -> None:
        """Add counts to evidence rows keyed (entity_id, context_id, surface, raw_type)."""
        if rows:
            self._driver_many(
                self._sql.add_evidence,
                [(*row, n) for row, n in rows.items()],
            )

    def evidence_summary(self, entity_ids: Sequence[str]) -> tuple[int, int]:
        """(resolves recorded, distinct contexts) over the given entities together."""
        r = self.conn.execute(
            select(
                func.coalesce(func.sum(t.evidence.c.count), 0),
                func.count(func.distinct(t.evidence.c.context_id)),
            ).where(t.evidence.c.entity_id.in_(list(entity_ids)))
        ).one()
        return int(r[0]), int(r[1])

    # -- change feed ---------------------------------------------------------------------------

    def max_seq(self) -> int:
        return int(self.conn.scalar(select(func.coalesce(func.max(t.changes.c.seq), 0))) or 0)

    def changes_after(self, seq: int, limit: int | None = None) -> list[ChangeRecord]:
        rows = (
            self.conn.exec_driver_sql(self._sql.changes_after_raw, (seq,))
            if not limit
            else self.conn.execute(self._sql.changes_after.limit(limit), {"after": seq})
        )
        return [
            ChangeRecord(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5]) for r in rows
        ]

    def append_changes(self, records: Sequence[ChangeRecord]) -> None:
        if records:
            self._driver_many(
                self._sql.insert_changes,
                [(c.seq, c.kind, c.entity_id, c.other_id, json_text.dumps(c.detail, sort_keys=True),
                  c.recorded_at) for c in records],
            )

    # -- idempotent batch replies ----------------------------------------------------------------

    def batch_reply(self, request_hash: str, *, not_before: float) -> str | None:
        row = self._driver_one(self._sql.batch_reply, (request_hash, not_before))
        return row[0] if row is not None else None

    def put_batch_reply(self, request_hash: str, reply: str, *, now: float) -> None:
        self._driver_many(self._sql.upsert_reply, [(request_hash, reply, now)])

    def purge_batch_replies(self, *, before: float) -> None:
        self.conn.execute(t.batch_replies.delete().where(t.batch_replies.c.created_at < before))


def _entity(r: Any, found: list[Name]) -> Entity:
    status = _STATUSES[r.status]
    return Entity(
        entity_id=r.entity_id,
        entity_type=r.entity_type,
        status=status,
        ordinal=r.ordinal,
        placeholder=bool(r.placeholder),
        redirect_to=r.redirect_to,
        names=() if status is Status.MERGED else tuple(found),
    )


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
