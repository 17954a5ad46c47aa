"""`identity-server`: serve, import an authority file, or resolve, inspect and curate through a
running server.

Settings come from flags, then `IDENTITY_*` environment variables, then defaults (settings.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from io import BufferedIOBase, BufferedReader
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic_settings import SettingsError
from tqdm import tqdm

from identity_client import IdentityError as CallFailed
from identity_client import ImportReport as ServerImportReport
from identity_server import remote
from identity_server.authority import (
    READ_CHUNK,
    READ_ERRORS,
    Line,
    TooLong,
    broke_off,
    decode_lines,
    split_lines,
    unpacked,
)
from identity_server.command_line import (
    add_command,
    add_log_format_option,
    configure_logging,
    json_logs,
    parse_command_line,
    server_address,
    tell,
    whole_number,
)
from identity_server.errors import IdentityError, InvalidArgument, StartupError
from identity_server.settings import Settings, describe_settings_error, unknown_environment

if TYPE_CHECKING:
    from identity_server.importing import ImportReport

logger = logging.getLogger("identity_server")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parse_command_line(parser, argv)
    configure_logging(getattr(logging, args.log_level.upper()), args.log_format)
    for warning in unknown_environment():
        logger.warning("%s", warning)
    try:
        code: int = args.run(args)
        return code
    except IdentityError as e:
        _error(f"{e}")
        return 2
    except (ValidationError, SettingsError) as e:
        _error(f"invalid setting: {describe_settings_error(e)}")
        return 2
    except StartupError as e:
        _error(f"{e}")
        return 1
    except CallFailed as e:
        _error(f"{e.code}: {e.message}{_hint(e.code, args)}")
        return 1
    except KeyboardInterrupt:
        return 130


def _error(text: str) -> None:
    tell(logger, logging.ERROR, text, prefix="error: ")


def _hint(code: str, args: argparse.Namespace) -> str:
    """What to check when a running server could not be reached or did not answer in time."""
    server = getattr(args, "server", None)
    if code == "UNAVAILABLE" and server:
        return (f"\nhint: no identity server answered at {server}: start one with "
                "`identity-server serve`, or check --server (and --tls-ca, for a server with TLS)")
    timeout = getattr(args, "timeout", None)
    if code == "DEADLINE_EXCEEDED" and server and timeout:
        return f"\nhint: {server} did not answer within --timeout {timeout:g} s"
    return ""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="identity-server", description=__doc__)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="default info; debug logs every call and decision")
    add_log_format_option(p)
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    serve = add_command(sub, "serve", help="run the gRPC server until SIGTERM or Ctrl-C")
    serve.add_argument("--db", dest="db_url", help="store URL (default sqlite:///identity.sqlite)")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 50051; 0 picks a free one)")
    serve.add_argument("--admin-token",
                       help="bearer token that admin RPCs must present (visible to `ps`: "
                       "prefer --tokens-file or IDENTITY_ADMIN_TOKEN)")
    serve.add_argument("--tokens-file",
                       help="bearer tokens, one `role token` a line (reader, writer, admin); "
                       "re-read on SIGHUP")
    serve.add_argument("--strict-types", action="store_true", default=None,
                       help="refuse unknown mention types instead of reading them as other")
    serve.add_argument("--promote-after", dest="promote_after_papers", type=int,
                       help="auto-promote provisional entities seen in this many papers")
    serve.add_argument("--tls-cert", help="PEM certificate (with --tls-key: serve TLS)")
    serve.add_argument("--tls-key", help="PEM private key")
    serve.add_argument("--tls-client-ca",
                       help="PEM root certificates: clients must present a certificate they "
                       "signed (mutual TLS)")
    serve.add_argument("--metrics-port", type=int,
                       help="serve Prometheus metrics over HTTP on this port (default: off)")
    serve.add_argument("--reconcile-port", type=int,
                       help="serve the W3C Reconciliation API (OpenRefine) over HTTP on this "
                       "port, at /reconcile (default: off)")
    serve.add_argument("--workers", type=int,
                       help="server processes on the one port (default 1; more than 1 needs a "
                       "shared store: a SQLite file or PostgreSQL; docs/scaling.md)")
    serve.set_defaults(run=_serve)

    exp = add_command(sub, "export", help="write every entity (name, aliases, status, redirect, "
                                        "surface forms) as JSON Lines or Parquet")
    exp.add_argument("out", type=Path, help="the file to write; - for standard output (jsonl)")
    exp.add_argument("--db", dest="db_url", help="store URL (default sqlite:///identity.sqlite)")
    exp.add_argument("--format", choices=["jsonl", "parquet"],
                     help="default: parquet for a .parquet file, else jsonl")
    exp.set_defaults(run=_export)

    imp = add_command(sub, "import", help="import an authority file (JSON Lines or CSV) into a "
                                        "store, or through a running server")
    imp.add_argument("file", type=Path,
                     help="JSON Lines or CSV (gzip, bzip2, xz too); - for standard input")
    into = imp.add_mutually_exclusive_group()
    into.add_argument("--db", dest="db_url", help="store URL (default sqlite:///identity.sqlite)")
    into.add_argument("--server", type=server_address,
                      help="host:port of a running server: import through it "
                      "(ImportAuthority; admin)")
    imp.add_argument("--format", choices=["jsonl", "csv"], help="default: guessed from line 1")
    imp.add_argument("--admin-token",
                     help="with --server: its admin token (default: IDENTITY_ADMIN_TOKEN)")
    imp.add_argument("--tls-ca", type=Path, help="with --server: PEM root certificates (TLS)")
    imp.add_argument("--timeout", type=remote.seconds, default=3600.0,
                     help="with --server: deadline of the whole import, s (default 3600)")
    imp.set_defaults(run=_import)

    res = add_command(sub, "resolve", help="resolve one mention through a running server")
    res.add_argument("mention")
    res.add_argument("--type", dest="entity_type", default="other",
                     help="the mention's entity type (default other: compatible with any)")
    res.add_argument("--context", default="", help="paper id to record evidence under")
    res.add_argument("--lookup-only", action="store_true", help="look, never write")
    remote.add_connection_options(res)
    res.set_defaults(run=remote.resolve)

    ent = add_command(sub, "entity", help="show an entity: names, status, evidence, redirect")
    ent.add_argument("entity_id")
    ent.add_argument("--forms", type=whole_number, default=20,
                     help="surface forms to fetch and print (default 20; 0: all)")
    ent.add_argument("--forms-offset", type=whole_number, default=0,
                     help="skip this many surface forms first, to page through them")
    remote.add_connection_options(ent)
    ent.set_defaults(run=remote.entity)

    links = add_command(sub, "links", help="list open possibly_same_as links (the review queue)")
    links.add_argument("--entity", help="only links touching this entity")
    links.add_argument("--limit", type=whole_number, default=100,
                       help="at most this many (default 100; 0: all)")
    remote.add_connection_options(links)
    links.set_defaults(run=remote.links)

    settle = add_command(sub, "settle", help="admin: settle a linked pair as same (merge) or "
                                           "distinct (never proposed again)")
    settle.add_argument("entity_id")
    settle.add_argument("other_id")
    settle.add_argument("decision", choices=["same", "distinct"])
    settle.add_argument("--reason", required=True, help="why (recorded with the decision)")
    settle.add_argument("--actor", help="who decides (default: your login name)")
    remote.add_connection_options(settle, admin=True)
    settle.set_defaults(run=remote.settle)

    merge = add_command(sub, "merge", help="admin: merge SOURCE into TARGET (SOURCE redirects)")
    merge.add_argument("source_id")
    merge.add_argument("target_id")
    remote.add_connection_options(merge, admin=True)
    merge.set_defaults(run=remote.merge)

    promote = add_command(sub, "promote", help="admin: make a provisional entity canonical")
    promote.add_argument("entity_id")
    remote.add_connection_options(promote, admin=True)
    promote.set_defaults(run=remote.promote)

    alias = add_command(sub, "alias", help="admin: add an alias (a typo anchor) to an entity")
    alias.add_argument("entity_id")
    alias.add_argument("alias")
    remote.add_connection_options(alias, admin=True)
    alias.set_defaults(run=remote.alias)
    return p


def _settings(args: argparse.Namespace, *fields: str) -> Settings:
    given: dict[str, Any] = {f: getattr(args, f) for f in fields if getattr(args, f, None) is not None}
    return Settings(**given)


def _serve(args: argparse.Namespace) -> int:
    from identity_server.server import address, serve_until_signalled, start_server

    settings = _settings(args, "db_url", "host", "port", "admin_token", "strict_types",
                         "promote_after_papers", "tls_cert", "tls_key", "tokens_file",
                         "tls_client_ca", "metrics_port", "reconcile_port", "workers")
    if settings.workers > 1:
        from identity_server.workers import serve_workers

        return serve_workers(settings, ready=lambda port: print(
            f"listening on {address(settings.host, port)}", flush=True))
    running = start_server(settings)
    serve_until_signalled(running, settings.grace_seconds, ready=lambda: print(
        f"listening on {address(settings.host, running.port)}", flush=True),
        drain=settings.drain_seconds)
    return 0


def _export(args: argparse.Namespace) -> int:
    from identity_server.exporting import export_jsonl, export_parquet
    from identity_server.store import open_store

    settings = _settings(args, "db_url")
    _require_existing_store(settings.db_url)
    fmt = args.format or ("parquet" if args.out.suffix == ".parquet" else "jsonl")
    to_stdout = str(args.out) == "-"
    if to_stdout and fmt == "parquet":
        raise InvalidArgument("Parquet needs a file to write, not standard output")
    store = open_store(settings.db_url)
    try:
        with tqdm(unit=" entities", desc="exporting", disable=_no_bar(), file=sys.stderr) as bar:
            if fmt == "parquet":
                count = export_parquet(store, args.out, bar.update)
            elif to_stdout:
                count = export_jsonl(store, sys.stdout, bar.update)
            else:
                partial = args.out.with_name(args.out.name + ".partial")
                with partial.open("w", encoding="utf-8") as out:
                    count = export_jsonl(store, out, bar.update)
                partial.replace(args.out)  # whole or not at all
    except OSError as e:
        raise InvalidArgument(f"cannot write {args.out}: {e.strerror}") from e
    finally:
        store.close()
    tell(logger, logging.INFO, f"exported {count} entities to {args.out} ({fmt})")
    return 0


def _require_existing_store(url: str) -> None:
    """An export reads a store: a SQLite path with no file is a typo, not an empty store to
    make (opening it would create one)."""
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///").split("?")[0])
        if not path.exists():
            raise InvalidArgument(f"no identity store at {path} (give --db)")


def _import(args: argparse.Namespace) -> int:
    path = Path("/dev/stdin") if str(args.file) == "-" else args.file
    try:  # before the store is opened: a typo in the path costs nothing
        raw = path.open("rb")
    except OSError as e:
        raise InvalidArgument(f"cannot read {args.file}: {e.strerror}") from e
    with raw:  # `stopped`: where reading broke off (compressed data cut short), if it did
        if args.server:
            with tqdm(unit="B", unit_scale=True, desc="sending", disable=_no_bar(),
                      file=sys.stderr) as bar:
                report: ImportReport | ServerImportReport
                report, stopped = remote.import_stream(args, raw, bar.update)
        else:
            report, stopped = _import_into_store(args, raw)
    _print_import(args.file, report)
    if stopped is not None:
        raise InvalidArgument(f"{args.file}: {stopped}; the lines before it were imported "
                              "(with their merges), the rest were not")
    return 1 if report.errors else 0


def _import_into_store(args: argparse.Namespace,
                       raw: BufferedReader) -> tuple[ImportReport, str | None]:
    """The import's report, and where reading broke off, if it did: then the whole lines read
    before it are imported, as through a server (`remote.import_stream`)."""
    from identity_server.server import build_service

    service = build_service(_settings(args, "db_url"))
    stopped: list[str] = []
    try:
        with unpacked(raw) as (f, kind), tqdm(
            unit=" records", desc="importing", disable=_no_bar(), file=sys.stderr
        ) as bar:
            report = service.import_lines(_readable(f, args.file, kind, stopped), args.format,
                                          progress=bar.update)
    finally:
        service.close()
    return report, (stopped[0] if stopped else None)


def _no_bar() -> bool | None:
    """tqdm's `disable`: no bar among JSON log lines; otherwise one on a terminal only."""
    return True if json_logs() else None


