"""The one write queue: jobs submitted while a group is being written, or while a group-commit
window is open, form the next group, and each group is written in one transaction (group
commit).

Every writing resolve goes through here, from the gRPC server's event loop and from in-process
callers on threads alike. A submitter that finds nobody writing writes the group itself at once:
on a thread it may wait for the store's lock; on the event loop it may not, so a group that would
have to wait is handed to the queue's own writer thread instead. Whatever is queued while a group
is written goes to that thread too, so no submitter writes more than its own group.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from identity_server.store import WouldBlock

J = TypeVar("J")
R = TypeVar("R")

# write_group(jobs, wait=...) -> one result per job, in order; with wait=False it raises
# WouldBlock, before doing anything, when a lock stands in its way.
GroupWrite = Callable[..., Sequence[R]]


class WriteQueue(Generic[J, R]):
    """Group commit over `write_group`, one group at a time."""

    def __init__(self, write_group: GroupWrite[R], *, weight: Callable[[J], int] = lambda _: 1,
                 max_group_weight: int | None = None) -> None:
        self._write_group = write_group
        # A group stops growing at this weight (at least one job): large requests queued
        # together commit one after another, each answered as it is done, instead of all in
        # one long transaction that ends, or is cut off by a deadline, for all of them at once.
        self._weight = weight
        self._max_group_weight = max_group_weight
        self._lock = threading.Lock()
        self._queued: list[tuple[J, Future[R]]] = []
        self._writing = False  # a group is being written (by a submitter or the writer thread)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="identity-writer")

    def submit(self, job: J, *, may_wait: bool = True,
               gather: Callable[[Callable[[], None]], object] | None = None) -> Future[R]:
        """Queue job; its future holds its result once its group is committed. `may_wait`:
        False on the event loop (never waits: a blocked group goes to the writer thread).
        `gather`: on the event loop, a way to run a callback a little later (a group-commit
        window): a job that finds the queue idle is then written by that callback, with the
        jobs submitted meanwhile, instead of at once."""
        future: Future[R] = Future()
        with self._lock:
            self._queued.append((job, future))
            if self._writing:
                return future  # joins the next group
            self._writing = True
        if gather is not None:
            gather(self._write_gathered)
            return future
        try:
            self._write_queued(wait=may_wait)
        except WouldBlock:
            self._hand_to_writer()
            return future
        except BaseException:
            self._pass_on()
            raise
        self._pass_on()
        return future

    def _write_gathered(self) -> None:
        """The end of a group-commit window, on the event loop: the group, as a loop write."""
        try:
            self._write_queued(wait=False)
        except WouldBlock:
            self._hand_to_writer()
            return
        self._pass_on()

    def close(self) -> None:
        """Finish what the writer thread has, then stop it; what is left (a window whose event
        loop has stopped) fails instead of waiting for ever."""
        self._writer.shutdown(wait=True)
        self._fail_queued()

    def _write_queued(self, *, wait: bool) -> None:
        """Write everything queued now as one group and settle its futures (a failed group's
        error goes to each of them). With wait=False a WouldBlock leaves the group queued,
        untouched, and is raised."""
        with self._lock:
            cut = self._group_end()
            taken = self._queued[:cut]
            del self._queued[:cut]
        group = [(job, f) for job, f in taken if _claimed(f)]
        if not group:
            return
        try:
            results = self._write_group([job for job, _ in group], wait=wait)
        except WouldBlock:
            if wait:
                raise AssertionError("a write that may wait raised WouldBlock") from None
            with self._lock:
                self._queued[:0] = group  # first in line again
            raise
        except BaseException as e:  # the group's transaction failed: so does each of its jobs
            for _, future in group:
                future.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        for (_, future), result in zip(group, results, strict=True):
            future.set_result(result)

    def _group_end(self) -> int:
        """How many of the queued jobs the next group takes (called under the lock)."""
        if self._max_group_weight is None:
            return len(self._queued)
        total = 0
        for i, (job, _) in enumerate(self._queued):
            total += self._weight(job)
            if total > self._max_group_weight and i > 0:
                return i
        return len(self._queued)

    def _pass_on(self) -> None:
        """After a group: the next one, queued meanwhile, goes to the writer thread."""
        with self._lock:
            if not self._queued:
                self._writing = False
                return
        self._hand_to_writer()

    def _hand_to_writer(self) -> None:
        try:
            self._writer.submit(self._drain)
        except RuntimeError:  # closed: nothing will write what is queued
            self._fail_queued()

    def _fail_queued(self) -> None:
        """Fail every job still queued: the queue is closed and nothing will write them."""
        with self._lock:
            stranded, self._queued = self._queued, []
            self._writing = False
        for _, future in stranded:
            if _claimed(future):
                future.set_exception(RuntimeError("the write queue is closed"))

    def _drain(self) -> None:
        """On the writer thread: write groups until nothing is queued."""
        while True:
            self._write_queued(wait=True)
            with self._lock:
                if not self._queued:
                    self._writing = False
                    return


def _claimed(future: Future[R]) -> bool:
    """Take a queued job's future for its group: False when its caller cancelled it first (the
    job is dropped, unwritten); a group put back after WouldBlock holds its futures already."""
    return future.running() or future.set_running_or_notify_cancel()


__all__ = ["WriteQueue"]
