"""The ``ingest`` command line: ``run``, ``sync`` and ``stats``.

The only place that reads settings, configures logging and prints. Without ``--server`` it starts
an embedded identity server in-process (SQLite in the working directory). Where ingest imports
``identity_server``: here, lazily, the embedded server and the settings checks the two commands
share (``identity_server.settings``); here and in ``ingest.settings``, the command-line parsing
and checks they share (``identity_server.command_line``, which imports nothing of the
server's), and in ``ingest.worker`` its logging set-up.

Exit codes: 0 the job ran (even if some items were rejected: see the summary); 1 the job could not
run (server unreachable for the whole retry budget, database locked, input missing); 2 bad usage.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from identity_client import IdentityClient, IdentityError, RetryPolicy
from identity_server.command_line import (
    add_command,
    add_log_format_option,
    command_parser,
    configure_logging,
    json_logs,
    log_format,
    parse_command_line,
    tell,
    whole_number,
)
from ingest.pipeline import (
    JobError,
    JobOptions,
    Resolver,
    ResolvesAhead,
    Summary,
    check_same_store,
    run_job,
    sync_redirects,
)
from ingest.read import CORRUPT, InputError, expand_paths, open_input
from ingest.settings import Settings
from ingest.sink import GraphSink, SinkError
from ingest.vocabulary import VocabularyError, default_vocabulary, load_vocabulary
from ingest.worker import JobWorker, WorkerFailed

logger = logging.getLogger(__name__)
_progress_log = logging.getLogger("ingest.progress")


@contextmanager
def identity_server_address(settings: Settings) -> Iterator[str]:
    """The server to talk to: ``--server``, or an embedded one started for this command."""
    if settings.server:
        yield settings.server
        return
    from identity_server.server import start_server  # lazy: the only import of the server
    from identity_server.settings import Settings as ServerSettings
    from identity_server.settings import describe_settings_error, unknown_environment

    for warning in unknown_environment(ServerSettings):
        logger.warning("embedded server: %s", warning)
    server_settings: dict[str, Any] = {"db_url": settings.embedded_db_url, "port": 0}
    if settings.admin_token:
        server_settings["admin_token"] = settings.admin_token
    try:
        running = start_server(ServerSettings(**server_settings))
    except Exception as e:
        logger.debug("embedded server failed to start", exc_info=True)
        why = describe_settings_error(e) if isinstance(e, ValueError) else str(e)
        raise JobError(f"cannot start the embedded identity server "
                       f"({_without_password(settings.embedded_db_url)}): {why}") from e
    logger.info("embedded identity server on 127.0.0.1:%d (%s)", running.port,
                _without_password(settings.embedded_db_url))
    try:
        yield f"127.0.0.1:{running.port}"
    finally:
        running.stop(grace=1.0)


@contextmanager
def _lean_collector() -> Iterator[None]:
    """Cheaper cyclic garbage collection for the job, restored afterwards.

    A job allocates a great many small objects that reference counting frees (parsed lines, rows),
    so the collector's default pace spends about a tenth of the client's CPU on them, most of it
    walking the modules and the embedded server again and again. Those are frozen out of the
    collections, and the young generation is collected less often.
    """
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(20_000, 50, 10)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _client(settings: Settings, address: str) -> IdentityClient:
    return IdentityClient(
        address,
        policy=RetryPolicy(deadline_seconds=settings.deadline_seconds,
                           budget_seconds=settings.retry_budget_seconds),
        admin_token=settings.admin_token,
        token=_bearer_token(settings),
        root_certificates=_tls_roots(settings),
    )


def _bearer_token(settings: Settings) -> str | None:
    """INGEST_TOKEN, else the first line of INGEST_TOKEN_FILE: a server with roles needs a
    writer token."""
    try:
        return settings.bearer_token()
    except ValueError as e:
        raise JobError(str(e)) from e


def _store_name(settings: Settings) -> str:
    """The identity store, as an error names it: the embedded server's by its URL (its port is
    picked afresh each run, and means nothing to the user); "" for a server's, which
    ``check_same_store`` names by its address."""
    if settings.server:
        return ""
    return f"the identity store {_without_password(settings.embedded_db_url)}"


def _without_password(url: str) -> str:
    """A store URL fit for a message: its password, if any, masked."""
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def _tls_roots(settings: Settings) -> bytes | None:
    """TLS to a --server when --tls-ca is given (the embedded server listens on loopback only)."""
    if settings.tls_ca is None or not settings.server:
        return None
    try:
        return settings.tls_ca.read_bytes()
    except OSError as e:
        raise JobError(f"cannot read the TLS root certificates {settings.tls_ca}: {e}") from e


def _progress(settings: Settings, total: int | None) -> tuple[Callable[[int], object], Any]:
    if not settings.progress:
        def ignore(n: int) -> None:
            return None

        return ignore, None
    if json_logs():  # no bar among JSON lines: a log record now and then, as for a log
        # Shown whatever -v says, as the plain lines are (they are not the job's log).
        _progress_log.setLevel(logging.INFO)
        return _LogProgress(total, LOG_PROGRESS_EVERY_S).update, None
    if not sys.stderr.isatty():  # a log, not a terminal: a plain line now and then
        return _LogProgress(total, LOG_PROGRESS_EVERY_S).update, None
    from tqdm import tqdm

    bar = tqdm(total=total, unit="line", file=sys.stderr, dynamic_ncols=True,
               disable=None, mininterval=0.25)
    return bar.update, bar


LOG_PROGRESS_EVERY_S = 30.0


class _LogProgress:
    """Progress for a job whose stderr is a file or a pipe: one line every `every_s` seconds
    (with JSON logs, a record of the logger ingest.progress)."""

    def __init__(self, total: int | None, every_s: float) -> None:
        self._total = total
        self._every_s = every_s
        self._done = 0
        self._started = time.monotonic()
        self._next = self._started + every_s

    def update(self, n: int) -> None:
        self._done += n
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._every_s
        of = f" of {self._total:,}" if self._total is not None else ""
        rate = self._done / (now - self._started)
        if json_logs():
            _progress_log.info("%s lines done (%s/s)", f"{self._done:,}{of}", f"{rate:,.0f}",
                               extra={"lines_done": self._done, "lines_total": self._total,
                                      "lines_per_s": round(rate, 1)})
            return
        sys.stderr.write(f"ingest: {self._done:,}{of} lines done ({rate:,.0f}/s)\n")
        sys.stderr.flush()


def _count_lines(files: Sequence[Path]) -> int | None:
    """A cheap total for the progress bar (newline count, of compressed files decompressed);
    None for huge inputs, for a pipe (it can be read only once), or when a file cannot be read
    to its end (its lines are rejected)."""
    if not all(f.is_file() for f in files):
        return None
    kinds = []
    for f in files:  # a file given twice is read twice
        with open_input(f) as (_, kind):
            kinds.append(kind)
    # A compressed byte is counted as the five or so it decompresses to.
    weight = sum(f.stat().st_size * (5 if kind else 1)
                 for f, kind in zip(files, kinds, strict=True))
    if weight > 2 * 1024**3:
        return None
    total = 0
    try:
        for f in files:
            with open_input(f) as (fh, _):
                while block := fh.read(1 << 20):
                    total += block.count(b"\n")
    except CORRUPT:
        return None
    return total


def cmd_run(settings: Settings, paths: Sequence[str], summary_json: Path | None = None) -> int:
    assert settings.db is not None
    options = _job_options(settings)
    files = expand_paths(paths)  # once: a directory without inputs is reported once
    total = _count_lines(files)
    job_args = (settings.db, files, options, total, settings)
    _refuse_catalog(settings.db)
    with ExitStack() as stack:
        # The graph opens first: one that cannot open fails before a server is started.
        sink = stack.enter_context(GraphSink(settings.db))
        worker = (stack.enter_context(JobWorker(_job, job_args, log_level=logging.root.level,
                                                log_format=log_format()))
                  if _in_worker(settings, files) else None)
        address = stack.enter_context(identity_server_address(settings))
        client = stack.enter_context(_client(settings, address))
        store = _store_name(settings)
        check_same_store(client, sink, store=store)  # before any id from another store is stored
        if worker is None:
            summary = _job(client, *job_args, sink=sink)
        else:
            sink.close()  # the worker writes the graph; DuckDB lets one process open it
            with _lean_collector():
                summary = worker.run(client, options.concurrency)
            sink = stack.enter_context(GraphSink(settings.db))
        try:
            merges = sync_redirects(client, sink, store=store).merges
        except IdentityError as e:
            # The papers are stored; only the redirects are stale. Say so, keep exit 0.
            logger.warning("sync after the run failed (%s); run `ingest sync` later", e)
            merges = 0
    _print_summary(summary, client.retries, merges)
    if summary_json is not None:
        _write_summary_json(summary_json, summary, client.retries, merges)
    return 0


def _job_options(settings: Settings) -> JobOptions:
    """What the pipeline runs with, as the settings say (either engine)."""
    vocabulary = (load_vocabulary(settings.vocabulary_file) if settings.vocabulary_file
                  else default_vocabulary())
    return JobOptions(concurrency=settings.effective_concurrency(), limits=settings.limits(),
                      vocabulary=vocabulary, group_papers=settings.group_papers)


def _refuse_catalog(db: Path) -> None:
    from ingest.catalog import is_catalog

    if is_catalog(db):
        raise SinkError(f"{db} is a catalog of shards written by `ingest run --engine dask`: "
                        "run it with --engine dask, or give --engine local a new graph file")


def cmd_run_dask(settings: Settings, paths: Sequence[str], summary_json: Path | None, *,
                 scheduler: str | None, workers: int | None, buckets: int | None) -> int:
    """`run --engine dask`: the input split into buckets, one Dask task a bucket, each into a
    shard of its own; the graph at --db is a catalog of views over them (ingest.distributed)."""
    from ingest.catalog import open_catalog, run_lock
    from ingest.distributed import ClientSettings, ClusterOptions, run_distributed

    assert settings.db is not None
    options = _job_options(settings)
    files = expand_paths(paths)
    total = _count_lines(files)
    cluster = ClusterOptions(scheduler=scheduler, workers=workers or 2)
    _quiet_dask()
    with ExitStack() as stack:
        # The catalog first: one that cannot be used fails before a server or cluster starts.
        layout, buckets = open_catalog(settings.db, buckets)
        stack.enter_context(run_lock(layout))
        address = stack.enter_context(identity_server_address(settings))
        client = stack.enter_context(_client(settings, address))
        store = _store_name(settings)
        with GraphSink(settings.db) as sink:  # closed again: readers may open the catalog
            check_same_store(client, sink, store=store)
        tasks_client = ClientSettings(
            address, settings.deadline_seconds, settings.retry_budget_seconds,
            admin_token=settings.admin_token, token=_bearer_token(settings),
            tls_roots=_tls_roots(settings))
        staged, staging_bar = _progress(settings, total)
        if staging_bar is not None:
            stack.callback(staging_bar.close)
        done = _BucketProgress(settings)
        stack.callback(done.close)
        summary, task_retries = run_distributed(
            files, layout=layout, buckets=buckets, options=options, client=tasks_client,
            cluster=cluster, progress=done.update, staging_progress=staged)
        try:
            with GraphSink(settings.db) as sink:
                merges = sync_redirects(client, sink, store=store).merges
        except (IdentityError, SinkError) as e:
            # The papers are stored (and published); only the redirects are stale.
            logger.warning("sync after the run failed (%s); run `ingest sync` later", e)
            merges = 0
    retries = client.retries + task_retries
    _print_summary(summary, retries, merges)
    if summary_json is not None:
        _write_summary_json(summary_json, summary, retries, merges)
    return 0


def _quiet_dask() -> None:
    """Dask logs its cluster's comings and goings at info, and -v is about the job's own."""
    import distributed  # noqa: F401  (it sets its loggers' levels as it is imported)

    if logging.root.level > logging.DEBUG:
        logging.getLogger("distributed").setLevel(logging.WARNING)


class _BucketProgress:
    """The distributed job's progress: lines done of the total, buckets done, and lines a
    second (a bar on a terminal; else a line, or a JSON record, now and then and at the end).
    Called from the Dask client's thread and the driver's."""

    def __init__(self, settings: Settings) -> None:
        self._started = time.monotonic()
        self._next = self._started + LOG_PROGRESS_EVERY_S
        self._bar: Any = None
        self._on = settings.progress
        self._lock = threading.Lock()
        if self._on and not json_logs() and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(unit=" lines", file=sys.stderr, dynamic_ncols=True, disable=None,
                             mininterval=0.25, desc="ingesting")
        elif self._on and json_logs():
            _progress_log.setLevel(logging.INFO)

    def update(self, lines: int, total: int, done: int, buckets: int) -> None:
        with self._lock:
            self._show(lines, total, done, buckets)

    def _show(self, lines: int, total: int, done: int, buckets: int) -> None:
        now = time.monotonic()
        rate = lines / max(now - self._started, 1e-9)
        if self._bar is not None:
            self._bar.total = total
            self._bar.set_postfix_str(f"{done}/{buckets} buckets", refresh=False)
            self._bar.update(lines - self._bar.n)
            return
        if not self._on or (now < self._next and done < buckets):
            return
        self._next = now + LOG_PROGRESS_EVERY_S
        if json_logs():
            _progress_log.info("%s of %s lines done, %d of %d buckets (%s/s)", f"{lines:,}",
                               f"{total:,}", done, buckets, f"{rate:,.0f}",
                               extra={"lines_done": lines, "lines_total": total,
                                      "buckets_done": done, "buckets_total": buckets,
                                      "lines_per_s": round(rate, 1)})
            return
        sys.stderr.write(f"ingest: {lines:,} of {total:,} lines done, {done:,} of {buckets:,} "
                         f"buckets ({rate:,.0f}/s)\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def summary_record(summary: Summary, retries: int, merges: int) -> dict[str, int | float]:
    """The run's summary as the pipelines that call ingest read it (`--summary-json`)."""
    return {
        "lines_read": summary.lines_read,
        "papers_ingested": summary.ingested,
        "papers_changed": summary.changed,
        "papers_unchanged": summary.unchanged,
        "rejected_lines": summary.rejected_lines,
        "rejected_items": summary.rejected_items,
        "new_entities": summary.new_entities,
        "matched_entities": summary.matched_entities,
        "relationships": summary.relationships,
        "retried_calls": retries,
        "new_redirects": merges,
        "elapsed_seconds": round(summary.elapsed_seconds, 3),
        "papers_per_second": round(summary.papers_per_second, 1),
    }


