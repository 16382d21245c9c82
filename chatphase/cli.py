"""The ``chatphase`` command: ``chat`` (default) | ``ask`` | ``bench`` | ``models`` | ``pull`` | ``info`` | ...

Every command reports a problem the user can act on as one line on stderr and a non-zero exit code
(2 for bad usage or an unusable model, 1 for an engine failure): see :mod:`chatphase.errors`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from chatphase import __version__
from chatphase.errors import ChatPhaseError

#: subcommand modules under chatphase.commands, in help order; the first is the default.
COMMAND_MODULES = ("chat", "ask", "models", "pull", "info", "bench", "sessions", "export")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="chatphase",
        description="Chat with a local GGUF model and watch prefill and decode happen.",
    )
    parser.add_argument("--version", action="version", version=f"chatphase {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"chatphase.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    if not argv or (argv[0] not in commands and argv[0] not in ("-h", "--help", "--version")):
        argv = [COMMAND_MODULES[0], *argv]
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ChatPhaseError as exc:
        print(f"chatphase: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("chatphase: interrupted", file=sys.stderr)
        return 130
