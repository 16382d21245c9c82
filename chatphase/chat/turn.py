"""One turn of a chat as the controller follows it: what was asked, and its live figures.

The live decode figures come from the engine's own token timestamps (``FirstToken.t_ns``,
``TokensDecoded.t_ns``), so a view that redraws at a bounded rate shows the engine's rate, not its own.
A reasoning model's reply comes split (:mod:`chatphase.engine.thinking`): ``thinking`` is the thinking
block's text, ``reply`` the answer's; the block is one phase of decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from chatphase.engine.events import (
    FirstToken,
    PrefillProgress,
    PrefillStarted,
    SpecLive,
    ThinkingEnded,
    TokensDecoded,
    TurnRequest,
)
from chatphase.engine.metrics import NS_PER_S, decode_rates

TurnKind = Literal["send", "regenerate", "resend"]
"""``send``: a new user message; ``regenerate``: the last reply again; ``resend``: an edited last message."""


@dataclass
class Turn:
    """A turn in flight.

    ``turn_id`` is unique for the controller's life (it tags the engine's events); ``number`` counts the
    turns of this chat from 1 (a new chat starts again at 1). ``position`` is the index of the turn's
    user message among the conversation's user messages (0 for the first): the turns after it were taken
    back. ``user`` is that message's text.
    """

    turn_id: int
    number: int
    kind: TurnKind
    user: str
    position: int
    request: TurnRequest
    prefill: PrefillStarted | None = None
    progress: PrefillProgress | None = None
    decode_tokens: int = 0
    t_first_ns: int = 0
    t_last_ns: int = 0
    ttft_ms: float | None = None
    error: str | None = None
    thinking_tokens: int = 0
    thinking_ended: ThinkingEnded | None = None
    spec: SpecLive | None = None
    _parts: list[str] = field(default_factory=list, repr=False)
    _thought: list[str] = field(default_factory=list, repr=False)

    def first_token(self, event: FirstToken) -> None:
        self.decode_tokens, self.t_first_ns, self.t_last_ns = 1, event.t_ns, event.t_ns
        self.ttft_ms = event.ttft_ms
        self._add(event.text, event.thinking)
        self.thinking_tokens = 1 if event.thinking else 0

    def decoded(self, event: TokensDecoded) -> None:
        self.decode_tokens, self.t_last_ns = event.decode_tokens, event.t_ns
        if event.spec is not None:
            self.spec = event.spec  # speculative decoding's figures so far
        self._add(event.text, event.thinking)
        self.thinking_tokens = max(self.thinking_tokens, event.thinking_tokens)

    def _add(self, text: str, thinking: str) -> None:
        if text:
            self._parts.append(text)  # per-token work stays an append; joined when asked for
        if thinking:
            self._thought.append(thinking)

    @property
    def reply(self) -> str:
        """The answer text generated so far."""
        return "".join(self._parts)

    @property
    def thinking(self) -> str:
        """The thinking text generated so far (markers removed)."""
        return "".join(self._thought)

    @property
    def thinking_now(self) -> bool:
        """Whether the reply is in its thinking block (it began and has not ended)."""
        return bool(self._thought or self.thinking_tokens) and self.thinking_ended is None

    def thinking_s(self) -> float:
        """Seconds of thinking so far (from the first generated token), on the engine's clock."""
        if self.thinking_ended is not None:
            return self.thinking_ended.thinking_ms / 1000
        return (self.t_last_ns - self.t_first_ns) / NS_PER_S if self.decoding else 0.0

    @property
    def decoding(self) -> bool:
        """Whether the first token has arrived."""
        return self.decode_tokens > 0

    def live_decode_rate(self) -> float | None:
        """Decode tokens/s so far (``docs/metrics.md``: ``(n - 1) / (t_last - t_first)``); ``None`` below 2."""
        return decode_rates(self.decode_tokens, self.t_last_ns - self.t_first_ns)[0]
