"""The server's settings: one frozen object, read once at the entry point.

Every field can be set by an environment variable `IDENTITY_<FIELD>` (e.g. `IDENTITY_DB_URL`)
or by the matching command-line flag, which wins.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from identity_server.command_line import header_safe_token

# The largest gRPC message the server and its command-line clients send or take: a full batch of
# 5,000 mentions of 512 code points fits, and so does an entity with many thousands of spellings.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

DEFAULT_TYPES: tuple[str, ...] = (
    "person",
    "organization",
    "place",
    "method",
    "dataset",
    "task",
    "metric",
    "material",
    "tool",
    "concept",
    "other",
)


class Settings(BaseSettings):
    """Configuration of one identity server process."""

    model_config = SettingsConfigDict(env_prefix="IDENTITY_", frozen=True, extra="forbid")

    db_url: str = Field(
        default="sqlite:///identity.sqlite",
        description="SQLAlchemy URL of the identity store (SQLite file or PostgreSQL).",
    )
    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=50051, ge=0, le=65535, description="Port; 0 picks a free one.")
    types: tuple[str, ...] = Field(default=DEFAULT_TYPES, description="The closed type vocabulary.")
    strict_types: bool = Field(
        default=False, description="Refuse unknown mention types instead of reading them as other."
    )
    max_mention_length: int = Field(default=512, ge=1, description="Display-form code points.")
    max_batch_size: int = Field(default=5000, ge=1, description="Mentions per ResolveBatch.")
    promote_after_papers: int = Field(
        default=0,
        ge=0,
        description="Promote a provisional entity seen in this many distinct papers (0: never).",
    )
    batch_reply_ttl_seconds: int = Field(
        default=7 * 24 * 3600, ge=0, description="How long ResolveBatch replies are kept."
    )
    admin_token: str | None = Field(
        default=None, description="Bearer token for admin RPCs; unset: admin RPCs are refused.",
    )
    tokens_file: str | None = Field(
        default=None,
        description="File of bearer tokens, one `role token` a line (roles: reader, writer, "
                    "admin); re-read on SIGHUP. With reader or writer tokens, every call needs "
                    "a token.",
    )
    tokens: str | None = Field(
        default=None, description="Bearer tokens as `role:token` entries separated by commas.",
    )
    token: str | None = Field(
        default=None,
        description="Client commands (resolve, entity, links, ...): the bearer token they "
                    "present to --server.",
    )
    tls_cert: str | None = Field(default=None, description="PEM certificate file: enables TLS.")
    tls_key: str | None = Field(default=None, description="PEM private key file for TLS.")
    tls_client_ca: str | None = Field(
        default=None,
        description="PEM root certificates of client certificates: with TLS on, every client "
                    "must present a certificate they signed (mutual TLS).",
    )
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535,
        description="Serve Prometheus metrics over HTTP on this port (on --host); unset: off.",
    )
    sqlite_synchronous: Literal["normal", "full"] = Field(
        default="normal",
        description="SQLite stores: `normal` (an acknowledged write survives the server's crash, "
                    "not a power loss) or `full` (it survives both: an fsync a commit).",
    )
    max_queued_mentions: int = Field(
        default=20_000, ge=1,
        description="Mentions of writing calls that may wait unanswered; a writing call beyond "
                    "them is refused at once (RESOURCE_EXHAUSTED, with retry-after-ms).",
    )
    reconcile_port: int | None = Field(
        default=None, ge=0, le=65535,
        description="Serve the W3C Reconciliation API (OpenRefine) over HTTP on this port, at "
                    "/reconcile (on --host); unset: off.",
    )
    drain_seconds: float = Field(
        default=5.0, ge=0, allow_inf_nan=False,
        description="After SIGTERM: seconds of NOT_SERVING health while calls are still taken, "
                    "so load balancers stop sending new ones, before the graceful stop.",
    )
    max_workers: int = Field(default=16, ge=1, description="Threads for calls that may wait on the store.")
    workers: int = Field(
        default=1, ge=1,
        description="Server processes on one port (SO_REUSEPORT) under one supervisor; more "
                    "than 1 needs a store they share (a SQLite file or PostgreSQL).",
    )
    grace_seconds: float = Field(default=5.0, ge=0, allow_inf_nan=False,
                                 description="Shutdown grace period.")
    core: Literal["auto", "reference", "compiled"] = Field(
        default="auto",
        description="The resolve core: compiled (Cython), reference (pure Python), or auto "
                    "(compiled where the install built it).",
    )

    @field_validator("types")
    @classmethod
    def _named(cls, types: tuple[str, ...]) -> tuple[str, ...]:
        """A blank type name would make an empty mention type a type of its own, and let an
        authority record without a type through (SPEC: both read or refuse as empty)."""
        if any(not t.strip() for t in types):
            raise ValueError("a type name is empty")
        return types

    @field_validator("admin_token", "token")
    @classmethod
    def _header_safe(cls, token: str | None) -> str | None:
        return header_safe_token(token)

    @field_validator("tokens")
    @classmethod
    def _tokens_readable(cls, tokens: str | None) -> str | None:
        if tokens:
            from identity_server.access import TokensError, parse_tokens_variable
            try:
                parse_tokens_variable(tokens)
            except TokensError as e:
                raise ValueError(str(e)) from None
        return tokens


_SECRET = re.compile("token|password|secret")


def describe_settings_error(error: ValueError, env_prefix: str = "IDENTITY_") -> str:
    """What was wrong with the settings, one clause per bad field, naming its environment
    variable (a flag of the same name sets it too): pydantic's own text, without its links."""
    if isinstance(error, ValidationError):
        clauses = []
        for e in error.errors(include_url=False):
            field = ".".join(str(part) for part in e["loc"]) or "settings"
            given = "***" if _SECRET.search(field) else repr(e.get("input"))  # not in a log
            clauses.append(f"{field} ({env_prefix}{field.upper()}): {e['msg']} (got {given})")
        return "; ".join(clauses)
    cause = error.__cause__
    return f"{error}: {cause}" if cause else str(error)


def unknown_environment(settings: type[BaseSettings] = Settings) -> list[str]:
    """A warning for each variable of the environment with the settings' prefix that names
    none of them (pydantic ignores those: a misspelt one would silently leave its default in
    force), with the nearest setting's variable when one is close. Ingest's CLI checks its own
    `INGEST_` settings with it too."""
    prefix = str(settings.model_config.get("env_prefix", "")).upper()
    known = [field.upper() for field in settings.model_fields]
    found = []
    for name in sorted(os.environ):
        suffix = name.upper()[len(prefix):]  # names are read case-insensitively
        if prefix and name.upper().startswith(prefix) and suffix not in known:
            near = difflib.get_close_matches(suffix, known, n=1, cutoff=0.5)
            hint = f" (did you mean {prefix}{near[0]}?)" if near else ""
            found.append(f"{name} is not a setting and is ignored{hint}")
    return found
