"""Where a served call's time goes under goals 1 and 2: py-spy samples of the real server.

    .venv/bin/pip install py-spy      # not a dependency of the project; it needs ptrace (root,
                                      # or kernel.yama.ptrace_scope = 0)
    .venv/bin/python -m benchmarks.spy                      # both goals, 20 s each, 1M entities
    .venv/bin/python -m benchmarks.spy --goal unary --seconds 30 --native

Starts `identity-server serve` over a copy of the suite's 1M store (built and cached as the suite
builds it), drives one goal's load from this process - goal 1: ResolveBatch of 100 from 4
callers, its 70/15/15 mix, a context id each; goal 2: Resolve from 16 callers, its read-mostly
mix - and meanwhile has `py-spy record --gil` sample the server. Sampling only the thread that
holds the GIL is the right lens here: both goals are bound by one thread's Python (the event
loop's), so the GIL's busy share and what fills it are the figures that matter. It prints
the share of wall time the GIL was held, the samples by layer (this project's modules, gRPC,
asyncio, SQLite, protobuf, ...), and the top functions by own and by inclusive samples. With
`--native`, C frames (SQLite, gRPC core, CPython) are sampled too and counted in their layer.

A measuring aid, not part of the suite: its figures are shares of one run's samples, not ratios
against a baseline, and sampling slows the server (py-spy pauses it for each sample). SQLite
releases the GIL while it works, so its own time shows in the share of wall time the GIL is free,
not in the tables.
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import bench_batch, bench_unary
from benchmarks.common import VENV_BIN, drive, identity_server
from benchmarks.data import build_store, copy_store, mention_mix, sample_entities
from benchmarks.grpc_load import Client, batch_requests, unary_requests

logger = logging.getLogger("benchmarks.spy")

HERE = Path(__file__).resolve().parent
N_ENTITIES = 1_000_000
# Mentions a second of sampling, about twice what the server resolves on a fast 2-core host, so
# the load outlasts the sampling (which also stops early if the load runs out: see spy_on).
BATCH_ITEMS_A_SECOND = 40_000
UNARY_CALLS_A_SECOND = 6_000
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*)\)$")

# (layer, test on a frame's file or function) in order: the first that holds names the layer.
LAYERS: tuple[tuple[str, Callable[[str, str], bool]], ...] = (
    ("identity_server (ours)", lambda f, fn: "/identity_server/" in f),
    ("identity_api (generated)", lambda f, fn: "/identity_api/" in f),
    ("gRPC (Python, Cython, core)", lambda f, fn: "/grpc/" in f or "grpc" in fn.lower()),
    ("asyncio (loop, selector, sockets)",
     lambda f, fn: any(m in f for m in ("/asyncio/", "_asynciomodule.c", "selectors.py",
                                        "socketmodule.c"))),
    ("SQLite", lambda f, fn: "sqlite" in f.lower() or fn.startswith("sqlite3")),
    ("SQLAlchemy", lambda f, fn: "/sqlalchemy/" in f),
    ("protobuf", lambda f, fn: "protobuf" in f or "upb" in fn),
    ("orjson", lambda f, fn: "orjson" in f),
    ("Python stdlib (inspect, abc, enum, ...)",
     lambda f, fn: f.startswith("<frozen") or ("/lib/python3" in f and "site-packages" not in f)),
    ("CPython runtime (gc, objects, eval)",
     lambda f, fn: "libpython" in f or "/Python-3." in f or fn.startswith(("_Py", "Py"))),
    ("kernel, libc", lambda f, fn: "libc" in f or "ld-linux" in f or f == "[vdso]"),
)


def layer_of(file: str, function: str) -> str:
    for name, test in LAYERS:
        if test(file, function):
            return name
    return "other"


def _own_frame(frames: list[tuple[str, str]]) -> tuple[str, str]:
    """The frame a sample's own time is charged to: its leaf, except that a dataclass's
    generated `__init__` (file `<string>`) is charged to the code that made the object."""
    function, file = frames[-1]
    if file == "<string>" and len(frames) > 1:
        return frames[-2]
    return function, file


def parse_raw(text: str) -> list[tuple[list[tuple[str, str]], int]]:
    """py-spy's raw output (one collapsed stack a line, root first, then its sample count) as
    (frames as (function, file), count); the thread's own root frame is dropped."""
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = []
        for part in stack.split(";"):
            m = FRAME.match(part)
            if m:
                frames.append((m["function"], m["file"]))
        if frames:
            stacks.append((frames, int(count)))
    return stacks