def _write_summary_json(path: Path, summary: Summary, retries: int, merges: int) -> None:
    """Written whole, then moved into place: a reader never sees half a file."""
    text = json.dumps(summary_record(summary, retries, merges), indent=2) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
        return
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except OSError as e:
        raise JobError(f"cannot write the summary to {path}: {e.strerror}") from e


def _in_worker(settings: Settings, files: Sequence[Path]) -> bool:
    """The job runs in a worker process beside an embedded server (see ingest.worker), which
    reads files by name: a pipe or standard input is read here, in one process."""
    return not settings.server and all(f.is_file() for f in files)


def _job(resolver: Resolver | ResolvesAhead, db: Path, files: Sequence[Path], options: JobOptions,
         total: int | None, settings: Settings, *, sink: GraphSink | None = None) -> Summary:
    """The pipeline over ``files`` into the graph at ``db`` (or the open ``sink``), with its
    progress shown: in this process, or as the target of a JobWorker."""
    with ExitStack() as stack:
        if sink is None:
            sink = stack.enter_context(GraphSink(db))
        update, bar = _progress(settings, total)
        if bar is not None:
            stack.callback(bar.close)
        with _lean_collector():
            return run_job(files, sink=sink, resolver=resolver, options=options, progress=update)


def _print_summary(summary: Summary, retries: int, merges: int) -> None:
    lines = summary.lines()
    if retries:
        lines.append(f"retried calls:     {retries}")
    if merges:
        lines.append(f"new redirects:     {merges}")
    sys.stdout.write("\n".join(lines) + "\n")


