"""The domain's exceptions; the servicer maps each to one gRPC status code.

    IdentityError
     +-- InvalidArgument       bad mention, type, id, file record, limit exceeded
     |    +-- BatchTooLarge    a ResolveBatch over the server's limit (which the client is told)
     +-- EntityNotFound        unknown id
     +-- FailedPrecondition    merge/settle that the lifecycle forbids
     +-- Unauthenticated       no token, or one the server does not know
     +-- PermissionDenied      a known token whose role may not make the call
     +-- StoreUnavailable      the database could not be reached or kept timing out
     +-- Overloaded            too much writing work waiting: refused early, retry later

    StartupError               the server could not start (never raised by a call)
"""

from __future__ import annotations


class IdentityError(Exception):
    """Base of every error the identity server raises on purpose."""


class InvalidArgument(IdentityError):
    """The request is malformed: say what and where."""


class BatchTooLarge(InvalidArgument):
    """A ResolveBatch with more mentions than the server takes. `limit` goes back to the client
    as trailing metadata, so it can send the mentions in parts instead of losing them."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"batch has {size} mentions; the limit is {limit}")
        self.limit = limit


class EntityNotFound(IdentityError):
    """No entity has this id."""


class FailedPrecondition(IdentityError):
    """The request is well formed but the entities' state forbids it."""


class Unauthenticated(IdentityError):
    """A call that needs a token came without one, or with one the server does not know."""


class PermissionDenied(IdentityError):
    """A known token whose role may not make this call."""


class StoreUnavailable(IdentityError):
    """The identity store failed; the call may be retried."""


class Overloaded(IdentityError):
    """Writes refused before any work because too many mentions already wait to be written;
    `retry_after_ms` goes back to the client as trailing metadata."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class StartupError(Exception):
    """The server could not start (TLS files, the listening address): says which and why."""
