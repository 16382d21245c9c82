"""Fitting a templated conversation into the context window.

The format (the model's Jinja template, a llama.cpp built-in, or a plain completion prompt) is chosen and
checked in :mod:`chatphase.engine.prompting.chat_format`; :class:`ChatTemplate` renders with it, tokenises, and
drops the oldest messages until the prompt fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from chatphase.engine.events import Message
from chatphase.engine.fit_hints import What, fit_hint
from chatphase.engine.prompting.chat_format import Render


class PromptTooLong(Exception):
    """The newest message alone (with the system prompt) does not fit the context; ``str`` says by how much."""


@dataclass(frozen=True)
class FittedPrompt:
    """The token list to evaluate, the templated text it stands for, and how many of the oldest
    messages were left out to fit ``n_ctx``."""

    tokens: list[int]
    dropped_messages: int
    text: str = ""
    add_special: bool = False
    full_tokens: int | None = None  # the prompt's length before this fit dropped anything (None: none dropped)
    full_ids: tuple[int, ...] = ()  # those ``full_tokens`` tokens (the token view's left-out ones are among them)


Encode = Callable[[str, bool], list[int]]
"""``(templated text, add_special) -> token ids`` of the prompt (the engine's may reuse cached tokens)."""


class ChatTemplate:
    """Renders ``Message`` lists in a chat format and tokenises them.

    Args:
        render: the format's :data:`~chatphase.engine.prompting.chat_format.Render` function.
        tokenize: ``(text, add_special) -> token ids`` of the loaded model, parsing special tokens.
    """

    def __init__(self, render: Render, tokenize: Callable[[str, bool], list[int]]):
        self._render = render
        self._tokenize = tokenize

    def render(self, messages: Sequence[Message], enable_thinking: bool | None = None) -> tuple[str, bool]:
        """``(text, add_special)``: the templated conversation, ending with the assistant's generation
        prompt, and whether tokenising it should add BOS/EOS (only when the template did not, as
        llama-cpp-python's chat handler does). ``enable_thinking`` goes to templates that take it."""
        return self._render(messages, True, enable_thinking)

    def tokens(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of the templated conversation, ending with the assistant's generation prompt."""
        return self._tokenize(*self.render(messages))

    def fit(
        self,
        messages: Sequence[Message],
        budget_tokens: int,
        encode: Encode | None = None,
        enable_thinking: bool | None = None,
        skip: int = 0,
        low_water: int | None = None,
        drop: bool = True,
    ) -> FittedPrompt:
        """Drop the oldest non-system messages until the prompt is at most ``budget_tokens`` long.

        Messages are dropped in order (oldest first) but a leading system message is kept, and the
        conversation always starts at a user message after dropping. ``encode`` turns the templated
        text into the tokens that will be evaluated (default: the whole text tokenised), so the
        budget counts exactly those. ``skip``: the oldest non-system messages already left out (they stay
        out; counted in ``dropped_messages``). ``low_water``: once it must drop, drop until the prompt is at
        most this long (the last exchange and the new message stay if they fit the budget). ``drop=False``: drop nothing.

        Raises:
            PromptTooLong: when the system prompt plus the newest message alone exceed the budget, or
                (``drop=False``) the conversation does.
        """
        system = [m for m in messages[:1] if m.role == "system"]
        rest = list(messages[len(system) :])
        skip = min(skip, max(0, len(rest) - 1))
        del rest[:skip]
        while len(rest) > 1 and rest[0].role != "user":  # an edit may leave a reply first
            rest.pop(0)
            skip += 1
        encode = encode or self._tokenize
        dropped, target, full = skip, budget_tokens, None
        full_ids: tuple[int, ...] = ()
        while True:
            text, add_special = self.render(system + rest, enable_thinking)
            tokens = encode(text, add_special)
            if len(tokens) <= target or (full is not None and len(tokens) <= budget_tokens and len(rest) <= 3):
                return FittedPrompt(tokens, dropped, text, add_special, full, full_ids)
            if len(rest) <= 1 or not drop:
                what: What = "message" if len(rest) <= 1 else "conversation"
                raise PromptTooLong(
                    f"the {what} is {len(tokens):,} tokens with the template; the context leaves room for "
                    f"{budget_tokens:,} ({fit_hint(what)})"
                )
            if full is None:
                full_ids = tuple(tokens)
                full, target = len(tokens), min(budget_tokens, low_water if low_water is not None else budget_tokens)
            rest.pop(0)
            dropped += 1
            while len(rest) > 1 and rest[0].role != "user":
                rest.pop(0)
                dropped += 1