def cmd_sync(settings: Settings) -> int:
    assert settings.db is not None
    with GraphSink(settings.db) as sink, identity_server_address(settings) as address, \
            _client(settings, address) as client:
        result = sync_redirects(client, sink, store=_store_name(settings), names=True)
    sys.stdout.write(f"changes read: {result.changes} (up to sequence {result.last_sequence})\n"
                     f"new merges:   {result.merges}\nopen links:   {result.links}\n"
                     f"names synced: {result.named}\n")
    if result.unknown:
        sys.stdout.write(f"unknown ids:  {result.unknown} (not in the identity store)\n")
    return 0


def cmd_stats(settings: Settings, top: int) -> int:
    assert settings.db is not None
    if not settings.db.exists():
        raise SinkError(f"graph database {settings.db} does not exist")
    with GraphSink(settings.db, read_only=True) as sink:

        def one(sql: str) -> Any:
            return sink.query(sql)[0][0]

        out = [
            (f"papers:          {one('SELECT count(*) FROM papers WHERE is_current')} "
            f"({one('SELECT count(*) FROM papers')} revisions)"),
            f"mentions:        {one('SELECT count(*) FROM mentions WHERE is_current')}",
            (f"relationships:   {one('SELECT count(*) FROM relationships WHERE valid_to IS NULL')}"
            f" open ({one('SELECT count(*) FROM graph_edges')} in graph_edges: not those a "
            "merge made self-loops), "
            f"{one('SELECT count(*) FROM relationships WHERE valid_to IS NOT NULL')} closed"),
            f"entities:        {one('SELECT count(*) FROM entities')}",
            f"rejects:         {one('SELECT count(*) FROM rejects')}",
            (f"redirects:       {one('SELECT count(*) FROM redirects')} "
            f"(feed synced to {sink.last_sequence()})"),
            f"possibly_same_as: {one('SELECT count(*) FROM possibly_same_as')} open links",
            *_catalog_lines(sink),  # after the counts: they stand where a graph file's do
            "",
            f"top {top} entities (by papers):",
        ]
        for eid, name, etype, papers, mentions in sink.query(
                "SELECT entity_id, name, entity_type, paper_count, mention_count FROM entities "
                "ORDER BY paper_count DESC, mention_count DESC, entity_id LIMIT ?", [top]):
            out.append(f"  {papers:6d} papers {mentions:6d} mentions  {name} [{etype}] {eid}")
        out.append("")
        out.append("predicates:")
        for predicate, n in sink.query(
                "SELECT predicate, count(*) FROM relationships WHERE valid_to IS NULL "
                "GROUP BY predicate ORDER BY count(*) DESC, predicate"):
            out.append(f"  {n:8d}  {predicate}")
        links = sink.query(
            "SELECT l.entity_id, a.name, l.other_id, b.name FROM possibly_same_as l "
            "LEFT JOIN entities a ON a.entity_id = l.entity_id "
            "LEFT JOIN entities b ON b.entity_id = l.other_id ORDER BY l.sequence LIMIT ?", [top])
        if links:
            out.append("")
            out.append("open possibly_same_as links (run `ingest sync` to refresh):")
            for a, an, b, bn in links:
                out.append(f"  {an or '?'} ({a})  ~  {bn or '?'} ({b})")
            more = one("SELECT count(*) FROM possibly_same_as") - len(links)
            if more > 0:
                out.append(f"  ... and {more} more (--top N lists N)")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _catalog_lines(sink: GraphSink) -> list[str]:
    """A catalog of shards says so (`run --engine dask` wrote it); a single-file graph, nothing."""
    if not sink.query("SELECT count(*) FROM information_schema.tables "
                      "WHERE table_name = 'catalog_info'")[0][0]:
        return []
    buckets, shards = sink.query("SELECT buckets, shards FROM catalog_info")[0]
    return [f"catalog:         {buckets} buckets, shards in {shards}"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ingest",
        description="Ingest papers' extraction output into a DuckDB graph of resolved ids.")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-v info, -vv debug)")
    add_log_format_option(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--db", type=Path, help="DuckDB graph file (env INGEST_DB)")
        p.add_argument("--server", help="identity server host:port (default: embedded)")
        p.add_argument("--tls-ca", type=Path,
                       help="PEM root certificates: TLS to --server (env INGEST_TLS_CA)")
        p.add_argument("--identity-db", dest="embedded_db_url",
                       help="store URL of the embedded server (default sqlite:///identity.sqlite)")

    run = add_command(sub, "run", help="ingest JSON Lines files or directories")
    run.add_argument("paths", nargs="+", metavar="PATHS",
                     help="JSON Lines files (gzip, bzip2, xz too), directories of them, - for stdin")
    common(run)
    run.add_argument("--concurrency", type=int,
                     help="papers in flight (1: file order, reproducible)")
    run.add_argument("--vocabulary", dest="vocabulary_file", type=Path,
                     help="predicate vocabulary file (.toml or .json)")
    run.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                     help="no progress bar or progress lines (env INGEST_PROGRESS=false)")
    run.add_argument("--summary-json", type=Path, metavar="FILE",
                     help="also write the run's summary to FILE as JSON (- for standard output)")
    run.add_argument("--engine", choices=("local", "dask"), default="local",
                     help="local: one process (default); dask: buckets of papers on Dask "
                          "distributed, the graph a catalog of shards (docs/ingest.md)")
    run.add_argument("--scheduler", metavar="ADDRESS",
                     help="--engine dask: a Dask scheduler (default: a local cluster)")
    run.add_argument("--workers", type=_at_least_one,
                     help="--engine dask: worker processes of the local cluster (default 2)")
    run.add_argument("--buckets", type=_at_least_one,
                     help="--engine dask: buckets the papers are split into (default: the "
                          "catalog's, 16 for a new one)")

    sync = add_command(sub, "sync",
                       help="pull merges (redirects), open links and entity names from the server")
    common(sync)

    stats = add_command(sub, "stats", help="what the graph holds")
    stats.add_argument("--db", type=Path, help="DuckDB graph file (env INGEST_DB)")
    stats.add_argument("--top", type=whole_number, default=10,
                       help="how many entities, and open links, to list (default 10)")
    return parser


