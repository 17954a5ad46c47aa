"""Issue 50: ResolveBatch with 1 and 2 server processes on one PostgreSQL store, and the store
write lock's share of the time.

Every writing call takes one lock for the whole store (PostgreSQL: `pg_advisory_xact_lock`) and
decides under it, and every ResolveBatch with a context id writes evidence, so every batch takes
the lock. Three measurements, in one run, on a PostgreSQL database of its own (created here,
dropped at the end) holding the 100k-entity benchmark store:

- **throughput**: ResolveBatch of 100 (bench_batch's 70/15/15 mix, a fresh context id a batch)
  from 8 callers, each on a connection of its own, against `identity-server serve --workers 1`
  and then `--workers 2` (one port, SO_REUSEPORT), in passes alternating the two (a pass starts
  each server afresh over the same database); items/s is the median of the rounds, and the
  CPU µs an item of the server's processes (supervisor and workers, from /proc).
- **the lock's share**: the same load against servers run by this module in a child process
  each (`start_server`, as `serve` does), whose store reports how long each write waited for the
  lock (`lock_wait_observer`) and held it, from granted to committed
  (`lock_hold_observer`). With one process, saturated by the load, the lock is held a share `h`
  of the wall time; N processes, each as busy, would need it N x h of the time, so the lock, not
  the CPU, becomes the limit at N = 1 / h processes (more cores than processes assumed; with
  fewer, the CPU is the limit first). With two processes (two children, the callers split
  between their ports), the sum of their shares is how much of the time the lock is held.
- **PostgreSQL's commit rate**: one connection committing transactions that take the same kind
  of lock and insert one row: the most lock-serialised transactions a second this database
  commits, whatever the work inside them.

Run on its own (the figures go to RESULTS.md's section when `--write-results` is given):
`python -m benchmarks.bench_workers [--quick] [--write-results]`; `BENCH_PG_ADMIN_URL` names the
database to connect to for CREATE DATABASE (default postgresql://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import grpc

from benchmarks.bench_batch import MIX
from benchmarks.common import (
    CALL_TIMEOUT_S,
    ROOT,
    VENV_BIN,
    Row,
    ServerProcess,
    alone_parser,
    child_env,
    cpu_seconds,
    drive,
    fmt_rate,
    median,
    process_tree,
    run_alone,
)
from benchmarks.data import Stored, build_store, mention_mix, sample_entities
from benchmarks.grpc_load import SERVICE, batch_requests
from identity_server.domain import NameRow
from identity_server.server import GRPC_OPTIONS
from identity_server.store import open_store

logger = logging.getLogger(__name__)

PG_ADMIN_URL = os.environ.get("BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/test")
SIZE = 100
CALLERS = 8
N_ENTITIES = 100_000
COMMIT_KEY = 0x50_50  # the commit-rate loop's advisory lock (its own database: any key)
SECTION = "## Server processes on PostgreSQL (issue 50)"


def profile(quick: bool) -> dict[str, int]:
    if quick:
        return {"items": 1000, "rounds": 2, "passes": 1, "commit_s": 1}
    return {"items": 3000, "rounds": 3, "passes": 2, "commit_s": 3}


# -- the database ------------------------------------------------------------------------------

def pg_admin() -> Any:
    """An autocommit connection for CREATE and DROP DATABASE, or None without PostgreSQL."""
    import psycopg

    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.Error as e:
        logger.warning("no PostgreSQL at %s (%s): the workers benchmark is skipped",
                       PG_ADMIN_URL, e)
        return None


@contextmanager
def pg_database(admin: Any) -> Iterator[str]:
    """A fresh database (its URL), dropped at the end."""
    from sqlalchemy import make_url

    name = f"bench_workers_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(PG_ADMIN_URL).set(drivername="postgresql+psycopg", database=name) \
            .render_as_string(hide_password=False)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def load_store(sqlite_db: Path, pg_url: str, chunk: int = 20_000) -> None:
    """The generated SQLite store's entities and names, written into PostgreSQL through the
    store's interface (as benchmarks.data builds stores)."""
    source, target = open_store(f"sqlite:///{sqlite_db}"), open_store(pg_url)
    try:
        now = time.time()
        with source.read() as read:
            entities = read.iter_all_entities()
            while batch := list(itertools.islice(entities, chunk)):
                with target.write() as tx:
                    tx.insert_entities(batch, now=now)
                    tx.put_names_of([(e.entity_id, NameRow(n.display, n.kind.value, n.position,
                                                           "authority"))
                                     for e in batch for n in e.names])
    finally:
        source.close()
        target.close()


