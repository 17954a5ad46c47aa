"""The only ingest module that speaks gRPC: deadlines, retries, protobuf -> plain dataclasses.

Every call has a deadline. UNAVAILABLE and DEADLINE_EXCEEDED are retried with exponential backoff
and full jitter until a retry budget (seconds) is spent, so a server restart in the middle of a job
costs time, not data; so is CANCELLED, unless this client cancelled the call itself (the job is
interrupted): a server that stops cancels the calls still running when its grace period ends.
Retrying is safe: ResolveBatch with a context is idempotent on the server, Merge of an already
merged pair is a no-op, and the change feed is resumed from the last sequence seen. Nothing
protobuf leaves this module.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Self, TypeVar
from urllib.parse import quote

import grpc
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

_STATUS = {
    pb.CANONICAL: "canonical",
    pb.PROVISIONAL: "provisional",
    pb.MERGED: "merged",
}
_KIND = {
    pb.EXACT: "exact",
    pb.CASE: "case",
    pb.PUNCTUATION: "punctuation",
    pb.ALIAS: "alias",
    pb.TYPO: "typo",
    pb.AMBIGUOUS: "ambiguous",
    pb.NEW: "new",
}
_CHANGE = {value: pb.ChangeKind.Name(value).removeprefix("CHANGE_KIND_").lower()
           for value in pb.ChangeKind.values()}


RETRY_WARNING_EVERY_S = 10.0  # at most one retry warning per client in this long
# Trailing metadata of a ResolveBatch the server refused for its size: the server's limit (see
# the proto's comments).
MAX_BATCH_SIZE_KEY = "identity-max-batch-size"
# Trailing metadata of a write a busy server refused: when to call again, in ms.
RETRY_AFTER_KEY = "retry-after-ms"


class IdentityError(Exception):
    """A call to the identity server failed for good (with its gRPC status code name).
    `batch_limit`: the server's ResolveBatch limit, when it refused a batch for its size."""

    def __init__(self, method: str, code: str, message: str, *,
                 batch_limit: int | None = None) -> None:
        super().__init__(f"{method} failed: {code}: {message}")
        self.method = method
        self.code = code
        self.message = message
        self.batch_limit = batch_limit


class ServerUnavailable(IdentityError):
    """The server stayed unreachable (or too slow) for the whole retry budget."""


class Resolution(NamedTuple):
    """What the server decided for one mention (a named tuple: one is built per mention)."""

    entity_id: str
    status: str
    match_kind: str
    created: bool
    entity_type: str
    name: str
    matched_name: str
    display_form: str
    candidates: tuple[str, ...]
    possibly_same_as: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ItemFailure:
    """The server refused one mention of a batch."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """A ResolveBatch's outcomes in request order; `replayed`: the server answered with the
    stored reply of an identical earlier request (ids and kinds as they were then)."""

    outcomes: list[Resolution | ItemFailure]
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class EntityInfo:
    entity_id: str
    name: str
    entity_type: str
    status: str
    aliases: tuple[str, ...]
    surface_forms: tuple[str, ...]
    redirect_to: str
    placeholder: bool
    evidence_count: int
    paper_count: int


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    sequence: int
    kind: str
    entity_id: str
    other_id: str
    detail: str
    recorded_at: str


@dataclass(frozen=True, slots=True)
class Link:
    entity_id: str
    other_id: str
    sequence: int


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Deadline per attempt and how long to keep retrying retryable failures."""

    deadline_seconds: float = 10.0
    budget_seconds: float = 120.0
    initial_backoff: float = 0.05
    max_backoff: float = 3.0


def _resolution(r: pb.ResolveResponse) -> Resolution:
    return Resolution(r.entity_id, _STATUS.get(r.status, ""), _KIND.get(r.match_kind, ""),
                      r.created, r.entity_type, r.name, r.matched_name, r.display_form,
                      tuple(r.candidates), tuple(r.possibly_same_as))


def _entity(e: pb.Entity) -> EntityInfo:
    return EntityInfo(
        entity_id=e.entity_id,
        name=e.name,
        entity_type=e.entity_type,
        status=_STATUS.get(e.status, ""),
        aliases=tuple(e.aliases),
        surface_forms=tuple(e.surface_forms),
        redirect_to=e.redirect_to,
        placeholder=e.placeholder,
        evidence_count=e.evidence_count,
        paper_count=e.paper_count,
    )


