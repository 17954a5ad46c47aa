"""Count the Python calls a served Resolve costs the server's event-loop thread, ours or the echo's.

A served call's time drifts by a third within the hour on these hosts. The number of
Python-level calls it makes does not, so this is how two versions of the serving path, or the
server and the echo, compare to a few percent. Goal 2 is bound by the event loop's thread.

This starts the identity server (over a copy of STORE) or the echo in this process. A child
process sends goal 2's mix from its 16 callers, so that this process's GIL serves only the
server. cProfile is enabled on the event loop's thread alone, for the CALLS calls after a
warm-up. It prints:

- the Python-level calls a served call makes, grouped by where they are: our modules, asyncio
  (which gRPC's asyncio server drives), other libraries, builtins;
- our functions called most.

cProfile slows the loop, so its times are not the served ones; its call counts are.

    .venv/bin/python -m benchmarks.loop_profile --store STORE --n N           # the identity server
    .venv/bin/python -m benchmarks.loop_profile --store STORE --n N --echo    # the echo

STORE is a generated store (`benchmarks/out/stores/identity-100000-20240601.sqlite` after a
run); it is copied before any write. Measured on stop 38 (100k store, 4,000 calls): the echo's
loop made 353-367 calls a served call in five runs, ours 545-553 in three (how many calls one
turn of the loop takes in varies the counts by ~2%).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import CALL_TIMEOUT_S, ROOT, child_env

CALLERS = 16
WARM_CALLS = 1000
_PACKAGES = ("identity_server", "ingest", "benchmarks")  # this project's code
_PROJECT = "project: "  # the origin of its calls, before the module's path


def client(address: str, store: Path, n: int, calls: int) -> None:
    """The child: warm the server up, say so, wait for the go on stdin, send CALLS calls."""
    from benchmarks.bench_unary import MIX
    from benchmarks.common import drive
    from benchmarks.data import mention_mix, sample_entities
    from benchmarks.grpc_load import Client, unary_requests

    pool = sample_entities(store, n, 5000, seed=7)
    with Client(address) as c:
        drive(c.resolve, unary_requests(mention_mix(pool, WARM_CALLS, MIX, seed=99)),
              concurrency=CALLERS)
        print("warm", flush=True)
        if not sys.stdin.readline():  # the profiler gave up: no go will come
            return
        done = drive(c.resolve, unary_requests(mention_mix(pool, calls, MIX, seed=1234)),
                     concurrency=CALLERS)
        print(f"done {done.completed} {done.errors}", flush=True)


def _serve_echo() -> tuple[asyncio.AbstractEventLoop, int, Callable[[], None]]:
    """The echo on an event loop of its own thread, as the identity server runs."""
    from benchmarks.echo import start
    from identity_server.server import EventLoopThread

    thread = EventLoopThread()
    server, port, handlers = thread.run(start(0), CALL_TIMEOUT_S)

    def stop() -> None:
        thread.run(server.stop(1.0), CALL_TIMEOUT_S)
        handlers.shutdown()
        thread.close()

    return thread.loop, port, stop


def _serve_identity(db: Path) -> tuple[asyncio.AbstractEventLoop, int, Callable[[], None]]:
    from identity_server.server import start_server
    from identity_server.settings import Settings

    running = start_server(Settings(db_url=f"sqlite:///{db}", host="127.0.0.1", port=0))
    return running.loop, running.port, lambda: running.stop(grace=1.0)


def profile(store: Path, n: int, calls: int, *, echo: bool) -> tuple[pstats.Stats, int]:
    """(the loop thread's profile over `calls` served calls, the calls completed)."""
    from benchmarks.data import copy_store

    with tempfile.TemporaryDirectory() as scratch:
        loop, port, stop = (_serve_echo() if echo else
                            _serve_identity(copy_store(store, Path(scratch) / "store.sqlite")))
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.loop_profile", "client", "--address",
                 f"127.0.0.1:{port}", "--store", str(store), "--n", str(n), "--calls",
                 str(calls)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                env=child_env())
            assert child.stdin is not None and child.stdout is not None
            try:
                if child.stdout.readline().strip() != "warm":
                    raise RuntimeError("the load generator did not start")
                profiler = cProfile.Profile()
                # Enabled and disabled from the loop's own thread: only its calls are counted.
                asyncio.run_coroutine_threadsafe(_call(profiler.enable), loop).result(
                    CALL_TIMEOUT_S)
                child.stdin.write("go\n")
                child.stdin.flush()
                done = child.stdout.readline().split()
                asyncio.run_coroutine_threadsafe(_call(profiler.disable), loop).result(
                    CALL_TIMEOUT_S)
                if len(done) != 3 or done[0] != "done":
                    raise RuntimeError(f"the load generator failed: {done}")
                completed, errors = int(done[1]), int(done[2])
                if errors:
                    raise RuntimeError(f"{errors} of the profiled calls failed")
            finally:
                child.stdin.close()
                try:
                    child.wait(CALL_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        finally:
            stop()
    return pstats.Stats(profiler), completed


async def _call(work: Callable[[], None]) -> None:
    work()


def _origin(file: str, function: str) -> str:
    if file == "~":
        return "builtin methods" if function.startswith("<method") else "builtins"
    path = Path(file)
    if path.is_relative_to(ROOT) and (inside := path.relative_to(ROOT)).parts[0] in _PACKAGES:
        return f"{_PROJECT}{inside}"
    if "/asyncio/" in file:
        return "asyncio"
    return "other: " + "/".join(path.parts[-2:])


def report(stats: pstats.Stats, completed: int, top: int = 15) -> str:
    """Python-level calls a served call, by origin and, for ours, by function."""
    by_origin: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, object]]
    raw = stats.stats  # type: ignore[attr-defined]
    for (file, line, function), (_, calls, _, _, _) in raw.items():
        origin = _origin(file, function)
        by_origin[origin] += calls
        if origin.startswith(_PROJECT):
            ours[f"{origin.removeprefix(_PROJECT)}:{line} {function}"] += calls
    total = sum(by_origin.values())
    lines = [f"{total / completed:,.1f} Python-level calls a served call ({completed:,} calls)"]
    lines += [f"  {count / completed:8.1f}  {origin}" for origin, count in by_origin.most_common()
              if count / completed >= 0.5]
    lines.append("this project's functions called most, a served call:")
    lines += [f"  {count / completed:8.2f}  {name}" for name, count in ours.most_common(top)
              if count / completed >= 0.01]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("mode", nargs="?", choices=("profile", "client"), default="profile",
                        help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--n", type=int, required=True, help="the store's entity count")
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--echo", action="store_true", help="profile the echo instead")
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="also write the pstats file here")
    args = parser.parse_args()
    if args.mode == "client":
        client(args.address, args.store, args.n, args.calls)
        return
    stats, completed = profile(args.store, args.n, args.calls, echo=args.echo)
    if args.out is not None:
        stats.dump_stats(args.out)
    print(report(stats, completed))


if __name__ == "__main__":
    main()
