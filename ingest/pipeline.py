"""Composition: read -> validate -> resolve -> write, with a bounded window of papers in flight.

Papers are resolved concurrently (one ResolveBatch per paper, the paper id as context) but written
in input order by this thread, the only writer. Memory is flat: at most one chunk of parsed lines,
``window`` papers in flight and one write group are held at once. Before resolving, a chunk's paper
ids are looked up in the database so unchanged papers cost no call; the writer checks again inside
its transaction, which is what makes reruns and killed jobs converge.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from identity_client import (
    BatchOutcome,
    ChangeEvent,
    ChangeKind,
    Entity,
    IdentityClient,
    IdentityError,
    ItemFailure,
    Resolution,
    ServerUnavailable,
)
from ingest.models import Limits
from ingest.read import RawLine, read_inputs
from ingest.sink import GraphSink, ResolvedPaper, WriteOutcome
from ingest.validate import (
    CheckedPaper,
    LineReject,
    drop_refused_mentions,
    drop_resolved_self_loops,
    parse_line,
)
from ingest.vocabulary import Vocabulary, default_vocabulary

T = TypeVar("T")
# The mentions (text, type), in order, of a paper's revisions stored or sent before the one
# being resolved: how a replayed reply is told to be an earlier revision's (paper_outcomes).
Earlier = frozenset[tuple[tuple[str, str], ...]]
_WAKE_S = 0.2  # how often the main thread, waiting on a paper, wakes to see a Ctrl-C

logger = logging.getLogger(__name__)


class Resolver(Protocol):
    """What the pipeline needs from the identity server (IdentityClient satisfies it)."""

    def resolve_batch(
        self, context_id: str, mentions: Sequence[tuple[str, str]], *, lookup_only: bool = False
    ) -> BatchOutcome: ...

    def abort(self) -> None:
        """The job stops (Ctrl-C, a failed write): cancel the calls in flight."""


@runtime_checkable
class ResolvesAhead(Protocol):
    """A Resolver that takes each paper as it is read, in order, and resolves the papers in that
    order without the pipeline's threads (the embedded job's worker: see ingest.worker)."""

    def submit_paper(self, paper: CheckedPaper, *,
                     earlier: Earlier) -> Future[ResolvedPaper | LineReject]: ...

    def abort(self) -> None:
        """The job stops: fail the papers waiting."""


# Codes that say something is wrong with the whole job (not with one paper): stop, exit non-zero.
JOB_FATAL_CODES = frozenset({"UNIMPLEMENTED", "UNAUTHENTICATED", "PERMISSION_DENIED",
                             "CANCELLED"})


class JobError(Exception):
    """The job could not run to the end (server gone for the retry budget, database error...)."""


@dataclass(frozen=True)
class JobOptions:
    concurrency: int = 8
    limits: Limits = field(default_factory=Limits)
    vocabulary: Vocabulary = field(default_factory=default_vocabulary)
    chunk_lines: int = 256
    chunk_bytes: int = 32 * 1024 * 1024
    group_papers: int = 500
    group_rows: int = 50_000
    flush_seconds: float = 1.0


@dataclass
class Summary:
    """The end-of-job report."""

    lines_read: int = 0
    ingested: int = 0
    changed: int = 0
    unchanged: int = 0
    rejected_lines: int = 0
    rejected_items: int = 0
    lines_rejected_before: int = 0
    new_entities: int = 0
    matched_entities: int = 0
    relationships: int = 0
    elapsed_seconds: float = 0.0

    @property
    def papers_per_second(self) -> float:
        papers = self.ingested + self.unchanged
        return papers / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    def absorb(self, outcome: WriteOutcome) -> None:
        self.ingested += outcome.ingested
        self.changed += outcome.changed
        self.unchanged += outcome.unchanged
        self.rejected_lines += outcome.rejected_lines
        self.rejected_items += outcome.rejected_items
        self.lines_rejected_before += outcome.lines_rejected_before
        self.new_entities += outcome.new_entities
        self.matched_entities += outcome.matched_entities
        self.relationships += outcome.relationships

    def lines(self) -> list[str]:
        matched = _counted(self.matched_entities, "mention")
        return [
            f"papers ingested:   {self.ingested} ({_counted(self.changed, 'changed revision')})",
            f"papers unchanged:  {self.unchanged}",
            f"rejected:          {_counted(self.rejected_items, 'item')}, "
            f"{_counted(self.rejected_lines, 'line')}"
            + (f"; {_counted(self.lines_rejected_before, 'line')} rejected as in an earlier run"
               if self.lines_rejected_before else "")
            + (" (see table rejects)" if self.rejected_items or self.rejected_lines
               or self.lines_rejected_before else ""),
            f"entities:          {self.new_entities} new; {matched} matched existing ones",
            f"relationships:     {self.relationships}",
            (f"rate:              {self.papers_per_second:.1f} papers/s "
            f"({self.elapsed_seconds:.2f} s)"),
        ]


def _counted(n: int, noun: str) -> str:
    """'1 line', '2 lines', '0 lines'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass(frozen=True, slots=True)
