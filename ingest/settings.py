"""The ingest service's settings: one frozen object, read once at the entry point.

Every field can be set by an environment variable ``INGEST_<FIELD>`` (e.g. ``INGEST_CONCURRENCY``)
or by the matching command-line flag, which wins.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from identity_server.command_line import grpc_target, header_safe_token, read_token_file
from ingest.models import Limits


class Settings(BaseSettings):
    """Configuration of one ingest job."""

    model_config = SettingsConfigDict(env_prefix="INGEST_", frozen=True, extra="forbid")

    db: Path | None = Field(default=None, description="The DuckDB graph file.")
    server: str | None = Field(
        default=None,
        description="host:port of the identity server; unset: start an embedded one.",
    )
    embedded_db_url: str = Field(
        default="sqlite:///identity.sqlite",
        description="Identity store of the embedded server (SQLite in the working directory).",
    )
    admin_token: str | None = Field(default=None, description="Bearer token for admin RPCs.")
    token: str | None = Field(
        default=None,
        description="Bearer token presented on every call to --server (a server with roles "
                    "needs a writer token); prefer INGEST_TOKEN_FILE.",
    )
    token_file: Path | None = Field(
        default=None, description="File holding the bearer token (its first line).",
    )
    tls_ca: Path | None = Field(
        default=None,
        description="PEM root certificates: talk TLS to --server (a server run with --tls-cert).",
    )
    concurrency: int | None = Field(
        default=None, ge=1, le=256,
        description="Papers in flight; unset: 8 with --server, 1 with the embedded server "
        "(which shares this process, so more threads only contend).",
    )
    deadline_seconds: float = Field(default=10.0, gt=0, allow_inf_nan=False,
                                    description="Deadline of each RPC.")
    retry_budget_seconds: float = Field(
        default=120.0, ge=0, allow_inf_nan=False,
        description="How long to retry UNAVAILABLE / DEADLINE_EXCEEDED."
    )
    max_line_bytes: int = Field(default=16 * 1024 * 1024, ge=1, description="Line cap.")
    max_mention_chars: int = Field(default=512, ge=1, description="Mention text cap.")
    max_quote_bytes: int = Field(default=64 * 1024, ge=0, description="Evidence quote cap.")
    max_mentions: int = Field(default=5000, ge=1, description="Mentions per paper.")
    max_relationships: int = Field(default=20000, ge=0, description="Relationships per paper.")
    vocabulary_file: Path | None = Field(
        default=None, description="TOML or JSON file extending the predicate vocabulary."
    )
    group_papers: int = Field(default=500, ge=1, description="Papers per write transaction.")
    progress: bool = Field(default=True, description="Show a progress bar on stderr.")

    @field_validator("admin_token", "token")
    @classmethod
    def _header_safe(cls, token: str | None) -> str | None:
        return header_safe_token(token)

    def bearer_token(self) -> str | None:
        """The token to present: INGEST_TOKEN, else the first line of the token file."""
        if self.token or self.token_file is None:
            return self.token
        return read_token_file(self.token_file)

    @field_validator("server")
    @classmethod
    def _a_grpc_target(cls, value: str | None) -> str | None:
        """host:port (or a gRPC target such as dns:///host:port or unix:/path), never a URL:
        gRPC would only fail on it after the whole retry budget."""
        return None if value is None else grpc_target(value)

    def effective_concurrency(self) -> int:
        if self.concurrency is not None:
            return self.concurrency
        return 8 if self.server else 1

    def limits(self) -> Limits:
        return Limits(
            max_line_bytes=self.max_line_bytes,
            max_mention_chars=self.max_mention_chars,
            max_quote_bytes=self.max_quote_bytes,
            max_mentions=self.max_mentions,
            max_relationships=self.max_relationships,
        )
