"""The ``chatphase`` command: ``chat`` (default) | ``ask`` | ``bench`` | ``models`` | ``pull`` | ``info`` | ...

Every command reports a problem the user can act on as one line on stderr and a non-zero exit code
(2 for bad usage or an unusable model, 1 for an engine failure): see :mod:`chatphase.errors`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from chatphase import __version__
from chatphase.errors import ChatPhaseError

#: subcommand modules under chatphase.commands, in help order; the first is the default.
COMMAND_MODULES = (
    "chat",
    "ask",
    "compare",
    "models",
    "pull",
    "info",
    "bench",
    "whatif",
    "sessions",
    "export",
    "logs",
    "stats",
    "cache",
)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr (exit 2), not the whole usage;
    ``--help`` still prints it. Subcommand parsers are of this class too (``add_subparsers`` copies it)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser(commands: tuple[str, ...] = COMMAND_MODULES) -> argparse.ArgumentParser:
    """The argument parser with ``commands`` registered (default: every subcommand). A run registers only the
    command it runs (:func:`command_of`): registering one imports its module, and importing all of them would
    cost every command the start-up of the heaviest (the TUI's controller, every experiment)."""
    parser = OneLineParser(
        prog="chatphase",
        description="Chat with a local GGUF model and watch prefill and decode happen.",
    )
    parser.add_argument("--version", action="version", version=f"chatphase {__version__}")
    parser.add_argument(
        "--verbose", action="store_true", help="before the command: print the details behind one-line errors"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in commands:
        importlib.import_module(f"chatphase.commands.{name}").register(sub)
    return parser


def command_of(argv: list[str]) -> str | None:
    """The subcommand ``argv`` runs (``chat`` when it names none), or ``None`` where the whole parser is needed:
    the top-level ``--help`` or ``--version``, or a first word that is no command (:func:`main` says so)."""
    words = argv[1:] if argv[:1] == ["--verbose"] else argv
    if not words:
        return COMMAND_MODULES[0]
    if words[0] in COMMAND_MODULES:
        return words[0]
    if words[0].startswith("-") and words[0] not in ("-h", "--help", "--version"):
        return COMMAND_MODULES[0]
    return None


def clean_argv(argv: list[str], parser: argparse.ArgumentParser | None = None) -> tuple[list[str], list[str]]:
    """``argv`` with bytes that are not UTF-8 (lone surrogates, as Python decodes them) replaced by
    U+FFFD, and the notice that says so (once, naming the first argument that held some by its option,
    e.g. ``--system``, or as ``ask``'s prompt; see :func:`argument_name`), also printed on stderr;
    ``main`` hands the notices to the command as ``args.input_notices`` (the TUI shows them)."""
    from chatphase.engine.text import clean_text, replaced_note

    out, first = [], None
    for i, arg in enumerate(argv):
        text, at = clean_text(arg)
        if at is not None and first is None:
            first = (i, at)
        out.append(text)
    if first is None:
        return out, []
    note = replaced_note(argument_name(out, first[0], parser or build_parser()), first[1])
    print(f"chatphase: {note}", file=sys.stderr)
    return out, [note]


def argument_name(argv: list[str], index: int, parser: argparse.ArgumentParser) -> str:
    """How a notice names ``argv[index]``: the option whose value it is (``--system``, also for
    ``--system=…``), ``the prompt`` (``prompt 2`` of several) for ``ask``'s prompts, else ``argument N of
    COMMAND`` (counting the command's own arguments, not the options and their values)."""
    arg = argv[index]
    if arg.startswith("--") and "=" in arg:
        return arg.split("=", 1)[0]
    takes_value = _value_options(parser)
    if index > 0 and argv[index - 1] in takes_value:
        return argv[index - 1]
    positional = [i for i, a in enumerate(argv) if not a.startswith("-") and not (i > 0 and argv[i - 1] in takes_value)]
    command = COMMAND_MODULES[0]
    if positional and argv[positional[0]] in COMMAND_MODULES:
        command, positional = argv[positional[0]], positional[1:]
    k = positional.index(index) + 1 if index in positional else 0
    if command == "ask":
        return "the prompt" if len(positional) == 1 else f"prompt {k}"
    return f"argument {k} of {command}"


def _value_options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings, of the parser and its subcommands, that take a value (``--system TEXT``)."""
    found: set[str] = set()
    for action in parser._actions:
        if action.option_strings and action.nargs != 0:
            found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _value_options(sub)
    return found


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = command_of(argv)
    parser = build_parser(COMMAND_MODULES if command is None else (command,))
    argv, input_notices = clean_argv(argv, parser)
    if argv[:1] == ["--verbose"]:  # before the command: the details behind one-line errors, on stderr
        argv = argv[1:]
        logging.basicConfig(level=logging.DEBUG, format="chatphase: debug: %(name)s: %(message)s")
    commands = set(COMMAND_MODULES)
    if argv and not argv[0].startswith("-") and argv[0] not in commands:  # chat takes no positional argument
        print(f"chatphase: unknown command {argv[0]!r} (commands: {', '.join(COMMAND_MODULES)})", file=sys.stderr)
        return 2
    if not argv or (argv[0] not in commands and argv[0] not in ("-h", "--help", "--version")):
        argv = [COMMAND_MODULES[0], *argv]
    args = parser.parse_args(argv)
    args.input_notices = input_notices
    try:
        return int(args.func(args) or 0)
    except ChatPhaseError as exc:  # inert: the message may quote a server, a model or a file name
        from chatphase.engine.text import inert

        print(inert(f"chatphase: {exc}"), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("chatphase: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