class _Unchanged:
    paper_id: str


def _chunks(lines: Iterable[RawLine], size: int, max_bytes: int) -> Iterator[list[RawLine]]:
    """Groups lines by count and by bytes, so a chunk of huge lines stays bounded too."""
    chunk: list[RawLine] = []
    total = 0
    for line in lines:
        chunk.append(line)
        total += line.size
        if len(chunk) >= size or total >= max_bytes:
            yield chunk
            chunk, total = [], 0
    if chunk:
        yield chunk


def _without_batch_index(message: str, i: int) -> str:
    """The server names a refused item by its place in the batch ("mention 2: ..."); the reject
    names it by its place in the paper, which differs once earlier mentions were rejected."""
    return message.removeprefix(f"mention {i}: ")


def resolve_paper(resolver: Resolver, paper: CheckedPaper, *,
                  earlier: Earlier = frozenset()) -> ResolvedPaper | LineReject:
    """One ResolveBatch for the paper (in parts when the server takes fewer mentions at once:
    see IdentityClient.resolve_batch); mentions the server refuses are rejected with its reason.

    `earlier`: the mentions of the paper's earlier revisions (see ``paper_outcomes``)."""
    if not paper.mentions:
        return ResolvedPaper(paper, ())
    try:
        outcomes = paper_outcomes(resolver, paper.paper_id, mention_pairs(paper),
                                  earlier=earlier)
    except IdentityError as e:  # ServerUnavailable and the job's fatal codes are raised again
        return refused_paper(paper, e)
    return settle_paper(paper, outcomes)


def mention_pairs(paper: CheckedPaper) -> list[tuple[str, str]]:
    """What ResolveBatch is sent for the paper: each mention's text and type, in order."""
    return [(m.text, m.entity_type) for m in paper.mentions]


def paper_outcomes(resolver: Resolver, paper_id: str, mentions: Sequence[tuple[str, str]], *,
                   earlier: Earlier = frozenset()) -> Sequence[Resolution | ItemFailure]:
    """The server's outcome for each mention of the paper, its id the call's context.

    When the server replays the reply of an earlier revision's identical request (`earlier`
    holds the mentions of the paper's revisions stored or sent before this one), the mentions
    are stored as it decides them now. A replay of this revision's own request (a job killed
    after the server answered it and before the paper was written, or a retry of a call whose
    reply was lost) is the reply one uninterrupted run got, and is stored as it is."""
    reply = resolver.resolve_batch(paper_id, mentions)
    if reply.replayed and _an_earlier_revisions_request(mentions, reply.outcomes, earlier):
        now = resolver.resolve_batch(paper_id, mentions, lookup_only=True)
        return _as_decided_now(reply.outcomes, now.outcomes)
    return reply.outcomes


