"""One turn of a chat as the controller follows it: what was asked, and its live figures.

The live decode figures come from the engine's own token timestamps (``FirstToken.t_ns``,
``TokensDecoded.t_ns``), so a view that redraws at a bounded rate shows the engine's rate, not its own.
A reasoning model's reply comes split (:mod:`chatphase.engine.prompting.thinking`): ``thinking`` is the thinking
block's text, ``reply`` the answer's; the block is one phase of decode.

The turn is the one place its text accumulates while it streams: the views and the session recording
read :attr:`Turn.reply` and :attr:`Turn.thinking` and keep only offsets into them.
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
from chatphase.engine.metrics import NS_PER_MS, NS_PER_S, TurnMetrics, decode_rates, rate_per_s
from chatphase.timing.ttft_prediction import TtftPrediction, remaining_ms

TurnKind = Literal["send", "regenerate", "resend"]
"""``send``: a new user message; ``regenerate``: the last reply again; ``resend``: an edited last message."""


@dataclass
class Turn:
    """A turn in flight.

    ``turn_id`` is unique for the controller's life (it tags the engine's events and nothing else);
    ``number`` counts the turns of this chat from 1 (a new chat starts again at 1) and is the turn's one
    identity in the views ("Turn 3" in the panel, the dashboard's row). ``position`` is the index of the
    turn's user message among the conversation's user messages (0 for the first): the turns after it were
    taken back. ``user`` is that message's text. ``reply_chars``: the length of :attr:`reply` (kept as
    tokens arrive, so per-token work never joins the text).
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
    reply_chars: int = 0
    #: the turn's one TTFT prediction (made when its message was counted, else when its prefill began)
    ttft_prediction: TtftPrediction | None = None
    #: the user ended it otherwise than with Esc (a restart, a model switch, quitting): cancelled, not an error
    ended_by_user: bool = False
    _parts: list[str] = field(default_factory=list, repr=False)
    _thought: list[str] = field(default_factory=list, repr=False)

    def ttft_left_ms(self) -> float | None:
        """Time left to the first token while the prefill runs (:func:`~chatphase.timing.ttft_prediction.
        remaining_ms`: the turn's prediction corrected by the chunks done); ``None`` before the prefill or
        without a prediction."""
        if self.prefill is None:
            return None
        p = self.progress
        done, elapsed = (p.done_tokens, p.elapsed_ms) if p is not None else (0, 0.0)
        return remaining_ms(self.ttft_prediction, done, elapsed)

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
            self.reply_chars += len(text)
        if thinking:
            self._thought.append(thinking)

    @property
    def reply(self) -> str:
        """The answer text generated so far (the same object until more arrives)."""
        return _joined(self._parts)

    @property
    def thinking(self) -> str:
        """The thinking text generated so far (markers removed; the same object until more arrives)."""
        return _joined(self._thought)

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

    @property
    def budget_reached(self) -> bool:
        """Whether the engine closed the thinking block at the thinking budget."""
        return self.thinking_ended is not None and self.thinking_ended.forced

    def metrics_so_far(self) -> TurnMetrics | None:
        """The figures of a turn that ended without its result (its engine stopped or was replaced), as
        its events measured them: prompt and cached tokens, the prefill done and its time, TTFT, the decode
        tokens and their rate (the tokens delivered so far), the thinking block. What only the engine's
        end of the turn reports (ITL, the KV cache) is ``None``; ``stop_reason="error"`` (``"cancelled"`` when
        :attr:`ended_by_user`). ``None`` before
        the prefill started (nothing was measured)."""
        pre, progress = self.prefill, self.progress
        if pre is None:
            return None
        if self.decoding:
            prefill_tokens = pre.prefill_tokens
            finished = progress is not None and progress.done_tokens >= progress.total_tokens
            prefill_ms = progress.elapsed_ms if finished and progress is not None else None
        else:
            prefill_tokens = progress.done_tokens if progress is not None else 0
            prefill_ms = progress.elapsed_ms if progress is not None else None
        decode_ns = self.t_last_ns - self.t_first_ns
        decode_tps, tpot_ms = decode_rates(self.decode_tokens, decode_ns)
        thought = self.thinking_tokens or self.thinking_ended is not None
        ended = self.thinking_ended
        thinking_tokens = (ended.thinking_tokens if ended else self.thinking_tokens) if thought else None
        return TurnMetrics(
            prompt_tokens=pre.prompt_tokens,
            cached_tokens=pre.cached_tokens,
            prefill_tokens=prefill_tokens,
            prefill_ms=prefill_ms,
            prefill_tokens_per_s=(
                rate_per_s(prefill_tokens, round(prefill_ms * NS_PER_MS)) if prefill_ms and prefill_tokens else None
            ),
            ttft_ms=self.ttft_ms,
            decode_tokens=self.decode_tokens,
            decode_ms=decode_ns / NS_PER_MS if self.decoding else None,
            decode_tokens_per_s=decode_tps,
            itl_ms_p50=None,
            itl_ms_p95=None,
            itl_ms_max=None,
            kv_cache_tokens=None,
            kv_bytes_per_token=None,
            kv_cache_bytes=None,
            kv_capacity_bytes=None,
            stop_reason="cancelled" if self.ended_by_user else "error",
            tokenize_ms=None,
            tpot_ms=tpot_ms,
            dropped_messages=pre.dropped_messages,
            thinking_tokens=thinking_tokens,
            thinking_ms=self.thinking_s() * 1000 if thought else None,
            thinking_cut_short=bool(thought) and ended is None,
            answer_tokens=self.decode_tokens - thinking_tokens if thinking_tokens is not None else None,
            n_threads_prefill=pre.n_threads_prefill,
            n_threads_decode=pre.n_threads_decode,
            threads_reason=pre.threads_reason,
            restored_tokens=pre.restored_tokens,
            restore_ms=pre.restore_ms,
            restore_bytes=pre.restore_bytes,
        )


def _joined(parts: list[str]) -> str:
    """The text of ``parts``, which then holds it as one piece: the text is held once, and reading it
    again before more arrives costs nothing."""
    if len(parts) > 1:
        parts[:] = ["".join(parts)]
    return parts[0] if parts else ""
