"""The event loop's group-commit window (loop_work.GroupWindow): a lone caller's writes never
wait; calls arriving beside waiting writes open a window; windows the loop spends idle close it
again, but for a probe now and then."""

from __future__ import annotations

import asyncio
import time

from identity_server.loop_work import BUSY_AT, COMPANY_AT, GATHER_S, PROBE_EVERY, GroupWindow


async def _written_at_once(window: GroupWindow, *, company: bool = False,
                           busy_s: float = 0.0) -> bool:
    """Defer one group; with `company`, a call arrives in the same turn; with `busy_s`, the
    loop works that long right after. Whether it was written without a window."""
    written: list[float] = []
    began = time.perf_counter()
    window.defer(lambda: written.append(time.perf_counter()))
    if company:
        window.note_call()
    if busy_s:
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    if not written:
        await asyncio.sleep(GATHER_S * 20)
    assert written, "the group was never written"
    return not busy_s and written[0] - began < GATHER_S / 2


def test_a_lone_caller_never_waits() -> None:
    async def run() -> list[bool]:
        window = GroupWindow()
        return [await _written_at_once(window) for _ in range(50)]

    assert all(asyncio.run(run()))


def test_company_opens_the_window() -> None:
    async def run() -> tuple[bool, bool]:
        window = GroupWindow()
        first = await _written_at_once(window, company=True)
        for _ in range(5):
            await _written_at_once(window, company=True, busy_s=GATHER_S)
        later = await _written_at_once(window, company=True)
        return first, later

    first, later = asyncio.run(run())
    assert first  # no company seen yet
    assert not later  # calls kept arriving beside waiting writes: now groups wait
    assert COMPANY_AT < 1


def test_windows_the_loop_spends_idle_close_but_for_probes() -> None:
    async def run() -> list[bool]:
        window = GroupWindow()
        for _ in range(5):  # company, and busy windows: windows open
            await _written_at_once(window, company=True, busy_s=GATHER_S)
        at_once = []
        for _ in range(2 * PROBE_EVERY + 10):  # company still, but the loop idles in windows
            at_once.append(await _written_at_once(window, company=True))
        return at_once

    at_once = asyncio.run(run())
    assert not at_once[0]  # the first idle window is still taken
    closed = at_once[10:]
    assert sum(closed) >= len(closed) - 3  # mostly unwaited: the busy average fell below
    assert not all(closed)  # a probe window every PROBE_EVERY groups
    assert BUSY_AT > 0
