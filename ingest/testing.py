"""A stub identity server: the real gRPC service, in-process, simple and deterministic.

Use it to test a pipeline without the real server::

    with serve_stub() as stub:                 # listens on 127.0.0.1, port 0
        client = IdentityClient(stub.address)
        stub.fail_next(3)                      # the next 3 calls fail with UNAVAILABLE
        stub.slow_next(2, 1.0)                 # the next 2 replies wait a second
        stub.delay_seconds = 0.5               # every reply waits half a second

Behaviour: a mention is read to a display form (NFKC, spacing collapsed, trimmed) and matched
within its type by exact display form (``EXACT``) or by casefolded form (``CASE``); anything else is
``NEW``. Ids are predictable: ``stub-`` plus a hash of (type, casefolded form), so two runs give the
same ids. An empty type reads as ``other``. ResolveBatch with a context is idempotent (replies are
replayed), Merge redirects, and every change is on the change feed. There is no typo matching, no
authority and no persistence: it is a test double, not a second implementation of the rules.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import signal
import threading
import time
import unicodedata
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn, Self

import grpc
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_client import MAX_BATCH_SIZE_KEY

logger = logging.getLogger(__name__)

_SPACES = re.compile(r"\s+")
MAX_MENTION_CHARS = 512
MAX_BATCH = 5000


def display_form(text: str) -> str:
    """A simplified display form: NFKC, whitespace runs collapsed, trimmed."""
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def stub_entity_id(entity_type: str, form: str) -> str:
    """The id the stub gives (type, casefolded display form): predictable in tests."""
    digest = hashlib.sha256(f"{entity_type}\x1f{form.casefold()}".encode()).hexdigest()
    return f"stub-{digest[:16]}"


@dataclass
class _Entity:
    entity_id: str
    name: str
    entity_type: str
    status: pb.EntityStatus = pb.PROVISIONAL
    surface_forms: list[str] = field(default_factory=list)
    redirect_to: str = ""
    contexts: list[str] = field(default_factory=list)


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """``context.abort`` always raises; this says so to the type checker."""
    context.abort(code, message)
    raise AssertionError("context.abort returned")


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class StubIdentityService(pb_grpc.IdentityServiceServicer):  # type: ignore[misc]
    """The stub's state and RPCs; tests reach it through ``StubServer.servicer``."""

    def __init__(self, *, admin_token: str | None = None, max_batch: int = MAX_BATCH) -> None:
        self._lock = threading.Lock()
        self.max_batch = max_batch
        self._entities: dict[str, _Entity] = {}
        self._batches: dict[tuple[Any, ...], pb.ResolveBatchResponse] = {}
        self._changes: list[pb.Change] = []
        self._links: list[tuple[str, str, int]] = []
        self._admin_token = admin_token
        self._failures: list[grpc.StatusCode] = []
        self._slow: list[float] = []
        self.delay_seconds = 0.0
        self.calls: dict[str, int] = {}

    # -- test controls -------------------------------------------------------------------------

    def fail_next(self, n: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        """The next ``n`` calls (any method) fail with ``code``."""
        with self._lock:
            self._failures.extend([code] * n)

    def slow_next(self, n: int, seconds: float) -> None:
        """The next ``n`` calls (any method) wait ``seconds`` before answering."""
        with self._lock:
            self._slow.extend([seconds] * n)

    def add_link(self, entity_id: str, other_id: str) -> None:
        """Records an open possibly_same_as link (the stub never makes one by itself)."""
        with self._lock:
            seq = self._record(pb.CHANGE_KIND_LINK_ADDED, entity_id, other_id, {})
            self._links.append((entity_id, other_id, seq))

    @property
    def entity_count(self) -> int:
        with self._lock:
            return len(self._entities)

    # -- plumbing ------------------------------------------------------------------------------

    def _enter(self, method: str, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            failure = self._failures.pop(0) if self._failures else None
            delay = self._slow.pop(0) if self._slow else self.delay_seconds
        if delay:
            time.sleep(delay)
        if failure is not None:
            context.abort(failure, f"stub: injected {failure.name}")

    def _record(self, kind: pb.ChangeKind, entity_id: str, other_id: str, detail: dict[str, Any]) -> int:
        seq = len(self._changes) + 1
        self._changes.append(pb.Change(
            sequence=seq, kind=kind, entity_id=entity_id, other_id=other_id,
            detail=json.dumps(detail), recorded_at=datetime.now(UTC).isoformat()))
        return seq

    def _live(self, entity_id: str) -> _Entity:
        entity = self._entities.get(entity_id)
        if entity is None:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"no entity with id {entity_id!r}")
        seen = 0
        while entity.redirect_to and seen < 1000:
            entity = self._entities[entity.redirect_to]
            seen += 1
        return entity

    def _resolve_one(self, mention: str, entity_type: str, context_id: str,
                     lookup_only: bool) -> pb.ResolveResponse:
        form = display_form(mention)
        if not form:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "mention is empty after normalisation")
        if len(form) > MAX_MENTION_CHARS:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                         f"mention is {len(form)} characters long, more than {MAX_MENTION_CHARS}")
        etype = entity_type.strip().casefold() or "other"
        entity_id = stub_entity_id(etype, form)
        existing = self._entities.get(entity_id)
        if existing is None:
            if lookup_only:
                return pb.ResolveResponse(match_kind=pb.NEW, display_form=form, entity_type=etype)
            entity = _Entity(entity_id, form, etype)
            self._entities[entity_id] = entity
            self._record(pb.CHANGE_KIND_CREATED, entity_id, "", {"name": form})
            kind, created, matched = pb.NEW, True, ""
        else:
            entity = self._live(entity_id)
            names = [entity.name, *entity.surface_forms]
            if form in names:
                kind, matched = pb.EXACT, form
            else:
                kind = pb.CASE
                matched = next((n for n in names if n.casefold() == form.casefold()), entity.name)
                if not lookup_only:
                    entity.surface_forms.append(form)
                    self._record(pb.CHANGE_KIND_SURFACE_FORM_ADDED, entity.entity_id, "",
                                 {"surface_form": form})
            created = False
        if context_id and not lookup_only:
            entity.contexts.append(context_id)
        return pb.ResolveResponse(
            entity_id=entity.entity_id, status=entity.status, match_kind=kind, created=created,
            candidates=[] if created else [entity.entity_id], name=entity.name,
            matched_name=matched, entity_type=entity.entity_type, display_form=form)

    def _entity_pb(self, entity: _Entity, forms: slice = slice(None)) -> pb.Entity:
        live = self._live(entity.entity_id)
        return pb.Entity(
            entity_id=entity.entity_id,
            name="" if entity.redirect_to else entity.name,
            entity_type=entity.entity_type, status=entity.status,
            surface_forms=entity.surface_forms[forms],
            surface_form_count=len(entity.surface_forms),
            redirect_to=live.entity_id if entity.redirect_to else "",
            evidence_count=len(entity.contexts), paper_count=len(set(entity.contexts)))

    def _check_admin(self, context: grpc.ServicerContext) -> None:
        if self._admin_token is None:
            return
        metadata = dict(context.invocation_metadata())
        if metadata.get("authorization") != f"Bearer {self._admin_token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "admin token required")

    # -- RPCs ----------------------------------------------------------------------------------

    def Resolve(self, request: pb.ResolveRequest,
                context: grpc.ServicerContext) -> pb.ResolveResponse:
        self._enter("Resolve", context)
        try:
            with self._lock:
                return self._resolve_one(request.mention, request.entity_type,
                                         request.context_id, request.lookup_only)
        except _Abort as e:
            _abort(context, e.code, e.message)

    def ResolveBatch(self, request: pb.ResolveBatchRequest,
                     context: grpc.ServicerContext) -> pb.ResolveBatchResponse:
        self._enter("ResolveBatch", context)
        if len(request.mentions) > self.max_batch:
            # As the server does: the limit goes back as trailing metadata.
            context.set_trailing_metadata(((MAX_BATCH_SIZE_KEY, str(self.max_batch)),))
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                   f"batch of {len(request.mentions)} mentions, more than {self.max_batch}")
        key = (request.context_id,
               tuple((m.mention, m.entity_type) for m in request.mentions))
        replay = bool(request.context_id) and not request.lookup_only
        with self._lock:
            if replay and key in self._batches:
                again = pb.ResolveBatchResponse(replayed=True)
                again.results.extend(self._batches[key].results)
                return again
            results = []
            for m in request.mentions:
                try:
                    results.append(pb.ResolveBatchResult(resolved=self._resolve_one(
                        m.mention, m.entity_type, request.context_id, request.lookup_only)))
                except _Abort as e:
                    results.append(pb.ResolveBatchResult(
                        error=pb.ItemError(code=e.code.value[0], message=e.message)))
            reply = pb.ResolveBatchResponse(results=results)
            if replay:
                self._batches[key] = reply
            return reply

    def GetEntity(self, request: pb.GetEntityRequest,
                  context: grpc.ServicerContext) -> pb.GetEntityResponse:
        self._enter("GetEntity", context)
        try:
            forms = _surface_page(request, request.surface_forms_offset)
            with self._lock:
                self._live(request.entity_id)
                return pb.GetEntityResponse(entity=self._entity_pb(
                    self._entities[request.entity_id], forms))
        except _Abort as e:
            _abort(context, e.code, e.message)

    def Merge(self, request: pb.MergeRequest,
              context: grpc.ServicerContext) -> pb.MergeResponse:
        self._enter("Merge", context)
        self._check_admin(context)
        try:
            forms = _surface_page(request)
            with self._lock:
                source = self._live(request.source_id)
                target = self._live(request.target_id)
                if source.entity_id == target.entity_id:
                    if request.source_id == request.target_id:
                        raise _Abort(grpc.StatusCode.FAILED_PRECONDITION,
                                     "cannot merge an entity into itself")
                    return pb.MergeResponse(entity=self._entity_pb(target, forms))
                source.status = pb.MERGED
                source.redirect_to = target.entity_id
                target.surface_forms.extend([source.name, *source.surface_forms])
                target.contexts.extend(source.contexts)
                self._record(pb.CHANGE_KIND_MERGED, source.entity_id, target.entity_id, {})
                return pb.MergeResponse(entity=self._entity_pb(target, forms))
        except _Abort as e:
            _abort(context, e.code, e.message)

    def ListPossiblySameAs(self, request: pb.ListPossiblySameAsRequest,
                           context: grpc.ServicerContext) -> pb.ListPossiblySameAsResponse:
        self._enter("ListPossiblySameAs", context)
        with self._lock:
            links = [pb.PossiblySameAsLink(entity_id=a, other_id=b, sequence=s)
                     for a, b, s in self._links
                     if not request.entity_id or request.entity_id in (a, b)]
        return pb.ListPossiblySameAsResponse(links=links)

    def ListChanges(self, request: pb.ListChangesRequest,
                    context: grpc.ServicerContext) -> Iterator[pb.ListChangesResponse]:
        self._enter("ListChanges", context)
        with self._lock:
            changes = [c for c in self._changes if c.sequence > request.after_sequence]
        if request.limit:
            changes = changes[: request.limit]
        for change in changes:
            yield pb.ListChangesResponse(change=change)