def _an_earlier_revisions_request(mentions: Sequence[tuple[str, str]],
                                  outcomes: Sequence[Resolution | ItemFailure],
                                  earlier: Earlier) -> bool:
    """Whether a replayed request is one an earlier revision made: its mentions are those of a
    revision sent before (`earlier` holds the whole request) or, for a stored revision, whose
    rows hold the mentions the server resolved, those resolved here."""
    if not earlier:
        return False
    if tuple(mentions) in earlier:
        return True
    resolved = tuple(m for m, o in zip(mentions, outcomes, strict=True)
                     if isinstance(o, Resolution))
    return resolved in earlier


def refused_paper(paper: CheckedPaper, error: IdentityError) -> LineReject:
    """The paper's line rejected for the server's refusal; re-raises what stops the job."""
    if isinstance(error, ServerUnavailable) or error.code in JOB_FATAL_CODES:
        raise error
    logger.warning("paper %s at %s refused by the identity server: %s",
                   paper.paper_id, paper.position, error)
    return LineReject(paper.position, f"identity server refused the paper: {error}", "",
                      paper.paper_id, paper.content_hash)


def settle_paper(paper: CheckedPaper,
                 outcomes: Sequence[Resolution | ItemFailure]) -> ResolvedPaper:
    """The paper with its resolutions: mentions the server refused, and relationships that
    became self-loops once resolved, rejected with their reasons."""
    refused = {m.index: f"{o.code}: {_without_batch_index(o.message, i)}"
               for i, (m, o) in enumerate(zip(paper.mentions, outcomes, strict=True))
               if isinstance(o, ItemFailure)}
    if refused:
        paper = drop_refused_mentions(paper, refused)
    resolutions = tuple(o for o in outcomes if isinstance(o, Resolution))
    paper = drop_resolved_self_loops(paper, [r.entity_id for r in resolutions])
    if logger.isEnabledFor(logging.DEBUG):
        for m, r in zip(paper.mentions, resolutions, strict=True):
            logger.debug("paper=%s mention=%s type=%s -> %s kind=%s created=%s", paper.paper_id,
                         m.mention_id, m.entity_type, r.entity_id, r.match_kind, r.created)
    return ResolvedPaper(paper, resolutions)


def _as_decided_now(replayed: Sequence[Resolution | ItemFailure],
                    now: Sequence[Resolution | ItemFailure]) -> list[Resolution | ItemFailure]:
    """A new revision whose mentions are its earlier revision's, in the same order, gets that
    request's stored reply (the server's idempotency: nothing is written twice), with the ids
    and kinds of then: an entity merged since, `new` and `created` for what that revision
    created. Stored as the lookup-only batch decides them now instead (current ids, so a
    merge makes a self-loop visible; kinds as found now); where the lookup finds nothing to
    point at (a pair that became ambiguous, with no placeholder yet), the replayed id stays, not
    as created."""
    out: list[Resolution | ItemFailure] = []
    for then, current in zip(replayed, now, strict=True):
        if isinstance(then, ItemFailure):
            out.append(then)
        elif isinstance(current, Resolution) and current.entity_id:
            out.append(current)
        else:
            out.append(then._replace(created=False))
    return out


