"""A Python client of the identity server: `IdentityClient` (blocking, thread-safe) and
`AsyncIdentityClient` (asyncio), with the same calls, typed results, deadlines, retries with
backoff, bearer tokens and TLS.

    from identity_client import IdentityClient

    with IdentityClient("127.0.0.1:50051", token="...") as client:
        r = client.resolve("Ada Lovelace", "person", lookup_only=True)
        print(r.entity_id, r.match_kind, list(zip(r.candidates, r.scores)))

It depends only on grpcio and the generated code of `identity_api` (the proto); docs/client.md
describes every call.
"""

from identity_client._protocol import (
    MAX_BATCH_SIZE_KEY,
    RETRY_AFTER_KEY,
    RetryPolicy,
    request_id_of,
)
from identity_client.aio import AsyncIdentityClient
from identity_client.errors import IdentityError, ServerUnavailable
from identity_client.sync import IdentityClient
from identity_client.types import (
    BatchOutcome,
    ChangeEvent,
    ChangeKind,
    Entity,
    EntityPage,
    ImportFailure,
    ImportReport,
    ItemFailure,
    Link,
    MatchKind,
    Resolution,
    Status,
)

__all__ = [
    "MAX_BATCH_SIZE_KEY",
    "RETRY_AFTER_KEY",
    "AsyncIdentityClient",
    "BatchOutcome",
    "ChangeEvent",
    "ChangeKind",
    "Entity",
    "EntityPage",
    "IdentityClient",
    "IdentityError",
    "ImportFailure",
    "ImportReport",
    "ItemFailure",
    "Link",
    "MatchKind",
    "Resolution",
    "RetryPolicy",
    "ServerUnavailable",
    "Status",
    "request_id_of",
]