_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "qu", "dra", "phi", "net",
              "gan", "bert", "form", "ter", "lex", "on", "ia")
_TYPES = ("method", "dataset", "task", "metric", "person", "organization")
_PREDICATES = ("uses", "evaluated on", "makes use of", "is used by", "improves_on", "part of",
               "outperforms", "related to", "inspired by", "affiliated with")


def synthetic_papers(n: int, *, mentions_per_paper: int = 25, relationships_per_paper: int = 15,
                     vocabulary_size: int = 2000, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Deterministic papers in the input shape (SPEC section 6), for tests and benchmarks.

    Names come from a pool of ``vocabulary_size`` made-up names, written with case and spacing
    variations, so papers share entities the way real ones do.
    """
    import random

    rng = random.Random(seed)
    pool = []
    for i in range(vocabulary_size):
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
        pool.append((f"{word.capitalize()} {i}", _TYPES[i % len(_TYPES)]))
    for p in range(n):
        mentions = []
        for m in range(mentions_per_paper):
            name, etype = pool[int(rng.paretovariate(1.2) * 7) % vocabulary_size]
            text = name.lower() if rng.random() < 0.15 else name
            mentions.append({"id": f"m{m}", "text": text, "type": etype,
                             "span": [m * 40, m * 40 + len(text)]})
        rels = []
        for r in range(relationships_per_paper):
            a, b = rng.sample(range(mentions_per_paper), 2)
            rels.append({"subject": f"m{a}", "predicate": rng.choice(_PREDICATES),
                         "object": f"m{b}", "confidence": round(rng.random(), 3),
                         "evidence": {"span": [r * 100, r * 100 + 60],
                                      "quote": f"sentence {r} of paper {p}"}})
        yield {"paper_id": f"synthetic-{seed}-{p:07d}", "mentions": mentions,
               "relationships": rels}


class StubServer:
    """A running stub; ``address`` is ``127.0.0.1:<port>``."""

    def __init__(self, server: grpc.Server, port: int, servicer: StubIdentityService) -> None:
        self._server = server
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.servicer = servicer

    def stop(self, grace: float | None = None) -> None:
        self._server.stop(grace).wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _surface_page(request: Any, start: int = 0) -> slice:
    """The surface forms a request's reply lists: `max_surface_forms` (unset: all) from start."""
    end = start + request.max_surface_forms if request.HasField("max_surface_forms") else None
    if start < 0 or (end is not None and end < start):
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                     "max_surface_forms (and surface_forms_offset) must be 0 or more")
    return slice(start, end)