def run_job(
    paths: Sequence[str | Path],
    *,
    sink: GraphSink,
    resolver: Resolver | ResolvesAhead,
    options: JobOptions | None = None,
    progress: Callable[[int], object] | None = None,
    lines: Iterable[RawLine] | None = None,
) -> Summary:
    """Ingests every paper of ``paths`` into ``sink``; returns the summary.

    ``lines``: the input lines, read already (positions kept), instead of reading ``paths``: a
    bucket of the distributed job (ingest.distributed).

    Raises JobError when the job cannot go on; everything written before stays (whole papers).
    """
    opts = options or JobOptions()
    summary = Summary()
    started = time.monotonic()
    # Papers read ahead of the writer: a chunk more than the calls in flight, so that while
    # this thread parses the next chunk or writes a group, the callers still have papers to
    # send (with only the calls in flight queued, the server sat idle through both).
    window_size = opts.chunk_lines + max(4 * opts.concurrency, 16)
    window: deque[Future[ResolvedPaper | LineReject] | LineReject | _Unchanged] = deque()
    group: list[ResolvedPaper | LineReject] = []
    group_rows = 0
    last_flush = time.monotonic()
    # The requests (mentions) of papers sent for resolving and not yet written, by id, in
    # order (bounded by the window and one group): a later revision of one of them is a
    # revision of a paper the database will hold. And the papers written since the current
    # chunk's stored revisions were looked up.
    unwritten: dict[str, deque[tuple[tuple[str, str], ...]]] = {}
    written_lately: set[str] = set()
    sent_ids: dict[Future[ResolvedPaper | LineReject], str] = {}
    group_sent: list[str] = []

    def flush() -> None:
        nonlocal group, group_rows, last_flush, group_sent
        if group:
            summary.absorb(sink.write(group))
            if progress is not None:
                progress(len(group))
        for pid in group_sent:
            requests = unwritten[pid]
            requests.popleft()
            if not requests:
                del unwritten[pid]
            written_lately.add(pid)
        group, group_rows, last_flush, group_sent = [], 0, time.monotonic(), []

    def earlier_revisions(paper: CheckedPaper, stored: set[str]) -> Earlier:
        """The mentions of the paper's revisions stored (`stored`: their content hashes, as
        the chunk found them, or written since) and of those sent and not yet written."""
        pid = paper.paper_id
        found = set(unwritten.get(pid, ()))
        if stored or pid in written_lately:
            found |= sink.mention_sequences(pid)
        return frozenset(found)

    def drain_one() -> None:
        nonlocal group_rows
        head = window.popleft()
        if isinstance(head, _Unchanged):
            summary.unchanged += 1
            if progress is not None:
                progress(1)
            return
        if isinstance(head, LineReject):
            item: ResolvedPaper | LineReject = head
        else:
            item = wait_interruptibly(head)
            group_sent.append(sent_ids.pop(head))
        group.append(item)
        if isinstance(item, ResolvedPaper):
            group_rows += len(item.paper.mentions) + len(item.paper.relationships)
        if (len(group) >= opts.group_papers or group_rows >= opts.group_rows
                or time.monotonic() - last_flush >= opts.flush_seconds):
            flush()

    with ThreadPoolExecutor(max_workers=opts.concurrency,
                            thread_name_prefix="ingest-resolve") as pool:
        if isinstance(resolver, ResolvesAhead):
            submit = resolver.submit_paper
        else:
            def submit(paper: CheckedPaper, *,
                       earlier: Earlier) -> Future[ResolvedPaper | LineReject]:
                return pool.submit(resolve_paper, resolver, paper, earlier=earlier)
        try:
            if lines is None:
                lines = read_inputs(paths, max_line_bytes=opts.limits.max_line_bytes)
            for chunk in _chunks(lines, opts.chunk_lines, opts.chunk_bytes):
                summary.lines_read += len(chunk)
                parsed = [parse_line(raw, vocabulary=opts.vocabulary, limits=opts.limits)
                          for raw in chunk]
                known = sink.known_hashes(
                    p.paper_id for p in parsed if isinstance(p, CheckedPaper))
                written_lately.clear()
                for p in parsed:
                    if isinstance(p, LineReject):
                        window.append(p)
                    elif p.content_hash in known.get(p.paper_id, ()):
                        window.append(_Unchanged(p.paper_id))
                    else:
                        future = submit(p, earlier=earlier_revisions(
                            p, known.get(p.paper_id, set())))
                        sent_ids[future] = p.paper_id
                        unwritten.setdefault(p.paper_id, deque()).append(
                            tuple(mention_pairs(p)))
                        window.append(future)
                    while len(window) > window_size:
                        drain_one()
            while window:
                drain_one()
            flush()
        except (ServerUnavailable, IdentityError) as e:
            for pending in window:
                if isinstance(pending, Future):
                    pending.cancel()
            flush()
            raise JobError(str(e)) from e
        except BaseException:
            for pending in window:
                if isinstance(pending, Future):
                    pending.cancel()
            # Calls already running would hold the pool's exit until the server answers, or,
            # retrying a slow or absent server, for the whole retry budget.
            resolver.abort()
            raise
    summary.elapsed_seconds = time.monotonic() - started
    logger.info("job done: %s", summary)
    return summary


