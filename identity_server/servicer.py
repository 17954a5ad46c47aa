"""protobuf <-> domain translation for IdentityService; errors become status codes. No rules here."""

from __future__ import annotations

import codecs
import functools
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.domain import MatchKind, Status
from identity_server.errors import (
    EntityNotFound,
    FailedPrecondition,
    IdentityError,
    InvalidArgument,
    StoreUnavailable,
    Unauthenticated,
)
from identity_server.service import EntityView, IdentityService, ItemError, ResolveResult

logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])

STATUS_CODES: dict[type[IdentityError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    EntityNotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
}

_STATUS = {
    Status.CANONICAL: pb.CANONICAL,
    Status.PROVISIONAL: pb.PROVISIONAL,
    Status.MERGED: pb.MERGED,
}
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


def _rpc(*, admin: bool = False) -> Callable[[F], F]:
    """Checks the admin token, maps domain errors to status codes, logs one line per call: at
    info for admin calls and failed ones, at debug for the rest (at thousands of resolves a
    second, a line each cost a fifth of the server's throughput)."""

    def wrap(method: F) -> F:
        name = method.__name__

        @functools.wraps(method)
        def handler(self: IdentityServicer, request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                if admin:
                    self._check_admin(context)
                return method(self, request, context)
            except IdentityError as e:
                code = STATUS_CODES.get(type(e), grpc.StatusCode.INTERNAL)
                context.abort(code, str(e))
            except Exception:
                # Aborted already (a request stream that did not decode): that status stands.
                # (ServicerContext.code() is in grpcio since 1.38; the type stubs lack it.)
                aborted = context.code()  # type: ignore[attr-defined]
                if aborted is not None:
                    code = aborted  # for the access log line
                    raise
                if not context.is_active():  # the client went away (cancelled, deadline): no fault
                    code = grpc.StatusCode.CANCELLED
                    context.abort(code, "the client cancelled the call")
                code = grpc.StatusCode.INTERNAL
                logger.exception("%s failed", name)
                context.abort(code, "internal error; the server log has the details")
            finally:
                level = logging.INFO if admin or code is not grpc.StatusCode.OK else logging.DEBUG
                if logger.isEnabledFor(level):
                    logger.log(
                        level, "rpc method=%s count=%d duration_ms=%.2f code=%s",
                        name, _count(request), (time.perf_counter() - start) * 1e3, code.name,
                    )

        return handler  # type: ignore[return-value]

    return wrap


def _count(request: Any) -> int:
    mentions = getattr(request, "mentions", None)
    return len(mentions) if mentions is not None else 1


class IdentityServicer(pb_grpc.IdentityServiceServicer):  # type: ignore[misc]
    def __init__(self, service: IdentityService, *, admin_token: str | None,
                 max_followers: int = 4) -> None:
        self.service = service
        self.admin_token = admin_token
        # A following ListChanges stream holds a handler thread for its whole life: capped, so
        # followers (or clients that stop reading) can never take every thread from other calls.
        self.max_followers = max_followers
        self._followers = threading.BoundedSemaphore(max_followers)

    def _check_admin(self, context: grpc.ServicerContext) -> None:
        if not self.admin_token:
            raise Unauthenticated(
                "admin RPCs are disabled: start the server with --admin-token "
                "(or IDENTITY_ADMIN_TOKEN)"
            )
        given = dict(context.invocation_metadata()).get("authorization", "")
        presented = given.encode() if isinstance(given, str) else given
        if not presented:
            raise Unauthenticated("admin RPC needs metadata 'authorization: Bearer <admin token>'")
        if not hmac.compare_digest(presented, f"Bearer {self.admin_token}".encode()):
            raise Unauthenticated("admin RPC: the 'authorization' metadata is not 'Bearer ' "
                                  "followed by this server's admin token")

    @_rpc()
    def Resolve(self, request: pb.ResolveRequest, context: grpc.ServicerContext) -> pb.ResolveResponse:
        result = self.service.resolve(
            request.mention, request.entity_type, context_id=request.context_id,
            lookup_only=request.lookup_only,
        )
        return resolve_response(result)

    @_rpc()
    def ResolveBatch(self, request: pb.ResolveBatchRequest,
                     context: grpc.ServicerContext) -> pb.ResolveBatchResponse:
        reply = self.service.resolve_batch_reply(
            request.context_id,
            [(m.mention, m.entity_type) for m in request.mentions],
            lookup_only=request.lookup_only,
        )
        out = pb.ResolveBatchResponse(replayed=reply.replayed)
        for r in reply.results:
            item = out.results.add()
            if isinstance(r, ItemError):
                item.error.code = grpc.StatusCode[r.code].value[0]
                item.error.message = r.message
            else:
                item.resolved.CopyFrom(resolve_response(r))
        return out

    @_rpc()
    def GetEntity(self, request: pb.GetEntityRequest,
                  context: grpc.ServicerContext) -> pb.GetEntityResponse:
        return pb.GetEntityResponse(entity=entity_message(self.service.get_entity(request.entity_id)))

    @_rpc(admin=True)
    def AddAlias(self, request: pb.AddAliasRequest,
                 context: grpc.ServicerContext) -> pb.AddAliasResponse:
        view = self.service.add_alias(request.entity_id, request.alias)
        return pb.AddAliasResponse(entity=entity_message(view))

    @_rpc(admin=True)
    def Promote(self, request: pb.PromoteRequest,
                context: grpc.ServicerContext) -> pb.PromoteResponse:
        return pb.PromoteResponse(entity=entity_message(self.service.promote(request.entity_id)))

    @_rpc(admin=True)
    def Merge(self, request: pb.MergeRequest, context: grpc.ServicerContext) -> pb.MergeResponse:
        view = self.service.merge(request.source_id, request.target_id)
        return pb.MergeResponse(entity=entity_message(view))

    @_rpc()
    def ListPossiblySameAs(self, request: pb.ListPossiblySameAsRequest,
                           context: grpc.ServicerContext) -> pb.ListPossiblySameAsResponse:
        if request.page_size < 0:
            raise InvalidArgument("page_size must not be negative")
        rows, token = self.service.list_links(
            entity_id=request.entity_id, page_size=request.page_size, page_token=request.page_token
        )
        return pb.ListPossiblySameAsResponse(
            links=[pb.PossiblySameAsLink(entity_id=r.a, other_id=r.b, sequence=r.created_seq)
                   for r in rows],
            next_page_token=token,
        )

    @_rpc(admin=True)
    def SettlePossiblySameAs(self, request: pb.SettlePossiblySameAsRequest,
                             context: grpc.ServicerContext) -> pb.SettlePossiblySameAsResponse:
        decision = _DECISION.get(request.decision)
        if decision is None:
            raise InvalidArgument("decision must be SAME or DISTINCT")
        view = self.service.settle(request.entity_id, request.other_id, decision,
                                   actor=request.actor, reason=request.reason)
        return pb.SettlePossiblySameAsResponse(entity=entity_message(view))

    @_rpc(admin=True)
    def ImportAuthority(self, request_iterator: Iterator[pb.ImportAuthorityRequest],
                        context: grpc.ServicerContext) -> pb.ImportAuthorityResponse:
        first = next(request_iterator, None)
        if first is None:
            return pb.ImportAuthorityResponse()
        fmt = _FORMAT.get(first.format)
        report = self.service.import_lines(_lines(first, request_iterator), fmt)
        return pb.ImportAuthorityResponse(
            imported=report.imported, created=report.created, updated=report.updated,
            merged=report.merged, linked=report.linked,
            errors=[pb.ImportError(line=e.line, message=e.message) for e in report.errors],
        )

    def ListChanges(self, request: pb.ListChangesRequest,
                    context: grpc.ServicerContext) -> Iterator[pb.ListChangesResponse]:
        if request.after_sequence < 0 or request.limit < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "after_sequence and limit must not be negative")
        if request.follow and not self._followers.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"this server already has {self.max_followers} following ListChanges "
                          "streams (each holds a handler thread); read without follow and poll, "
                          "or retry later")
        try:
            yield from self._changes(request, context)
        finally:
            if request.follow:
                self._followers.release()

    def _changes(self, request: pb.ListChangesRequest,
                 context: grpc.ServicerContext) -> Iterator[pb.ListChangesResponse]:
        after, sent = request.after_sequence, 0
        limit = request.limit or None
        logger.info("rpc method=ListChanges after=%d follow=%s", after, request.follow)
        while context.is_active():
            want = min(500, limit - sent) if limit else 500
            try:
                batch = self.service.list_changes(after, want)
            except StoreUnavailable as e:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
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
                time.sleep(_FOLLOW_POLL_S)


