"""protobuf <-> domain translation for IdentityService; errors become status codes. No rules here."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from typing import Any, TypeVar

import grpc
from identity_api.v1 import identity_service_pb2 as pb

from identity_server.access import AccessPolicy, Role
from identity_server.authority import Line, decode_lines, split_lines
from identity_server.domain import MatchKind, Status
from identity_server.errors import (
    BatchTooLarge,
    EntityNotFound,
    FailedPrecondition,
    IdentityError,
    InvalidArgument,
    Overloaded,
    PermissionDenied,
    StoreUnavailable,
    Unauthenticated,
)
from identity_server.loop_work import AsyncResolver, CallEnded, blocking_iterator, on_pool
from identity_server.metrics import Metrics
from identity_server.service import (
    BatchReply,
    EntityView,
    IdentityService,
    ItemError,
    ResolveResult,
)

logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]

STATUS_CODES: dict[type[IdentityError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    EntityNotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
}

_STATUS = {
    Status.CANONICAL: pb.CANONICAL,
    Status.PROVISIONAL: pb.PROVISIONAL,
    Status.MERGED: pb.MERGED,
}
_STATUS_OF = {number: status for status, number in _STATUS.items()}
_KIND = {k: pb.MatchKind.Value(k.value) for k in MatchKind}
_CHANGE_KIND = {
    name: pb.ChangeKind.Value(f"CHANGE_KIND_{name.upper()}")
    for name in (
        "created", "surface_form_added", "alias_added", "type_upgraded", "promoted", "merged",
        "link_added", "link_settled", "imported",
    )
}
_DECISION = {pb.SAME: "same", pb.DISTINCT: "distinct"}
_FORMAT = {pb.AUTHORITY_FORMAT_JSONL: "jsonl", pb.AUTHORITY_FORMAT_CSV: "csv"}
_FOLLOW_POLL_S = 0.2
_INTERNAL = "internal error; the server log has the details"
# A call's request id: taken from this metadata key (or made), logged with the call and sent
# back in trailing metadata, so that one paper's calls can be followed through a pipeline.
REQUEST_ID_KEY = "x-request-id"
_REQUEST_ID_CHARS = frozenset(range(0x21, 0x7F))


# Made ids: this process's random prefix and a count, unique without a system call per call.
_ID_PREFIX = uuid.uuid4().hex[:12]
_next_id = itertools.count(1).__next__


def _request_id(context: Context) -> str:
    """The caller's request id when it is a visible-ASCII one of at most 200 characters (it is
    logged and sent back); else a new one."""
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_KEY and isinstance(value, str):
            if 0 < len(value) <= 200 and all(ord(c) in _REQUEST_ID_CHARS for c in value):
                return value
            break
    return f"{_ID_PREFIX}-{_next_id():x}"


# Trailing metadata of a ResolveBatch refused for its size: the server's limit, so a client can
# send the mentions in parts (named in the proto's comments; ingest reads it).
MAX_BATCH_SIZE_KEY = "identity-max-batch-size"
# Trailing metadata of a write refused because the server is busy: when to try again (ms).
RETRY_AFTER_KEY = "retry-after-ms"


def _resolve_role(request: Any) -> Role:
    """A lookup-only resolve writes nothing: a reader may make it."""
    return Role.READER if request.lookup_only else Role.WRITER


def _rpc(role: Role | Callable[[Any], Role] = Role.READER) -> Callable[[F], F]:
    """Checks the caller's role, maps domain errors to status codes, logs one line per call: at
    info for admin calls and failed ones, at debug for the rest (at thousands of resolves a
    second, a line each cost a fifth of the server's throughput)."""

    def wrap(method: F) -> F:
        name = method.__name__
        admin = role is Role.ADMIN

        @functools.wraps(method)
        async def handler(self: IdentityServicer, request: Any, context: Context) -> Any:
            start = time.perf_counter()
            code, details = grpc.StatusCode.OK, ""
            request_id = _request_id(context)
            if self.metrics is not None:
                self.metrics.record_start(name)
            trailing: tuple[tuple[str, str], ...] = ((REQUEST_ID_KEY, request_id),)
            context.set_trailing_metadata(trailing)
            try:
                self._check_role(context, role if isinstance(role, Role) else role(request),
                                 name)
                return await method(self, request, context)
            except IdentityError as e:
                code, details = _status_code(e), str(e)
                if isinstance(e, BatchTooLarge):
                    trailing += ((MAX_BATCH_SIZE_KEY, str(e.limit)),)
                if isinstance(e, Overloaded):
                    trailing += ((RETRY_AFTER_KEY, str(e.retry_after_ms)),)
                if isinstance(e, StoreUnavailable):  # an operator must tell these apart
                    logger.warning("%s: the store failed: %s", name, e,
                                   extra={"method": name, "request_id": request_id})
            except asyncio.CancelledError:  # the client went away (cancelled, deadline): no fault
                code = grpc.StatusCode.CANCELLED
                if self.stopping:  # or the server's grace period ran out: say which call
                    logger.warning("%s cancelled: the server stopped before it finished "
                                   "(request_id=%s, %.1f s in)", name, request_id,
                                   time.perf_counter() - start,
                                   extra={"method": name, "request_id": request_id})
                raise
            except CallEnded:  # the same, noticed while reading its request stream
                code = grpc.StatusCode.CANCELLED
                raise asyncio.CancelledError() from None
            except grpc.aio.AbortError:  # aborted already (a request that did not decode)
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except Exception:
                code, details = grpc.StatusCode.INTERNAL, _INTERNAL
                logger.exception("%s failed", name)
            finally:  # logged and counted before the status is sent
                if self.metrics is not None:
                    self.metrics.record_call(name, code.name, time.perf_counter() - start)
                level = logging.INFO if admin or code is not grpc.StatusCode.OK else logging.DEBUG
                if logger.isEnabledFor(level):
                    duration_ms = round((time.perf_counter() - start) * 1e3, 3)
                    peer = context.peer()
                    logger.log(
                        level, "rpc method=%s count=%d duration_ms=%.2f peer=%s request_id=%s "
                        "code=%s", name, _count(request), duration_ms, peer, request_id,
                        code.name,
                        extra={"method": name, "code": code.name, "duration_ms": duration_ms,
                               "peer": peer, "request_id": request_id,
                               "count": _count(request)},
                    )
            await context.abort(code, details, trailing)

        return handler  # type: ignore[return-value]

    return wrap


def _status_code(error: IdentityError) -> grpc.StatusCode:
    """The status code of the nearest class of `error` that has one (a BatchTooLarge is an
    InvalidArgument); INTERNAL for none."""
    for cls in type(error).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    return grpc.StatusCode.INTERNAL


def _count(request: Any) -> int:
    mentions = getattr(request, "mentions", None)
    return len(mentions) if mentions is not None else 1


class IdentityServicer:
    """IdentityService on gRPC's asyncio server. Handlers run on the event loop; whatever may
    wait (a lock, another process's write, PostgreSQL, a large batch) runs on the `blocking`
    thread pool, so the loop never waits. A Resolve the index answers at once, and a write
    (Resolve, or a batch of up to INLINE_BATCH_LIMIT mentions) that finds no lock taken on
    SQLite, cost no thread switch."""

    def __init__(self, service: IdentityService, *, access: AccessPolicy,
                 blocking: futures.Executor, max_followers: int = 4,
                 max_imports: int = 4, metrics: Metrics | None = None,
                 max_queued_mentions: int = 20_000) -> None:
        self.service = service
        self.metrics = metrics
        self.stopping = False  # the graceful stop has begun: a call cancelled now is logged
        self.access = access  # replaced whole when the tokens are read again (SIGHUP)
        self._blocking = blocking
        self._resolver = AsyncResolver(service, blocking,
                                       max_queued_mentions=max_queued_mentions)
        # Following ListChanges streams each poll the store, and an import holds a pool thread
        # for as long as its client keeps sending: both capped, so followers and imports (or
        # clients that stop reading or sending) can never crowd out other calls.
        self._followers = _Slots(max_followers, "following ListChanges streams",
                                 "read without follow and poll, or retry later")
        self._imports = _Slots(max_imports, "imports in progress", "retry when one has ended")

    async def _off_loop(self, work: Callable[..., T], *args: Any) -> T:
        """work(*args) on the blocking pool (it may wait on locks or the store)."""
        return await on_pool(self._blocking, work, *args)

    def _check_role(self, context: Context, needed: Role, call: str) -> None:
        access = self.access
        if needed is Role.ADMIN or access.enforcing:  # else open, as before roles
            access.check(context.invocation_metadata(), needed, call)

    @_rpc(_resolve_role)
    async def Resolve(self, request: pb.ResolveRequest, context: Context) -> pb.ResolveResponse:
        reply = await self._resolver.resolve(
            request.mention, request.entity_type, context_id=request.context_id,
            lookup_only=request.lookup_only)
        (result,) = reply.results
        assert isinstance(result, ResolveResult)
        if self.metrics is not None:
            self.metrics.record_results(reply.results)
        return resolve_response(result)

    @_rpc(_resolve_role)
    async def ResolveBatch(self, request: pb.ResolveBatchRequest,
                           context: Context) -> pb.ResolveBatchResponse:
        reply = await self._resolver.resolve_batch(
            request.context_id, _mentions(request), lookup_only=request.lookup_only)
        if self.metrics is not None:
            self.metrics.batch_items.observe(len(request.mentions))
            self.metrics.record_results(reply.results)
        return batch_response(reply)

    @_rpc()
    async def GetEntity(self, request: pb.GetEntityRequest,
                        context: Context) -> pb.GetEntityResponse:
        view = await self._off_loop(functools.partial(
            self.service.get_entity, request.entity_id, max_surface_forms=_forms_cap(request),
            surface_forms_offset=request.surface_forms_offset))
        return pb.GetEntityResponse(entity=entity_message(view))

    @_rpc()
    async def ListEntities(self, request: pb.ListEntitiesRequest,
                           context: Context) -> pb.ListEntitiesResponse:
        status = _STATUS_OF.get(request.status) if request.status else None
        if request.status and status is None:
            raise InvalidArgument(f"unknown status {request.status}")
        views, token = await self._off_loop(functools.partial(
            self.service.list_entities, status=status, entity_type=request.entity_type,
            page_size=request.page_size, page_token=request.page_token,
            max_surface_forms=_forms_cap(request)))
        return pb.ListEntitiesResponse(entities=[entity_message(v) for v in views],
                                       next_page_token=token)

    @_rpc(Role.ADMIN)
    async def AddAlias(self, request: pb.AddAliasRequest, context: Context) -> pb.AddAliasResponse:
        view = await self._off_loop(functools.partial(
            self.service.add_alias, request.entity_id, request.alias,
            max_surface_forms=_forms_cap(request)))
        return pb.AddAliasResponse(entity=entity_message(view))

    @_rpc(Role.ADMIN)
    async def Promote(self, request: pb.PromoteRequest, context: Context) -> pb.PromoteResponse:
        view = await self._off_loop(functools.partial(
            self.service.promote, request.entity_id, max_surface_forms=_forms_cap(request)))
        return pb.PromoteResponse(entity=entity_message(view))

    @_rpc(Role.ADMIN)
    async def Merge(self, request: pb.MergeRequest, context: Context) -> pb.MergeResponse:
        view = await self._off_loop(functools.partial(
            self.service.merge, request.source_id, request.target_id,
            max_surface_forms=_forms_cap(request)))
        return pb.MergeResponse(entity=entity_message(view))

    @_rpc()
    async def ListPossiblySameAs(self, request: pb.ListPossiblySameAsRequest,
                                 context: Context) -> pb.ListPossiblySameAsResponse:
        if request.page_size < 0:
            raise InvalidArgument("page_size must not be negative")
        rows, token = await self._off_loop(functools.partial(
            self.service.list_links, entity_id=request.entity_id, page_size=request.page_size,
            page_token=request.page_token))
        return pb.ListPossiblySameAsResponse(
            links=[pb.PossiblySameAsLink(entity_id=r.a, other_id=r.b, sequence=r.created_seq)
                   for r in rows],
            next_page_token=token,
        )

    @_rpc(Role.ADMIN)
    async def SettlePossiblySameAs(self, request: pb.SettlePossiblySameAsRequest,
                                   context: Context) -> pb.SettlePossiblySameAsResponse:
        decision = _DECISION.get(request.decision)
        if decision is None:
            raise InvalidArgument("decision must be SAME or DISTINCT")
        view = await self._off_loop(functools.partial(
            self.service.settle, request.entity_id, request.other_id, decision,
            actor=request.actor, reason=request.reason, max_surface_forms=_forms_cap(request)))
        return pb.SettlePossiblySameAsResponse(entity=entity_message(view))

    @_rpc(Role.ADMIN)
    async def ImportAuthority(self, request_iterator: AsyncIterator[pb.ImportAuthorityRequest],
                              context: Context) -> pb.ImportAuthorityResponse:
        first = await anext(request_iterator, None)
        if first is None:
            return pb.ImportAuthorityResponse()
        fmt = _FORMAT.get(first.format)
        call = asyncio.current_task()
        assert call is not None
        await self._imports.take(context)
        try:
            rest = blocking_iterator(request_iterator, asyncio.get_running_loop(), call)
            report = await self._off_loop(self.service.import_lines, _lines(first, rest), fmt)
        finally:
            self._imports.give_back()
        return pb.ImportAuthorityResponse(
            imported=report.imported, created=report.created, updated=report.updated,
            merged=report.merged, linked=report.linked,
            errors=[pb.ImportError(line=e.line, message=e.message) for e in report.errors],
        )

    async def ListChanges(self, request: pb.ListChangesRequest,
                          context: Context) -> AsyncIterator[pb.ListChangesResponse]:
        start, code = time.perf_counter(), grpc.StatusCode.OK
        if self.metrics is not None:
            self.metrics.record_start("ListChanges")
        try:
            async for change in self._list_changes(request, context):
                yield change
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except grpc.aio.AbortError:
            code = context.code() or grpc.StatusCode.UNKNOWN
            raise
        except Exception:
            code = grpc.StatusCode.INTERNAL
            raise
        finally:
            if self.metrics is not None:
                self.metrics.record_call("ListChanges", code.name, time.perf_counter() - start)

    async def _list_changes(self, request: pb.ListChangesRequest,
                            context: Context) -> AsyncIterator[pb.ListChangesResponse]:
        try:
            self._check_role(context, Role.READER, "ListChanges")
        except IdentityError as e:
            await context.abort(_status_code(e), str(e))
        if request.after_sequence < 0 or request.limit < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "after_sequence and limit must not be negative")
        if request.follow:
            await self._followers.take(context)
        try:
            async for change in self._changes(request, context):
                yield change
        finally:
            if request.follow:
                self._followers.give_back()

    async def _changes(self, request: pb.ListChangesRequest,
                       context: Context) -> AsyncIterator[pb.ListChangesResponse]:
        after, sent = request.after_sequence, 0
        limit = request.limit or None
        logger.info("rpc method=ListChanges after=%d follow=%s", after, request.follow)
        while not context.done():
            want = min(500, limit - sent) if limit else 500
            try:
                batch = await self._off_loop(self.service.list_changes, after, want)
            except StoreUnavailable as e:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
            for c in batch:
                yield pb.ListChangesResponse(change=pb.Change(
                    sequence=c.seq, kind=_CHANGE_KIND.get(c.kind, pb.CHANGE_KIND_UNSPECIFIED),
                    entity_id=c.entity_id, other_id=c.other_id,
                    detail=_json(c.detail), recorded_at=_rfc3339(c.recorded_at),
                ))
                after, sent = c.seq, sent + 1
            if limit and sent >= limit:
                return
            if len(batch) < want:
                if not request.follow:
                    return
                await asyncio.sleep(_FOLLOW_POLL_S)


