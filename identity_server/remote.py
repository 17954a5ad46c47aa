"""The command line's client commands: each talks to a running server over gRPC.

`resolve` a mention, look at an `entity`, work the curator's review queue (`links`, `settle`),
curate (`merge`, `promote`, `alias`) and `import --server` an authority file from a terminal,
without hand-written gRPC calls or metadata. Every call has a deadline; admin calls present the
admin token as the server expects it (`authorization: Bearer <token>`). `--json` prints what
the server answered, for scripts.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import BufferedReader
from pathlib import Path
from typing import Any, Protocol

import grpc
from google.protobuf import json_format
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

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
from identity_server.settings import MAX_MESSAGE_BYTES, Settings

logger = logging.getLogger("identity_server")

Metadata = tuple[tuple[str, str], ...]
_PAGE = 1000  # links asked for per ListPossiblySameAs call (the server's most)
# Surface forms fetched and printed by default (`entity`, and the admin commands' replies): a
# much-mentioned entity has thousands.
_FORMS_SHOWN = 20
_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]


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
    with _server(args) as call:
        reply = call("Resolve", pb.ResolveRequest(
            mention=args.mention, entity_type=args.entity_type, context_id=args.context,
            lookup_only=args.lookup_only))
    if args.json:
        return _print_json(reply)
    print(f"entity_id:    {reply.entity_id or '(none: lookup only)'}")
    print(f"status:       {pb.EntityStatus.Name(reply.status)}")
    print(f"match_kind:   {pb.MatchKind.Name(reply.match_kind)}")
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
    with _server(args) as call:
        # Only the page of surface forms shown travels: a much-mentioned entity has thousands.
        reply = call("GetEntity", pb.GetEntityRequest(
            entity_id=args.entity_id, max_surface_forms=args.forms or None,
            surface_forms_offset=args.forms_offset))
    return _show(args, reply.entity, forms=args.forms, offset=args.forms_offset)


def links(args: argparse.Namespace) -> int:
    """The open possibly_same_as links, each end with its name and type, oldest first."""
    with _server(args) as call:
        found, more = _links(call, args.entity or "", args.limit)
        ids = dict.fromkeys(i for link in found for i in (link.entity_id, link.other_id))
        ends: dict[str, pb.Entity] = {
            i: call("GetEntity", pb.GetEntityRequest(entity_id=i, max_surface_forms=0)).entity
            for i in ids}
    if args.json:
        print(json.dumps([{"entity": _as_dict(ends[link.entity_id]),
                           "other": _as_dict(ends[link.other_id]),
                           "sequence": link.sequence} for link in found],
                         ensure_ascii=False, indent=2))
    else:
        for link in found:
            print(f"{_label(ends[link.entity_id])}  ~  {_label(ends[link.other_id])}")
        print(f"{len(found)} open links" + (" (more: raise --limit)" if more else ""))
    return 0


def settle(args: argparse.Namespace) -> int:
    decision = {"same": pb.SAME, "distinct": pb.DISTINCT}[args.decision]
    actor = args.actor or _login_name()
    with _server(args) as call:
        reply = call("SettlePossiblySameAs", pb.SettlePossiblySameAsRequest(
            entity_id=args.entity_id, other_id=args.other_id, decision=decision, actor=actor,
            reason=args.reason, max_surface_forms=_FORMS_SHOWN), admin=True)
    return _show(args, reply.entity)


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError) as e:  # no login name (a container's numeric user)
        raise InvalidArgument("no login name to record as the actor: give --actor") from e


def merge(args: argparse.Namespace) -> int:
    with _server(args) as call:
        reply = call("Merge", pb.MergeRequest(source_id=args.source_id, target_id=args.target_id,
                                              max_surface_forms=_FORMS_SHOWN), admin=True)
    return _show(args, reply.entity)


def promote(args: argparse.Namespace) -> int:
    with _server(args) as call:
        reply = call("Promote", pb.PromoteRequest(entity_id=args.entity_id,
                                                  max_surface_forms=_FORMS_SHOWN), admin=True)
    _note_redirect(args.entity_id, reply.entity)
    return _show(args, reply.entity)


def alias(args: argparse.Namespace) -> int:
    with _server(args) as call:
        reply = call("AddAlias", pb.AddAliasRequest(entity_id=args.entity_id, alias=args.alias,
                                                    max_surface_forms=_FORMS_SHOWN), admin=True)
    _note_redirect(args.entity_id, reply.entity)
    return _show(args, reply.entity)


def _note_redirect(asked: str, acted_on: pb.Entity) -> None:
    """Admin calls on a merged id act on the entity it redirects to (SPEC section 3): say so,
    on stderr, so that a curator who named a merged-away id is not surprised."""
    if acted_on.entity_id and acted_on.entity_id != asked:
        tell(logger, logging.WARNING, f"{asked} was merged into {acted_on.entity_id}; this acted "
             f"on {acted_on.entity_id}", prefix="note: ")


_FORMATS = {None: pb.AUTHORITY_FORMAT_UNSPECIFIED, "jsonl": pb.AUTHORITY_FORMAT_JSONL,
            "csv": pb.AUTHORITY_FORMAT_CSV}


def import_stream(args: argparse.Namespace, raw: BufferedReader,
                  progress: Callable[[int], object]) -> tuple[pb.ImportAuthorityResponse,
                                                              str | None]:
    """Stream an authority file (decompressed) to ImportAuthority; the server's reply, and
    where reading broke off (compressed data cut short), if it did: then the server imports
    the lines sent before, and the part of a line read so far is not sent, so no record is
    imported cut short. `progress` is called with the bytes sent."""
    stopped: list[str] = []  # why reading broke off, if it did
    utf16: list[bool] = []  # the file is UTF-16: refused whole, before any line is sent

    def requests() -> Iterator[pb.ImportAuthorityRequest]:
        yield pb.ImportAuthorityRequest(format=_FORMATS[args.format])
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
                    yield pb.ImportAuthorityRequest(data=data)
                if pending:
                    progress(len(pending))
                    yield pb.ImportAuthorityRequest(data=bytes(pending))
            except READ_ERRORS as e:
                stopped.append(broke_off(kind, lines, e))

    with _server(args) as call:
        reply: pb.ImportAuthorityResponse = call("ImportAuthority", requests(), admin=True)
    if utf16:  # as an import into a store says it (the server was sent no line)
        raise InvalidArgument(f"{args.file}: {UTF16_REFUSAL}")
    return reply, (stopped[0] if stopped else None)


# -- calls -------------------------------------------------------------------------------------

class Call(Protocol):
    def __call__(self, method: str, request: Any, *, admin: bool = False) -> Any: ...


@contextmanager
def _server(args: argparse.Namespace) -> Iterator[Call]:
    """A channel to --server for one command, as a function making unary calls on it, each
    with the command's deadline (and, when admin, the admin token)."""
    with _channel(args) as channel:
        stub = pb_grpc.IdentityServiceStub(channel)

        def call(method: str, request: Any, *, admin: bool = False) -> Any:
            metadata = (_admin_metadata(args) if admin else ()) or _token_metadata(args)
            try:
                return getattr(stub, method)(request, timeout=args.timeout, metadata=metadata)
            except grpc.RpcError as e:
                if (admin and not metadata and e.code() is grpc.StatusCode.UNAUTHENTICATED
                        and "disabled" not in (e.details() or "")):  # not: the server has none
                    raise InvalidArgument(f"{e.details()}: give the token with --admin-token "
                                          "or IDENTITY_ADMIN_TOKEN") from e
                raise

        yield call