def _lines(first: pb.ImportAuthorityRequest,
           rest: Iterator[pb.ImportAuthorityRequest]) -> Iterator[str]:
    """Text lines from a stream of byte chunks (chunks may split lines and UTF-8 sequences)."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    buffer = ""

    def chunks() -> Iterator[bytes]:
        yield first.data
        for req in rest:
            yield req.data

    try:
        for data in chunks():
            buffer += decoder.decode(data)
            *complete, buffer = buffer.split("\n")
            yield from complete
        buffer += decoder.decode(b"", final=True)
    except UnicodeDecodeError as e:
        raise InvalidArgument(f"authority file is not valid UTF-8: {e.reason}") from e
    if buffer:
        yield buffer


def _json(detail: dict[str, Any]) -> str:
    return json.dumps(detail, ensure_ascii=False, sort_keys=True)


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e6):06d}Z"


def resolve_response(r: ResolveResult) -> pb.ResolveResponse:
    return pb.ResolveResponse(
        entity_id=r.entity_id,
        status=_STATUS[r.status] if r.status else pb.ENTITY_STATUS_UNSPECIFIED,
        match_kind=_KIND[r.match_kind],
        created=r.created,
        possibly_same_as=r.possibly_same_as,
        candidates=r.candidates,
        name=r.name,
        matched_name=r.matched_name,
        entity_type=r.entity_type,
        display_form=r.display_form,
    )


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
    )
