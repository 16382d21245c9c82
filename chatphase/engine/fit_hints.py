"""How to make room for what does not fit n_ctx, in the words of the front end that says it.

A refusal (the prompt's :class:`~chatphase.engine.prompting.prompt.PromptTooLong`, a file larger than the
context) ends with a hint in parentheses, in the command line's words by default:
``(raise --n-ctx or shorten the message)``. The TUI changes settings in its settings screen (F9), not with
flags: :func:`for_tui` puts its words in place of the command line's, so both come from :data:`HINTS`.
"""

from __future__ import annotations

from typing import Literal

#: what does not fit: the newest message, the conversation (an overflow policy of ``stop``), an attached file.
What = Literal["message", "conversation", "file"]
FrontEnd = Literal["cli", "tui"]

#: the hints, ``{settings}`` being the TUI's key for its settings screen.
HINTS: dict[What, dict[FrontEnd, str]] = {
    "message": {
        "cli": "raise --n-ctx or shorten the message",
        "tui": "raise n_ctx in {settings} (Settings) or shorten the message",
    },
    "conversation": {
        "cli": "raise --n-ctx or shorten the message; --overflow drop-oldest or shift goes on past n_ctx",
        "tui": "raise n_ctx in {settings} (Settings) or shorten the message; "
        "Overflow drop-oldest or shift there goes on past n_ctx",
    },
    "file": {
        "cli": "raise --n-ctx or attach a part of it",
        "tui": "raise n_ctx in {settings} (Settings) or attach a part of it",
    },
}


def fit_hint(what: What, front_end: FrontEnd = "cli", settings_key: str = "F9") -> str:
    """The hint for ``what``, without its parentheses; ``settings_key``: the TUI's key for its settings."""
    return HINTS[what][front_end].format(settings=settings_key)


def for_tui(text: str, settings_key: str) -> str:
    """``text`` (a refusal as the engine words it) with each command-line hint in parentheses replaced by the
    TUI's, which names ``settings_key`` (``F9``, or the key it is remapped to); other text as it is."""
    for what in HINTS:
        text = text.replace(f"({fit_hint(what)})", f"({fit_hint(what, 'tui', settings_key)})")
    return text
