"""Speculative decoding on llama.cpp's C API: draft tokens cheaply, verify them in one batched step.

Decode reads all the weights once per step, so a step of ``k + 1`` tokens costs far less than ``k + 1``
steps of one. Each step here evaluates the last sampled token and ``k`` drafted ones in one ``llama_batch``
with logits at every position, then samples position 0, 1, … with **the user's sampler chain** and keeps
going while the sampled token equals the draft; the first mismatch ends the step (its sampled token is kept,
as plain decode would have sampled it) and the rejected positions leave the KV cache
(``llama_memory_seq_rm``). Each sampled token takes one random draw, in the same order as plain decode, so
the reply's distribution is the target's at any temperature, and with a fixed seed the two agree token for
token as long as batched and one-token evaluation give the same logits (at temperature 0: byte-identical).

Every sampled token goes through the same per-token pieces as plain decode
(:mod:`chatphase.engine.generation`: the end-of-generation check, :class:`IncrementalDetokenizer`,
:class:`StopText`, :class:`ThinkingTracker`, one event, the thread policy), in order, so a stop string or
the thinking budget that falls inside a verified batch ends or closes the reply where plain decode would:
the tokens after it are dropped from the cache.

Drafters: :class:`LookupDrafter` (the most recent earlier occurrence of the last ``n`` tokens of the
conversation proposes what followed it: llama.cpp's ngram-simple idea) and :class:`DraftModel` (a second,
small GGUF of the same vocabulary, greedy in its own context). :class:`AutoPolicy` chooses the draft length
from this turn's measured acceptance and step costs, and drafts nothing when it does not pay. Figures:
:func:`chatphase.engine.metrics.spec_figures` (``docs/metrics.md``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import llama_cpp as lc

from chatphase.engine.detok import IncrementalDetokenizer
from chatphase.engine.events import Event, FirstToken, SpecLive, ThinkingEnded, TokensDecoded, TurnRequest
from chatphase.engine.generation import Generated, Model
from chatphase.engine.llama_params import context_params, model_params, offload_plan
from chatphase.engine.metrics import ns_to_ms, spec_figures
from chatphase.engine.sampling import sampler_chain
from chatphase.engine.stops import StopText
from chatphase.engine.thinking import ThinkingFormat, ThinkingTracker

#: n-gram length of the lookup and its draft length, chosen by measurement: replaying greedy replies to the
#: prompts of :mod:`chatphase.bench.spec` against the verify-step costs :func:`chatphase.bench.spec.verify_cost`
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


def can_speculate(model) -> str | None:
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
        p = index.get(tuple(hist[end - n :]))
        return list(hist[p : p + k]) if p is not None else []


class DraftModel:
    """A second GGUF that drafts greedily in its own llama.cpp context (same engine settings as the target).

    Raises:
        RuntimeError: llama.cpp cannot load it, or its vocabulary is not the target's (token for token).
    """

    def __init__(self, path: str, settings: dict, system_info: str, gpu_ok: bool, target_vocab) -> None:
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
        self._n_batch = settings["n_batch"]
        self._n_ctx = lc.llama_n_ctx(self._ctx)
        self._greedy = lc.llama_sampler_init_greedy()
        self._one = (lc.llama_token * 1)()
        self._cache: list[int] = []

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


def vocab_mismatch(target, draft) -> str | None:
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
    """How many tokens to draft next (``auto``): the ``k`` that maximises the expected tokens per ms,
    ``E(k) / cost(k)`` with ``E(k) = (1 - a^(k+1)) / (1 - a)`` (each draft token accepted with probability
    ``a``, the running acceptance) and ``cost(k) = plain + k × per_token`` (both measured on this turn's
    steps, exponentially averaged), against ``1 / plain`` for no draft. Before a drafted step was measured
    it drafts two tokens (to measure); after :data:`PROBE_EVERY` undrafted steps it drafts once more to re-measure."""

    ALPHA = 0.2

    def __init__(self, k_max: int = 2 * LOOKUP_K) -> None:
        self.k_max = k_max
        self.plain_ms: float | None = None
        self.per_token_ms: float | None = None
        self.acceptance = 0.5
        self._idle = 0

    def choose(self) -> int:
        """The draft length for the next step (0: a plain step)."""
        if self.per_token_ms is None or self.plain_ms is None:
            return min(2, self.k_max) if self.plain_ms is not None else 0  # a short draft measures the cost
        a, c1, ct = min(self.acceptance, 0.99), self.plain_ms, max(self.per_token_ms, 1e-6)
        best_k, best = 0, 1.0 / c1
        for k in range(1, self.k_max + 1):
            gain = (1 - a ** (k + 1)) / (1 - a) / (c1 + k * ct)
            if gain > best:
                best_k, best = k, gain
        if best_k == 0:
            self._idle += 1
            if self._idle >= PROBE_EVERY:
                self._idle = 0
                return 2
        return best_k

    def observe(self, drafted: int, accepted: int, step_ms: float) -> None:
        """One step's outcome: ``drafted`` tokens (0 for a plain step), ``accepted`` of them, in ``step_ms``."""
        al = self.ALPHA
        if drafted == 0:
            self.plain_ms = step_ms if self.plain_ms is None else (1 - al) * self.plain_ms + al * step_ms
            return
        self.acceptance = (1 - al) * self.acceptance + al * (accepted / drafted)
        if self.plain_ms is not None:
            per = max(step_ms - self.plain_ms, 0.0) / drafted
            self.per_token_ms = per if self.per_token_ms is None else (1 - al) * self.per_token_ms + al * per


