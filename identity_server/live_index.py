"""The in-memory name index, kept current with the store.

Built from the store at start, then caught up from the change feed before every decision, so a
decision always sees every committed change from every server process. Writes run under the
store's write lock and this process's lock (`write`); reads catch up without the store's lock;
answers that only read the index run without any lock when nothing changed since it last caught
up, optimistically (`answer`). New typo anchors are packed into the typo table in the
background.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from identity_server.domain import Entity
from identity_server.index import NameIndex
from identity_server.store import BeforeLock, SqlStore, Tx, WouldBlock
from identity_server.unit import LINK_KINDS, REPLAYED_KINDS, Unit, replayed

logger = logging.getLogger(__name__)

PACK_RETRY_AFTER_S = 60.0  # after a failed typo pack, the next waits this long
T = TypeVar("T")


class LiveIndex:
    """The name index over one store, and the locks and feed position that keep it current."""

    def __init__(self, store: SqlStore, *, typo_pack_at: int) -> None:
        self.store = store
        self.index = NameIndex()
        self.seq = 0  # the change feed's position the index holds
        self.lock = threading.RLock()
        # Odd while a thread changes the index (always under the lock), so a reader that ran
        # without the lock can tell whether what it read may be torn (see answer).
        self._index_version = 0
        self._settled_marker: bytes | None = None  # store.commit_marker() the index is current at
        # Typo anchors filed since the last pack that start a background pack.
        self.typo_pack_at = typo_pack_at
        self._packer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="typo-pack")
        self._packing: Future[None] | None = None
        self._no_pack_before = 0.0  # time.monotonic() before which no pack starts
        self.load()

    def load(self) -> None:
        """Build the index from the store: the feed position first, then every entity, so
        changes committed meanwhile are replayed by the next catch-up (reloads are idempotent)."""
        collecting = gc.isenabled()
        gc.disable()  # millions of long-lived objects: cyclic collections would re-walk them all
        try:
            with self.lock, self.changing(), self.store.read() as tx:
                self._settled_marker = self.store.commit_marker()
                self.seq = tx.max_seq()
                self.index = NameIndex()
                self.index.load(tx.iter_all_entities())
                self.index.note_merged_placeholders(tx.merged_placeholder_pairs())
        finally:
            gc.freeze()  # the index lives as long as the process: keep it out of later collections
            if collecting:
                gc.enable()
        logger.info("index built: %d entities, feed at %d", len(self.index), self.seq)

    def catch_up(self, tx: Tx) -> dict[str, Entity | None]:
        """Apply the changes committed since the index's position; the versions they replaced.

        New entities and surface forms (most of what resolving writes) are applied from the
        feed's events alone (`unit.replayed`); an entity any other change touched is read
        again from the store, which holds the result of all of them."""
        changes = tx.changes_after(self.seq)
        if not changes:
            return {}
        stored: set[str] = set()  # read from the store
        for c in changes:
            if c.kind not in LINK_KINDS and c.kind not in REPLAYED_KINDS:
                stored.add(c.entity_id)
                if c.other_id:
                    stored.add(c.other_id)
                stored.update(c.detail.get("redirected", ()))
        replaced: dict[str, Entity | None] = {}
        for c in changes:
            eid = c.entity_id
            if c.kind in LINK_KINDS or eid in stored:
                continue
            current = self.index.get(eid)
            entity = replayed(c, current)
            if entity is None:  # not as its writer saw it: the store has it
                stored.add(eid)
                continue
            replaced.setdefault(eid, current)
            self.index.put(entity)
        for eid, before in self.reload(tx, stored).items():
            replaced.setdefault(eid, before)
        self.seq = changes[-1].seq
        self.schedule_typo_pack()
        return replaced

    def reload(self, tx: Tx, ids: Iterable[str]) -> dict[str, Entity | None]:
        """Reload these entities from the store; the versions they replaced."""
        wanted = set(ids)
        replaced = {eid: self.index.get(eid) for eid in wanted}
        loaded = tx.load_entities(wanted)
        for eid in wanted:
            entity = loaded.get(eid)
            if entity is None:
                self.index.discard(eid)
            else:
                self.index.put(entity)
        unpaired = self.index.merged_placeholders_unpaired(wanted)
        if unpaired:  # merged away before this process saw them live
            self.index.note_merged_placeholders(tx.merged_placeholder_pairs(unpaired))
        return replaced

    @contextmanager
    def changing(self) -> Iterator[None]:
        """Mark the index as changing for the block (the caller holds the lock; never nested)."""
        self._index_version += 1
        try:
            yield
        finally:
            self._index_version += 1

    def write(self, work: Callable[[Unit], T], *, wait: bool = True,
              before_lock: BeforeLock | None = None) -> T:
        """work in a write transaction, under the lock. The store's write lock is taken first,
        so a write waiting for another process's holds no lock of this process: reads that
        must catch up go on meanwhile (nothing takes the store's lock while holding the lock).
        wait=False: WouldBlock, before anything is done, when either lock is taken.
        `before_lock`: what the transaction does before the store's lock (SqlStore.write)."""
        locked = False
        unit: Unit | None = None
        try:
            with self.store.write(wait=wait, before_lock=before_lock) as tx:
                if not self.lock.acquire(blocking=wait):
                    raise WouldBlock("another thread of this process holds the index")
                locked = True
                self._index_version += 1  # changing: lock-free readers wait or retry
                position = self.seq
                replaced = {} if self.settled() else self.catch_up(tx)
                unit = Unit(tx, self.index, self.seq, caught_up_from=position,
                            caught_up=replaced)
                result = work(unit)
                unit.flush()
            self.seq = unit.seq
            self._settle_after_own_commit(tx.commit_marker)
            self.schedule_typo_pack()
            return result
        except BaseException:
            if unit is not None and unit.touched:  # rolled back: the index forgets it too
                with self.store.read() as tx:
                    self.reload(tx, unit.touched)
            raise
        finally:
            if locked:
                self._index_version += 1
                self.lock.release()

    def schedule_typo_pack(self) -> None:
        """Start packing the typo overlay in the background when enough anchors wait in it
        (under the lock, so one pack at a time), keeping the index's memory near start-up's."""
        if self._packing is not None and not self._packing.done():
            return
        if time.monotonic() < self._no_pack_before:
            return
        if self.index.typo_pack_due(self.typo_pack_at):
            try:
                self._packing = self._packer.submit(self._pack_typo_overlay)
            except RuntimeError:  # closed: a straggling call must not fail after its commit
                logger.debug("typo pack not started: the service is closed")

    def _pack_typo_overlay(self) -> None:
        """Move the typo overlay's anchors into the packed table: set the overlay aside and,
        at the end, drop it under the lock (both quick); in between, merge it into the shards
        without the lock (reads and writes go on; anchors filed meanwhile wait in a fresh
        overlay for the next pack)."""
        index = self.index
        with self.lock, self.changing():
            pack = index.begin_typo_pack()
        try:
            index.build_typo_pack(pack)
        except Exception:  # a failed pack costs memory, never answers
            logger.exception("packing the typo table failed; its overlay keeps serving, and the "
                             "next pack waits %.0f s", PACK_RETRY_AFTER_S)
            with self.lock, self.changing():
                index.abandon_typo_pack(pack)
                self._no_pack_before = time.monotonic() + PACK_RETRY_AFTER_S
            return
        with self.lock, self.changing():
            installed = self.index is index and index.install_typo_pack(pack)
        pack.release()
        logger.info("typo table: %d anchors packed (%s)", len(pack.absorbed),
                    "installed" if installed else "dropped: the index was rebuilt")

    def read(self, work: Callable[[Tx], T]) -> T:
        with self.lock, self.store.read() as tx:
            with self.changing():
                self.catch_up(tx)
            return work(tx)

    def settle(self) -> None:
        """Bring the index up to the store's last commit (under the lock); no transaction when
        nothing was committed since the last look, or only this process's own writes were."""
        marker, last = self.store.commit_state()
        if marker is not None and marker == self._settled_marker:
            return
        if last != self.seq:
            with self.changing(), self.store.read() as tx:
                self.catch_up(tx)
        self._settled_marker = marker

    def settled(self) -> bool:
        """Whether the store reports no commit since the index was last known current."""
        marker = self._settled_marker
        return marker is not None and self.store.commit_marker() == marker

    def _settle_after_own_commit(self, own: bytes | None) -> None:
        """Mark the index settled at the commit just made when no other process committed
        since, so the next lock-free read need not take the lock to find that out. `own`: the
        store's marker as that commit left it, when the store could tell that nothing came
        after it; else the marker is read before the newest sequence number, so it never
        stands for more commits than the index holds."""
        if own is not None:
            self._settled_marker = own
            return
        marker, last = self.store.commit_state()
        if marker is not None and last == self.seq:
            self._settled_marker = marker

    def answer(self, work: Callable[..., T], *args: Any) -> T:
        """work(*args), which only reads the index, once the index holds every committed change.

        Optimistic first: when no thread is changing the index and the store reports no commit
        since the index last caught up, work runs without the lock, and its result stands if the
        index version did not move meanwhile (a torn read, or one that failed because the index
        changed under it, is retried). Otherwise, or then, under the lock.
        """
        result = self.answer_at_once(work, *args)
        if result is not None:
            return result
        with self.lock:
            self.settle()
            return work(*args)

    def as_it_stands(self, work: Callable[..., T], *args: Any) -> T:
        """work(*args) on the index as it stands (under the lock), without asking the store for
        newer commits: for a caller that checks later what changed since `seq` (it reads it in
        work) and costs a round trip to the store less."""
        with self.lock:
            return work(*args)

    def answer_at_once(self, work: Callable[..., T], *args: Any) -> T | None:
        """`answer`'s optimistic path alone: work(*args), or None when it needs the lock. (The
        arguments passed, not a closure made: the event loop answers most Resolves here.)"""
        version = self._index_version
        if not version & 1 and self.settled():
            try:
                result = work(*args)
            except Exception:
                if self._index_version == version:
                    raise
            else:
                if self._index_version == version:
                    return result
        return None

    def close(self) -> None:
        """Finish a typo pack in flight."""
        self._packer.shutdown(wait=True, cancel_futures=True)


__all__ = ["LiveIndex"]
