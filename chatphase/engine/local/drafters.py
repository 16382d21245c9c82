"""Drafters for speculative decoding (:mod:`chatphase.engine.local.speculative`) and the ``auto`` policy.

:class:`LookupDrafter` proposes the tokens that followed the most recent earlier occurrence of the last ``n``
tokens of the conversation (llama.cpp's ngram-simple idea); :class:`DraftModel` is a second, small GGUF of the
same vocabulary (checked token for token, :func:`vocab_mismatch`), greedy in its own context;
:class:`AutoPolicy` chooses the draft length from the tokens per ms each length's steps made on this turn.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp as lc

from chatphase.engine.local.llama_params import context_params, model_params, offload_plan
from chatphase.engine.spec_modes import SPEC_WARNING
from chatphase.units import fmt_bytes

#: n-gram length of the lookup and its draft length, chosen by measurement: replaying greedy replies to the
#: prompts of :mod:`chatphase.bench.spec.arms` against the verify-step costs :func:`chatphase.bench.spec.arms.verify_cost`
#: measured on the default model (a step of k + 1 tokens cost 1.4× one at k = 1, 2.0× at 3, 4.3× at 8), n = 4
#: and k = 3 gave the most tokens per unit of step cost on input-grounded prompts without losing on open ones
#: (n = 2…5 × k = 1…8 tried; longer drafts are mostly rejected, shorter n-grams match in the wrong places).
LOOKUP_N = 4
LOOKUP_K = 3
#: a draft model's draft length (its drafts are accepted far more often than lookup's).
DRAFT_K = 6
#: the most tokens a draft may have (the verify batch holds one more).
K_MAX = 16
#: a plain one-token step every this many steps, so that each turn measures its own plain-step cost.
PROBE_EVERY = 32
#: a draft model with at least this share of the target's weight bytes is said not to pay before the first
#: turn: decode reads all the weights once a step, so each drafted token costs about this share of a plain
#: step, and a verify step of k + 1 tokens already costs more than a plain one (1.4× at k = 1, 2.0× at 3 on
#: the default model, :data:`LOOKUP_K`'s note).
DRAFT_MAX_SHARE = 0.5
#: steps after which a turn's measured speed-up (like with like, :class:`~chatphase.engine.metrics.SpeedupTally`)
#: is judged: a draft model's turn under 1 says it did not pay.
JUDGE_STEPS = 16


def can_speculate(model: lc.llama_model_p) -> str | None:
    """Why a llama.cpp ``model`` cannot take speculative decoding (``None`` when it can): recurrent and
    hybrid models keep a state that cannot drop a rejected suffix."""
    if lc.llama_model_is_recurrent(model):
        return "recurrent"
    if lc.llama_model_is_hybrid(model):
        return "hybrid (part recurrent)"
    return None


class LookupDrafter:
    """Prompt-lookup drafts: the tokens that followed the most recent earlier occurrence of the last ``n``
    tokens. The index over the history grows as tokens are appended (one dict entry a token)."""

    def __init__(self, n: int = LOOKUP_N) -> None:
        self.n = n
        self._index: dict[tuple[int, ...], int] = {}
        self._upto = n  # the n-grams ending before this position are indexed

    def reset(self) -> None:
        self._index.clear()
        self._upto = self.n

    def propose(self, hist: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that may follow ``hist`` (its earlier n-grams indexed first); may be empty."""
        n, index = self.n, self._index
        end = len(hist)
        for p in range(self._upto, end):  # n-grams ending at p, before the current one (ending at end)
            index[tuple(hist[p - n : p])] = p
        self._upto = max(self._upto, end)
        if k <= 0 or end <= n:
            return []
        at = index.get(tuple(hist[end - n :]))
        return list(hist[at : at + k]) if at is not None else []


