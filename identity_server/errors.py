"""The domain's exceptions; the servicer maps each to one gRPC status code.

    IdentityError
     +-- InvalidArgument       bad mention, type, id, file record, limit exceeded
     +-- EntityNotFound        unknown id
     +-- FailedPrecondition    merge/settle that the lifecycle forbids
     +-- Unauthenticated       admin call without the admin token
     +-- StoreUnavailable      the database could not be reached or kept timing out

    StartupError               the server could not start (never raised by a call)
"""

from __future__ import annotations


class IdentityError(Exception):
    """Base of every error the identity server raises on purpose."""


class InvalidArgument(IdentityError):
    """The request is malformed: say what and where."""


class EntityNotFound(IdentityError):
    """No entity has this id."""


class FailedPrecondition(IdentityError):
    """The request is well formed but the entities' state forbids it."""


class Unauthenticated(IdentityError):
    """An admin call without a valid admin token."""


class StoreUnavailable(IdentityError):
    """The identity store failed; the call may be retried."""


class StartupError(Exception):
    """The server could not start (TLS files, the listening address): says which and why."""