def _batch_limit(error: grpc.RpcError) -> int | None:
    """The limit a server names in the trailing metadata of a batch it refused for its size."""
    if not isinstance(error, grpc.Call):
        return None
    for key, value in error.trailing_metadata() or ():
        if key == MAX_BATCH_SIZE_KEY:
            try:
                limit = int(value)
            except (TypeError, ValueError):
                return None
            return limit if limit > 0 else None
    return None


def _retry_after_s(error: grpc.RpcError) -> float | None:
    """When a busy server asks to be called again (RESOURCE_EXHAUSTED with `retry-after-ms`):
    that many seconds; None for any other refusal."""
    if not isinstance(error, grpc.Call) or error.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for key, value in error.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                return max(0.0, int(value) / 1000)
            except (TypeError, ValueError):
                return None
    return None


def _renumbered(outcome: Resolution | ItemFailure, offset: int,
                index: int) -> Resolution | ItemFailure:
    """A part's refused item named by its place in the whole batch ("mention 2: ..." of a part
    starting at 10 is "mention 12: ...")."""
    if isinstance(outcome, Resolution) or not offset:
        return outcome
    prefix = f"mention {index}: "
    if not outcome.message.startswith(prefix):
        return outcome
    return ItemFailure(outcome.code,
                       f"mention {offset + index}: {outcome.message.removeprefix(prefix)}")


def _code_name(code: int) -> str:
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return str(status.name)
    return str(code)


def request_id_of(context_id: str) -> str:
    """The request id of a paper's calls: `paper:` and its id, percent-encoded (metadata values
    are ASCII) and capped."""
    return "paper:" + quote(context_id, safe="")[:200]


