"""What an overflow did in one turn of :class:`~chatphase.engine.local.llama.LlamaEngine`, and the room a reply makes.

The engine fills an :class:`Overflow` while it fits the prompt (:func:`overflow_cut`), after it keeps the cache's
prefix and after a reply that made room (:class:`ReplyShift`); its figures go into ``PrefillStarted`` and the
turn's ``TurnMetrics`` (``overflow_*``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatphase.engine.events import CountRequest, Message, TurnRequest
from chatphase.engine.local import kv_shift
from chatphase.engine.local.kv_context import KvContext
from chatphase.engine.metrics import TurnMetrics, ns_to_ms
from chatphase.engine.prompting.prompt import FittedPrompt


@dataclass
class Overflow:
    """``policy`` (``drop-oldest`` / ``shift``) dropped ``dropped_messages`` more messages (``dropped_tokens`` of
    prompt) this turn; ``cache_before`` tokens were cached then; ``kept_bytes`` where the kept history ends in the
    new prompt's text (``None``: not located); ``shifted`` whether the cache was shifted in place (in
    ``shift_ms``); ``reprefill`` the kept history's tokens evaluated again (mid-reply ones included, timed
    apart); ``left_out_ids`` the ``dropped_tokens`` themselves (the token view)."""

    policy: str
    dropped_messages: int
    dropped_tokens: int = 0
    cache_before: int = 0
    kept_bytes: int | None = None
    shifted: bool = False
    shift_ms: float = 0.0
    reprefill: int = 0
    reply_reprefill_tokens: int = 0  # of ``reprefill``, those evaluated again mid-reply (drop-oldest)
    reply_reprefill_ms: float = 0.0
    left_out_ids: list[int] = field(default_factory=list)

    def count_reprefill(
        self, prompt: Sequence[int], render: kv_shift.Render, text: bytes, cached: int, restored: bool
    ) -> None:
        """Set ``reprefill``: the kept history's tokens of ``prompt`` (spelling ``text``) evaluated again although
        the cache held them before the turn (:func:`~chatphase.engine.local.kv_shift.reprefill_tokens` past the
        ``cached`` ones). 0 when the cache held nothing before (``cache_before``: a resume, a new engine) or a
        restore from the prefix store supplied the prefix: the tokens after it were never in the cache, and the
        new message's never are."""
        if restored or not self.cache_before:
            self.reprefill = 0
        else:
            self.reprefill = kv_shift.reprefill_tokens(prompt, render, text, cached, self.kept_bytes)

    def add_reply_room(self, room: ReplyShift) -> None:
        """Count what a reply that went on past n_ctx dropped (``room``, :class:`ReplyShift`) and evaluated again."""
        self.dropped_messages += room.dropped_messages
        self.dropped_tokens += room.dropped_tokens
        self.left_out_ids += room.dropped_ids
        self.reprefill += room.reprefill_tokens
        self.reply_reprefill_tokens, self.reply_reprefill_ms = room.reprefill_tokens, room.reprefill_ms

    def fields(self) -> dict[str, Any]:
        """``PrefillStarted``'s overflow fields."""
        return {
            "overflow": self.policy,
            "overflow_dropped_messages": self.dropped_messages,
            "overflow_dropped_tokens": self.dropped_tokens,
            "overflow_reprefill_tokens": self.reprefill,
        }

    def metrics_fields(self, m: TurnMetrics) -> dict[str, Any]:
        """``TurnMetrics``' overflow fields; the re-prefill's time is its tokens' share of ``prefill_ms``."""
        prompt_part = self.reprefill - self.reply_reprefill_tokens
        share = prompt_part / m.prefill_tokens if m.prefill_tokens else 0.0
        return self.fields() | {"overflow_reprefill_ms": (m.prefill_ms or 0.0) * share + self.reply_reprefill_ms}


def overflow_cut(req: TurnRequest | CountRequest, fitted: FittedPrompt, n_messages: int, kv: KvContext) -> Overflow:
    """An overflow at the start of a turn (``fitted`` dropped messages from the ``n_messages`` non-system ones):
    where the dropped messages lie in the cache (``kv``'s tokens and text record) and, under ``shift``, take them
    out of it in place (:meth:`~chatphase.engine.local.kv_context.KvContext.shift_out`). A
    :meth:`~chatphase.engine.local.kv_context.KvContext.what_if` copy: a count of what the turn's cut would
    leave, llama.cpp untouched."""
    ovf = Overflow(req.overflow, fitted.dropped_messages - min(req.overflow_from, n_messages - 1))
    ovf.dropped_tokens = max(0, (fitted.full_tokens or 0) - len(fitted.tokens))
    vocab = kv.vocab
    ovf.left_out_ids = left_out(
        fitted.full_ids, fitted.tokens, ovf.dropped_tokens, lambda t: vocab.is_special(t) and not vocab.is_eog(t)
    )
    ovf.cache_before = len(kv.tokens)
    cut = None
    if kv.known.n_tokens == len(kv.tokens):
        cut = kv_shift.plan_cut(kv.tokens, kv.known.text, kv.vocab.render, fitted.text.encode("utf-8"))
    if cut is None:
        return ovf
    ovf.kept_bytes = len(cut.text)
    if req.overflow == "shift":
        t0 = time.perf_counter_ns()
        if kv.shift_out(cut.start, cut.end):
            ovf.shifted, ovf.shift_ms = True, ns_to_ms(time.perf_counter_ns() - t0)
            kv.known.clear()
            if kv.tokens:
                kv.known.add_prompt(len(kv.tokens), cut.text)
    return ovf


