"""The command line's client commands: each talks to a running server through `identity_client`.

`resolve` a mention, look at an `entity`, work the curator's review queue (`links`, `settle`),
curate (`merge`, `promote`, `alias`) and `import --server` an authority file from a terminal,
without hand-written gRPC calls or metadata. Every call has a deadline and is tried once (a
person at a terminal retries); admin calls present the admin token. `--json` prints what the
server answered, for scripts.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import BufferedReader
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from identity_client import Entity, IdentityClient, ImportReport, Resolution, RetryPolicy
from identity_client import IdentityError as CallFailed
from identity_server.authority import (
    MAX_LINE_BYTES,
    READ_CHUNK,
    READ_ERRORS,
    UTF16_REFUSAL,
    broke_off,
    starts_utf16,
    unpacked,
)
from identity_server.command_line import read_token_file, server_address, tell
from identity_server.errors import InvalidArgument
from identity_server.settings import Settings

logger = logging.getLogger("identity_server")

# Surface forms fetched and printed by default (`entity`, and the admin commands' replies): a
# much-mentioned entity has thousands.
_FORMS_SHOWN = 20


def add_connection_options(parser: argparse.ArgumentParser, *, admin: bool = False) -> None:
    """--server, --timeout, --tls-ca and --json; and --admin-token for admin commands."""
    parser.add_argument("--server", type=server_address, default="127.0.0.1:50051",
                        help="host:port of the server (default 127.0.0.1:50051)")
    parser.add_argument("--timeout", type=seconds, default=10.0,
                        help="deadline of each call, s (default 10)")
    parser.add_argument("--tls-ca", type=Path,
                        help="PEM root certificates: talk TLS (to a server run with --tls-cert)")
    parser.add_argument("--json", action="store_true", help="print the reply as JSON")
    parser.add_argument("--token-file", type=Path,
                        help="file whose first line is the bearer token to present (default: "
                        "IDENTITY_TOKEN); a server with roles needs one")
    if admin:
        parser.add_argument("--admin-token",
                            help="the server's admin token (default: IDENTITY_ADMIN_TOKEN)")


def seconds(text: str) -> float:
    """A deadline in seconds, more than 0 and finite, for argparse."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0 and finite (got {text})")
    return value


def resolve(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.resolve(args.mention, args.entity_type, context_id=args.context,
                               lookup_only=args.lookup_only)
    if args.json:
        print(json.dumps(_resolution_dict(reply), ensure_ascii=False, indent=2))
        return 0
    print(f"entity_id:    {reply.entity_id or '(none: lookup only)'}")
    print(f"status:       {_enum_name(reply.status, 'ENTITY_STATUS')}")
    print(f"match_kind:   {_enum_name(reply.match_kind, 'MATCH_KIND')}")
    print(f"name:         {reply.name}")
    print(f"type:         {reply.entity_type}")
    print(f"matched_name: {reply.matched_name}")
    print(f"created:      {reply.created}")
    if reply.candidates:
        print(f"candidates:   {', '.join(reply.candidates)}")
    if reply.possibly_same_as:
        print(f"possibly_same_as: {', '.join(reply.possibly_same_as)}")
    return 0


def entity(args: argparse.Namespace) -> int:
    with _client(args) as client:
        # Only the page of surface forms shown travels: a much-mentioned entity has thousands.
        found = client.get_entity(args.entity_id, max_surface_forms=args.forms or None,
                                  surface_forms_offset=args.forms_offset)
    return _show(args, found, forms=args.forms, offset=args.forms_offset)


def links(args: argparse.Namespace) -> int:
    """The open possibly_same_as links, each end with its name and type, oldest first."""
    with _client(args) as client:
        # One more than asked for tells whether there are more.
        found = client.list_possibly_same_as(args.entity or "",
                                             limit=args.limit + 1 if args.limit else 0)
        more = bool(args.limit) and len(found) > args.limit
        found = found[:args.limit] if args.limit else found
        ids = dict.fromkeys(i for link in found for i in (link.entity_id, link.other_id))
        ends = {i: client.get_entity(i, max_surface_forms=0) for i in ids}
    if args.json:
        print(json.dumps([{"entity": _as_dict(ends[link.entity_id].message),
                           "other": _as_dict(ends[link.other_id].message),
                           "sequence": link.sequence} for link in found],
                         ensure_ascii=False, indent=2))
    else:
        for link in found:
            print(f"{_label(ends[link.entity_id])}  ~  {_label(ends[link.other_id])}")
        print(f"{len(found)} open links" + (" (more: raise --limit)" if more else ""))
    return 0


def settle(args: argparse.Namespace) -> int:
    actor = args.actor or _login_name()
    with _client(args, admin=True) as client:
        found = client.settle(args.entity_id, args.other_id, args.decision, actor=actor,
                              reason=args.reason, max_surface_forms=_FORMS_SHOWN)
    return _show(args, found)

def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError) as e:  # no login name (a container's numeric user)
        raise InvalidArgument("no login name to record as the actor: give --actor") from e