class _Slots:
    """At most `limit` calls of one kind at a time; one more is RESOURCE_EXHAUSTED. Used from
    the event loop's thread only, so it needs no lock."""

    def __init__(self, limit: int, what: str, instead: str) -> None:
        self.limit = limit
        self._what = what
        self._instead = instead
        self._used = 0

    async def take(self, context: Context) -> None:
        if self._used >= self.limit:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"this server already has {self.limit} {self._what}; "
                                f"{self._instead}")
        self._used += 1

    def give_back(self) -> None:
        self._used -= 1


def _lines(first: pb.ImportAuthorityRequest,
           rest: Iterator[pb.ImportAuthorityRequest]) -> Iterator[Line]:
    """Lines from a stream of byte chunks (chunks may split lines and UTF-8 sequences), each
    decoded on its own: a line that is not UTF-8, or too long, refuses its record only."""
    chunks = itertools.chain((first.data,), (req.data for req in rest))
    return decode_lines(split_lines(chunks))


def _json(detail: dict[str, Any]) -> str:
    return json.dumps(detail, ensure_ascii=False, sort_keys=True)


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e6):06d}Z"


def _forms_cap(request: Any) -> int | None:
    """A request's `max_surface_forms`, None when unset (all of them)."""
    return request.max_surface_forms if request.HasField("max_surface_forms") else None


