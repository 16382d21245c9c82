"""What an overflow did in one turn of :class:`~chatphase.engine.local.llama.LlamaEngine`, and the sliding-window check.

The engine fills an :class:`Overflow` while it fits the prompt (``_overflow_cut``) and after it keeps the cache's
prefix; its figures go into ``PrefillStarted`` and the turn's ``TurnMetrics`` (``overflow_*``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp as lc

from chatphase.engine.events import CountRequest, LoadedModel, Message, TurnRequest
from chatphase.engine.local import kv_shift
from chatphase.engine.local.prefix import CacheText
from chatphase.engine.metrics import TurnMetrics, ns_to_ms
from chatphase.engine.prompting.prompt import FittedPrompt


@dataclass
class Overflow:
    """``policy`` (``drop-oldest`` / ``shift``) dropped ``dropped_messages`` more messages (``dropped_tokens`` of
    prompt) this turn; ``cache_before`` tokens were cached then; ``kept_bytes`` where the kept history ends in the
    new prompt's text (``None``: not located); ``shifted`` whether the cache was shifted in place (in
    ``shift_ms``); ``reprefill`` the kept history's tokens evaluated again (mid-reply ones included, timed
    apart)."""

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


def overflow_cut(
    req: TurnRequest | CountRequest,
    fitted: FittedPrompt,
    n_messages: int,
    mem: lc.llama_memory_t | None,
    cache: list[int],
    known: CacheText,
    render: Callable[[int], bytes],
) -> Overflow:
    """An overflow at the start of a turn (``fitted`` dropped messages from the ``n_messages`` non-system ones):
    where the dropped messages lie in the cache (``cache``, its text record ``known``) and, under ``shift``, take
    them out of it in place (:mod:`chatphase.engine.local.kv_shift`; ``cache`` and ``known`` follow). ``mem=None``
    and copies of ``cache`` and ``known``: a count of what the turn's cut would leave, llama.cpp untouched."""
    ovf = Overflow(req.overflow, fitted.dropped_messages - min(req.overflow_from, n_messages - 1))
    ovf.dropped_tokens = max(0, (fitted.full_tokens or 0) - len(fitted.tokens))
    ovf.cache_before = len(cache)
    cut = None
    if known.n_tokens == len(cache):
        cut = kv_shift.plan_cut(cache, known.text, render, fitted.text.encode("utf-8"))
    if cut is None:
        return ovf
    ovf.kept_bytes = len(cut.text)
    if req.overflow == "shift":
        t0 = time.perf_counter_ns()
        if kv_shift.shift_out(mem, cache, cut.start, cut.end):
            ovf.shifted, ovf.shift_ms = True, ns_to_ms(time.perf_counter_ns() - t0)
            known.clear()
            if cache:
                known.add_prompt(len(cache), cut.text)
    return ovf


def swa_trim_refusal(mem: lc.llama_memory_t, model: lc.llama_model_p | None, keep: int) -> str | None:
    """``"swa"`` when a sliding-window cache no longer holds the cells that tokens after ``keep`` would attend
    to (its oldest position is past ``keep - n_swa``, llama-server's test), else ``None``. With llama.cpp's
    default full-size SWA cache (``swa_full``) nothing is evicted and this never refuses."""
    n_swa = lc.llama_model_n_swa(model) if model else 0
    if n_swa <= 0:
        return None
    pos_min = lc.llama_memory_seq_pos_min(mem, 0)
    return "swa" if pos_min > max(0, keep - n_swa) else None