class Speculator:
    """A speculative mode for an engine: its drafter, the verify batch and the mode's label.

    ``kind``: ``lookup``, ``auto`` or ``draft`` (with ``draft`` the :class:`DraftModel`).
    """

    def __init__(self, kind: str, draft: DraftModel | None = None, k: int | None = None) -> None:
        self.kind = kind
        self.k = min(k or (DRAFT_K if draft is not None else LOOKUP_K), K_MAX)
        self.drafter = draft if draft is not None else LookupDrafter()
        self.batch = lc.llama_batch_init(K_MAX + 1, 0, 1)
        self._threads = None

    def sync_threads(self, ctx) -> None:
        """Give a draft model the target's thread counts (the thread policy changes them between tokens)."""
        if isinstance(self.drafter, DraftModel):
            now = lc.llama_n_threads(ctx), lc.llama_n_threads_batch(ctx)
            if now != self._threads:
                self._threads = now
                self.drafter.set_threads(*now)

    def close(self) -> None:
        if self.batch is not None:
            lc.llama_batch_free(self.batch)
            self.batch = None
        if isinstance(self.drafter, DraftModel):
            self.drafter.close()


@dataclass
class SpecGenerated(Generated):
    """:class:`Generated` and the turn's ``spec_*`` figures (:func:`spec_figures`' dict)."""

    spec: dict | None = None