def _print_import(file: Path, report: Any) -> None:
    """An import's report (the service's, or ImportAuthority's reply: the same fields)."""
    for refused in report.errors:
        tell(logger, logging.WARNING, f"{file}:{refused.line}: {refused.message}",
             extra={"file": str(file), "line": refused.line, "reason": refused.message})
    print(
        f"imported {report.imported} records ({report.created} new, {report.updated} replaced); "
        f"merged {report.merged} provisional entities, linked {report.linked}; "
        f"refused {len(report.errors)} records"
    )


def _readable(f: BufferedIOBase, path: Path, kind: str, stopped: list[str]) -> Iterator[Line]:
    """f's lines, decoded one at a time (a line that is not UTF-8, or too long, refuses its
    record only); data that cannot be read on (compressed data cut short) ends the lines, and
    `stopped` says after which line."""
    number = 0  # lines read whole

    def counted() -> Iterator[bytes | TooLong]:
        nonlocal number
        for raw in split_lines(iter(lambda: f.read1(READ_CHUNK), b"")):
            number += 1
            yield raw

    try:
        yield from decode_lines(counted())
    except READ_ERRORS as e:
        stopped.append(broke_off(kind, number, e))
    except InvalidArgument as e:  # a UTF-16 file
        raise InvalidArgument(f"{path}: {e}") from e


if __name__ == "__main__":
    raise SystemExit(main())