def merge(args: argparse.Namespace) -> int:
    with _client(args, admin=True) as client:
        found = client.merge(args.source_id, args.target_id, max_surface_forms=_FORMS_SHOWN)
    return _show(args, found)


def promote(args: argparse.Namespace) -> int:
    with _client(args, admin=True) as client:
        found = client.promote(args.entity_id, max_surface_forms=_FORMS_SHOWN)
    _note_redirect(args.entity_id, found)
    return _show(args, found)


def alias(args: argparse.Namespace) -> int:
    with _client(args, admin=True) as client:
        found = client.add_alias(args.entity_id, args.alias, max_surface_forms=_FORMS_SHOWN)
    _note_redirect(args.entity_id, found)
    return _show(args, found)

def _note_redirect(asked: str, acted_on: Entity) -> None:
    """Admin calls on a merged id act on the entity it redirects to (SPEC section 3): say so,
    on stderr, so that a curator who named a merged-away id is not surprised."""
    if acted_on.entity_id and acted_on.entity_id != asked:
        tell(logger, logging.WARNING, f"{asked} was merged into {acted_on.entity_id}; this acted "
             f"on {acted_on.entity_id}", prefix="note: ")


def import_stream(args: argparse.Namespace, raw: BufferedReader,
                  progress: Callable[[int], object]) -> tuple[ImportReport, str | None]:
    """Stream an authority file (decompressed) to ImportAuthority; the server's reply, and
    where reading broke off (compressed data cut short), if it did: then the server imports
    the lines sent before, and the part of a line read so far is not sent, so no record is
    imported cut short. `progress` is called with the bytes sent."""
    stopped: list[str] = []  # why reading broke off, if it did
    utf16: list[bool] = []  # the file is UTF-16: refused whole, before any line is sent

    def chunks() -> Iterator[bytes]:
        lines, pending = 0, bytearray()
        with unpacked(raw) as (f, kind):
            try:
                for block in iter(lambda: f.read1(READ_CHUNK), b""):
                    if not lines and not pending and starts_utf16(block):
                        utf16.append(True)
                        return
                    end = block.rfind(b"\n") + 1
                    if not end and len(pending) + len(block) <= MAX_LINE_BYTES:
                        pending += block  # a line longer than a block: wait for its end
                        continue
                    if not end:  # part of a line over the server's cap, which refuses it
                        end = len(block)
                    data, pending = bytes(pending) + block[:end], bytearray(block[end:])
                    lines += data.count(b"\n")
                    progress(len(data))
                    yield data
                if pending:
                    progress(len(pending))
                    yield bytes(pending)
            except READ_ERRORS as e:
                stopped.append(broke_off(kind, lines, e))

    with _client(args, admin=True) as client:
        reply = client.import_authority(chunks(), authority_format=args.format,
                                        timeout=args.timeout)
    if utf16:  # as an import into a store says it (the server was sent no line)
        raise InvalidArgument(f"{args.file}: {UTF16_REFUSAL}")
    return reply, (stopped[0] if stopped else None)


# -- calls -------------------------------------------------------------------------------------

@contextmanager
def _client(args: argparse.Namespace, *, admin: bool = False) -> Iterator[IdentityClient]:
    """A client of --server for one command: each call with the command's deadline, tried
    once, presenting the token (and for admin commands the admin token)."""
    admin_token = _admin_token(args) if admin else None
    client = IdentityClient(args.server, policy=RetryPolicy(deadline_seconds=args.timeout,
                                                            budget_seconds=0),
                            token=_token(args), admin_token=admin_token,
                            root_certificates=_tls_roots(args))
    try:
        yield client
    except CallFailed as e:
        if (admin and not admin_token and e.code == "UNAUTHENTICATED"
                and "disabled" not in e.message):  # not: the server has none
            raise InvalidArgument(f"{e.message}: give the token with --admin-token "
                                  "or IDENTITY_ADMIN_TOKEN") from e
        raise
    finally:
        client.close()


