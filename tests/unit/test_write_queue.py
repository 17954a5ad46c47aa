"""The write queue: group commit in submission order, failures to every job of a group, a
submitter that may not wait never waits, and a cancelled job is never written."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import pytest

from identity_server.store import WouldBlock
from identity_server.write_queue import WriteQueue


class Recorder:
    """A write_group that records its groups; `gate` holds a group until set."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.blocked_once = False
        self.fail_with: BaseException | None = None

    def __call__(self, jobs: Sequence[str], *, wait: bool = True) -> list[str]:
        if not wait and self.blocked_once:
            self.blocked_once = False
            raise WouldBlock("the lock is taken")
        self.entered.set()
        assert self.gate.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        self.groups.append(list(jobs))
        return [f"done {job}" for job in jobs]


def test_a_lone_job_is_written_by_its_submitter_at_once() -> None:
    recorder = Recorder()
    queue: WriteQueue[str, str] = WriteQueue(recorder)
    future = queue.submit("a", may_wait=False)
    assert future.done() and future.result() == "done a"
    assert recorder.groups == [["a"]]
    queue.close()


def test_jobs_submitted_while_a_group_is_written_form_the_next_group_in_order() -> None:
    recorder = Recorder()
    recorder.gate.clear()
    queue: WriteQueue[str, str] = WriteQueue(recorder)
    first = threading.Thread(target=queue.submit, args=("first",))
    first.start()
    assert recorder.entered.wait(10)
    later = [queue.submit(name, may_wait=False) for name in ("b", "c", "d")]
    assert not any(f.done() for f in later)  # queued behind the group being written
    recorder.gate.set()
    first.join(10)
    assert [f.result(timeout=10) for f in later] == ["done b", "done c", "done d"]
    assert recorder.groups == [["first"], ["b", "c", "d"]]
    queue.close()


def test_a_group_that_would_block_is_written_by_the_writer_thread() -> None:
    recorder = Recorder()
    recorder.blocked_once = True
    queue: WriteQueue[str, str] = WriteQueue(recorder)
    future = queue.submit("a", may_wait=False)
    assert future.result(timeout=10) == "done a"
    assert recorder.groups == [["a"]]
    queue.close()


def test_a_failed_group_fails_each_of_its_jobs_and_the_queue_goes_on() -> None:
    recorder = Recorder()
    recorder.fail_with = RuntimeError("disk full")
    queue: WriteQueue[str, str] = WriteQueue(recorder)
    failed = queue.submit("a")
    with pytest.raises(RuntimeError, match="disk full"):
        failed.result(timeout=10)
    recorder.fail_with = None
    assert queue.submit("b").result(timeout=10) == "done b"
    queue.close()


def test_a_job_cancelled_before_its_group_began_is_not_written() -> None:
    recorder = Recorder()
    recorder.gate.clear()
    queue: WriteQueue[str, str] = WriteQueue(recorder)
    threading.Thread(target=queue.submit, args=("first",)).start()
    assert recorder.entered.wait(10)
    gone: Future[str] = queue.submit("gone", may_wait=False)
    kept = queue.submit("kept", may_wait=False)
    assert gone.cancel()
    recorder.gate.set()
    assert kept.result(timeout=10) == "done kept"
    assert recorder.groups == [["first"], ["kept"]]
    queue.close()


def test_after_close_a_job_fails_instead_of_waiting_forever() -> None:
    recorder = Recorder()
    recorder.blocked_once = True
    queue: WriteQueue[str, str] = WriteQueue(recorder)
    queue.close()
    future = queue.submit("late", may_wait=False)
    with pytest.raises(RuntimeError, match="closed"):
        future.result(timeout=10)


def test_jobs_submitted_during_a_gather_window_are_written_as_one_group() -> None:
    recorder = Recorder()
    queue: WriteQueue[str, str] = WriteQueue(recorder)
    windows: list[Callable[[], None]] = []
    first = queue.submit("a", may_wait=False, gather=windows.append)
    more = [queue.submit(name, may_wait=False, gather=windows.append) for name in ("b", "c")]
    assert len(windows) == 1 and not first.done()  # one window, opened by the first job
    windows[0]()  # the window ends
    assert [f.result(timeout=0) for f in (first, *more)] == ["done a", "done b", "done c"]
    assert recorder.groups == [["a", "b", "c"]]
    queue.close()


def test_close_fails_a_job_whose_window_never_ended() -> None:
    """The event loop stopped with a window open: close() fails its jobs instead of leaving
    their callers waiting for ever."""
    queue: WriteQueue[str, str] = WriteQueue(Recorder())
    windows: list[Callable[[], None]] = []
    future = queue.submit("a", may_wait=False, gather=windows.append)
    queue.close()
    with pytest.raises(RuntimeError, match="closed"):
        future.result(timeout=0)


def test_a_group_stops_growing_at_its_weight_and_the_rest_follow_in_order() -> None:
    """Large requests queued together commit one group after another (each answered as its
    group is done), never all in one transaction; one heavier than the cap goes alone."""
    recorder = Recorder()
    recorder.gate.clear()
    queue: WriteQueue[str, str] = WriteQueue(recorder, weight=len, max_group_weight=4)
    first = threading.Thread(target=queue.submit, args=("x",))
    first.start()
    assert recorder.entered.wait(10)
    later = [queue.submit(job, may_wait=False) for job in ("aa", "bb", "c", "dddddd", "e")]
    recorder.gate.set()
    first.join(10)
    assert [f.result(timeout=10) for f in later] == [f"done {j}" for j in
                                                     ("aa", "bb", "c", "dddddd", "e")]
    assert recorder.groups == [["x"], ["aa", "bb"], ["c"], ["dddddd"], ["e"]]
    queue.close()