@dataclass(frozen=True, slots=True)
class SyncResult:
    changes: int
    merges: int
    links: int
    last_sequence: int
    named: int = 0  # entities whose names were fetched (sync with names)
    unknown: int = 0  # of those, ids the server does not know


def check_same_store(client: IdentityClient, sink: GraphSink, *,
                     store: str = "") -> ChangeEvent | None:
    """Refuse a graph whose ids came from another identity store (an embedded job run from
    another directory makes a new, empty one): the store must hold the change the graph last
    synced, at the same sequence number. Returns that change (None before any sync). `store`
    names the store in the error (default: the one behind the client's server)."""
    store = store or f"the identity store behind {client.target}"
    after = sink.last_sequence()
    if after == 0:
        _check_first_stored_entity(client, sink, store)
        return None
    found = next(iter(client.list_changes(after - 1, limit=1)), None)
    anchor = sink.feed_anchor()
    if found is None or found.sequence != after:
        raise _another_store(store, f"has no change {after}, but this graph was synced up to it",
                             " (a new, empty one?)")
    if anchor is not None and anchor[0] == after and (
            found.entity_id, found.recorded_at) != (anchor[1], anchor[2]):
        raise _another_store(store, f"recorded change {after} as {found.entity_id} at "
                                     f"{found.recorded_at}, but this graph synced it as "
                                     f"{anchor[1]} at {anchor[2]}")
    return found


def _check_first_stored_entity(client: IdentityClient, sink: GraphSink, store: str) -> None:
    """Before any sync (a first run killed before its closing sync): the store must know the
    first entity the graph saw created, under the spelling that created it (its name, or a
    surface form of the entity it was merged into)."""
    rows = sink.query("SELECT entity_id, display_form FROM mentions WHERE created "
                      "ORDER BY paper_id, content_hash, mention_index LIMIT 1")
    if not rows:
        return
    entity_id, spelling = rows[0]
    try:
        entity = client.get_entity(entity_id)
        if entity.redirect_to:
            entity = client.get_entity(entity.redirect_to)
    except IdentityError as e:
        if e.code != "NOT_FOUND":
            raise
        names: tuple[str, ...] = ()
    else:
        names = (entity.name, *entity.aliases, *entity.surface_forms)
    if spelling not in names:
        raise _another_store(store, f"does not know {entity_id} as {spelling!r}, which this "
                                     f"graph stored", " (a new, empty one?)")


def _another_store(store: str, found: str, guess: str = "") -> JobError:
    return JobError(
        f"{store} {found}: the graph's ids come from another "
        f"identity store{guess}. Point the job at the store this graph was built with "
        f"(--identity-db or --server), or write to a new graph file")


# Changes after which an entity's name, type, status or aliases may read differently.
_RENAMING = frozenset({ChangeKind.ALIAS_ADDED, ChangeKind.TYPE_UPGRADED, ChangeKind.PROMOTED,
                       ChangeKind.MERGED, ChangeKind.IMPORTED, ChangeKind.LINK_SETTLED})
NAME_FETCHES = 16  # GetEntity calls in flight while names are synced