def serve_stub(*, port: int = 0, max_workers: int = 8, admin_token: str | None = None,
               max_batch: int = MAX_BATCH) -> StubServer:
    """Starts the stub on 127.0.0.1 (port 0 picks a free one) and returns it running;
    `max_batch`: the most mentions it takes in one ResolveBatch."""
    servicer = StubIdentityService(admin_token=admin_token, max_batch=max_batch)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    pb_grpc.add_IdentityServiceServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    logger.info("stub identity server listening on 127.0.0.1:%d", bound)
    return StubServer(server, bound, servicer)


def main(argv: list[str] | None = None) -> None:
    """``python -m ingest.testing [PORT]``: serve the stub until interrupted (for benchmarks)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m ingest.testing",
        description="Serve the stub identity server on 127.0.0.1 until interrupted; "
                    "prints its address.")
    parser.add_argument("port", nargs="?", type=int, default=0,
                        help="port to listen on (default 0: a free one)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"port must be 0-65535, got {args.port}")
    stub = serve_stub(port=args.port)
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    sys.stdout.write(f"{stub.address}\n")  # once the signals are ours
    sys.stdout.flush()
    # In slices: a signal landing on a gRPC thread runs its handler only when this thread wakes.
    while not stopping.wait(0.2):
        pass
    stub.stop()


if __name__ == "__main__":
    main()
