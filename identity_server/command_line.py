"""Parsing a command line with subcommands so that a mistake is reported by the subcommand.

argparse reports an unknown option (`serve --prot 0`) with the top-level usage, which does not
show the options the subcommand takes, and a top-level option given after the subcommand
(`ingest run -v ...`) as merely unrecognised. Both CLIs parse through here instead.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

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
