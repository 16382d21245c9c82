"""Exceptions that carry a one-line user message and a CLI exit code.

The CLI prints ``str(error)`` on one stderr line and exits with ``error.exit_code``; the TUI shows the
same text as a notice. Nothing else should reach the user as a traceback.
"""

from __future__ import annotations


class ChatPhaseError(Exception):
    """Base class: a problem the user can act on. ``exit_code`` is the CLI's exit status."""

    exit_code = 1


class UsageError(ChatPhaseError):
    """Bad command-line usage or settings (exit code 2)."""

    exit_code = 2


class ModelError(ChatPhaseError):
    """A model that cannot be used: missing, a directory, not GGUF, truncated, unsupported (exit 2)."""

    exit_code = 2


class EngineError(ChatPhaseError):
    """The inference engine failed or its process died (exit code 1)."""

    exit_code = 1