def _channel(args: argparse.Namespace) -> grpc.Channel:
    """To --server, taking replies as large as the server sends (an entity with thousands of
    spellings outgrows gRPC's default 4 MB)."""
    if args.tls_ca is None:
        return grpc.insecure_channel(args.server, options=_OPTIONS)
    try:
        roots = args.tls_ca.read_bytes()
    except OSError as e:
        raise InvalidArgument(
            f"cannot read the TLS root certificates {args.tls_ca}: {e.strerror}") from e
    return grpc.secure_channel(args.server, grpc.ssl_channel_credentials(root_certificates=roots),
                               options=_OPTIONS)


def _token_metadata(args: argparse.Namespace) -> Metadata:
    """The bearer token of --token-file, else IDENTITY_TOKEN; none when neither is given."""
    path: Path | None = getattr(args, "token_file", None)
    if path is not None:
        try:
            token = read_token_file(path)
        except ValueError as e:
            raise InvalidArgument(str(e)) from e
    else:
        token = Settings().token
    return (("authorization", f"Bearer {token}"),) if token else ()


def _admin_metadata(args: argparse.Namespace) -> Metadata:
    given = {"admin_token": args.admin_token} if args.admin_token else {}
    token = Settings(**given).admin_token  # IDENTITY_ADMIN_TOKEN when no flag; checked
    return (("authorization", f"Bearer {token}"),) if token else ()


