"""The asyncio client: the blocking client's calls, awaited, on one `grpc.aio` channel.

What a call sends, how its reply reads and when it is retried are decided in `_protocol`, as
for the blocking client; only the waiting differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, Self

import grpc
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_client import _protocol as protocol
from identity_client import types
from identity_client._protocol import Call, RetryPolicy
from identity_client.errors import IdentityError


class AsyncIdentityClient:
    """IdentityClient for asyncio: the same calls, arguments, results and retries. Create it
    inside the event loop that uses it; `async with` closes it."""

    def __init__(self, target: str, *, policy: RetryPolicy | None = None,
                 token: str | None = None, admin_token: str | None = None,
                 root_certificates: bytes | None = None,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        if root_certificates is not None and credentials is None:
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        self.target = target
        self._token = token
        self._admin_token = admin_token
        self._retrier = protocol.Retrier(policy or RetryPolicy(), target, credentials is not None)
        self._channel = (
            grpc.aio.secure_channel(target, credentials, options=protocol.CHANNEL_OPTIONS)
            if credentials is not None
            else grpc.aio.insecure_channel(target, options=protocol.CHANNEL_OPTIONS))
        self._stub: Any = pb_grpc.IdentityServiceStub(self._channel)

    @property
    def policy(self) -> RetryPolicy:
        return self._retrier.policy

    @property
    def retries(self) -> int:
        return self._retrier.retries

    async def close(self) -> None:
        await self._channel.close()

    async def abort(self) -> None:
        """Cancel the calls in flight and fail every later one."""
        self._retrier.aborted.set()
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, call: Call[protocol.T]) -> protocol.T:
        metadata = protocol.metadata(self._token, self._admin_token, call.admin, call.context_id)
        method = getattr(self._stub, call.method)
        tries = protocol.Attempts(self._retrier, call.method)
        while True:
            tries.begin()
            try:
                reply = await method(call.request, timeout=self._retrier.policy.deadline_seconds,
                                     metadata=metadata)
            except grpc.RpcError as e:
                await asyncio.sleep(tries.pause_after(e, f"count={call.count}"))
                continue
            tries.answered(call.count)
            return call.read(reply)

    async def resolve(self, mention: str, entity_type: str, *, context_id: str = "",
                      lookup_only: bool = False) -> types.Resolution:
        return await self._unary(protocol.resolve(mention, entity_type, context_id, lookup_only))

    async def resolve_batch(self, context_id: str, mentions: Sequence[tuple[str, str]], *,
                            lookup_only: bool = False) -> types.BatchOutcome:
        """As IdentityClient.resolve_batch: parts of the server's size, in order, if need be."""
        try:
            return await self._unary(protocol.resolve_batch(context_id, mentions, lookup_only))
        except IdentityError as e:
            if (limit := protocol.too_large(e, len(mentions))) is None:
                raise
        self._retrier.warn_parts_once(limit)
        parts = []
        for start in range(0, len(mentions), limit):  # in order: a part sees the ones before
            parts.append((start, await self.resolve_batch(
                context_id, mentions[start:start + limit], lookup_only=lookup_only)))
        return protocol.joined(parts)

    async def get_entity(self, entity_id: str, *, max_surface_forms: int | None = None,
                         surface_forms_offset: int = 0) -> types.Entity:
        return await self._unary(protocol.get_entity(entity_id, max_surface_forms,
                                                     surface_forms_offset))

    async def list_entities_page(
            self, *, status: types.Status | None = None, entity_type: str = "",
            page_size: int = protocol.PAGE_SIZE, page_token: str = "",
            max_surface_forms: int | None = None) -> types.EntityPage:
        return await self._unary(protocol.list_entities(status, entity_type, page_size,
                                                        page_token, max_surface_forms))

    async def list_entities(self, *, status: types.Status | None = None, entity_type: str = "",
                            max_surface_forms: int | None = 0) -> AsyncIterator[types.Entity]:
        token = ""
        while True:
            page = await self.list_entities_page(status=status, entity_type=entity_type,
                                                 page_token=token,
                                                 max_surface_forms=max_surface_forms)
            for found in page.entities:
                yield found
            if not (token := page.next_page_token):
                return

    async def list_possibly_same_as(self, entity_id: str = "", *,
                                    limit: int = 0) -> list[types.Link]:
        links: list[types.Link] = []
        token = ""
        while True:
            want = min(protocol.PAGE_SIZE, limit - len(links)) if limit else protocol.PAGE_SIZE
            page, token = await self._unary(protocol.list_links(entity_id, want, token))
            links += page
            if not token or (limit and len(links) >= limit):
                return links

    async def list_changes(self, after_sequence: int = 0, *, limit: int = 0,
                           follow: bool = False) -> AsyncIterator[types.ChangeEvent]:
        """As IdentityClient.list_changes."""
        feed = protocol.ChangesFeed(self._retrier, self._token, after_sequence, limit, follow)
        while (request := feed.next_request()) is not None:
            stream = self._stub.ListChanges(request, timeout=feed.timeout, metadata=feed.metadata)
            try:
                async for reply in stream:
                    yield feed.read(reply)
                feed.ended()
                return
            except grpc.RpcError as e:
                await asyncio.sleep(feed.pause_after(e))
            finally:
                stream.cancel()  # a caller that stops reading ends the stream

    async def add_alias(self, entity_id: str, alias: str, *,
                        max_surface_forms: int | None = None) -> types.Entity:
        return await self._unary(protocol.add_alias(entity_id, alias, max_surface_forms))

    async def promote(self, entity_id: str, *,
                      max_surface_forms: int | None = None) -> types.Entity:
        return await self._unary(protocol.promote(entity_id, max_surface_forms))

    async def merge(self, source_id: str, target_id: str, *,
                    max_surface_forms: int | None = None) -> types.Entity:
        return await self._unary(protocol.merge(source_id, target_id, max_surface_forms))

    async def settle(self, entity_id: str, other_id: str, decision: str, *, actor: str,
                     reason: str = "", max_surface_forms: int | None = None) -> types.Entity:
        return await self._unary(protocol.settle(entity_id, other_id, decision, actor, reason,
                                                 max_surface_forms))

    async def import_authority(self, chunks: Iterable[bytes], *,
                               authority_format: str | None = None,
                               timeout: float = 3600.0) -> types.ImportReport:
        self._retrier.check_open("ImportAuthority")
        try:
            reply = await self._stub.ImportAuthority(
                protocol.import_requests(chunks, authority_format), timeout=timeout,
                metadata=protocol.metadata(self._token, self._admin_token, True))
        except grpc.RpcError as e:
            raise IdentityError("ImportAuthority", protocol.code_of(e).name,
                                protocol.details_of(e)) from e
        return types.import_report(reply)