def sync_redirects(client: IdentityClient, sink: GraphSink, *, store: str = "",
                   names: bool = False) -> SyncResult:
    """Pulls the change feed after the stored position: merges become redirects (chains
    resolved); the open possibly_same_as links are refreshed for ``stats``; with `names`, the
    server's names of the entities the graph refers to (new ones, and those the feed says
    changed). `store`: as ``check_same_store`` takes it."""
    anchor = check_same_store(client, sink, store=store)
    after = anchor.sequence if anchor is not None else 0  # the graph's stored position
    merges: list[ChangeEvent] = []
    touched: set[str] = set()
    count, last = 0, after
    for change in client.list_changes(after):
        count += 1
        if change.sequence >= last:
            last, anchor = change.sequence, change
        if change.kind == ChangeKind.MERGED:
            merges.append(change)
        if change.kind in _RENAMING:
            touched.update(i for i in (change.entity_id, change.other_id) if i)
    links = client.list_possibly_same_as()
    new = sink.apply_changes(merges, links, last_sequence=last, anchor=anchor)
    logger.info("sync: %d changes after %d, %d merges, %d open links", count, after, new,
                len(links))
    named, unknown = sync_names(client, sink, touched, last) if names else (0, 0)
    return SyncResult(count, new, len(links), last, named, unknown)


def sync_names(client: IdentityClient, sink: GraphSink, touched: set[str],
               sequence: int) -> tuple[int, int]:
    """Fetches the names the graph lacks (and those of `touched` entities) and stores them in
    parts, so a killed sync keeps what it fetched. Returns (fetched, unknown to the server).
    Many ids are read from the whole entity table a page at a time (a thousand a call), the
    rest (few, or merged away since) one GetEntity each."""
    wanted = sink.ids_to_name(touched)
    listed = _names_by_listing(client, sink, set(wanted), sequence) \
        if len(wanted) >= LIST_ALL_FROM else set()
    rest = [i for i in wanted if i not in listed]
    unknown = 0

    def fetch(entity_id: str) -> Entity | None:
        try:
            return client.get_entity(entity_id, max_surface_forms=0)
        except IdentityError as e:
            if e.code != "NOT_FOUND":
                raise
            return None

    with ThreadPoolExecutor(NAME_FETCHES, thread_name_prefix="names") as pool:
        for start in range(0, len(rest), _NAMES_PART):
            found = list(pool.map(fetch, rest[start:start + _NAMES_PART]))
            known = [e for e in found if e is not None]
            unknown += len(found) - len(known)
            sink.store_entity_names(known, sequence)
            logger.info("sync: names of %d of %d entities", len(listed) + start + len(found),
                        len(wanted))
    if unknown:
        logger.warning("sync: the identity server knows %d of the graph's ids not at all "
                       "(they keep no server name)", unknown)
    return len(wanted) - unknown, unknown


def _names_by_listing(client: IdentityClient, sink: GraphSink, wanted: set[str],
                      sequence: int) -> set[str]:
    """The wanted entities found by reading every live entity of the store; their ids."""
    stored: set[str] = set()
    part: list[Entity] = []
    for entity in client.list_entities(max_surface_forms=0):
        if entity.entity_id in wanted:
            part.append(entity)
        if len(part) >= _NAMES_PART:
            sink.store_entity_names(part, sequence)
            stored.update(e.entity_id for e in part)
            logger.info("sync: names of %d of %d entities", len(stored), len(wanted))
            part = []
    sink.store_entity_names(part, sequence)
    stored.update(e.entity_id for e in part)
    return stored


# Ids to name from which reading the whole entity table takes fewer calls than one each.
LIST_ALL_FROM = 20_000
_NAMES_PART = 5000


def wait_interruptibly(future: Future[T]) -> T:
    """future.result(), waited in slices: Ctrl-C delivered to one of gRPC's threads only marks
    itself pending for the main thread, which raises KeyboardInterrupt when it next wakes."""
    while True:
        try:
            return future.result(timeout=_WAKE_S)
        except TimeoutError:
            if future.done():  # the call itself timed out: its own error
                raise
