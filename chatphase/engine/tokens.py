"""A turn's tokens as the model saw and wrote them (``TurnFinished.tokens``): the record of the token view.

The prompt is one tuple of ids cut into consecutive spans by where each token came from this turn: restored from
the disk prefix store, reused from the KV cache, prefilled now, left unevaluated (a cancel between chunks). The
tokens an overflow left out of the prompt this turn (dropped, or shifted out of the cache) are a list beside it.
The reply is its sampled ids with their sampling times, the accepted draft tokens and the speculative steps.

The spans are cut from the very values :func:`~chatphase.engine.metrics.compute_turn_metrics` is given, so that
:meth:`TurnTokens.counts` equals the turn's metrics by construction (:meth:`TurnTokens.metric_counts`). Arrays of
ints and a few bounds, never an object per token: it crosses the engine's process pipe after every turn.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from chatphase.engine.metrics import TurnMetrics, ns_to_ms

#: where a prompt token came from this turn, in prompt order; ``dropped`` / ``shifted`` are the tokens an
#: overflow left out (under ``drop-oldest`` / ``shift``), which are not in the prompt.
Source = Literal["restored", "cached", "prefilled", "unevaluated", "dropped", "shifted"]
SOURCES: tuple[Source, ...] = ("restored", "cached", "prefilled", "unevaluated", "dropped", "shifted")


@dataclass(frozen=True)
class Piece:
    """One vocabulary entry as llama.cpp renders it: ``text`` (its bytes as UTF-8; a byte that is part of a
    character split across tokens as ``\\xNN``), ``special`` a control or user-defined token (a chat template's
    marker such as ``<|im_start|>``, ``llama_vocab_get_attr``)."""

    text: str
    special: bool


@dataclass(frozen=True)
class TurnTokens:
    """One turn's tokens.

    ``prompt_ids``: the prompt as evaluated, in position order; its first ``restored`` came from the prefix
    store, up to ``cached`` (restored included) were reused from the KV cache, the next ``prefilled`` were evaluated
    this turn and any after them never were (the turn was cancelled during the prefill). ``left_out_ids``: the
    tokens an overflow took out of the conversation this turn (``left_out_how``: ``dropped`` or ``shifted``).
    ``reply_ids`` / ``reply_t_ns``: each generated token and when it was sampled, in ns since the turn was
    submitted (TTFT is the first, each ITL the gap to the one before). ``reply_accepted``: indices into
    ``reply_ids`` of accepted draft tokens; ``spec_steps``: ``(first reply index, drafted, accepted)`` per
    speculative step (empty for plain decode). ``pieces``: every id above, rendered. ``thinking_tokens``: the
    reply's first tokens that are a reasoning model's thinking block, its markers included (the metrics'
    ``thinking_tokens``; 0 without one).

    The id and time lists are given as any sequence of ints and kept as ``array`` (4 bytes a token id, 8 a
    time: a chat keeps every turn's, and a 20,000-token prompt is 80 KB, not 720 KB of ``int`` objects).
    """

    prompt_ids: Sequence[int]
    restored: int
    cached: int
    prefilled: int
    left_out_ids: Sequence[int] = ()
    left_out_how: Literal["dropped", "shifted"] = "dropped"
    reply_ids: Sequence[int] = ()
    reply_t_ns: Sequence[int] = ()
    reply_accepted: Sequence[int] = ()
    spec_steps: tuple[tuple[int, int, int], ...] = ()
    pieces: dict[int, Piece] = field(default_factory=dict)
    thinking_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("prompt_ids", "left_out_ids", "reply_ids", "reply_accepted"):
            object.__setattr__(self, name, array("i", getattr(self, name)))
        object.__setattr__(self, "reply_t_ns", array("q", self.reply_t_ns))
        object.__setattr__(self, "spec_steps", tuple(tuple(s) for s in self.spec_steps))
        n = len(self.prompt_ids)
        if not 0 <= self.restored <= self.cached <= self.cached + self.prefilled <= n:
            raise ValueError(f"spans out of order: {self.restored}/{self.cached}/{self.prefilled} of {n}")
        if len(self.reply_ids) != len(self.reply_t_ns):
            raise ValueError("one time per reply token")
        if not 0 <= self.thinking_tokens <= len(self.reply_ids):
            raise ValueError(f"{self.thinking_tokens} thinking tokens of a {len(self.reply_ids)}-token reply")

    # -- the prompt ------------------------------------------------------------------------------
    def spans(self) -> list[tuple[int, int, Source]]:
        """The prompt's ``(start, end, source)`` runs in position order, empty ones left out."""
        a, b, c = self.restored, self.cached, self.cached + self.prefilled
        runs: list[tuple[int, int, Source]] = [
            (0, a, "restored"),
            (a, b, "cached"),
            (b, c, "prefilled"),
            (c, len(self.prompt_ids), "unevaluated"),
        ]
        return [r for r in runs if r[1] > r[0]]

    def source(self, position: int) -> Source:
        """Where prompt token ``position`` came from."""
        for start, end, src in self.spans():
            if start <= position < end:
                return src
        raise IndexError(position)

    def counts(self) -> dict[Source, int]:
        """Tokens per source: the prompt's spans and the overflow's left-out tokens."""
        out: dict[Source, int] = dict.fromkeys(SOURCES, 0)
        for start, end, src in self.spans():
            out[src] += end - start
        out[self.left_out_how] += len(self.left_out_ids)
        return out

    # -- the reply -------------------------------------------------------------------------------
    def t_ms(self, i: int) -> float:
        """Reply token ``i``'s sampling time, ms since the turn was submitted."""
        return ns_to_ms(self.reply_t_ns[i])

    def itl_ms(self, i: int) -> float | None:
        """The gap before reply token ``i`` (``None`` for the first: its time is the TTFT)."""
        return ns_to_ms(self.reply_t_ns[i] - self.reply_t_ns[i - 1]) if i > 0 else None

    def thinking(self, i: int) -> bool:
        """Whether reply token ``i`` is in the thinking block."""
        return i < self.thinking_tokens

    @property
    def spec_drafted(self) -> int:
        return sum(d for _, d, _ in self.spec_steps)

    @property
    def spec_accepted(self) -> int:
        return sum(a for _, _, a in self.spec_steps)

    def text(self, token: int) -> str:
        """Token ``token``'s piece (``""`` for an id the record does not hold)."""
        piece = self.pieces.get(token)
        return piece.text if piece else ""

    def special(self, token: int) -> bool:
        piece = self.pieces.get(token)
        return bool(piece and piece.special)

    # -- against the metrics ---------------------------------------------------------------------
    def view_counts(self) -> dict[str, int]:
        """The counts the token view shows, under the names of :class:`TurnMetrics`' fields."""
        c = self.counts()
        return {
            "prompt_tokens": len(self.prompt_ids),
            "cached_tokens": self.cached,
            "restored_tokens": c["restored"],
            "prefill_tokens": c["prefilled"],
            "overflow_dropped_tokens": len(self.left_out_ids),
            "decode_tokens": len(self.reply_ids),
            "spec_drafted": self.spec_drafted,
            "spec_accepted": self.spec_accepted,
        }

    @staticmethod
    def metric_counts(m: TurnMetrics) -> dict[str, int]:
        """The same counts read from the turn's metrics (an absent figure is 0: nothing restored, dropped…)."""
        return {
            "prompt_tokens": m.prompt_tokens or 0,
            "cached_tokens": m.cached_tokens or 0,
            "restored_tokens": m.restored_tokens or 0,
            "prefill_tokens": m.prefill_tokens or 0,
            "overflow_dropped_tokens": m.overflow_dropped_tokens or 0,
            "decode_tokens": m.decode_tokens or 0,
            "spec_drafted": m.spec_drafted or 0,
            "spec_accepted": m.spec_accepted or 0,
        }