class ReplyShift:
    """Room for a reply that reached ``n_ctx``: the oldest whole exchanges before the newest message leave the
    KV cache (:func:`~chatphase.engine.local.kv_shift.locate_cut` on the prompt's text), so the reply goes on;
    the newest message and the reply so far stay. Under ``shift`` the rest moves down in place
    (:func:`~chatphase.engine.local.kv_shift.shift_out`); under ``drop-oldest`` (``decode`` given) everything
    after the cut is evaluated again, ``n_batch`` at a time (``reprefill_tokens``, ``reprefill_ms``). Call it when
    the cache is full; ``False``: nothing is left to drop (the reply stops at ``context_full``).

    Args:
        mem / cache: llama.cpp's memory and the engine's token list mirroring it (cut in place).
        render_token: a token's bytes (control tokens as text).
        render_prompt: ``messages -> templated text`` with the generation prompt (the engine's template).
        messages: the prompt's messages (a leading system message kept); text: the prompt's templated text.
        prompt_len: the prompt's tokens at the start of ``cache``; n_ctx: the context's size.
        decode: ``tokens -> ok`` evaluating after the cache (drop-oldest), ``None`` for a shift; n_batch its chunk.
    """

    def __init__(
        self,
        mem: lc.llama_memory_t,
        cache: list[int],
        render_token: Callable[[int], bytes],
        render_prompt: Callable[[Sequence[Message]], str],
        messages: Sequence[Message],
        text: bytes,
        prompt_len: int,
        n_ctx: int,
        decode: Callable[[list[int]], bool] | None = None,
        n_batch: int = 512,
    ) -> None:
        self._mem, self._cache, self._render_token, self._render_prompt = mem, cache, render_token, render_prompt
        self._system = list(messages[:1]) if messages and messages[0].role == "system" else []
        self._rest = list(messages[len(self._system) :])
        self.text, self.prompt_len, self._n_ctx = text, prompt_len, n_ctx
        self._decode, self._n_batch = decode, n_batch
        self.dropped_messages = self.dropped_tokens = self.reprefill_tokens = 0
        self.shift_ms = self.reprefill_ms = 0.0

    @classmethod
    def for_turn(
        cls,
        req: TurnRequest,
        loaded: LoadedModel,
        messages: Sequence[Message],
        dropped: int,
        render_prompt: Callable[[Sequence[Message]], str],
        text: bytes,
        mem: lc.llama_memory_t,
        cache: list[int],
        render_token: Callable[[int], bytes],
        prompt_len: int,
        n_ctx: int,
        decode: Callable[[list[int]], bool],
        n_batch: int,
    ) -> ReplyShift | None:
        """The one for this turn (its ``dropped`` oldest non-system ``messages`` left out), or ``None`` under
        ``stop`` and under ``shift`` on a model that cannot shift (the reply then stops at ``context_full``)."""
        if req.overflow == "stop" or (req.overflow == "shift" and loaded.kv_shift_refusal is not None):
            return None
        system = list(messages[:1]) if messages and messages[0].role == "system" else []
        kept = system + list(messages[len(system) :])[dropped:]
        step = None if req.overflow == "shift" else decode
        return cls(mem, cache, render_token, render_prompt, kept, text, prompt_len, n_ctx, step, n_batch)

    def __call__(self) -> bool:
        offsets = kv_shift.token_offsets(self._cache[: self.prompt_len], self._render_token, self.text)
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
            if cut.end - cut.start >= self._n_ctx // 4:
                break
        if best is None:
            return False
        j, cut = best
        t0 = time.perf_counter_ns()
        if self._decode is not None:
            if not self._reprefill(cut.start, cut.end):
                return False
            self.reprefill_ms += (time.perf_counter_ns() - t0) / 1e6
        elif not kv_shift.shift_out(self._mem, self._cache, cut.start, cut.end):
            return False
        else:
            self.shift_ms += (time.perf_counter_ns() - t0) / 1e6
        freed = cut.end - cut.start
        self.prompt_len -= freed
        self.text = cut.text
        del self._rest[:j]
        self.dropped_messages += j
        self.dropped_tokens += freed
        return True

    def _reprefill(self, start: int, end: int) -> bool:
        """Drop cache tokens from ``start`` on and evaluate those after ``end`` again (drop-oldest)."""
        assert self._decode is not None
        tail = self._cache[end:]
        if not lc.llama_memory_seq_rm(self._mem, 0, start, -1):
            return False
        del self._cache[start:]
        for i in range(0, len(tail), self._n_batch):
            chunk = tail[i : i + self._n_batch]
            if not self._decode(chunk):
                return False
            self._cache.extend(chunk)
        self.reprefill_tokens += len(tail)
        return True
