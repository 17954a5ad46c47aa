"""The import use case: an authority file's records become canonical entities, and the
provisional entities they name are merged into them (SPEC section 3, "import merges")."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from identity_server import lifecycle
from identity_server.authority import AuthorityRecord, Line, RecordError, parse_authority
from identity_server.checks import check_type_length, checked_id, is_unicode
from identity_server.domain import Status, is_provisional_id
from identity_server.errors import IdentityError, InvalidArgument, StoreUnavailable
from identity_server.live_index import LiveIndex
from identity_server.normalize import display_form, key
from identity_server.unit import Unit

if TYPE_CHECKING:
    from identity_server.service import ServiceConfig

logger = logging.getLogger(__name__)

IMPORT_CHUNK = 1000
# An import collects its merge targets again after merging, in case a change landed meanwhile;
# so many passes at most (each needs a change landing during the one before).
MAX_IMPORT_MERGE_PASSES = 16


@dataclass(frozen=True, slots=True)
class ImportReport:
    imported: int = 0
    created: int = 0
    updated: int = 0
    merged: int = 0
    linked: int = 0
    errors: tuple[RecordError, ...] = ()


class AuthorityImport:
    """One import: records written a chunk at a time, each chunk a unit of work, then the
    import merges. `write_unit` runs work in one write transaction (the service's)."""

    def __init__(self, write_unit: Callable[[Callable[[Unit], None]], None], live: LiveIndex,
                 config: ServiceConfig) -> None:
        self._write_unit = write_unit
        self._live = live
        self._config = config

    def run(self, lines: Iterable[Line], fmt: str | None = None, *,
            progress: Callable[[int], object] | None = None) -> ImportReport:
        """Import an authority file's lines; bad records are refused with their line numbers.

        `progress` is called with the number of records handled after each transaction."""
        errors: list[RecordError] = []
        counts = {"imported": 0, "created": 0, "updated": 0, "merged": 0, "linked": 0}
        # Each key the import brought -> the records bringing it (a tuple: mostly one, and an
        # import of millions of records holds millions of keys).
        keys: dict[str, tuple[str, ...]] = {}
        chunk: list[AuthorityRecord] = []

        def flush() -> None:
            if chunk:
                self._write_unit(lambda u: self._import_chunk(u, list(chunk), counts, keys, errors))
                if progress is not None:
                    progress(len(chunk))
                chunk.clear()

        try:
            for item in parse_authority(lines, fmt):
                if isinstance(item, RecordError):
                    errors.append(item)
                    continue
                chunk.append(item)
                if len(chunk) >= IMPORT_CHUNK:
                    flush()
            flush()
        except StoreUnavailable:
            raise
        except Exception as e:
            # The input broke off (bad bytes, a cancelled stream): the chunks committed before
            # stay, so they get their import merges too, and the error says what was kept.
            try:
                self._merge_imported(keys, counts)
            except Exception:
                logger.exception("import merges after a failed import failed")
            if isinstance(e, IdentityError) and not counts["imported"] and not errors:
                raise  # refused before any record (a UTF-16 file): nothing to account for
            if isinstance(e, IdentityError):
                raise type(e)(
                    f"{e}; {counts['imported']} records from before it were imported (with "
                    "their merges) and the rest were not: import the corrected file again "
                    "(records already imported are replaced, not duplicated)") from e
            raise
        self._merge_imported(keys, counts)
        return ImportReport(errors=tuple(sorted(errors, key=lambda e: e.line)), **counts)

    def _merge_imported(self, keys: dict[str, tuple[str, ...]], counts: dict[str, int]) -> None:
        """The import merges, decided for each provisional entity over every key the import
        brought, so that the outcome does not depend on the order of records or keys: one
        compatible canonical target in all merges it, several link it to each. A key counts for
        an entity only where a record of compatible type brought it: the records imported are
        what a provisional entity is merged into, never a canonical entity that merely shares
        a key with a record the entity could not converge on.

        Targets are collected a part at a time (resolves go on between parts), then merged in
        write transactions. A change that lands in between (a merge moving a spelling with one
        of the keys onto another provisional entity) is caught by collecting again after the
        merges, until a collection finds nothing not yet handled: the outcome is then the one
        of that change made before the import."""
        pending = list(keys)
        handled: dict[str, frozenset[str]] = {}  # provisional id -> the targets it was given
        linked: set[str] = set()
        for _ in range(MAX_IMPORT_MERGE_PASSES):
            targets: dict[str, set[str]] = {}
            for i in range(0, len(pending), IMPORT_CHUNK):
                with self._live.lock:  # a part at a time: resolves go on between parts
                    self._live.settle()
                    self._collect_import_targets(pending[i : i + IMPORT_CHUNK], keys, targets)
            found = [pid for pid, t in targets.items() if handled.get(pid) != frozenset(t)]
            if not found:
                return
            for i in range(0, len(found), IMPORT_CHUNK):
                part = found[i : i + IMPORT_CHUNK]
                self._write_unit(lambda u, part=part, targets=targets: (  # type: ignore[misc]
                    self._import_merges(u, part, targets, counts, linked)))
            handled.update((pid, frozenset(targets[pid])) for pid in found)
        logger.warning("import merges: changes kept landing while they were made; stopped "
                       "after %d passes", MAX_IMPORT_MERGE_PASSES)

    def _import_chunk(self, u: Unit, records: list[AuthorityRecord], counts: dict[str, int],
                      keys: dict[str, tuple[str, ...]], errors: list[RecordError]) -> None:
        new: dict[str, tuple[str, str, str, list[str]]] = {}
        for rec in records:
            try:
                checked = self._check_record(rec)
            except InvalidArgument as e:
                errors.append(RecordError(rec.line, str(e)))
                continue
            entity_id, name, entity_type, aliases = checked
            if entity_id in new:  # the same id twice in a chunk: create it, then re-import
                u.create_canonicals(list(new.values()))
                new.clear()
            existing = self._live.index.get(entity_id)
            if existing is not None:
                u.reimport_canonical(existing, name, entity_type, aliases)
                counts["updated"] += 1
            else:
                new[entity_id] = checked
                counts["created"] += 1
            counts["imported"] += 1
            for spelling in (name, *aliases):  # rule 3 compares with every name of the record
                k = key(spelling)
                if len(k) >= 3:
                    brought = keys.get(k, ())
                    if entity_id not in brought:
                        keys[k] = (*brought, entity_id)
        u.create_canonicals(list(new.values()))

    def _check_record(self, rec: AuthorityRecord) -> tuple[str, str, str, list[str]]:
        entity_id = rec.entity_id.strip()
        if not entity_id:
            raise InvalidArgument("empty id")
        checked_id(entity_id)
        if is_provisional_id(entity_id):
            raise InvalidArgument(f"id {entity_id!r} looks like a provisional id")
        existing = self._live.index.get(entity_id)
        if existing is not None and existing.status is Status.MERGED:
            raise InvalidArgument(f"id {entity_id!r} was merged into {existing.redirect_to}")
        if existing is not None and existing.status is not Status.CANONICAL:
            raise InvalidArgument(f"id {entity_id!r} belongs to a provisional entity")
        check_type_length(rec.entity_type)
        entity_type = self._config.vocabulary.for_authority(rec.entity_type)
        name = display_form(rec.name)
        if not name:
            raise InvalidArgument("empty name")
        if not key(name):
            raise InvalidArgument(f"name {name!r} has no letters, digits or symbols")
        limit = self._config.max_mention_length
        if len(name) > limit:
            raise InvalidArgument(f"name is {len(name)} code points long; the limit is {limit}")
        aliases = [a for a in (display_form(x) for x in rec.aliases) if a and key(a)]
        for i, a in enumerate(aliases, start=1):
            if len(a) > limit:
                raise InvalidArgument(f"alias {i} ({a[:40]!r}...) is {len(a)} code points long; "
                                      f"the limit is {limit}")
        for what, text in (("id", entity_id), ("name", name), *(("an alias", a) for a in aliases)):
            if not is_unicode(text):  # a JSON \ud800 escape: no character at all
                raise InvalidArgument(f"{what} contains a lone surrogate (a \\ud800-\\udfff "
                                      "escape standing alone): not valid Unicode")
        return entity_id, name, entity_type, aliases

    def _collect_import_targets(self, keys: list[str], brought_by: dict[str, tuple[str, ...]],
                                targets: dict[str, set[str]]) -> None:
        """For each provisional, non-placeholder entity holding one of keys that a record of
        compatible type brought, the canonical entities of compatible type holding it (rule 3:
        every name compares); `brought_by`: each key's imported records."""
        index = self._live.index
        for k in keys:
            entities = [e for e in (index.get(i) for i in index.with_key(k)) if e]
            canonical = [e for e in entities if e.status is Status.CANONICAL]
            imported = {e.entity_id for e in map(index.live, brought_by[k]) if e is not None}
            for p in entities:
                found = {c.entity_id for c in lifecycle.import_merge_target(p, canonical)}
                if not found.isdisjoint(imported):
                    targets.setdefault(p.entity_id, set()).update(found)

    def _import_merges(self, u: Unit, provisional: list[str], targets: dict[str, set[str]],
                       counts: dict[str, int], linked_ids: set[str]) -> None:
        """Merge each provisional entity into its one target, or link it to each of several;
        what changed since the targets were collected (a merge, a promotion) is read again."""
        entities = (self._live.index.get(pid) for pid in provisional)
        for p in sorted((e for e in entities if e is not None), key=lambda e: e.ordinal):
            pid = p.entity_id
            found = lifecycle.import_merge_target(
                p, (e for e in (self._live.index.live(t) for t in targets[pid]) if e))
            if len(found) == 1 and not u.is_distinct(pid, found[0].entity_id):
                u.merge(p, found[0], reason="import")
                counts["merged"] += 1
            elif len(found) > 1:
                linked = [c for c in found if u.link(pid, c.entity_id)]
                if linked and pid not in linked_ids:  # counted once, however many passes
                    linked_ids.add(pid)
                    counts["linked"] += 1


__all__ = ["IMPORT_CHUNK", "AuthorityImport", "ImportReport"]
