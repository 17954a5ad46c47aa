"""Fixtures for ingest integration tests: a real stub server on port 0, corpora, DB snapshots."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from ingest.testing import StubServer, serve_stub

TABLES = ("papers", "mentions", "relationships", "rejects", "redirects", "possibly_same_as",
          "sync_state")
# Wall-clock columns may differ between runs; a closed relationship must still be closed.
WALL_CLOCK = {"ingested_at", "valid_from"}

Snapshot = dict[str, list[tuple[Any, ...]]]


def take_snapshot(db: Path, *, wall_clock: bool = False,
                  leave_out: Collection[str] = ()) -> Snapshot:
    """Every table's rows, sorted; without wall-clock columns unless asked, nor the columns
    in `leave_out`."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        out: Snapshot = {}
        for table in TABLES:
            cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
            exprs = []
            for c in cols:
                if c in leave_out:
                    continue
                if c == "valid_to" and not wall_clock:
                    exprs.append("valid_to IS NOT NULL AS closed")
                elif wall_clock or c not in WALL_CLOCK:
                    exprs.append(f'"{c}"')
            out[table] = con.execute(
                f"SELECT {', '.join(exprs)} FROM {table} ORDER BY ALL").fetchall()
        return out
    finally:
        con.close()


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """What a query of the graph at db returns, read-only."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def write_jsonl(path: Path, papers: Iterable[Any]) -> Path:
    """Writes papers (dicts, or raw strings for deliberately broken lines)."""
    with path.open("w", encoding="utf-8") as f:
        for p in papers:
            f.write((p if isinstance(p, str) else json.dumps(p)) + "\n")
    return path


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with serve_stub() as server:
        yield server


@pytest.fixture
def snapshot() -> Callable[..., Snapshot]:
    return take_snapshot


@pytest.fixture
def jsonl() -> Callable[[Path, Iterable[Any]], Path]:
    return write_jsonl


def kill_at(proc: subprocess.Popen[Any], seconds: float) -> bool:
    """SIGKILLs ``proc`` ``seconds`` from now unless it ends first; True when SIGKILL ended it.

    The outcome is read from the exit status, not from a poll before the kill, so a job that ends
    just before the signal counts as "ended first" (False), never as a failed kill. Any exit status
    other than 0 or -SIGKILL is a job that failed on its own and fails the test.
    """
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)  # not waited for yet, so the pid is still this process
    status = proc.wait(timeout=30)
    if status == -signal.SIGKILL:
        return True
    assert status == 0, f"the job failed on its own (exit status {status})"
    return False


@pytest.fixture(name="kill_at")
def kill_at_fixture() -> Callable[[subprocess.Popen[Any], float], bool]:
    return kill_at
