"""Command-line parsing the two CLIs share: subcommands that report their own mistakes, the
check of a server address, of a count and of an admin token; and their logging set-up.

argparse reports an unknown option (`serve --prot 0`) with the top-level usage, which does not
show the options the subcommand takes, and a top-level option given after the subcommand
(`ingest run -v ...`) as merely unrecognised. Both CLIs parse through here instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

_COMMAND_PARSER = "command_parser"


def add_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, *,
                help: str) -> argparse.ArgumentParser:
    """`subparsers.add_parser(name, help=...)`, remembered so its usage errors are its own."""
    command = subparsers.add_parser(name, help=help)
    command.set_defaults(**{_COMMAND_PARSER: command})
    return command


def command_parser(parser: argparse.ArgumentParser,
                   args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the subcommand given (the top-level one when there is none)."""
    found: argparse.ArgumentParser = getattr(args, _COMMAND_PARSER, None) or parser
    return found


def parse_command_line(parser: argparse.ArgumentParser,
                       argv: Sequence[str] | None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, with unrecognised arguments reported by the subcommand's
    parser (its usage), naming a top-level option put after the subcommand."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        top_level = {option for action in parser._actions for option in action.option_strings
                     if option not in ("-h", "--help")}
        misplaced = [a for a in extra if a.split("=", 1)[0] in top_level]
        hint = ""
        if misplaced:
            hint = (f" ({misplaced[0]} is an option of {parser.prog} itself: give it before "
                    f"the command)")
        command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


_GRPC_SCHEMES = frozenset({"dns", "unix", "unix-abstract", "ipv4", "ipv6", "vsock"})


def grpc_target(value: str) -> str:
    """host:port (or a gRPC target such as dns:///host:port or unix:/path), never a URL: gRPC
    would fail on `http://...` only after its retries, and take `host` alone as port 443.
    ValueError says what to write instead."""
    value = value.strip()
    scheme = value.split(":", 1)[0].lower() if "://" in value else ""
    if scheme and scheme not in _GRPC_SCHEMES:
        raise ValueError(f"takes host:port (e.g. 127.0.0.1:50051), not a {scheme}:// URL")
    if not value or (not scheme and ":" not in value and not value.startswith("unix:")):
        raise ValueError("takes host:port (e.g. 127.0.0.1:50051)")
    return value


def server_address(text: str) -> str:
    """`grpc_target` for argparse, which then names the flag in its error."""
    try:
        return grpc_target(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}, got {text!r}") from None


def whole_number(text: str) -> int:
    """A whole number of at least 0, for argparse (which then names the flag in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def header_safe_token(token: str | None) -> str | None:
    """An admin token as both CLIs' settings take it. It travels in a gRPC header
    (`authorization: Bearer <token>`), which takes visible ASCII only: any other token could
    never be presented. ValueError says so (never echoing the token)."""
    if token is not None and not re.fullmatch(r"[\x21-\x7e]+", token):
        raise ValueError("must be visible ASCII characters, with no spaces or accents "
                         "(it is sent in a gRPC header)")
    return token


def read_token_file(path: Path) -> str | None:
    """The bearer token a file holds on its first line (None for an empty file), as both
    CLIs' clients read --token-file and INGEST_TOKEN_FILE. ValueError names the file, never
    the token."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the token file {path}: {e}") from e
    first = lines[0].strip() if lines else ""
    try:
        return header_safe_token(first) if first else None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


LOG_FORMATS = ("text", "json")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# The JSON lines carry the text lines' fields, under the names log collectors expect.
_JSON_NAMES = {"asctime": "time", "levelname": "level", "name": "logger", "message": "event",
               "exc_info": "exception", "stack_info": "stack"}
_log_format = "text"  # as the last configure_logging set it (in this process)


def add_log_format_option(parser: argparse.ArgumentParser) -> None:
    """`--log-format`, for both CLIs' top-level parsers."""
    parser.add_argument(
        "--log-format", default="text", choices=LOG_FORMATS,
        help="text (default): one plain line a message; json: one JSON object a line (time, "
             "level, logger, event and the message's fields), for log collectors; with json, "
             "messages that would be plain lines on stderr are log records too, and there is "
             "no progress bar")


def log_format() -> str:
    """The format the last configure_logging set ("text" before any), for a worker process."""
    return _log_format


def json_logs() -> bool:
    """Whether logging was configured as JSON: then stderr holds nothing but log records."""
    return _log_format == "json"


def configure_logging(level: int, log_format: str = "text") -> None:
    """Log lines to stderr at `level`, one format for both CLIs (and ingest's worker process).
    grpcio's own debug lines (its event loop's plumbing, a few for every call) are left out even
    at debug: they are not what a verbose run asks for, and gRPC's tracing has variables of its
    own (GRPC_TRACE)."""
    global _log_format
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    _log_format = log_format
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_json_formatter())
        logging.basicConfig(level=level, handlers=[handler])
        # What would otherwise reach stderr as plain text: warnings and an uncaught exception.
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
    else:
        logging.basicConfig(level=level, stream=sys.stderr, format=_TEXT_FORMAT)
    logging.getLogger("grpc").setLevel(max(level, logging.INFO))


def _json_formatter() -> logging.Formatter:
    # Imported only for JSON logs.
    from pythonjsonlogger.json import JsonEncoder
    from pythonjsonlogger.orjson import OrjsonFormatter

    class JsonLines(OrjsonFormatter):
        """python-json-logger's orjson formatter, with an RFC 3339 UTC time to the
        millisecond and the level in lower case."""

        def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
            return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                    + f".{int(record.msecs):03d}Z")

        def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
            log_data["level"] = str(log_data["level"]).lower()
            return log_data

        def jsonify_log_record(self, log_data: dict[str, Any]) -> str:
            try:
                text: str = super().jsonify_log_record(log_data)
            except TypeError:  # orjson refuses some values (an int past 64 bits): never lose a line
                text = json.dumps(log_data, cls=JsonEncoder, separators=(",", ":"))
            return text

    formatter: logging.Formatter = JsonLines(_TEXT_FORMAT, rename_fields=_JSON_NAMES)
    return formatter


def _log_uncaught(kind: type[BaseException], value: BaseException,
                  tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger("uncaught").critical("%s: %s", kind.__name__, value,
                                           exc_info=(kind, value, tb))


def tell(logger: logging.Logger, level: int, text: str, *, prefix: str = "",
         extra: Mapping[str, object] | None = None) -> None:
    """A message for the person running the command: `prefix + text` on stderr, or with JSON
    logs a record of `logger` (`text` its event, `extra` its fields), so that stderr stays one
    JSON object a line."""
    if json_logs():
        logger.log(level, "%s", text, extra=extra)
    else:
        print(prefix + text, file=sys.stderr)


def how_it_ended(exitcode: int | None) -> str:
    """A process's end as a person reads it: multiprocessing gives -N for signal N."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
