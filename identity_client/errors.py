"""The client's errors: a call that failed for good, named by its method and gRPC status."""

from __future__ import annotations


class IdentityError(Exception):
    """A call to the identity server failed for good (`code`: the gRPC status code's name).
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