def draft_wont_pay(target_path: str | None, draft_path: str, target_bytes: int, draft_bytes: int) -> str | None:
    """Why a draft model cannot pay before it drafts (:data:`SPEC_WARNING` and one line), ``None`` when it may:
    it is the target's own file, or its weights are at least :data:`DRAFT_MAX_SHARE` of the target's
    (``*_bytes``: ``llama_model_size``)."""
    name = Path(draft_path).name
    try:
        same = target_path is not None and os.path.samefile(target_path, draft_path)
    except OSError:
        same = False
    if same:
        return (
            f"{SPEC_WARNING} the draft model {name} is the target model itself: each drafted token costs a whole "
            "decode step (use --spec lookup, or a much smaller draft model)"
        )
    if target_bytes > 0 and draft_bytes >= DRAFT_MAX_SHARE * target_bytes:
        return (
            f"{SPEC_WARNING} the draft model {name} is not much smaller than the target ({fmt_bytes(draft_bytes)} "
            f"against {fmt_bytes(target_bytes)} of weights): each drafted token costs "
            f"{draft_bytes / target_bytes:.0%} of a decode step"
        )
    return None


class DraftModel:
    """A second GGUF that drafts greedily in its own llama.cpp context (same engine settings as the target).

    Raises:
        RuntimeError: llama.cpp cannot load it, or its vocabulary is not the target's (token for token).
    """

    def __init__(
        self, path: str, settings: dict[str, Any], system_info: str, gpu_ok: bool, target_vocab: lc.llama_vocab_p
    ) -> None:
        plan = offload_plan(settings, system_info, gpu_ok)
        self.path = path
        self._model = lc.llama_model_load_from_file(str(path).encode("utf-8"), model_params(plan))
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load the draft model {path}")
        self._ctx = None
        try:
            why = vocab_mismatch(target_vocab, lc.llama_model_get_vocab(self._model))
            if why:
                raise RuntimeError(f"the draft model {path} cannot draft for this model: {why}")
            if can_speculate(self._model):
                raise RuntimeError(f"the draft model {path} is {can_speculate(self._model)}; it cannot draft")
            self._ctx = lc.llama_init_from_model(self._model, context_params(dict(settings, n_seq_max=1)))
            if not self._ctx:
                raise RuntimeError(f"llama.cpp could not create a context for the draft model {path}")
        except Exception:
            self.close()
            raise
        self._mem = lc.llama_get_memory(self._ctx)
        self._vocab = lc.llama_model_get_vocab(self._model)
        self._n_batch = lc.llama_n_batch(self._ctx)  # n_batch, at most the n_ctx asked for (as the engine's)
        self._n_ctx = lc.llama_n_ctx(self._ctx)
        self._greedy = lc.llama_sampler_init_greedy()
        self._one = (lc.llama_token * 1)()
        self._cache: list[int] = []
        self.size_bytes: int = lc.llama_model_size(self._model)

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        lc.llama_set_n_threads(self._ctx, n_threads, n_threads_batch)

    def reset(self) -> None:
        """Nothing to do between turns: :meth:`propose` keeps the common prefix of its cache."""

    def propose(self, hist: Sequence[int], k: int) -> list[int]:
        """``k`` greedy tokens after ``hist``: the draft context is brought to ``hist`` (its longest common
        prefix kept, the rest evaluated in ``n_batch`` chunks), then ``k`` one-token steps."""
        if k <= 0 or len(hist) + k >= self._n_ctx:
            return []
        cache = self._cache
        keep, limit = 0, min(len(cache), len(hist) - 1)
        while keep < limit and cache[keep] == hist[keep]:
            keep += 1
        if keep < len(cache):
            lc.llama_memory_seq_rm(self._mem, 0, keep, -1)
            del cache[keep:]
        todo = list(hist[keep:])
        for start in range(0, len(todo), self._n_batch):
            chunk = todo[start : start + self._n_batch]
            arr = (lc.llama_token * len(chunk))(*chunk)
            if lc.llama_decode(self._ctx, lc.llama_batch_get_one(arr, len(chunk))) != 0:
                return []
            cache.extend(chunk)
        out: list[int] = []
        one, batch = self._one, lc.llama_batch_get_one(self._one, 1)
        while True:
            token = lc.llama_sampler_sample(self._greedy, self._ctx, -1)
            out.append(token)
            if len(out) == k or lc.llama_vocab_is_eog(self._vocab, token):  # nothing follows the end
                return out
            one[0] = token
            if lc.llama_decode(self._ctx, batch) != 0:
                return out
            cache.append(token)

    def close(self) -> None:
        """Free the context and the model. Idempotent."""
        if getattr(self, "_greedy", None) is not None:
            lc.llama_sampler_free(self._greedy)
            self._greedy = None
        if self._ctx is not None:
            lc.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            lc.llama_model_free(self._model)
            self._model = None