def _mentions(request: pb.ResolveBatchRequest) -> list[tuple[str, str]]:
    return [(m.mention, m.entity_type) for m in request.mentions]


def batch_response(reply: BatchReply) -> pb.ResolveBatchResponse:
    out = pb.ResolveBatchResponse(replayed=reply.replayed)
    add = out.results.add
    for r in reply.results:
        if isinstance(r, ItemError):
            add(error=pb.ItemError(code=grpc.StatusCode[r.code].value[0], message=r.message))
        else:
            # Fields straight into the item's message: a ResolveResponse built and copied in
            # cost ~10% more a mention, serialisation included.
            add(resolved=_resolved_fields(r))
    return out


def resolve_response(r: ResolveResult) -> pb.ResolveResponse:
    return pb.ResolveResponse(**_resolved_fields(r))


def _resolved_fields(r: ResolveResult) -> dict[str, Any]:
    """The reply's fields, leaving out those at their default (false, empty lists), which the
    message would not carry anyway: each field given costs the message's init a name lookup,
    and a repeated one an extend, even when empty."""
    fields = {
        "entity_id": r.entity_id,
        "status": _STATUS[r.status] if r.status else pb.ENTITY_STATUS_UNSPECIFIED,
        "match_kind": _KIND[r.match_kind],
        "name": r.name,
        "matched_name": r.matched_name,
        "entity_type": r.entity_type,
        "display_form": r.display_form,
    }
    if r.created:
        fields["created"] = True
    if r.possibly_same_as:
        fields["possibly_same_as"] = r.possibly_same_as
    if r.candidates:
        fields["candidates"] = r.candidates
        fields["candidate_scores"] = r.candidate_scores
    return fields


def entity_message(v: EntityView) -> pb.Entity:
    return pb.Entity(
        entity_id=v.entity_id,
        name=v.name,
        entity_type=v.entity_type,
        status=_STATUS[v.status],
        aliases=v.aliases,
        surface_forms=v.surface_forms,
        redirect_to=v.redirect_to,
        placeholder=v.placeholder,
        evidence_count=v.evidence_count,
        paper_count=v.paper_count,
        surface_form_count=v.surface_form_count,
    )