class IdentityClient:
    """A blocking client of IdentityService, safe to share between threads."""

    def __init__(
        self,
        target: str,
        *,
        policy: RetryPolicy | None = None,
        admin_token: str | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.target = target
        self.policy = policy or RetryPolicy()
        self._admin_token = admin_token
        self._token = token  # presented on every call (a server with roles needs one)
        self._tls = credentials is not None
        self._sleep = sleep
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024),
                   ("grpc.max_send_message_length", 64 * 1024 * 1024)]
        self._channel = (
            grpc.secure_channel(target, credentials, options=options)
            if credentials is not None
            else grpc.insecure_channel(target, options=options)
        )
        # The generated stub is untyped; replies are typed through the pb2 stubs below.
        self._stub: Any = pb_grpc.IdentityServiceStub(self._channel)
        self._retries = 0
        self._retries_lock = threading.Lock()
        self._retry_warned_at = -RETRY_WARNING_EVERY_S  # time.monotonic() of the last warning
        # time.monotonic() of the first failure since the last success, shared by every call:
        # the budget is the outage's, so the calls in flight give up together instead of each
        # starting its own budget when it first fails.
        self._outage_since: float | None = None
        self._aborted = threading.Event()
        self._parts_warned = False  # the job was told once that papers go in parts

    @property
    def retries(self) -> int:
        """Calls retried so far (for the job summary)."""
        return self._retries

    def close(self) -> None:
        self._channel.close()

    def abort(self) -> None:
        """The job is being interrupted: cancel the calls in flight and fail every later one, so
        that no call goes on retrying a slow or absent server until its budget runs out."""
        self._aborted.set()
        self._channel.close()

    def _check_not_aborted(self, method: str) -> None:
        if self._aborted.is_set():
            raise IdentityError(method, "CANCELLED", "the job was interrupted")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _metadata(self, admin: bool, context_id: str = "") -> tuple[tuple[str, str], ...] | None:
        """The token (the admin token for admin calls, when given), and for a paper's calls a
        request id naming the paper, so that its calls can be found in the server's log."""
        token = self._admin_token if admin and self._admin_token else self._token
        metadata = [("authorization", f"Bearer {token}")] if token else []
        if context_id:
            metadata.append(("x-request-id", request_id_of(context_id)))
        return tuple(metadata) or None

    def _retryable(self, code: grpc.StatusCode) -> bool:
        """Whether a call that failed with `code` is worth trying again (see the module doc)."""
        return code in RETRYABLE or (code is grpc.StatusCode.CANCELLED
                                     and not self._aborted.is_set())

    def _call(self, method: str, fn: Callable[[float], T], count: int = 1) -> T:
        """Runs ``fn(timeout)`` with retries on UNAVAILABLE, DEADLINE_EXCEEDED and a CANCELLED
        this client did not cause."""
        policy = self.policy
        backoff = policy.initial_backoff
        attempt = 0
        while True:
            attempt += 1
            self._check_not_aborted(method)
            started = time.monotonic()
            try:
                result = fn(policy.deadline_seconds)
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
                details = (e.details() if isinstance(e, grpc.Call) else str(e)) or ""
                busy_for = _retry_after_s(e)  # a busy server: come back later
                if not self._retryable(code) and busy_for is None:
                    logger.info("rpc=%s count=%d status=%s attempt=%d duration=%.4fs",
                                method, count, code.name, attempt, time.monotonic() - started)
                    raise IdentityError(method, code.name, details,
                                        batch_limit=_batch_limit(e)) from e
                self._sleep(max(busy_for or 0.0, self._pause_before_retry(
                    e, method, code.name, details, attempt, backoff, f"count={count}")))
                backoff = min(backoff * 2, policy.max_backoff)
                continue
            self._outage_since = None
            logger.debug("rpc=%s count=%d status=OK attempt=%d duration=%.4fs",
                         method, count, attempt, time.monotonic() - started)
            return result

    def _pause_before_retry(self, error: grpc.RpcError, method: str, code: str, details: str,
                            attempt: int, backoff: float, what: str) -> float:
        """How long to wait before retrying a failed call; raises ServerUnavailable once the
        outage (shared by every call of this client) has lasted the retry budget."""
        budget = self.policy.budget_seconds
        pause = random.uniform(0, backoff)
        with self._retries_lock:
            now = time.monotonic()
            if self._outage_since is None:
                self._outage_since = now
            if now + pause > self._outage_since + budget:
                # A plaintext call to a TLS server fails as one to no server does.
                tls = "" if self._tls else " and serving without TLS (else give --tls-ca)"
                raise ServerUnavailable(
                    method, code,
                    f"{details} (gave up after {attempt} attempts: the server has been "
                    f"unreachable for the retry budget of {budget:g} s; is the identity server "
                    f"at {self.target} running{tls}?)",
                ) from error
            self._retries += 1
            # One line per outage, not one per call and attempt: with many papers in flight a
            # restart would print hundreds; the rest go to debug.
            warn = now - self._retry_warned_at >= RETRY_WARNING_EVERY_S
            if warn:
                self._retry_warned_at = now
        logger.log(logging.WARNING if warn else logging.DEBUG,
                   "rpc=%s %s status=%s attempt=%d retry_in=%.3fs: %s (retrying for up to %g s; "
                   "further retries within %g s are logged at debug)",
                   method, what, code, attempt, pause, details[:200], budget,
                   RETRY_WARNING_EVERY_S)
        return pause

    def resolve(
        self, mention: str, entity_type: str, *, context_id: str = "", lookup_only: bool = False
    ) -> Resolution:
        request = pb.ResolveRequest(mention=mention, entity_type=entity_type,
                                    context_id=context_id, lookup_only=lookup_only)
        metadata = self._metadata(admin=False, context_id=context_id)
        reply = self._call("Resolve", lambda t: self._stub.Resolve(request, timeout=t,
                                                                   metadata=metadata))
        return _resolution(reply)

    def resolve_batch(
        self, context_id: str, mentions: Sequence[tuple[str, str]], *, lookup_only: bool = False
    ) -> BatchOutcome:
        """Resolves one paper's (text, type) mentions in order; refused items come back as
        failures. More mentions than the server takes in one ResolveBatch are sent in parts."""
        request = pb.ResolveBatchRequest(
            context_id=context_id,
            mentions=[pb.Mention(mention=text, entity_type=etype) for text, etype in mentions],
            lookup_only=lookup_only,
        )
        metadata = self._metadata(admin=False, context_id=context_id)
        try:
            reply = self._call("ResolveBatch",
                               lambda t: self._stub.ResolveBatch(request, timeout=t,
                                                                 metadata=metadata),
                               count=len(mentions))
        except IdentityError as e:
            if e.batch_limit is None or e.batch_limit >= len(mentions):
                raise
            return self._resolve_in_parts(context_id, mentions, e.batch_limit,
                                          lookup_only=lookup_only)
        if len(reply.results) != len(mentions):
            raise IdentityError("ResolveBatch", "INTERNAL",
                                f"{len(reply.results)} results for {len(mentions)} mentions")
        out: list[Resolution | ItemFailure] = []
        for result in reply.results:
            if result.WhichOneof("outcome") == "resolved":
                out.append(_resolution(result.resolved))
            else:
                out.append(ItemFailure(_code_name(result.error.code), result.error.message))
        return BatchOutcome(out, reply.replayed)

    def _resolve_in_parts(self, context_id: str, mentions: Sequence[tuple[str, str]],
                          limit: int, *, lookup_only: bool) -> BatchOutcome:
        """Mentions beyond the server's batch limit, sent in parts of that size, in order, under
        the same context. The parts in order resolve as the whole batch would (one mention at a
        time, in order) and each is idempotent as a whole batch is; only their writes no longer
        commit together, and a rerun of the job makes up for a part that never ran. `replayed`
        only when every part was."""
        if not self._parts_warned:  # once a job (two callers racing may both warn: harmless)
            self._parts_warned = True
            logger.warning("the identity server takes at most %d mentions in one ResolveBatch: "
                           "larger papers are resolved in parts of that size (raise its "
                           "IDENTITY_MAX_BATCH_SIZE to resolve each paper in one transaction)",
                           limit)
        outcomes: list[Resolution | ItemFailure] = []
        replayed = True
        for start in range(0, len(mentions), limit):
            part = self.resolve_batch(context_id, mentions[start:start + limit],
                                      lookup_only=lookup_only)
            outcomes += (_renumbered(o, start, i) for i, o in enumerate(part.outcomes))
            replayed = replayed and part.replayed
        return BatchOutcome(outcomes, replayed)

    def get_entity(self, entity_id: str) -> EntityInfo:
        request = pb.GetEntityRequest(entity_id=entity_id)
        reply = self._call("GetEntity", lambda t: self._stub.GetEntity(
            request, timeout=t, metadata=self._metadata(admin=False)))
        return _entity(reply.entity)

    def merge(self, source_id: str, target_id: str) -> EntityInfo:
        request = pb.MergeRequest(source_id=source_id, target_id=target_id)
        reply = self._call("Merge", lambda t: self._stub.Merge(
            request, timeout=t, metadata=self._metadata(admin=True)))
        return _entity(reply.entity)

    def list_changes(self, after_sequence: int = 0, limit: int = 0) -> Iterator[ChangeEvent]:
        """Every change after ``after_sequence`` (no follow), or the first ``limit`` of them;
        resumes where it broke off."""
        last = after_sequence
        backoff = self.policy.initial_backoff
        attempt = 0
        while True:
            attempt += 1
            self._check_not_aborted("ListChanges")
            left = limit - (last - after_sequence) if limit else 0
            if limit and left <= 0:
                return
            request = pb.ListChangesRequest(after_sequence=last, follow=False, limit=left)
            try:
                for reply in self._stub.ListChanges(request,
                                                    timeout=self.policy.deadline_seconds * 6,
                                                    metadata=self._metadata(admin=False)):
                    c = reply.change
                    last = c.sequence
                    self._outage_since = None
                    yield ChangeEvent(c.sequence, _CHANGE.get(c.kind, "unspecified"),
                                      c.entity_id, c.other_id, c.detail, c.recorded_at)
                self._outage_since = None
                return
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
                details = (e.details() if isinstance(e, grpc.Call) else str(e)) or ""
                busy_for = _retry_after_s(e)  # a busy server: come back later
                if not self._retryable(code) and busy_for is None:
                    raise IdentityError("ListChanges", code.name, details) from e
                self._sleep(self._pause_before_retry(
                    e, "ListChanges", code.name, details, attempt, backoff, f"after={last}"))
                backoff = min(backoff * 2, self.policy.max_backoff)

    def _list_links(self, request: pb.ListPossiblySameAsRequest) -> pb.ListPossiblySameAsResponse:
        reply: pb.ListPossiblySameAsResponse = self._call(
            "ListPossiblySameAs", lambda t: self._stub.ListPossiblySameAs(
                request, timeout=t, metadata=self._metadata(admin=False)))
        return reply

    def list_possibly_same_as(self, entity_id: str = "") -> list[Link]:
        """All open possibly_same_as links (every page)."""
        links: list[Link] = []
        token = ""
        while True:
            request = pb.ListPossiblySameAsRequest(entity_id=entity_id, page_size=1000,
                                                   page_token=token)
            reply = self._list_links(request)
            links.extend(Link(x.entity_id, x.other_id, x.sequence) for x in reply.links)
            token = reply.next_page_token
            if not token:
                return links