class _Steps:
    """The turn's steps as parallel lists (for :func:`spec_figures`) and the live figures."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.ends: list[int] = []
        self.tokens: list[int] = []
        self.drafted: list[int] = []
        self.accepted: list[int] = []
        self.plain: list[bool] = []
        self.n_tokens = self.n_drafted = self.n_accepted = 0
        self.plain_ns = self.plain_n = 0
        self.live: SpecLive | None = None

    def add(self, t_start: int, t_end: int, tokens: int, drafted: int, accepted: int, plain: bool) -> None:
        self.ends.append(t_end)
        self.tokens.append(tokens)
        self.drafted.append(drafted)
        self.accepted.append(accepted)
        self.plain.append(plain)
        self.n_tokens += tokens
        self.n_drafted += drafted
        self.n_accepted += accepted
        if plain:
            self.plain_ns += t_end - t_start
            self.plain_n += 1

    def snapshot(self, t_first: int) -> SpecLive:
        elapsed = self.ends[-1] - t_first if self.ends else 0
        speedup = self.plain_ns / self.plain_n * self.n_tokens / elapsed if self.plain_n and elapsed > 0 else None
        self.live = SpecLive(self.mode, len(self.ends), self.n_drafted, self.n_accepted, self.n_tokens, speedup)
        return self.live

    def figures(self, t_first: int) -> dict:
        return spec_figures(self.mode, t_first, self.ends, self.tokens, self.drafted, self.accepted, self.plain)


def generate_speculative(
    m: Model,
    mem,
    spec: Speculator,
    req: TurnRequest,
    t_submit: int,
    stops: tuple,
    thinking: ThinkingFormat | None,
    preopened: bool,
    out: SpecGenerated,
) -> Iterator[Event]:
    """As :func:`chatphase.engine.generation.generate` (the same events, ``out`` filled the same way), with
    drafted steps (the module docstring); ``out.spec`` gets the turn's ``spec_*`` figures. ``mem`` is the
    target context's ``llama_memory``; ``m.cache`` and the KV cache hold the same tokens after each step."""
    sp = req.sampling
    sampler = sampler_chain(sp)
    detok = IncrementalDetokenizer()
    stop_text = StopText(() if req.ignore_eos else stops)
    track = out.tracker = ThinkingTracker(thinking, preopened, sp.think_budget) if thinking else None
    sample, decode, perf_ns, is_eog = (
        lc.llama_sampler_sample,
        lc.llama_decode,
        time.perf_counter_ns,
        lc.llama_vocab_is_eog,
    )
    ctx, vocab, cache, cancel, piece, on_token = m.ctx, m.vocab, m.cache, m.cancel, m.piece, m.on_token
    times, parts, thought, turn_id = out.times, out.parts, out.thought, req.turn_id
    filtered = bool(stop_text.stops)
    b = spec.batch
    drafter, auto = spec.drafter, AutoPolicy(spec.k) if spec.kind == "auto" else None
    drafter.reset()
    steps = _Steps(spec.kind)
    pending: list[Event] = []

    def take(token: int, t: int, n_cached: int, drafted: bool) -> str | None:
        """One sampled token, as plain decode takes it (its events go to ``pending``); a stop reason or ``None``.
        ``n_cached``: the tokens plain decode would hold in the cache at this point."""
        if not req.ignore_eos and is_eog(vocab, token):
            return "stop"
        text = detok.feed(piece(token))
        if filtered:
            text = stop_text.feed(text)
            if stop_text.stopped and not text:
                return "stop"
        times.append(t)
        on_token(t)
        thinking_text, closed = "", False
        if track is not None:
            split = track.token(text, t)
            text, thinking_text, closed = split.answer, split.thinking, split.closed
            thought.append(thinking_text)
        parts.append(text)
        if len(times) == 1:
            pending.append(FirstToken(turn_id, text, ns_to_ms(t - t_submit), t, thinking_text))
        else:
            spans = ((0, len(text)),) if drafted and text else ()
            pending.append(
                TokensDecoded(
                    turn_id,
                    text,
                    1,
                    len(times),
                    t,
                    thinking_text,
                    track.thinking_tokens if track else 0,
                    steps.live,
                    spans,
                )
            )
        if closed:
            pending.append(ThinkingEnded(turn_id, track.thinking_tokens, ns_to_ms(t - times[0]), t))
        if stop_text.stopped:
            return "stop"
        if len(times) >= sp.max_tokens:
            return "length"
        if n_cached >= m.n_ctx:
            return "context_full"
        if cancel.is_set():
            return "cancelled"
        return None

    stop: str | None = None
    try:
        token = sample(sampler, ctx, -1)
        stop = take(token, perf_ns(), len(cache), False)
        t_prev = times[0] if times else 0
        n_step = 0
        while stop is None:
            yield from pending
            pending.clear()
            # invariant: ``token`` was sampled and taken, not evaluated; the KV cache holds ``cache``
            if track is not None and track.over_budget():
                stop = yield from _force_close(m, thinking, token, track, times, turn_id, perf_ns)
                if stop is None:
                    token = sample(sampler, ctx, -1)
                    n_before = len(times)
                    stop = take(token, perf_ns(), len(cache), False)
                    if len(times) > n_before:
                        steps.add(t_prev, times[-1], 1, 0, 0, False)
                        t_prev = times[-1]
                        steps.snapshot(times[0])
                continue
            n_step += 1
            room = min(m.n_ctx - len(cache) - 1, sp.max_tokens - len(times) - 1, K_MAX)
            k = auto.choose() if auto is not None else (0 if n_step % PROBE_EVERY == 1 else spec.k)
            k = min(k, room)
            spec.sync_threads(ctx)
            cache.append(token)  # the history the drafter continues (the KV cache gets it in this step)
            draft = drafter.propose(cache, k) if k > 0 else []
            nd = len(draft)
            b.token[0], b.pos[0], b.n_seq_id[0], b.seq_id[0][0], b.logits[0] = token, len(cache) - 1, 1, 0, 1
            pos = len(cache)
            for i, d in enumerate(draft, 1):
                b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = d, pos, 1, 0, 1
                pos += 1
            b.n_tokens = nd + 1
            if decode(ctx, b) != 0:
                cache.pop()
                stop = "error"
                break
            base, n_before, agreed, i = len(cache), len(times), 0, 0
            while True:
                s = sample(sampler, ctx, i)
                is_draft = i < nd and s == draft[i]
                stop = take(s, perf_ns(), base + i, is_draft)
                agreed += is_draft
                if stop is not None or not is_draft or (track is not None and track.over_budget()):
                    break  # a spent thinking budget: the closing marker goes after s, at the top of the loop
                i += 1
            # draft[:i] stay: each equals the token sampled before it; s is the next token, not evaluated
            cache.extend(draft[:i])
            if i < nd:
                lc.llama_memory_seq_rm(mem, 0, len(cache), -1)
            token = s
            made = len(times) - n_before
            if made:
                if auto is not None:
                    auto.observe(nd, agreed, ns_to_ms(times[-1] - t_prev))
                steps.add(t_prev, times[-1], made, nd, agreed, nd == 0)
                t_prev = times[-1]
                steps.snapshot(times[0])
        yield from pending
        pending.clear()
    finally:
        lc.llama_sampler_free(sampler)
        out.stop = stop or "length"
        tail = stop_text.feed(detok.flush()) + stop_text.flush()
        if track is not None:
            rest = track.finish(tail)
            thought.append(rest.thinking)
            tail = rest.answer
        if tail:
            parts.append(tail)
        if times:
            out.spec = steps.figures(times[0])


def _force_close(m: Model, thinking, token, track, times, turn_id, perf_ns):
    """Evaluate ``token`` and the thinking format's closing marker (the budget is spent), as plain decode does;
    a stop reason or ``None``."""
    if len(m.cache) + 1 >= m.n_ctx:
        return "context_full"
    if not m.decode([token]):
        return "error"
    m.cache.append(token)
    closing = m.tokenize(thinking.forced_close)
    if len(m.cache) + len(closing) >= m.n_ctx:
        return "context_full"
    if not m.decode(closing):
        return "error"
    m.cache.extend(closing)
    t_end = perf_ns()
    track.force_close(t_end)
    yield ThinkingEnded(turn_id, track.thinking_tokens, ns_to_ms(t_end - times[0]), t_end, forced=True)
    return None