def commit_rate(pg_url: str, seconds: float) -> float:
    """Commits a second of one connection whose transactions take an advisory lock and insert
    one row: the ceiling of lock-serialised writes on this database."""
    import psycopg
    from sqlalchemy import make_url

    plain = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_commits (id bigserial PRIMARY KEY, at float8)")
        done = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (COMMIT_KEY,))
                conn.execute("INSERT INTO bench_commits (at) VALUES (%s)", (time.time(),))
            done += 1
        return done / (time.perf_counter() - started)


# -- load --------------------------------------------------------------------------------------

class Spread:
    """ResolveBatch callers on a connection each (a local subchannel pool a channel: channels
    to one address would otherwise share one connection, and so one worker), the channels
    assigned round-robin over `addresses`; each calling thread keeps the channel it first
    takes. Requests go serialized in advance, replies stay bytes (grpc_load.Client's reasons)."""

    def __init__(self, addresses: Sequence[str], channels: int) -> None:
        options = [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        self.channels = [grpc.insecure_channel(addresses[i % len(addresses)], options=options)
                         for i in range(channels)]
        for channel in self.channels:
            grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
        self._calls: list[grpc.UnaryUnaryMultiCallable[bytes, bytes]] = [
            c.unary_unary(SERVICE + "ResolveBatch") for c in self.channels]
        self._next = itertools.count()
        self._mine = threading.local()

    def resolve_batch(self, request: bytes) -> bytes:
        call = getattr(self._mine, "call", None)
        if call is None:
            call = self._mine.call = self._calls[next(self._next) % len(self._calls)]
        reply: bytes = call(request, timeout=CALL_TIMEOUT_S)
        return reply

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def _seed(tag: str, round_: int) -> int:
    """A mention mix's seed, the same in every run (str's hash is not)."""
    return zlib.crc32(f"{tag}/{round_}".encode()) % 1_000_000


def tree_cpu(pid: int) -> float:
    return sum(cpu_seconds(p) for p in process_tree(pid))


def connections_per_worker(supervisor: int, port: int) -> list[int]:
    """Established connections to `port` each worker of `serve --workers` holds (from /proc)."""
    established = _established(port)
    counts = []
    for pid in process_tree(supervisor)[1:]:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if b"spawn_main" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
        except FileNotFoundError:
            continue
        inodes = set()
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except FileNotFoundError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        counts.append(len(inodes & established))
    return counts


def _established(port: int) -> set[str]:
    """Inodes of the established TCP sockets whose local port is `port`."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as fh:
            next(fh)
            for line in fh:
                fields = line.split()
                if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    found.add(fields[9])
    return found


# -- throughput with `serve --workers N` -------------------------------------------------------

def served(pg_url: str, workers: int, pool: Sequence[Stored], *, items: int, rounds: int,
           tag: str) -> dict[str, Any]:
    """Rounds of fresh batches against `identity-server serve --workers N` on pg_url."""
    argv = [str(VENV_BIN / "identity-server"), "--log-level", "warning", "serve", "--db", pg_url,
            "--port", "0", "--workers", str(workers)]
    env = {**child_env(), "IDENTITY_DRAIN_SECONDS": "0"}
    rates, cpu = [], []
    with ServerProcess(argv, name=f"serve --workers {workers}", env=env) as srv:
        assert srv.pid is not None
        spread = Spread([srv.address], CALLERS)
        try:
            warm = batch_requests(mention_mix(pool, 20 * CALLERS, MIX, seed=_seed(tag, -1)),
                                  20, f"bench-workers-warm-{tag}")
            drive(spread.resolve_batch, warm, concurrency=CALLERS)
            spread_over = connections_per_worker(srv.pid, srv.port) if workers > 1 else [CALLERS]
            for r in range(rounds):
                requests = batch_requests(
                    mention_mix(pool, items, MIX, seed=_seed(tag, r)), SIZE,
                    f"bench-workers-{tag}-{r}")
                before = tree_cpu(srv.pid)
                res = drive(spread.resolve_batch, requests, concurrency=CALLERS)
                cpu.append((tree_cpu(srv.pid) - before) * 1e6 / max(1, res.completed * SIZE))
                if res.errors:
                    raise RuntimeError(f"{res.errors} ResolveBatch calls failed against "
                                       f"serve --workers {workers}")
                rates.append(res.completed * SIZE / res.elapsed_s)
        finally:
            spread.close()
    return {"items_per_s": rates, "server_cpu_us_per_item": cpu,
            "connections_per_worker": spread_over}


# -- the lock's share, from instrumented servers -------------------------------------------------

class Instrumented:
    """A server in a child process (`--serve-instrumented`) whose store adds up lock waits and
    holds; a line on its stdin asks for the totals so far."""

    def __init__(self, pg_url: str) -> None:
        self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_workers", "--serve-instrumented", pg_url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            cwd=ROOT, env=child_env())
        line = self._out.readline()
        if not line.startswith("listening on "):
            self.close()
            self._log.seek(0)
            raise RuntimeError(f"instrumented server did not start: {self._log.read()[-2000:]}")
        self.address = line.split()[-1]

    @property
    def _out(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def totals(self) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("totals\n")
        self.proc.stdin.flush()
        found: dict[str, float] = json.loads(self._out.readline())
        return found

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # its cue to stop
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()
        self._log.close()


def lock_share(pg_url: str, processes: int, pool: Sequence[Stored], *, items: int, rounds: int,
               tag: str, seen: bool = False) -> dict[str, Any]:
    """Rounds against `processes` instrumented servers (callers split evenly between them):
    per round, each process's lock hold and wait as shares of the round's wall time, and per
    transaction; the calls' median latency; the write groups written again because a guess
    no longer held. `seen`: each round's mentions are resolved once first (not measured), so
    the measured batches, under fresh context ids, only add evidence to known entities."""
    servers = [Instrumented(pg_url) for _ in range(processes)]
    spread = Spread([s.address for s in servers], CALLERS)
    out: dict[str, list[Any]] = {"hold_share": [], "wait_share": [], "hold_ms": [],
                                 "wait_ms": [], "writes_per_batch": [], "call_ms": [],
                                 "items_per_s": [], "cpu_ms_per_batch": [],
                                 "groups_missed": []}
    try:
        warm = batch_requests(mention_mix(pool, 20 * CALLERS, MIX, seed=_seed(tag, -1)), 20,
                              f"bench-lock-warm-{tag}")
        drive(spread.resolve_batch, warm, concurrency=CALLERS)
        for r in range(rounds):
            mentions = mention_mix(pool, items, MIX, seed=_seed(tag, r))
            if seen:
                drive(spread.resolve_batch, batch_requests(mentions, SIZE,
                                                           f"bench-lock-{tag}-{r}-first"),
                      concurrency=CALLERS)
            requests = batch_requests(mentions, SIZE, f"bench-lock-{tag}-{r}")
            before = [s.totals() for s in servers]
            res = drive(spread.resolve_batch, requests, concurrency=CALLERS)
            after = [s.totals() for s in servers]
            if res.errors:
                raise RuntimeError(f"{res.errors} ResolveBatch calls failed (lock share)")
            delta = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
            writes = sum(d["writes"] for d in delta)
            hold, wait = sum(d["hold_s"] for d in delta), sum(d["wait_s"] for d in delta)
            out["hold_share"].append([d["hold_s"] / res.elapsed_s for d in delta])
            out["wait_share"].append([d["wait_s"] / res.elapsed_s for d in delta])
            out["hold_ms"].append(hold * 1e3 / max(1, writes))
            out["wait_ms"].append(wait * 1e3 / max(1, writes))
            out["writes_per_batch"].append(writes / max(1, res.completed))
            out["call_ms"].append(median(res.latencies_s) * 1e3)
            out["items_per_s"].append(res.completed * SIZE / res.elapsed_s)
            out["cpu_ms_per_batch"].append(
                sum(d["cpu_s"] for d in delta) * 1e3 / max(1, res.completed))
            out["groups_missed"].append(sum(d["missed"] for d in delta))
    finally:
        spread.close()
        for s in servers:
            s.close()
    return out


def serve_instrumented(pg_url: str) -> None:
    """The child of `Instrumented`: a server whose store adds up its lock waits and holds;
    answers each line on stdin with the totals (and its CPU seconds) as JSON; stops at EOF."""
    import signal

    from identity_server.command_line import configure_logging
    from identity_server.server import serve_until_signalled, start_server
    from identity_server.settings import Settings
    from identity_server.store.postgres import PostgresStore

    configure_logging(logging.WARNING)
    running = start_server(Settings(db_url=pg_url, port=0))
    store = running.service.store
    assert isinstance(store, PostgresStore)
    totals = {"writes": 0.0, "hold_s": 0.0, "wait_s": 0.0}
    lock = threading.Lock()

    def waited(seconds: float) -> None:
        with lock:
            totals["wait_s"] += seconds

    def held(seconds: float) -> None:
        with lock:
            totals["writes"] += 1
            totals["hold_s"] += seconds

    store.lock_wait_observer = waited
    store.lock_hold_observer = held

    def answer() -> None:
        for _ in sys.stdin:
            with lock:
                snapshot = {**totals, "cpu_s": cpu_seconds(),
                            "missed": float(running.service.guesses_missed)}
            sys.stdout.write(json.dumps(snapshot) + "\n")
            sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGINT)  # stdin closed: stop, without a drain

    threading.Thread(target=answer, daemon=True).start()
    serve_until_signalled(running, 1.0, ready=lambda: (
        sys.stdout.write(f"listening on 127.0.0.1:{running.port}\n"), sys.stdout.flush()))


# -- the suite's rows --------------------------------------------------------------------------

def run(out: Path, *, quick: bool) -> list[Row]:
    """The rows of this benchmark (one saying why, when PostgreSQL is not there)."""
    p = profile(quick)
    admin = pg_admin()
    if admin is None:
        return [Row("6 workers", "ResolveBatch with 1 and 2 server processes on PostgreSQL",
                    f"not run: no PostgreSQL at {PG_ADMIN_URL}", "", None, "report", None)]
    sqlite_db = build_store(out, N_ENTITIES)
    pool = sample_entities(sqlite_db, N_ENTITIES, 20_000, seed=50)
    with admin, pg_database(admin) as pg_url:
        started = time.perf_counter()
        load_store(sqlite_db, pg_url)
        logger.info("workers: %d entities into PostgreSQL in %.1f s", N_ENTITIES,
                    time.perf_counter() - started)
        commits = commit_rate(pg_url, p["commit_s"])
        by_workers: dict[int, dict[str, list[Any]]] = {1: {}, 2: {}, 4: {}}
        for n in range(p["passes"]):
            for workers in ((1, 2, 4) if n % 2 == 0 else (4, 2, 1)):
                got = served(pg_url, workers, pool, items=p["items"], rounds=p["rounds"],
                             tag=f"{n}-{workers}")
                for key, values in got.items():
                    by_workers[workers].setdefault(key, []).extend(
                        values if key != "connections_per_worker" else [values])
                logger.info("workers: serve --workers %d, pass %d: %s items/s", workers, n,
                            ", ".join(f"{x:,.0f}" for x in got["items_per_s"]))
        one = lock_share(pg_url, 1, pool, items=p["items"], rounds=p["rounds"], tag="lock-1")
        two = lock_share(pg_url, 2, pool, items=p["items"], rounds=p["rounds"], tag="lock-2")
        seen = lock_share(pg_url, 1, pool, items=p["items"], rounds=p["rounds"],
                          tag="lock-seen", seen=True)
    return rows(by_workers, one, two, seen, commits)


def rows(by_workers: dict[int, dict[str, list[Any]]], one: dict[str, list[Any]],
         two: dict[str, list[Any]], seen: dict[str, list[Any]], commits: float) -> list[Row]:
    rate = {w: median(by_workers[w]["items_per_s"]) for w in (1, 2, 4)}
    cpu = {w: median(by_workers[w]["server_cpu_us_per_item"]) for w in (1, 2, 4)}
    held = median([shares[0] for shares in one["hold_share"]])
    waited = median([shares[0] for shares in one["wait_share"]])
    held_two = median([sum(shares) for shares in two["hold_share"]])
    hold_ms, wait_ms = median(one["hold_ms"]), median(one["wait_ms"])
    limit = 1 / held if held > 0 else float("inf")
    held_seen = median([shares[0] for shares in seen["hold_share"]])
    limit_seen = 1 / held_seen if held_seen > 0 else float("inf")
    load = (f"ResolveBatch of {SIZE} (70/15/15 mix, a context id a batch: evidence written), "
            f"PostgreSQL store of {N_ENTITIES:,} entities, {CALLERS} callers on a connection "
            "each")
    lock_data = {"one_process": one, "two_processes": two, "hold_share": held,
                 "wait_share": waited, "hold_share_two": held_two, "hold_ms": hold_ms,
                 "wait_ms": wait_ms, "call_ms": median(one["call_ms"]),
                 "writes_per_batch": median(one["writes_per_batch"]),
                 "cpu_ms_per_batch": median(one["cpu_ms_per_batch"]),
                 "lock_limit_processes": limit, "pg_commits_per_s": commits,
                 "groups_missed": sum(one["groups_missed"]) + sum(two["groups_missed"]),
                 "lock_bound_batches_per_s": 1e3 / hold_ms if hold_ms > 0 else float("nan")}
    def data(w: int) -> dict[str, Any]:
        return {"items_per_s": rate[w], "server_cpu_us_per_item": cpu[w],
                "rounds": by_workers[w]["items_per_s"],
                "cpu_rounds": by_workers[w]["server_cpu_us_per_item"],
                "connections_per_worker": by_workers[w]["connections_per_worker"]}

    return [
        Row("6 workers 1", f"{load}: `serve --workers 1`",
            f"{fmt_rate(rate[1], ' items/s')}, server CPU {cpu[1]:,.0f} µs/item", "", None,
            "report", None, data(1)),
        Row("6 workers 2", f"{load}: `serve --workers 2` (one port), passes alternating with "
            "--workers 1",
            f"{fmt_rate(rate[2], ' items/s')}, server CPU {cpu[2]:,.0f} µs/item",
            f"1 process {fmt_rate(rate[1], ' items/s')}", rate[2] / rate[1], "report", None,
            data(2)),
        Row("6 workers 4", f"{load}: `serve --workers 4` (one port), in the same passes",
            f"{fmt_rate(rate[4], ' items/s')}, server CPU {cpu[4]:,.0f} µs/item",
            f"1 process {fmt_rate(rate[1], ' items/s')}", rate[4] / rate[1], "report", None,
            data(4)),
        Row("6 workers lock",
            "the store's write lock held (granted to committed) as a share of one saturated "
            "process's time, same load; ratio: 1 / share, the processes at which the lock, "
            "not the CPU, is the limit",
            f"held {held:.0%} of the time ({hold_ms:.1f} ms a write, waited {wait_ms:.2f} ms; "
            f"2 processes: held {held_two:.0%})",
            f"PostgreSQL {fmt_rate(commits, ' commits/s')} (lock + 1-row insert)", limit,
            "report", None, lock_data),
        Row("6 workers lock seen",
            "the same, each round's mentions resolved once before (not measured), so the "
            "measured batches, under fresh context ids, only add evidence to known entities",
            f"held {held_seen:.0%} of the time ({median(seen['hold_ms']):.1f} ms a write, "
            f"{median(seen['items_per_s']):,.0f} items/s)", "", limit_seen, "report", None,
            {"one_process": seen, "hold_share": held_seen, "hold_ms": median(seen["hold_ms"]),
             "writes_per_batch": median(seen["writes_per_batch"]),
             "items_per_s": median(seen["items_per_s"]),
             "lock_limit_processes": limit_seen}),
    ]


def section(rows_json: Sequence[dict[str, Any]], machine: dict[str, str], date: str) -> str:
    """RESULTS.md's section on this benchmark, from its rows (as results.json keeps them)."""
    found = {r["benchmark"]: r for r in rows_json if r["benchmark"].startswith("6 workers")}
    lines = [SECTION, ""]
    if "6 workers lock" not in found:
        skipped = found.get("6 workers")
        why = f" ({skipped['figure']})" if skipped else ""
        return "\n".join([*lines, f"Not measured in this run{why}.", ""])
    one, two, lock = (found[k]["data"] for k in ("6 workers 1", "6 workers 2", "6 workers lock"))
    four = found["6 workers 4"]["data"] if "6 workers 4" in found else None
    seen = found["6 workers lock seen"]["data"] if "6 workers lock seen" in found else None
    two_lock = lock["two_processes"]
    lines += [
        (f"Run {date} on {machine['nproc']} cores ({machine['cpu']}), PostgreSQL on the same "
        f"machine; the load generator shares the cores ({CALLERS} callers, a connection each); "
        "`benchmarks/bench_workers.py` (README: what it measures)."),
        "",
        "| measure | figure |",
        "|---|---|",
        (f"| ResolveBatch of {SIZE}, `serve --workers 1` | {one['items_per_s']:,.0f} items/s "
        f"(rounds {_listed(one['rounds'])}), server CPU {one['server_cpu_us_per_item']:,.0f} "
        "µs/item |"),
        (f"| ResolveBatch of {SIZE}, `serve --workers 2` | {two['items_per_s']:,.0f} items/s, "
        f"{two['items_per_s'] / one['items_per_s']:.2f}x (rounds {_listed(two['rounds'])}), "
        f"server CPU {two['server_cpu_us_per_item']:,.0f} µs/item; connections per worker, "
        f"each pass: {two['connections_per_worker']} |"),
        *([(f"| ResolveBatch of {SIZE}, `serve --workers 4` | {four['items_per_s']:,.0f} "
           f"items/s, {four['items_per_s'] / one['items_per_s']:.2f}x (rounds "
           f"{_listed(four['rounds'])}), server CPU {four['server_cpu_us_per_item']:,.0f} "
           f"µs/item; connections per worker, each pass: {four['connections_per_worker']} |")]
          if four else []),
        (f"| write lock held, 1 process | {lock['hold_share']:.0%} of the wall time: "
        f"{lock['hold_ms']:.1f} ms a write transaction ({lock['writes_per_batch']:.2f} a "
        f"batch), after waiting {lock['wait_ms']:.2f} ms; a batch call takes "
        f"{lock['call_ms']:.1f} ms (median, {CALLERS} callers) and "
        f"{lock['cpu_ms_per_batch']:.1f} ms of server CPU |"),
        (f"| write lock held, 2 processes | {lock['hold_share_two']:.0%} of the wall time "
        "(the two processes' holds added up; each is timed to its commit's return, so they "
        f"overlap a little): {median(two_lock['hold_ms']):.1f} ms a write transaction "
        f"({median(two_lock['writes_per_batch']):.2f} a batch), after waiting "
        f"{median(two_lock['wait_ms']):.1f} ms; {median(two_lock['items_per_s']):,.0f} items/s, "
        f"{median(two_lock['cpu_ms_per_batch']):.1f} ms of server CPU a batch |"),
        (f"| processes at which the lock is the limit | 1 / {lock['hold_share']:.2f} = "
        f"{lock['lock_limit_processes']:.1f} |"),
        *([(f"| write groups written again (a guess no longer held under the lock) | "
           f"{lock['groups_missed']:.0f}, over both lock measurements |")]
          if "groups_missed" in lock else []),
        *([(f"| write lock held, 1 process, mentions seen before (evidence only) | "
           f"{seen['hold_share']:.0%} of the wall time: {seen['hold_ms']:.1f} ms a write "
           f"transaction ({seen['writes_per_batch']:.2f} a batch), {seen['items_per_s']:,.0f} "
           f"items/s; the lock is the limit at 1 / {seen['hold_share']:.2f} = "
           f"{seen['lock_limit_processes']:.1f} processes |")] if seen else []),
        (f"| lock-bound ceiling | 1 / {lock['hold_ms']:.1f} ms = "
        f"{lock['lock_bound_batches_per_s']:,.0f} write transactions/s, about "
        f"{lock['lock_bound_batches_per_s'] / max(lock['writes_per_batch'], 1e-9) * SIZE:,.0f}"
        " items/s, however many processes |"),
        (f"| PostgreSQL commit rate | {lock['pg_commits_per_s']:,.0f} commits/s (one connection: "
        "advisory lock + one-row insert) |"),
        "",
        ("How the limit is computed: one process under this load holds the lock a share h of "
        "the wall time; N processes as busy would need it N x h of the time, so beyond "
        "N = 1 / h the lock, not the CPU, bounds throughput, at 1 / (hold a write) writes a "
        "second. This assumes a core per process (here two cores also run the load generator "
        "and PostgreSQL, so two processes are CPU-bound before that)."),
        "",
    ]
    return "\n".join(lines)


def _listed(values: Sequence[float]) -> str:
    return ", ".join(f"{x:,.0f}" for x in values)


def main() -> None:
    parser = alone_parser("python -m benchmarks.bench_workers", __doc__)
    parser.add_argument("--serve-instrumented", metavar="PG_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_instrumented:
        serve_instrumented(args.serve_instrumented)
        return
    run_alone(args, title=SECTION, out_name="workers.json", run=run, section=section)


if __name__ == "__main__":
    main()
