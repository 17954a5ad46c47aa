"""Access by role: bearer tokens mapped to roles, and which role each call needs.

Roles are ordered: a `writer` may do what a `reader` may, an `admin` what a `writer` may.

    reader   lookup-only resolves, GetEntity, ListPossiblySameAs, ListChanges
    writer   resolves that may write (Resolve, ResolveBatch)
    admin    AddAlias, Promote, Merge, SettlePossiblySameAs, ImportAuthority

Tokens come from a file (`--tokens-file`, one `role token` a line, re-read on SIGHUP), from
IDENTITY_TOKENS (`role:token` entries separated by commas), and from the admin token of old
(`--admin-token`, IDENTITY_ADMIN_TOKEN), which is an admin token. Without reader or writer
tokens, access is as it was before roles: resolves and reads are open to anyone who can reach
the port, admin calls need the admin token. Tokens are compared in constant time and never
logged or put in an error message.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from identity_server.command_line import header_safe_token
from identity_server.errors import PermissionDenied, StartupError, Unauthenticated


class Role(enum.IntEnum):
    READER = 1
    WRITER = 2
    ADMIN = 3


ROLE_NAMES = {r.name.lower(): r for r in Role}


class TokensError(StartupError):
    """A tokens file or IDENTITY_TOKENS that cannot be read: says where, never the token."""


@dataclass(frozen=True)
class AccessPolicy:
    """The tokens a server knows, each with its role. `enforcing`: reader or writer tokens are
    configured, so every IdentityService call needs a token; else only admin calls do."""

    tokens: tuple[tuple[bytes, Role], ...] = ()
    enforcing: bool = False

    @classmethod
    def of(cls, entries: Iterable[tuple[Role, str]], *, admin_token: str | None = None
           ) -> AccessPolicy:
        pairs = [(token.encode("ascii"), role) for role, token in entries]
        enforcing = bool(pairs)
        if admin_token:
            pairs.append((admin_token.encode("ascii"), Role.ADMIN))
        return cls(tuple(pairs), enforcing)

    @classmethod
    def load(cls, *, tokens_file: str | None, tokens: str | None,
             admin_token: str | None) -> AccessPolicy:
        """The policy the settings describe; TokensError names the line or entry at fault."""
        entries: list[tuple[Role, str]] = []
        if tokens_file:
            entries += read_tokens_file(Path(tokens_file))
        if tokens:
            entries += parse_tokens_variable(tokens)
        return cls.of(entries, admin_token=admin_token)

    @property
    def admin_enabled(self) -> bool:
        return any(role is Role.ADMIN for _, role in self.tokens)

    def role_of(self, token: bytes) -> Role | None:
        """The role of a presented token; every known token is compared, in constant time, so
        the time taken does not tell which (or how much of one) matched."""
        found: Role | None = None
        for known, role in self.tokens:
            if hmac.compare_digest(token, known) and (found is None or role > found):
                found = role
        return found

    def check(self, metadata: Iterable[tuple[str, str | bytes]] | None, needed: Role,
              call: str) -> None:
        """Raise Unauthenticated or PermissionDenied unless the call's `authorization`
        metadata presents a token whose role is at least `needed`."""
        if needed is not Role.ADMIN and not self.enforcing:
            return
        if needed is Role.ADMIN and not self.admin_enabled:
            raise Unauthenticated(
                "admin RPCs are disabled: start the server with --admin-token "
                "(or IDENTITY_ADMIN_TOKEN, or an `admin TOKEN` line in --tokens-file)")
        presented = _bearer(metadata)
        if presented is None:
            raise Unauthenticated(f"{call} needs metadata 'authorization: Bearer <token>' "
                                  f"with a token of role {needed.name.lower()} or above")
        if not presented:
            raise Unauthenticated(f"{call}: the 'authorization' metadata is not 'Bearer ' "
                                  "followed by a token")
        role = self.role_of(presented)
        if role is None:
            raise Unauthenticated(f"{call}: the bearer token is not one this server knows")
        if role < needed:
            raise PermissionDenied(f"{call} needs role {needed.name.lower()} or above; the "
                                   f"token presented has role {role.name.lower()}")


def _bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> bytes | None:
    """The token of the first `authorization` entry when it is `Bearer <token>` (the scheme is
    case-insensitive, RFC 9110 11.1); empty when the entry is something else; None without
    one."""
    for key, value in metadata or ():
        if key == "authorization":
            raw = value.encode("latin-1") if isinstance(value, str) else value
            scheme, _, token = raw.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return None


def _entry(role_name: str, token: str, where: str) -> tuple[Role, str]:
    role = ROLE_NAMES.get(role_name.lower())
    if role is None:
        raise TokensError(f"{where}: unknown role {role_name!r}; expected one of "
                          f"{', '.join(ROLE_NAMES)}")
    try:
        header_safe_token(token)
    except ValueError as e:
        raise TokensError(f"{where}: a token {e}") from None
    return role, token


def read_tokens_file(path: Path) -> list[tuple[Role, str]]:
    """`role token` a line; blank lines and lines starting with # are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TokensError(f"cannot read the tokens file {path}: {e}") from e
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokensError(f"{path}, line {number}: expected `role token` (two words)")
        entries.append(_entry(parts[0], parts[1], f"{path}, line {number}"))
    return entries


def parse_tokens_variable(text: str) -> list[tuple[Role, str]]:
    """IDENTITY_TOKENS: `role:token` entries separated by commas."""
    entries = []
    for number, item in enumerate(text.split(","), start=1):
        item = item.strip()
        if not item:
            continue
        role_name, sep, token = item.partition(":")
        if not sep:
            raise TokensError(f"IDENTITY_TOKENS, entry {number}: expected `role:token`")
        entries.append(_entry(role_name.strip(), token.strip(), f"IDENTITY_TOKENS, entry {number}"))
    return entries


__all__ = ["AccessPolicy", "Role", "TokensError", "parse_tokens_variable", "read_tokens_file"]