def _tls_roots(args: argparse.Namespace) -> bytes | None:
    if args.tls_ca is None:
        return None
    try:
        roots: bytes = args.tls_ca.read_bytes()
    except OSError as e:
        raise InvalidArgument(
            f"cannot read the TLS root certificates {args.tls_ca}: {e.strerror}") from e
    return roots


def _token(args: argparse.Namespace) -> str | None:
    """The bearer token of --token-file, else IDENTITY_TOKEN; none when neither is given."""
    path: Path | None = getattr(args, "token_file", None)
    if path is None:
        return Settings().token
    try:
        return read_token_file(path)
    except ValueError as e:
        raise InvalidArgument(str(e)) from e


def _admin_token(args: argparse.Namespace) -> str | None:
    given = {"admin_token": args.admin_token} if args.admin_token else {}
    return Settings(**given).admin_token  # IDENTITY_ADMIN_TOKEN when no flag; checked

# -- output ------------------------------------------------------------------------------------

def _show(args: argparse.Namespace, e: Entity, *, forms: int = _FORMS_SHOWN,
          offset: int = 0) -> int:
    """An entity for a person (or as JSON); `forms` surface forms at most (0: all), the reply's
    being those from `offset` on."""
    if args.json:
        print(json.dumps(_as_dict(e.message), ensure_ascii=False, indent=2))
        return 0
    print(f"entity_id:     {e.entity_id}")
    print(f"status:        {_enum_name(e.status, 'ENTITY_STATUS')}")
    if e.redirect_to:
        print(f"redirect_to:   {e.redirect_to}")
    if e.name:
        print(f"name:          {e.name}")
    print(f"type:          {e.entity_type}")
    if e.placeholder:
        print("placeholder:   yes (an ambiguous spelling's; only a curator merges or promotes it)")
    if e.aliases:
        print(f"aliases:       {' | '.join(e.aliases)}")
    total = e.surface_form_count
    if total:
        shown = list(e.surface_forms[:forms] if forms else e.surface_forms)
        more = total - offset - len(shown)
        span = (f"[{offset + 1:,}-{offset + len(shown):,} of {total:,}] "
                if shown and (offset or more) else "")
        listed = " | ".join(shown) if shown else f"none from {offset + 1:,} on ({total:,} in all)"
        print(f"surface_forms: {span}{listed}"
              + (f"  ... and {more:,} more (`entity {e.entity_id} --forms 0`: all)"
                 if more else ""))
    if e.status == "merged":
        print("evidence:      moved with its names to the entity it redirects to")
    else:
        print(f"evidence:      {e.evidence_count} resolves in {e.paper_count} papers")
    return 0


def _enum_name(value: str, unspecified: str) -> str:
    """A status or match kind as the proto names it (CANONICAL, EXACT, ...)."""
    return value.upper() if value else f"{unspecified}_UNSPECIFIED"

def _label(e: Entity) -> str:
    """`id 'name' [type, status]`, placeholders marked: what a curator needs to judge a link."""
    return (f"{e.entity_id} {e.name!r} [{e.entity_type}, {e.status}"
            f"{' placeholder' if e.placeholder else ''}]")


def _resolution_dict(r: Resolution) -> dict[str, Any]:
    """A Resolve reply as its proto's JSON mapping names it, every field present."""
    return {"entity_id": r.entity_id, "status": _enum_name(r.status, "ENTITY_STATUS"),
            "match_kind": _enum_name(r.match_kind, "MATCH_KIND"), "created": r.created,
            "possibly_same_as": list(r.possibly_same_as), "candidates": list(r.candidates),
            "name": r.name, "matched_name": r.matched_name, "entity_type": r.entity_type,
            "display_form": r.display_form, "candidate_scores": list(r.scores)}


def _as_dict(message: Any) -> dict[str, Any]:
    as_dict: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return as_dict