def vocab_mismatch(target: lc.llama_vocab_p, draft: lc.llama_vocab_p) -> str | None:
    """Why vocabulary ``draft`` cannot draft for ``target`` (``llama_vocab`` pointers), ``None`` when each token
    id has the same text (as llama.cpp's ``common_speculative_are_compatible`` asks, but for every token)."""
    n_t, n_d = lc.llama_vocab_n_tokens(target), lc.llama_vocab_n_tokens(draft)
    if n_t != n_d:
        return f"its vocabulary has {n_d:,} tokens, this model's {n_t:,}"
    if lc.llama_vocab_type(target) != lc.llama_vocab_type(draft):
        return "its tokenizer is of another type"
    for special in (lc.llama_vocab_bos, lc.llama_vocab_eos):
        if special(target) != special(draft):
            return "its BOS/EOS tokens differ"
    text = lc.llama_vocab_get_text
    for t in range(n_t):
        if text(target, t) != text(draft, t):
            return f"token {t} differs ({text(target, t)!r} against {text(draft, t)!r})"
    return None


class AutoPolicy:
    """How many tokens to draft next (``auto``): the draft length ``k`` (0 = a plain step) whose steps made the
    most tokens per ms on this turn, measured: for each ``k`` the exponentially averaged tokens a step made
    and its duration (the drafting included), so acceptance and cost are both in the figure, however the
    cost of a verify step grows with ``k``. A ``k`` without :data:`MIN_TRIES` steps yet is tried first
    (plain, then :data:`LOOKUP_K`, then the others); afterwards, every :data:`PROBE_EVERY` steps the ``k``
    measured longest ago gets one step, so that a change in the text (a passage to copy) or the machine
    is seen. The measurements are per decode thread count: a change of the count starts them again (a plain
    step at 2 threads says nothing about a drafted one at 1).
    """

    ALPHA = 0.2
    MIN_TRIES = 2
    PROBE_EVERY = 16

    def __init__(self, k_max: int = 2 * LOOKUP_K) -> None:
        self.k_max = max(1, k_max)
        self._order = [0, min(LOOKUP_K, self.k_max)] + [k for k in range(1, self.k_max + 1) if k != LOOKUP_K]
        self._threads: int | None = None
        self._reset()

    def _reset(self) -> None:
        self.tokens: dict[int, float] = {}  # k -> averaged tokens a step made
        self.ms: dict[int, float] = {}  # k -> averaged step duration
        self.tries: dict[int, int] = dict.fromkeys(self._order, 0)
        self._last_seen: dict[int, int] = dict.fromkeys(self._order, 0)
        self._step = 0

    def rate(self, k: int) -> float | None:
        """Tokens per ms of steps drafting ``k`` (``None`` before one was measured)."""
        ms = self.ms.get(k)
        return self.tokens[k] / ms if ms else None

    def choose(self) -> int:
        """The draft length for the next step (0: a plain step)."""
        self._step += 1
        for k in self._order:
            if self.tries[k] < self.MIN_TRIES:
                return k
        if self._step % self.PROBE_EVERY == 0:
            return min(self._order, key=lambda k: self._last_seen[k])
        return max(self._order, key=lambda k: (self.rate(k) or 0.0, -k))

    def observe(self, k: int, tokens: int, step_ms: float, threads: int | None = None) -> None:
        """One step's outcome: it was asked to draft ``k`` (what :meth:`choose` said), made ``tokens`` in
        ``step_ms``, at ``threads`` decode threads (another count than the last step's: all is measured again)."""
        if threads != self._threads:
            self._threads = threads
            self._reset()
        if k not in self.tries:
            return
        al = self.ALPHA
        if k in self.ms:
            self.tokens[k] = (1 - al) * self.tokens[k] + al * tokens
            self.ms[k] = (1 - al) * self.ms[k] + al * step_ms
        else:
            self.tokens[k], self.ms[k] = float(tokens), step_ms
        self.tries[k] += 1
        self._last_seen[k] = self._step
