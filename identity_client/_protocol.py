"""What both clients share, with no I/O: each call as a value (method, request, how to read the
reply), the metadata it carries, and when a failed call is tried again.

The sync and asyncio clients differ only in how they wait; everything they decide is here, so
the two cannot drift apart.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import grpc
from identity_api.v1 import identity_service_pb2 as pb

from identity_client import types
from identity_client.errors import IdentityError, ServerUnavailable

logger = logging.getLogger("identity_client")

T = TypeVar("T")

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
RETRY_WARNING_EVERY_S = 10.0  # at most one retry warning per client in this long
# Trailing metadata of a ResolveBatch the server refused for its size: the server's limit.
MAX_BATCH_SIZE_KEY = "identity-max-batch-size"
# Trailing metadata of a write a busy server refused: when to call again, in ms.
RETRY_AFTER_KEY = "retry-after-ms"
# Replies as large as the server sends: an entity with thousands of spellings outgrows gRPC's
# default 4 MB.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024),
                   ("grpc.max_send_message_length", 64 * 1024 * 1024)]
PAGE_SIZE = 1000  # the most the server sends in one page of links or entities

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The deadline of each attempt, and for how long an outage is retried before the call
    fails with ServerUnavailable (0: never retried)."""

    deadline_seconds: float = 10.0
    budget_seconds: float = 120.0
    initial_backoff: float = 0.05
    max_backoff: float = 3.0


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One unary call: the RPC, its request, how its reply reads, and what it carries."""

    method: str
    request: Any
    read: Callable[[Any], T]
    admin: bool = False
    context_id: str = ""
    count: int = 1  # mentions the call carries, for the log


def request_id_of(context_id: str) -> str:
    """The request id of a paper's calls: `paper:` and its id, percent-encoded (metadata values
    are ASCII) and capped, so that a paper's calls can be found in the server's log."""
    return "paper:" + quote(context_id, safe="")[:200]


def metadata(token: str | None, admin_token: str | None, call_admin: bool,
             context_id: str = "") -> Metadata | None:
    """The bearer token (the admin token for admin calls, when given) and a paper's request id."""
    chosen = admin_token if call_admin and admin_token else token
    out = [("authorization", f"Bearer {chosen}")] if chosen else []
    if context_id:
        out.append(("x-request-id", request_id_of(context_id)))
    return tuple(out) or None


# -- failures ----------------------------------------------------------------------------------
# Sync errors are grpc.Call; asyncio's AioRpcError is not, but has the same three methods.

