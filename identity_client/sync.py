"""The blocking client: one channel, safe to share between threads."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Self

import grpc
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_client import _protocol as protocol
from identity_client import types
from identity_client._protocol import Call, RetryPolicy
from identity_client.errors import IdentityError


class IdentityClient:
    """A client of IdentityService. Every call has a deadline; an outage (UNAVAILABLE,
    DEADLINE_EXCEEDED, a server stopping, a busy server's `retry-after-ms`) is retried with
    backoff and jitter until the policy's budget is spent. Retrying is safe: ResolveBatch with a
    context is idempotent on the server, and so are the curation calls on what they already did.

    `token` is presented on every call (a server with roles needs one); `admin_token`, when
    given, on the admin calls instead. `root_certificates` (PEM) or `credentials` talk TLS.
    """

    def __init__(self, target: str, *, policy: RetryPolicy | None = None,
                 token: str | None = None, admin_token: str | None = None,
                 root_certificates: bytes | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if root_certificates is not None and credentials is None:
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        self.target = target
        self._token = token
        self._admin_token = admin_token
        self._sleep = sleep
        self._retrier = protocol.Retrier(policy or RetryPolicy(), target, credentials is not None)
        self._channel = (
            grpc.secure_channel(target, credentials, options=protocol.CHANNEL_OPTIONS)
            if credentials is not None
            else grpc.insecure_channel(target, options=protocol.CHANNEL_OPTIONS))
        # The generated stub is untyped; replies are typed by the Call that reads them.
        self._stub: Any = pb_grpc.IdentityServiceStub(self._channel)

    @property
    def policy(self) -> RetryPolicy:
        return self._retrier.policy

    @property
    def retries(self) -> int:
        """Attempts retried so far."""
        return self._retrier.retries

    def close(self) -> None:
        self._channel.close()

    def abort(self) -> None:
        """Cancel the calls in flight and fail every later one (a job being interrupted), so no
        call goes on retrying a slow or absent server until its budget runs out."""
        self._retrier.aborted.set()
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, call: Call[protocol.T]) -> protocol.T:
        metadata = protocol.metadata(self._token, self._admin_token, call.admin, call.context_id)
        method = getattr(self._stub, call.method)
        tries = protocol.Attempts(self._retrier, call.method)
        while True:
            tries.begin()
            try:
                reply = method(call.request, timeout=self._retrier.policy.deadline_seconds,
                               metadata=metadata)
            except grpc.RpcError as e:
                self._sleep(tries.pause_after(e, f"count={call.count}"))
                continue
            tries.answered(call.count)
            return call.read(reply)

    # -- resolving -----------------------------------------------------------------------------

    def resolve(self, mention: str, entity_type: str, *, context_id: str = "",
                lookup_only: bool = False) -> types.Resolution:
        """Which entity `mention` (of `entity_type`) is about; with `context_id` (the paper),
        the evidence is recorded; `lookup_only` writes nothing."""
        return self._unary(protocol.resolve(mention, entity_type, context_id, lookup_only))

    def resolve_batch(self, context_id: str, mentions: Sequence[tuple[str, str]], *,
                      lookup_only: bool = False) -> types.BatchOutcome:
        """One paper's (text, type) mentions, in order; refused items come back as
        ItemFailure. More mentions than the server takes at once go in parts of its size, in
        order: they resolve as the whole would, but no longer commit together."""
        try:
            return self._unary(protocol.resolve_batch(context_id, mentions, lookup_only))
        except IdentityError as e:
            if (limit := protocol.too_large(e, len(mentions))) is None:
                raise
        self._retrier.warn_parts_once(limit)
        return protocol.joined([
            (start, self.resolve_batch(context_id, mentions[start:start + limit],
                                       lookup_only=lookup_only))
            for start in range(0, len(mentions), limit)])

    # -- reading -------------------------------------------------------------------------------

    def get_entity(self, entity_id: str, *, max_surface_forms: int | None = None,
                   surface_forms_offset: int = 0) -> types.Entity:
        """The entity (a merged id's own record, `redirect_to` naming where it went)."""
        return self._unary(protocol.get_entity(entity_id, max_surface_forms,
                                               surface_forms_offset))

    def list_entities_page(self, *, status: types.Status | None = None, entity_type: str = "",
                           page_size: int = protocol.PAGE_SIZE, page_token: str = "",
                           max_surface_forms: int | None = None) -> types.EntityPage:
        return self._unary(protocol.list_entities(status, entity_type, page_size, page_token,
                                                  max_surface_forms))

    def list_entities(self, *, status: types.Status | None = None, entity_type: str = "",
                      max_surface_forms: int | None = 0) -> Iterator[types.Entity]:
        """Every entity (canonical and provisional unless `status` says), page by page."""
        token = ""
        while True:
            page = self.list_entities_page(status=status, entity_type=entity_type,
                                           page_token=token, max_surface_forms=max_surface_forms)
            yield from page.entities
            if not (token := page.next_page_token):
                return

    def list_possibly_same_as(self, entity_id: str = "", *, limit: int = 0) -> list[types.Link]:
        """The open possibly_same_as links (of `entity_id`, or all), oldest first; at most
        `limit` (0: all)."""
        links: list[types.Link] = []
        token = ""
        while True:
            want = min(protocol.PAGE_SIZE, limit - len(links)) if limit else protocol.PAGE_SIZE
            page, token = self._unary(protocol.list_links(entity_id, want, token))
            links += page
            if not token or (limit and len(links) >= limit):
                return links

    def list_changes(self, after_sequence: int = 0, *, limit: int = 0,
                     follow: bool = False) -> Iterator[types.ChangeEvent]:
        """The changes after `after_sequence`, in order (the first `limit`, 0: all). Without
        `follow` the stream has a deadline and ends with the backlog; with it, it goes on until
        the iterator is closed. Resumes where it broke off."""
        feed = protocol.ChangesFeed(self._retrier, self._token, after_sequence, limit, follow)
        while (request := feed.next_request()) is not None:
            stream = self._stub.ListChanges(request, timeout=feed.timeout, metadata=feed.metadata)
            try:
                for reply in stream:
                    yield feed.read(reply)
                feed.ended()
                return
            except grpc.RpcError as e:
                self._sleep(feed.pause_after(e))
            finally:
                stream.cancel()  # a caller that stops reading ends the stream

    # -- curating (admin) ----------------------------------------------------------------------

    def add_alias(self, entity_id: str, alias: str, *,
                  max_surface_forms: int | None = None) -> types.Entity:
        return self._unary(protocol.add_alias(entity_id, alias, max_surface_forms))

    def promote(self, entity_id: str, *, max_surface_forms: int | None = None) -> types.Entity:
        return self._unary(protocol.promote(entity_id, max_surface_forms))

    def merge(self, source_id: str, target_id: str, *,
              max_surface_forms: int | None = None) -> types.Entity:
        """Merges `source_id` into `target_id`; the merged entity."""
        return self._unary(protocol.merge(source_id, target_id, max_surface_forms))

    def settle(self, entity_id: str, other_id: str, decision: str, *, actor: str,
               reason: str = "", max_surface_forms: int | None = None) -> types.Entity:
        """A curator's decision on a possibly_same_as link: 'same' or 'distinct'."""
        return self._unary(protocol.settle(entity_id, other_id, decision, actor, reason,
                                           max_surface_forms))

    def import_authority(self, chunks: Iterable[bytes], *, authority_format: str | None = None,
                         timeout: float = 3600.0) -> types.ImportReport:
        """Streams an authority file's bytes (chunks may split lines). Not retried: the chunks
        can be read once; importing a file again is harmless."""
        self._retrier.check_open("ImportAuthority")
        try:
            reply = self._stub.ImportAuthority(
                protocol.import_requests(chunks, authority_format), timeout=timeout,
                metadata=protocol.metadata(self._token, self._admin_token, True))
        except grpc.RpcError as e:
            raise IdentityError("ImportAuthority", protocol.code_of(e).name,
                                protocol.details_of(e)) from e
        return types.import_report(reply)