def left_out(
    full: Sequence[int], fitted: Sequence[int], n: int, opens_message: Callable[[int], bool] = lambda token: False
) -> list[int]:
    """The ``n`` tokens of the prompt before the fit (``full``) that the fitted prompt lacks. Every cut that leaves
    ``fitted`` lies between the end of the prefix both share (the system prompt, and the next message's header
    where the dropped one has the same) and the start of the suffix both share; the first token in that range that
    ``opens_message`` (a chat template's header token: special, not end-of-generation) starts the cut, so that the
    dropped messages start with their header; else the earliest cut. Where no cut leaves ``fitted`` exactly (the
    text was tokenised otherwise), the one after the shared prefix."""
    prefix = 0
    for a, b in zip(full, fitted, strict=False):
        if a != b:
            break
        prefix += 1
    suffix = 0
    for a, b in zip(reversed(full), reversed(fitted), strict=False):
        if a != b or suffix >= len(fitted):
            break
        suffix += 1
    last = max(0, len(full) - n)
    low, high = max(0, len(full) - n - suffix), min(prefix, last)
    start = next((s for s in range(low, high + 1) if opens_message(full[s])), low) if low <= high else high
    return list(full[start : start + n])


class ReplyShift:
    """Room for a reply that reached ``n_ctx``: the oldest whole exchanges before the newest message leave the
    KV cache (:func:`~chatphase.engine.local.kv_shift.locate_cut` on the prompt's text), so the reply goes on;
    the newest message and the reply so far stay. Under ``shift`` the rest moves down in place
    (:meth:`~chatphase.engine.local.kv_context.KvContext.shift_out`); under ``drop-oldest`` everything after the
    cut is evaluated again, ``n_batch`` at a time (``reprefill_tokens``, ``reprefill_ms``). Call it when the cache
    is full; ``False``: nothing is left to drop (the reply stops at ``context_full``).

    Args:
        kv: the context and its record (cut in place).
        render_prompt: ``messages -> templated text`` with the generation prompt (the engine's template).
        messages: the prompt's messages (a leading system message kept); text: the prompt's templated text.
        prompt_len: the prompt's tokens at the start of the cache.
        reprefill: drop-oldest (evaluate the kept tokens again), not a shift.
    """

    def __init__(
        self,
        kv: KvContext,
        render_prompt: Callable[[Sequence[Message]], str],
        messages: Sequence[Message],
        text: bytes,
        prompt_len: int,
        reprefill: bool,
    ) -> None:
        self._kv, self._render_prompt, self._reprefills = kv, render_prompt, reprefill
        self._system = list(messages[:1]) if messages and messages[0].role == "system" else []
        self._rest = list(messages[len(self._system) :])
        self.text, self.prompt_len = text, prompt_len
        self.dropped_messages = self.dropped_tokens = self.reprefill_tokens = 0
        self.dropped_ids: list[int] = []  # the ``dropped_tokens`` themselves, in the order they left
        self.shift_ms = self.reprefill_ms = 0.0

    @classmethod
    def for_turn(
        cls,
        req: TurnRequest,
        kv: KvContext,
        messages: Sequence[Message],
        dropped: int,
        render_prompt: Callable[[Sequence[Message]], str],
        text: bytes,
    ) -> ReplyShift | None:
        """The one for this turn, whose prompt (spelling ``text``) the cache holds whole (its ``dropped`` oldest
        non-system ``messages`` left out), or ``None`` under ``stop`` and under ``shift`` on a model that cannot
        shift (the reply then stops at ``context_full``)."""
        if req.overflow == "stop" or (req.overflow == "shift" and kv.shift_refusal is not None):
            return None
        system = list(messages[:1]) if messages and messages[0].role == "system" else []
        kept = system + list(messages[len(system) :])[dropped:]
        return cls(kv, render_prompt, kept, text, len(kv.tokens), req.overflow != "shift")

    def __call__(self) -> bool:
        kv = self._kv
        offsets = kv_shift.token_offsets(kv.tokens[: self.prompt_len], kv.vocab.render, self.text)
        if offsets is None:
            return False
        users = [j for j, m in enumerate(self._rest) if m.role == "user" and j > 0]
        best: tuple[int, kv_shift.Cut] | None = None
        for j in users:
            new_text = self._render_prompt(self._system + self._rest[j:]).encode("utf-8")
            cut = kv_shift.locate_cut(self.text, offsets, new_text, fallback=False)
            if cut is None:
                continue
            best = (j, cut)
            if cut.end - cut.start >= kv.n_ctx // 4:
                break
        if best is None:
            return False
        j, cut = best
        gone = kv.tokens[cut.start : cut.end]
        t0 = time.perf_counter_ns()
        if self._reprefills:
            if not self._reprefill(cut.start, cut.end):
                return False
            self.reprefill_ms += (time.perf_counter_ns() - t0) / 1e6
        elif not kv.shift_out(cut.start, cut.end):
            return False
        else:
            self.shift_ms += (time.perf_counter_ns() - t0) / 1e6
        freed = cut.end - cut.start
        self.prompt_len -= freed
        self.text = cut.text
        del self._rest[:j]
        self.dropped_messages += j
        self.dropped_tokens += freed
        self.dropped_ids += gone
        return True

    def _reprefill(self, start: int, end: int) -> bool:
        """Drop cache tokens from ``start`` on and evaluate those after ``end`` again (drop-oldest)."""
        kv = self._kv
        tail = kv.tokens[end:]
        if not kv.drop_after(start):
            return False
        for i in range(0, len(tail), kv.n_batch):
            chunk = tail[i : i + kv.n_batch]
            if not kv.decode(chunk):
                return False
            kv.tokens.extend(chunk)
        self.reprefill_tokens += len(tail)
        return True
