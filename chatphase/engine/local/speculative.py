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
(:mod:`chatphase.engine.local.generation`: the end-of-generation check, :class:`IncrementalDetokenizer`,
:class:`StopText`, :class:`ThinkingTracker`, one event, the thread policy), in order, so a stop string or
the thinking budget that falls inside a verified batch ends or closes the reply where plain decode would:
the tokens after it are dropped from the cache.

Drafters: :class:`LookupDrafter` (the most recent earlier occurrence of the last ``n`` tokens of the
conversation proposes what followed it: llama.cpp's ngram-simple idea) and :class:`DraftModel` (a second,
small GGUF of the same vocabulary, greedy in its own context). :class:`AutoPolicy` chooses the draft length
from the tokens per ms each length's steps made on this turn (plain steps included), so it drafts nothing
when drafts do not pay. Figures:
:func:`chatphase.engine.metrics.spec_figures` (``docs/metrics.md``); each step records its decode thread count,
so that the speed-up compares steps with plain steps at the same count.

The thread policy sees one gap per target step (:meth:`~chatphase.engine.threads.governor.ThreadGovernor.on_token`
with the step's width), not one per token: the tokens of a verified batch come microseconds apart, and judged
as tokens they read as preemption (decode fell to one thread in every speculative turn under ``--threads auto``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, replace
from typing import Any

import llama_cpp as lc

from chatphase.engine.events import Event, SpecLive, ThinkingEnded, TurnRequest
from chatphase.engine.local.drafters import (
    DRAFT_K,
    JUDGE_STEPS,
    K_MAX,
    LOOKUP_K,
    PROBE_EVERY,
    AutoPolicy,
    DraftModel,
    LookupDrafter,
    can_speculate,
    draft_wont_pay,
)
from chatphase.engine.local.generation import Generated, Model, TokenStep
from chatphase.engine.local.llama_params import batch_positions
from chatphase.engine.local.sampling import sampler_chain
from chatphase.engine.metrics import SpeedupTally, StopReason, ns_to_ms, spec_figures
from chatphase.engine.prompting.thinking import ThinkingFormat, ThinkingTracker
from chatphase.engine.spec_modes import parse_spec
from chatphase.errors import ModelError, UsageError
from chatphase.models.resolve import resolve_model


def speculator(
    spec: str,
    model: lc.llama_model_p,
    vocab: lc.llama_vocab_p,
    settings: dict[str, Any],
    system_info: str,
    gpu_ok: bool,
    notes: list[str],
    target_path: str | None = None,
) -> Speculator | None:
    """The speculative mode ``spec`` (``EngineConfig.spec``) for the loaded llama.cpp ``model`` (``vocab`` its
    vocabulary); ``None`` for plain decode, or with a note in ``notes`` for a model that cannot take it
    (recurrent, hybrid). A ``draft:`` model is found as ``--model`` finds one (``default``: the bundled one)
    and loaded with the same ``settings``; one that cannot pay (the target's own file ``target_path``, or
    not much smaller: :func:`draft_wont_pay`) gets a note that says so.

    Raises:
        UsageError: a draft model that cannot be found or loaded, or that has another vocabulary.
    """
    mode = parse_spec(spec)
    if mode.kind == "off":
        return None
    why = can_speculate(model)
    if why:
        notes.append(f"speculative decoding off: this model is {why} (its state cannot drop rejected drafts)")
        return None
    draft = None
    if mode.kind == "draft":
        try:
            path = resolve_model(None if mode.draft == "default" else mode.draft)
            draft = DraftModel(str(path), settings, system_info, gpu_ok, vocab)
        except ModelError as exc:
            raise UsageError(f"draft model: {exc}") from None
        except RuntimeError as exc:
            raise UsageError(str(exc)) from None
        notes.append(f"speculative decoding: {path.name} drafts")
        why = draft_wont_pay(target_path, str(path), lc.llama_model_size(model), draft.size_bytes)
        if why:
            notes.append(why)
    return Speculator(mode.kind, draft)


class Speculator:
    """A speculative mode for an engine: its drafter, the verify batch and the mode's label.

    ``kind``: ``lookup``, ``auto`` or ``draft`` (with ``draft`` the :class:`DraftModel`).
    """

    def __init__(self, kind: str, draft: DraftModel | None = None, k: int | None = None) -> None:
        self.kind = kind
        self.k = min(k or (DRAFT_K if draft is not None else 2 * LOOKUP_K if kind == "auto" else LOOKUP_K), K_MAX)
        self.drafter = draft if draft is not None else LookupDrafter()
        self.batch: lc.llama_batch | None = lc.llama_batch_init(K_MAX + 1, 0, 1)
        self._threads: tuple[int, int] | None = None

    def sync_threads(self, ctx: lc.llama_context_p | None) -> int:
        """The target's decode threads now; a draft model gets the target's thread counts (the thread policy
        changes them between steps)."""
        n = lc.llama_n_threads(ctx)
        if isinstance(self.drafter, DraftModel):
            now = n, lc.llama_n_threads_batch(ctx)
            if now != self._threads:
                self._threads = now
                self.drafter.set_threads(*now)
        return int(n)

    def close(self) -> None:
        if self.batch is not None:
            lc.llama_batch_free(self.batch)
            self.batch = None
        if isinstance(self.drafter, DraftModel):
            self.drafter.close()


@dataclass
class SpecGenerated(Generated):
    """:class:`Generated` and the turn's ``spec_*`` figures (:func:`spec_figures`' dict)."""

    spec: dict[str, Any] | None = None


class _Steps:
    """The turn's steps as parallel lists (for :func:`spec_figures`) and the live figures."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.ends: list[int] = []
        self.tokens: list[int] = []
        self.drafted: list[int] = []
        self.accepted: list[int] = []
        self.plain: list[bool] = []
        self.threads: list[int] = []
        self.n_tokens = self.n_drafted = self.n_accepted = 0
        self.tally = SpeedupTally()
        self.live: SpecLive | None = None

    def add(
        self, t_start: int, t_end: int, tokens: int, drafted: int, accepted: int, plain: bool, threads: int
    ) -> None:
        self.ends.append(t_end)
        self.tokens.append(tokens)
        self.drafted.append(drafted)
        self.accepted.append(accepted)
        self.plain.append(plain)
        self.threads.append(threads)
        self.n_tokens += tokens
        self.n_drafted += drafted
        self.n_accepted += accepted
        self.tally.add(threads, t_end - t_start, tokens, plain)

    def snapshot(self) -> SpecLive:
        speedup = self.tally.speedup()
        self.live = SpecLive(self.mode, len(self.ends), self.n_drafted, self.n_accepted, self.n_tokens, speedup)
        return self.live

    def figures(self, t_first: int) -> dict[str, Any]:
        note = None
        if self.mode == "draft" and len(self.ends) >= JUDGE_STEPS:
            speedup = self.tally.speedup()
            if speedup is not None and speedup < 1:
                threads, _ = self.tally.baseline()
                note = (
                    f"the draft model did not pay: this turn decoded at ×{speedup:.2f} of plain steps "
                    f"({threads} thread{'s' if threads != 1 else ''}); --spec off or lookup is faster"
                )
        return spec_figures(
            self.mode, t_first, self.ends, self.tokens, self.drafted, self.accepted, self.plain, self.threads, note
        )


def generate_speculative(
    m: Model,
    spec: Speculator,
    req: TurnRequest,
    t_submit: int,
    stops: tuple[str, ...],
    thinking: ThinkingFormat | None,
    preopened: bool,
    out: SpecGenerated,
) -> Iterator[Event]:
    """As :func:`chatphase.engine.local.generation.generate` (the same events, ``out`` filled the same way), with
    drafted steps (the module docstring); ``out.spec`` gets the turn's ``spec_*`` figures. ``m.kv.tokens`` and the KV
    cache hold the same tokens after each step."""
    sp = req.sampling
    sampler = sampler_chain(sp)
    policy = m.on_token  # the thread policy sees one gap per step (the module docstring), not one per token
    step = TokenStep(replace(m, on_token=_no_policy), req, t_submit, stops, thinking, preopened, out)
    track, pending = step.track, step.events
    sample, decode, perf_ns = lc.llama_sampler_sample, lc.llama_decode, time.perf_counter_ns
    kv = m.kv
    ctx, cache, times, turn_id = kv.ptr, kv.tokens, out.times, req.turn_id
    b = spec.batch
    if b is None:
        raise RuntimeError("the speculator is closed")
    positions = batch_positions(b)
    drafter, auto = spec.drafter, AutoPolicy(spec.k) if spec.kind == "auto" else None
    drafter.reset()
    steps = _Steps(spec.kind)

    def take(token: int, t: int, n_cached: int, drafted: bool) -> StopReason | None:
        """One sampled token, as plain decode takes it (its events go to ``pending``); a stop reason or ``None``.
        ``n_cached``: the tokens plain decode would hold in the cache at this point."""
        return step.take(token, t, drafted, steps.live) or step.limits(n_cached)

    stop: StopReason | None = None
    try:
        token = sample(sampler, ctx, -1)
        stop = take(token, perf_ns(), len(cache), False)
        t_prev = times[0] if times else 0
        if times:
            policy(t_prev, 1)
        n_step = 0
        while stop is None:
            yield from pending
            pending.clear()
            # invariant: ``token`` was sampled and taken, not evaluated; the KV cache holds ``cache``
            if track is not None and thinking is not None and track.over_budget():
                stop = yield from _force_close(m, thinking.forced_close, token, track, times, turn_id, perf_ns)
                if stop is None:
                    token = sample(sampler, ctx, -1)
                    n_before = len(times)
                    stop = take(token, perf_ns(), len(cache), False)
                    if len(times) > n_before:
                        steps.add(t_prev, times[-1], 1, 0, 0, False, lc.llama_n_threads(ctx))
                        t_prev = times[-1]
                        policy(t_prev, 0)  # a step unlike the others
                        steps.snapshot()
                continue
            n_step += 1
            room = min(kv.n_ctx - len(cache) - 1, sp.max_tokens - len(times) - 1, K_MAX)
            k = auto.choose() if auto is not None else (0 if n_step % PROBE_EVERY == 1 else spec.k)
            k = min(k, room)
            n_threads = spec.sync_threads(ctx)
            cache.append(token)  # the history the drafter continues (the KV cache gets it in this step)
            draft = drafter.propose(cache, k) if k > 0 else []
            nd = len(draft)
            b.token[0], positions[0], b.n_seq_id[0], b.seq_id[0][0], b.logits[0] = token, len(cache) - 1, 1, 0, 1
            pos = len(cache)
            for i, d in enumerate(draft, 1):
                b.token[i], positions[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = d, pos, 1, 0, 1
                pos += 1
            b.n_tokens = nd + 1
            if decode(ctx, b) != 0:
                cache.pop()
                stop = "error"
                break
            kv.batch_evaluated(len(cache) - 1, nd + 1)  # a verify batch: its cells were computed together
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
                kv.drop_after(len(cache))  # the rejected drafts
            token = s
            made = len(times) - n_before
            if made:
                if auto is not None:
                    auto.observe(k, made, ns_to_ms(times[-1] - t_prev), n_threads)
                steps.add(t_prev, times[-1], made, nd, agreed, nd == 0, n_threads)
                out.steps.append((n_before, nd, agreed))
                t_prev = times[-1]
                policy(t_prev, nd + 1)  # may change the threads before the next step
                steps.snapshot()
        yield from pending
        pending.clear()
    finally:
        lc.llama_sampler_free(sampler)
        out.stop = stop or "length"
        step.finish()
        if times:
            out.spec = steps.figures(times[0])


def _no_policy(t_ns: int, width: int = 1) -> None:
    """In place of the thread policy's per-token call: a speculative turn calls it once per step."""


def _force_close(
    m: Model,
    forced_close: str,
    token: int,
    track: ThinkingTracker,
    times: list[int],
    turn_id: int,
    perf_ns: Callable[[], int],
) -> Generator[Event, None, StopReason | None]:
    """Evaluate ``token`` and the thinking format's closing marker (the budget is spent), as plain decode does;
    a stop reason or ``None``."""
    kv = m.kv
    if len(kv.tokens) + 1 >= kv.n_ctx:
        return "context_full"
    if not kv.decode([token]):
        return "error"
    kv.tokens.append(token)
    closing = m.tokenize(forced_close)
    if len(kv.tokens) + len(closing) >= kv.n_ctx:
        return "context_full"
    if not kv.decode(closing):
        return "error"
    kv.tokens.extend(closing)
    t_end = perf_ns()
    track.force_close(t_end)
    yield ThinkingEnded(turn_id, track.thinking_tokens, ns_to_ms(t_end - times[0]), t_end, forced=True)
    return None