def _links(call: Call, entity_id: str,
           limit: int) -> tuple[list[pb.PossiblySameAsLink], bool]:
    """Up to limit links (0: all), page by page; and whether there are more."""
    limit = limit or sys.maxsize
    found: list[pb.PossiblySameAsLink] = []
    token = ""
    while len(found) < limit:
        reply = call("ListPossiblySameAs", pb.ListPossiblySameAsRequest(
            entity_id=entity_id, page_size=min(_PAGE, limit - len(found)), page_token=token))
        found.extend(reply.links)
        token = reply.next_page_token
        if not token:
            return found, False
    return found, True


# -- output ------------------------------------------------------------------------------------

def _show(args: argparse.Namespace, e: pb.Entity, *, forms: int = _FORMS_SHOWN,
          offset: int = 0) -> int:
    """An entity for a person (or as JSON); `forms` surface forms at most (0: all), the reply's
    being those from `offset` on."""
    if args.json:
        return _print_json(e)
    print(f"entity_id:     {e.entity_id}")
    print(f"status:        {pb.EntityStatus.Name(e.status)}")
    if e.redirect_to:
        print(f"redirect_to:   {e.redirect_to}")
    if e.name:
        print(f"name:          {e.name}")
    print(f"type:          {e.entity_type}")
    if e.placeholder:
        print("placeholder:   yes (an ambiguous spelling's; only a curator merges or promotes it)")
    if e.aliases:
        print(f"aliases:       {' | '.join(e.aliases)}")
    total = e.surface_form_count or offset + len(e.surface_forms)  # 0: an older server
    if total:
        shown = list(e.surface_forms[:forms] if forms else e.surface_forms)
        more = total - offset - len(shown)
        span = (f"[{offset + 1:,}-{offset + len(shown):,} of {total:,}] "
                if shown and (offset or more) else "")
        listed = " | ".join(shown) if shown else f"none from {offset + 1:,} on ({total:,} in all)"
        print(f"surface_forms: {span}{listed}"
              + (f"  ... and {more:,} more (`entity {e.entity_id} --forms 0`: all)"
                 if more else ""))
    if e.status == pb.MERGED:
        print("evidence:      moved with its names to the entity it redirects to")
    else:
        print(f"evidence:      {e.evidence_count} resolves in {e.paper_count} papers")
    return 0


def _label(e: pb.Entity) -> str:
    """`id 'name' [type, status]`, placeholders marked: what a curator needs to judge a link."""
    status = pb.EntityStatus.Name(e.status).lower()
    return (f"{e.entity_id} {e.name!r} [{e.entity_type}, {status}"
            f"{' placeholder' if e.placeholder else ''}]")


def _as_dict(message: Any) -> dict[str, Any]:
    as_dict: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return as_dict


def _print_json(message: Any) -> int:
    print(json.dumps(_as_dict(message), ensure_ascii=False, indent=2))
    return 0