def summarise(stacks: list[tuple[list[tuple[str, str]], int]], *, seconds: float,
              rate: int, top: int = 15) -> str:
    total = sum(n for _, n in stacks)
    if not total:
        return "no samples (did py-spy attach? it needs ptrace)"
    by_layer: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for frames, n in stacks:
        function, file = _own_frame(frames)
        by_layer[layer_of(file, function)] += n
        own[_label(function, file)] += n
        for label in {_label(fn, f) for fn, f in frames if "/identity_server/" in f}:
            inclusive[label] += n
    held = (f"GIL held in {total:,} of ~{int(seconds * rate):,} samples "
            f"({100 * total / (seconds * rate):.0f}% of wall time)")
    lines = [held, "", "| layer (own samples) | share |", "|---|---|"]
    lines += [f"| {name} | {100 * n / total:.1f}% |" for name, n in by_layer.most_common()]
    lines += ["", "| function (own samples) | share |", "|---|---|"]
    lines += [f"| {label} | {100 * n / total:.1f}% |" for label, n in own.most_common(top)]
    lines += ["", "| identity_server function (inclusive samples) | share |", "|---|---|"]
    lines += [f"| {label} | {100 * n / total:.1f}% |"
              for label, n in inclusive.most_common(top)]
    return "\n".join(lines)


def _label(function: str, file: str) -> str:
    short = file.rsplit("/site-packages/", 1)[-1]
    for marker in ("/identity_server/", "/identity_api/", "/benchmarks/"):
        if marker in short:
            short = marker.strip("/") + "/" + short.split(marker, 1)[1]
    return f"{function} ({short})"


Load = tuple[Callable[[Client], Any], list[Any], int]  # client method, requests, callers


def load_for(goal: str, pool: Sequence[Any], seconds: float) -> Load:
    """One goal's load, enough for `seconds` of sampling: fresh mentions throughout, so the
    share of calls that write stays the goal's."""
    if goal == "batch":
        mentions = mention_mix(pool, int(seconds * BATCH_ITEMS_A_SECOND), bench_batch.MIX,
                               seed=7001)
        tag = f"spy-{int(time.time())}"
        return (lambda c: c.resolve_batch,
                batch_requests(mentions, bench_batch.GOAL_SIZE, tag), 4)
    mentions = mention_mix(pool, int(seconds * UNARY_CALLS_A_SECOND), bench_unary.MIX,
                           seed=7002)
    return (lambda c: c.resolve, unary_requests(mentions), bench_unary.CALLERS)


def spy_on(goal: str, db: Path, pool: Sequence[Any], *, seconds: float, rate: int,
           native: bool, raw_out: Path) -> str:
    """Sample the server for `seconds` of its goal's load, or until the load runs out (the
    GIL's share is of the time sampled)."""
    method, requests, callers = load_for(goal, pool, seconds)
    with identity_server(db) as srv, Client(srv.address, srv.pid) as client:
        call = method(client)
        drive(call, requests[:200], concurrency=callers)  # warm up, unsampled
        load = threading.Thread(
            target=drive, args=(call, requests[200:]),
            kwargs={"concurrency": callers, "time_cap_s": seconds + 10}, daemon=True)
        load.start()
        time.sleep(1.0)  # the load at its pace before sampling starts
        argv = [_py_spy(), "record", "--pid", str(srv.pid), "--format", "raw",
                "--output", str(raw_out), "--rate", str(rate), "--gil", "--full-filenames",
                "--nolineno"]
        if native:
            argv.append("--native")
        spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        started = time.monotonic()
        load.join(seconds)
        sampled = time.monotonic() - started
        spy.send_signal(signal.SIGINT)  # py-spy writes what it has sampled, and exits
        try:
            _, err = spy.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
            raise
        if spy.returncode != 0 or not raw_out.exists():
            raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
        load.join(seconds + 60)
    return summarise(parse_raw(raw_out.read_text()), seconds=sampled, rate=rate)


def _py_spy() -> str:
    found = shutil.which("py-spy", path=str(VENV_BIN)) or shutil.which("py-spy")
    if found is None:
        sys.exit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.spy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--goal", choices=("batch", "unary", "both"), default="both")
    ap.add_argument("--seconds", type=float, default=20.0, help="sampling time a goal")
    ap.add_argument("--rate", type=int, default=200, help="samples a second")
    ap.add_argument("--native", action="store_true", help="sample C frames too")
    ap.add_argument("--out", type=Path, default=HERE / "out",
                    help="where the suite's data is cached, and the raw samples go")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    _py_spy()
    out: Path = args.out.resolve()
    store = build_store(out, N_ENTITIES)
    pool = sample_entities(store, N_ENTITIES, 20_000, seed=5)
    goals = ("batch", "unary") if args.goal == "both" else (args.goal,)
    for goal in goals:
        db = copy_store(store, out / "work" / f"spy-{goal}.sqlite")
        raw = out / f"spy-{goal}.txt"
        logger.info("sampling the server under goal %s's load for %.0f s",
                    "1 (ResolveBatch 100)" if goal == "batch" else "2 (unary Resolve)",
                    args.seconds)
        report = spy_on(goal, db, pool, seconds=args.seconds, rate=args.rate,
                        native=args.native, raw_out=raw)
        print(f"\n## {goal}: {N_ENTITIES:,} entities, raw samples in {raw}\n")
        print(report)


if __name__ == "__main__":
    main()
