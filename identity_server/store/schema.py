"""The identity store's tables (SQLAlchemy Core). Uniqueness lives here, in the database.

On SQLite, the tables with a natural primary key are WITHOUT ROWID (the rows kept in key order):
each row written is one b-tree insert instead of a rowid table's and its key index's. The batch
replies, rows of kilobytes, stay rowid tables. Stores made before keep their layout and work the
same (tests/integration/test_store_layout.py).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

entities = Table(
    "entities",
    metadata,
    Column("entity_id", String(512), primary_key=True),
    # Creation order: breaks ties between equally ranked candidates.
    Column("ordinal", BigInteger, nullable=False),
    Column("entity_type", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("placeholder", Boolean, nullable=False, default=False),
    # For merged entities: the live entity at the end of the chain (kept compressed on merge).
    Column("redirect_to", String(512), nullable=True),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("ordinal", name="uq_entities_ordinal"),
    Index("ix_entities_redirect_to", "redirect_to"),
    sqlite_with_rowid=False,
)

# Every display form of an entity: its name, aliases and surface forms. `kind` "retired" marks an
# authority alias that a re-import dropped (kept, never matched).
names = Table(
    "names",
    metadata,
    Column("entity_id", String(512), nullable=False),
    Column("display", Text, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("position", Integer, nullable=False),
    # Who recorded an alias: "authority", "curator", "merge" or "previous_name"; or
    # "authority_seen", an authority alias that is a surface form again once dropped.
    Column("source", String(16), nullable=False, default=""),
    PrimaryKeyConstraint("entity_id", "display", name="pk_names"),
    sqlite_with_rowid=False,
)

# One placeholder per ambiguous (display form, type) pair: the primary key makes it so.
placeholders = Table(
    "placeholders",
    metadata,
    Column("display", Text, nullable=False),
    Column("entity_type", String(64), nullable=False),
    Column("entity_id", String(512), nullable=False),
    PrimaryKeyConstraint("display", "entity_type", name="pk_placeholders"),
    sqlite_with_rowid=False,
)

# possibly_same_as links, unordered (a < b), with the curator's decision. state: open, distinct,
# same (merged by a decision or a merge), moved (re-keyed onto a merge target).
links = Table(
    "links",
    metadata,
    Column("a", String(512), nullable=False),
    Column("b", String(512), nullable=False),
    Column("state", String(16), nullable=False),
    Column("created_seq", BigInteger, nullable=False),
    Column("actor", Text, nullable=True),
    Column("reason", Text, nullable=True),
    Column("decided_at", Float, nullable=True),
    PrimaryKeyConstraint("a", "b", name="pk_links"),
    Index("ix_links_b", "b"),
    Index("ix_links_state_seq", "state", "created_seq"),
    sqlite_with_rowid=False,
)

evidence = Table(
    "evidence",
    metadata,
    Column("entity_id", String(512), nullable=False),
    Column("context_id", Text, nullable=False),
    Column("surface", Text, nullable=False),
    Column("raw_type", Text, nullable=False),
    Column("count", BigInteger, nullable=False),
    PrimaryKeyConstraint("entity_id", "context_id", "surface", "raw_type", name="pk_evidence"),
    sqlite_with_rowid=False,
)

# The change feed; sequence numbers are assigned under the store's write lock: gapless, in commit
# order, so a reader can resume from any point. On SQLite, `seq` is an INTEGER primary key, so the
# rowid itself: one b-tree per row instead of a table and an index (every write appends here).
changes = Table(
    "changes",
    metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=False),
    Column("kind", String(32), nullable=False),
    Column("entity_id", String(512), nullable=False),
    Column("other_id", String(512), nullable=False, default=""),
    Column("detail", Text, nullable=False, default="{}"),
    Column("recorded_at", Float, nullable=False),
)

# Replies of idempotent ResolveBatch requests, by a hash of the request.
batch_replies = Table(
    "batch_replies",
    metadata,
    Column("request_hash", String(64), primary_key=True),
    Column("reply", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_batch_replies_created_at", "created_at"),
)
