"""Chat templating and fitting a conversation into the context window.

The template is the model's own (``tokenizer.chat_template`` in the GGUF), rendered by llama-cpp-python's
``Jinja2ChatFormatter`` in Jinja's immutable sandbox (CVE-2024-34359 was the unsandboxed case). Models
without one fall back to ChatML, llama.cpp's own default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from chatphase.engine.events import Message

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class PromptTooLong(Exception):
    """The newest message alone (with the system prompt) does not fit the context; ``str`` says by how much."""


@dataclass(frozen=True)
class FittedPrompt:
    """The token list to evaluate, the templated text it stands for, and how many of the oldest
    messages were left out to fit ``n_ctx``."""

    tokens: list[int]
    dropped_messages: int
    text: str = ""


Encode = Callable[[str, bool], list[int]]
"""``(templated text, add_special) -> token ids`` of the prompt (the engine's may reuse cached tokens)."""


class ChatTemplate:
    """Renders ``Message`` lists with the model's template and tokenises them.

    Args:
        template: Jinja source (``None`` -> ChatML).
        bos_token / eos_token: the special tokens' text, passed to the template.
        tokenize: ``(text, add_special) -> token ids`` of the loaded model, parsing special tokens.
    """

    def __init__(
        self, template: str | None, bos_token: str, eos_token: str, tokenize: Callable[[str, bool], list[int]]
    ):
        self.source = template or CHATML_TEMPLATE
        self.is_fallback = template is None
        self._formatter = Jinja2ChatFormatter(self.source, eos_token=eos_token, bos_token=bos_token)
        self._tokenize = tokenize

    def render(self, messages: Sequence[Message]) -> tuple[str, bool]:
        """``(text, add_special)``: the templated conversation, ending with the assistant's generation
        prompt, and whether tokenising it should add BOS/EOS (only when the template did not, as
        llama-cpp-python's chat handler does)."""
        result = self._formatter(messages=[{"role": m.role, "content": m.content} for m in messages])
        return result.prompt, not result.added_special

    def tokens(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of the templated conversation, ending with the assistant's generation prompt."""
        return self._tokenize(*self.render(messages))

    def fit(self, messages: Sequence[Message], budget_tokens: int, encode: Encode | None = None) -> FittedPrompt:
        """Drop the oldest non-system messages until the prompt is at most ``budget_tokens`` long.

        Messages are dropped in order (oldest first) but a leading system message is kept, and the
        conversation always starts at a user message after dropping. ``encode`` turns the templated
        text into the tokens that will be evaluated (default: the whole text tokenised), so the
        budget counts exactly those.

        Raises:
            PromptTooLong: when the system prompt plus the newest message alone exceed the budget.
        """
        system = [m for m in messages[:1] if m.role == "system"]
        rest = list(messages[len(system) :])
        encode = encode or self._tokenize
        dropped = 0
        while True:
            text, add_special = self.render(system + rest)
            tokens = encode(text, add_special)
            if len(tokens) <= budget_tokens:
                return FittedPrompt(tokens, dropped, text)
            if len(rest) <= 1:
                raise PromptTooLong(
                    f"the message is {len(tokens):,} tokens with the template; the context leaves room for "
                    f"{budget_tokens:,} (raise --n-ctx or shorten the message)"
                )
            rest.pop(0)
            dropped += 1
            while len(rest) > 1 and rest[0].role != "user":
                rest.pop(0)
                dropped += 1