def _at_least_one(text: str) -> int:
    n = whole_number(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text}")
    return n


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_command_line(parser, argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    configure_logging(level, args.log_format)
    from identity_server.settings import unknown_environment

    for warning in unknown_environment(Settings):
        logger.warning("%s", warning)
    overrides = {key: value for key, value in vars(args).items()
                 if key in Settings.model_fields and value is not None}
    try:
        settings = Settings(**overrides)
    except ValueError as e:
        from identity_server.settings import describe_settings_error

        command_parser(parser, args).error(
            f"invalid setting: {describe_settings_error(e, 'INGEST_')}")
    if settings.db is None:
        command_parser(parser, args).error("--db is required (or set INGEST_DB)")
    if args.command == "run" and args.engine != "dask":
        given = [f for f in ("scheduler", "workers", "buckets") if getattr(args, f) is not None]
        if given:
            command_parser(parser, args).error(f"--{given[0]} needs --engine dask")
    if args.command == "run" and args.scheduler is not None and args.workers is not None:
        command_parser(parser, args).error(
            "--workers starts a local cluster; with --scheduler, the scheduler's workers run")
    try:
        if args.command == "run" and args.engine == "dask":
            return cmd_run_dask(settings, args.paths, args.summary_json,
                                scheduler=args.scheduler, workers=args.workers,
                                buckets=args.buckets)
        if args.command == "run":
            return cmd_run(settings, args.paths, args.summary_json)
        if args.command == "sync":
            return cmd_sync(settings)
        return cmd_stats(settings, args.top)
    except (JobError, SinkError, InputError, VocabularyError, IdentityError, WorkerFailed) as e:
        logger.debug("job failed", exc_info=True)
        tell(logger, logging.ERROR, f"{e}", prefix="ingest: error: ")
        if "serving without TLS?" in str(e):
            # A plaintext call to a TLS server fails as one to no server does.
            tell(logger, logging.ERROR, "a server run with TLS needs --tls-ca (INGEST_TLS_CA)",
                 prefix="ingest: hint: ")
        return 1
    except KeyboardInterrupt:
        tell(logger, logging.WARNING, "interrupted; rerun the same command to continue",
             prefix="ingest: ")
        return 130


if __name__ == "__main__":
    sys.exit(main())