def code_of(error: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(error, "code", None)
    return code() if callable(code) else grpc.StatusCode.UNKNOWN


def details_of(error: grpc.RpcError) -> str:
    details = getattr(error, "details", None)
    return (details() if callable(details) else str(error)) or ""


def _trailing(error: grpc.RpcError, key: str) -> str | None:
    trailing = getattr(error, "trailing_metadata", None)
    for k, value in (trailing() if callable(trailing) else None) or ():
        if k == key:
            return str(value)
    return None


def batch_limit_of(error: grpc.RpcError) -> int | None:
    """The limit a server names in the trailing metadata of a batch it refused for its size."""
    try:
        limit = int(_trailing(error, MAX_BATCH_SIZE_KEY) or 0)
    except ValueError:
        return None
    return limit if limit > 0 else None


def retry_after_of(error: grpc.RpcError) -> float | None:
    """When a busy server asks to be called again (RESOURCE_EXHAUSTED with `retry-after-ms`):
    that many seconds; None for any other refusal."""
    if code_of(error) is not grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    try:
        return max(0.0, int(_trailing(error, RETRY_AFTER_KEY) or "") / 1000)
    except ValueError:
        return None


class Retrier:
    """When to try a failed call again, shared by every call of one client: the budget is the
    outage's, so the calls in flight give up together instead of each starting its own budget
    when it first fails. Thread-safe."""

    def __init__(self, policy: RetryPolicy, target: str, tls: bool) -> None:
        self.policy = policy
        self._target = target
        self._tls = tls
        self._lock = threading.Lock()
        self._outage_since: float | None = None  # time.monotonic() of the first failure
        self._warned_at = -RETRY_WARNING_EVERY_S
        self.retries = 0
        self.aborted = threading.Event()
        self._parts_warned = False

    def check_open(self, method: str) -> None:
        if self.aborted.is_set():
            raise IdentityError(method, "CANCELLED", "the client was aborted")

    def succeeded(self) -> None:
        self._outage_since = None

    def pause_after(self, error: grpc.RpcError, method: str, attempt: int, backoff: float,
                    what: str, *, started: float) -> float:
        """How long to wait before trying `method` again; raises IdentityError when the failure
        is final, ServerUnavailable once the outage has lasted the retry budget. A CANCELLED
        the client did not cause (a server stopping cancels the calls it still runs) is
        retried; UNAVAILABLE and DEADLINE_EXCEEDED are; RESOURCE_EXHAUSTED with a
        `retry-after-ms` is, after that long."""
        code = code_of(error)
        details = details_of(error)
        busy_for = retry_after_of(error)
        retryable = code in RETRYABLE or (code is grpc.StatusCode.CANCELLED
                                          and not self.aborted.is_set())
        if not retryable and busy_for is None:
            logger.info("rpc=%s %s status=%s attempt=%d duration=%.4fs",
                        method, what, code.name, attempt, time.monotonic() - started)
            raise IdentityError(method, code.name, details,
                                batch_limit=batch_limit_of(error)) from error
        budget = self.policy.budget_seconds
        pause = max(busy_for or 0.0, random.uniform(0, backoff))
        with self._lock:
            now = time.monotonic()
            if self._outage_since is None:
                self._outage_since = now
            if not budget:  # retrying was not asked for: the failure as it came
                raise ServerUnavailable(method, code.name, details) from error
            if now + pause > self._outage_since + budget:
                # A plaintext call to a TLS server fails as one to no server does.
                tls = "" if self._tls else " and serving without TLS"
                raise ServerUnavailable(
                    method, code.name,
                    f"{details} (gave up after {attempt} attempts: the server has been "
                    f"unreachable for the retry budget of {budget:g} s; is the identity server "
                    f"at {self._target} running{tls}?)") from error
            self.retries += 1
            # One line per outage, not one per call and attempt: with many calls in flight a
            # restart would print hundreds; the rest go to debug.
            warn = now - self._warned_at >= RETRY_WARNING_EVERY_S
            if warn:
                self._warned_at = now
        logger.log(logging.WARNING if warn else logging.DEBUG,
                   "rpc=%s %s status=%s attempt=%d retry_in=%.3fs: %s (retrying for up to %g s; "
                   "further retries within %g s are logged at debug)",
                   method, what, code.name, attempt, pause, details[:200], budget,
                   RETRY_WARNING_EVERY_S)
        return pause

    def warn_parts_once(self, limit: int) -> None:
        """Says once a client that batches go in parts (two callers racing may both say it)."""
        if self._parts_warned:
            return
        self._parts_warned = True
        logger.warning("the identity server takes at most %d mentions in one ResolveBatch: "
                       "larger batches are resolved in parts of that size (raise its "
                       "IDENTITY_MAX_BATCH_SIZE to resolve each in one transaction)", limit)



class Attempts:
    """One call's tries through the client's Retrier: counted, timed, and spaced by a backoff
    that doubles (up to the policy's most) after each failure."""

    def __init__(self, retrier: Retrier, method: str) -> None:
        self._retrier = retrier
        self.method = method
        self._attempt = 0
        self._backoff = retrier.policy.initial_backoff
        self._started = 0.0

    def begin(self) -> None:
        """An attempt starts (IdentityError if the client was aborted)."""
        self._attempt += 1
        self._retrier.check_open(self.method)
        self._started = time.monotonic()

    def pause_after(self, error: grpc.RpcError, what: str) -> float:
        """How long to wait before the next attempt (see Retrier.pause_after)."""
        pause = self._retrier.pause_after(error, self.method, self._attempt, self._backoff, what,
                                          started=self._started)
        self._backoff = min(self._backoff * 2, self._retrier.policy.max_backoff)
        return pause

    def answered(self, count: int | None = None) -> None:
        """The server answered: the client's outage, if any, is over. `count`: the call is
        done, with that many mentions (logged at debug)."""
        self._retrier.succeeded()
        if count is not None:
            logger.debug("rpc=%s count=%d status=OK attempt=%d duration=%.4fs",
                         self.method, count, self._attempt, time.monotonic() - self._started)


class ChangesFeed:
    """A ListChanges read to its end (or followed), started again after the last change read
    when it fails on the way: the requests to send, and what each reply reads as."""

    def __init__(self, retrier: Retrier, token: str | None, after_sequence: int, limit: int,
                 follow: bool) -> None:
        self.tries = Attempts(retrier, "ListChanges")
        self._after = after_sequence
        self._last = after_sequence
        self._limit = limit
        self._follow = follow
        # A followed feed has no end, so no deadline; a backlog gets six calls' worth.
        self.timeout = None if follow else retrier.policy.deadline_seconds * 6
        self.metadata = metadata(token, None, False)

    def next_request(self) -> pb.ListChangesRequest | None:
        """The request of the next attempt; None once `limit` changes were read."""
        if not self._limit:
            left = 0
        else:  # sequence numbers are gapless: the changes read are last - after
            left = self._limit - (self._last - self._after)
            if left <= 0:
                return None
        self.tries.begin()
        return pb.ListChangesRequest(after_sequence=self._last, follow=self._follow,
                                     limit=left)

    def read(self, reply: pb.ListChangesResponse) -> types.ChangeEvent:
        change = types.change(reply.change)
        self._last = change.sequence
        self.tries.answered()
        return change

    def ended(self) -> None:
        self.tries.answered()

    def pause_after(self, error: grpc.RpcError) -> float:
        return self.tries.pause_after(error, f"after={self._last}")


# -- the calls ---------------------------------------------------------------------------------

def resolve(mention: str, entity_type: str, context_id: str,
            lookup_only: bool) -> Call[types.Resolution]:
    return Call("Resolve", pb.ResolveRequest(mention=mention, entity_type=entity_type,
                                             context_id=context_id, lookup_only=lookup_only),
                types.resolution, context_id=context_id)


def resolve_batch(context_id: str, mentions: Sequence[tuple[str, str]],
                  lookup_only: bool) -> Call[types.BatchOutcome]:
    request = pb.ResolveBatchRequest(
        context_id=context_id,
        mentions=[pb.Mention(mention=text, entity_type=etype) for text, etype in mentions],
        lookup_only=lookup_only)

    def read(reply: pb.ResolveBatchResponse) -> types.BatchOutcome:
        if len(reply.results) != len(mentions):
            raise IdentityError("ResolveBatch", "INTERNAL",
                                f"{len(reply.results)} results for {len(mentions)} mentions")
        return types.BatchOutcome(
            [types.resolution(r.resolved) if r.WhichOneof("outcome") == "resolved"
             else types.ItemFailure(_code_name(r.error.code), r.error.message)
             for r in reply.results], reply.replayed)

    return Call("ResolveBatch", request, read, context_id=context_id, count=len(mentions))


def _code_name(code: int) -> str:
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return str(status.name)
    return str(code)


def too_large(error: IdentityError, mentions: int) -> int | None:
    """The part size to send a batch in, when the server refused it for its size."""
    limit = error.batch_limit
    return limit if limit is not None and limit < mentions else None


def joined(parts: Sequence[tuple[int, types.BatchOutcome]]) -> types.BatchOutcome:
    """The parts' outcomes, in order, as the whole batch's: a refused item is named by its place
    in the whole batch ("mention 2: ..." of a part from 10 is "mention 12: ..."). `replayed`
    only when every part was."""
    outcomes: list[types.Resolution | types.ItemFailure] = []
    for offset, part in parts:
        outcomes += (_renumbered(o, offset, i) for i, o in enumerate(part.outcomes))
    return types.BatchOutcome(outcomes, all(part.replayed for _, part in parts))


def _renumbered(outcome: types.Resolution | types.ItemFailure, offset: int,
                index: int) -> types.Resolution | types.ItemFailure:
    if isinstance(outcome, types.Resolution) or not offset:
        return outcome
    prefix = f"mention {index}: "
    if not outcome.message.startswith(prefix):
        return outcome
    return types.ItemFailure(outcome.code,
                             f"mention {offset + index}: {outcome.message.removeprefix(prefix)}")


def get_entity(entity_id: str, max_surface_forms: int | None,
               surface_forms_offset: int) -> Call[types.Entity]:
    request = pb.GetEntityRequest(entity_id=entity_id, max_surface_forms=max_surface_forms,
                                  surface_forms_offset=surface_forms_offset)
    return Call("GetEntity", request, lambda r: types.entity(r.entity))


def list_entities(status: types.Status | None, entity_type: str, page_size: int,
                  page_token: str, max_surface_forms: int | None) -> Call[types.EntityPage]:
    request = pb.ListEntitiesRequest(
        status=_STATUS_VALUE[status] if status else pb.ENTITY_STATUS_UNSPECIFIED,
        entity_type=entity_type, page_size=page_size, page_token=page_token,
        max_surface_forms=max_surface_forms)
    return Call("ListEntities", request, lambda r: types.EntityPage(
        tuple(types.entity(e) for e in r.entities), r.next_page_token))


_STATUS_VALUE = {types.Status.CANONICAL: pb.CANONICAL, types.Status.PROVISIONAL: pb.PROVISIONAL,
                 types.Status.MERGED: pb.MERGED}


def list_links(entity_id: str, page_size: int,
               page_token: str) -> Call[tuple[list[types.Link], str]]:
    request = pb.ListPossiblySameAsRequest(entity_id=entity_id, page_size=page_size,
                                           page_token=page_token)
    return Call("ListPossiblySameAs", request,
                lambda r: ([types.link(x) for x in r.links], r.next_page_token))


def add_alias(entity_id: str, alias: str, max_surface_forms: int | None) -> Call[types.Entity]:
    return Call("AddAlias", pb.AddAliasRequest(entity_id=entity_id, alias=alias,
                                               max_surface_forms=max_surface_forms),
                lambda r: types.entity(r.entity), admin=True)


def promote(entity_id: str, max_surface_forms: int | None) -> Call[types.Entity]:
    return Call("Promote", pb.PromoteRequest(entity_id=entity_id,
                                             max_surface_forms=max_surface_forms),
                lambda r: types.entity(r.entity), admin=True)


def merge(source_id: str, target_id: str, max_surface_forms: int | None) -> Call[types.Entity]:
    return Call("Merge", pb.MergeRequest(source_id=source_id, target_id=target_id,
                                         max_surface_forms=max_surface_forms),
                lambda r: types.entity(r.entity), admin=True)


_DECISION = {"same": pb.SAME, "distinct": pb.DISTINCT}


def settle(entity_id: str, other_id: str, decision: str, actor: str, reason: str,
           max_surface_forms: int | None) -> Call[types.Entity]:
    if decision not in _DECISION:
        raise ValueError(f"decision must be 'same' or 'distinct', not {decision!r}")
    request = pb.SettlePossiblySameAsRequest(
        entity_id=entity_id, other_id=other_id, decision=_DECISION[decision], actor=actor,
        reason=reason, max_surface_forms=max_surface_forms)
    return Call("SettlePossiblySameAs", request, lambda r: types.entity(r.entity), admin=True)


_FORMAT = {None: pb.AUTHORITY_FORMAT_UNSPECIFIED, "jsonl": pb.AUTHORITY_FORMAT_JSONL,
           "csv": pb.AUTHORITY_FORMAT_CSV}


def import_requests(chunks: Iterable[bytes],
                    authority_format: str | None) -> Iterator[pb.ImportAuthorityRequest]:
    """An import's messages: the format first (None: the server guesses it), then the bytes.
    The format is checked here, before the stream starts."""
    if authority_format not in _FORMAT:
        raise ValueError(f"format must be 'jsonl', 'csv' or None, not {authority_format!r}")
    return _import_stream(chunks, _FORMAT[authority_format])


def _import_stream(chunks: Iterable[bytes], value: int) -> Iterator[pb.ImportAuthorityRequest]:
    yield pb.ImportAuthorityRequest(format=value)
    for chunk in chunks:
        yield pb.ImportAuthorityRequest(data=chunk)
