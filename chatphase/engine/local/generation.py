"""One reply's generation loop for :class:`~chatphase.engine.local.llama.LlamaEngine`: sample, decode, split.

Per token the Python work stays small: one ``llama_sampler_sample``, one piece lookup, the incremental
UTF-8 decode, the end-of-turn text check (:class:`~chatphase.engine.prompting.stops.StopText`), the thinking split
(:class:`~chatphase.engine.prompting.thinking.ThinkingTracker`, only for a model that thinks), one event, the thread
policy's check and one ``llama_decode``. A token that completes an end-of-turn marker written as text
ends the reply as an end-of-generation token does (not counted, not evaluated) unless text before the
marker came with it. When the thinking budget is spent, the closing marker is evaluated as if the model
had written it (as llama-server's reasoning budget does) and the model goes on with its answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import llama_cpp as lc

from chatphase.engine.base import CancelEvent
from chatphase.engine.events import Event, FirstToken, SpecLive, ThinkingEnded, TokensDecoded, TurnRequest
from chatphase.engine.local.detok import IncrementalDetokenizer
from chatphase.engine.local.kv_context import KvContext
from chatphase.engine.local.sampling import sampler_chain
from chatphase.engine.metrics import StopReason, ns_to_ms
from chatphase.engine.prompting.stops import StopText
from chatphase.engine.prompting.thinking import ThinkingFormat, ThinkingTracker


@dataclass
class Generated:
    """What a reply's generation produced: each sampled token's time (ns) and id, the answer's and the thinking
    block's text pieces, the thinking tracker (``None`` for a model that does not think) and why it stopped;
    ``accepted`` the indices of accepted draft tokens and ``steps`` ``(first token index, drafted, accepted)`` per
    speculative step (the token view, :mod:`chatphase.engine.tokens`)."""

    times: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    steps: list[tuple[int, int, int]] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    thought: list[str] = field(default_factory=list)
    tracker: ThinkingTracker | None = None
    stop: StopReason = "length"


@dataclass(frozen=True)
class Model:
    """What the loop needs beside the request: ``kv`` the context and the record of its KV cache (the loop appends
    each evaluated token to ``kv.tokens``), ``cancel``, ``piece(token)`` the bytes to show (markers of a thinking
    model as their text), ``tokenize(text)``, ``on_token(t_ns)`` the thread policy's per-token check
    (``on_token(t_ns, width)`` once per step in speculative decoding)."""

    kv: KvContext
    cancel: CancelEvent
    piece: Callable[[int], bytes]
    tokenize: Callable[[str], list[int]]
    on_token: Callable[..., None]
    make_room: Callable[[], bool] | None = None  # a full cache: free some (KV shift) and go on; False: cannot


class TokenStep:
    """What every sampled token goes through, in order, in both decode loops (this module's plain one and
    :func:`chatphase.engine.local.speculative.generate_speculative`): the end-of-generation check, the incremental
    UTF-8 decode, the end-of-turn text check, the token's time and the thread policy, the thinking split, its
    event(s) into :attr:`events`, then the limits. Sets up and fills ``out`` (its tracker too)."""

    def __init__(
        self,
        m: Model,
        req: TurnRequest,
        t_submit: int,
        stops: tuple[str, ...],
        thinking: ThinkingFormat | None,
        preopened: bool,
        out: Generated,
    ) -> None:
        sp = req.sampling
        self._m, self._req, self._t_submit, self._max_tokens = m, req, t_submit, sp.max_tokens
        self._vocab, self._n_ctx = m.kv.vocab.ptr, m.kv.n_ctx
        self._detok = IncrementalDetokenizer()
        self._stop_text = StopText(() if req.ignore_eos else stops)
        self._filtered = bool(self._stop_text.stops)
        self.track = out.tracker = ThinkingTracker(thinking, preopened, sp.think_budget) if thinking else None
        self._out = out
        self.events: list[Event] = []

    def take(self, token: int, t: int, drafted: bool = False, live: SpecLive | None = None) -> StopReason | None:
        """Token ``token`` sampled at ``t`` (ns): ``"stop"`` when it ends the reply unseen, else ``None`` (its
        events are in :attr:`events`; ask :meth:`limits` next). ``drafted`` / ``live``: speculative decoding's
        tint span and figures so far."""
        m, req, out, track = self._m, self._req, self._out, self.track
        if not req.ignore_eos and lc.llama_vocab_is_eog(self._vocab, token):
            return "stop"
        text = self._detok.feed(m.piece(token))
        stop_text = self._stop_text
        if self._filtered:
            text = stop_text.feed(text)
            if stop_text.stopped and not text:
                return "stop"
        times = out.times
        times.append(t)
        out.ids.append(token)
        if drafted:
            out.accepted.append(len(times) - 1)
        m.on_token(t)  # the thread policy: may change decode threads before this token is evaluated
        thinking_text, closed = "", False
        if track is not None:
            split = track.token(text, t)
            text, thinking_text, closed = split.answer, split.thinking, split.closed
            out.thought.append(thinking_text)
        out.parts.append(text)
        if len(times) == 1:
            self.events.append(FirstToken(req.turn_id, text, ns_to_ms(t - self._t_submit), t, thinking_text))
        else:
            spans = ((0, len(text)),) if drafted and text else ()
            thinking_tokens = track.thinking_tokens if track else 0
            self.events.append(
                TokensDecoded(req.turn_id, text, 1, len(times), t, thinking_text, thinking_tokens, live, spans)
            )
        if closed and track is not None:
            self.events.append(ThinkingEnded(req.turn_id, track.thinking_tokens, ns_to_ms(t - times[0]), t))
        return None

    def limits(self, n_cached: int) -> StopReason | None:
        """After a token was taken, with ``n_cached`` tokens in the KV cache: a stop reason, or ``None``. The
        plain loop asks after the token's events were delivered, so a cancel they caused stops right there."""
        if self._stop_text.stopped:  # the token ended with a marker: the text before it was the last
            return "stop"
        if len(self._out.times) >= self._max_tokens:
            return "length"
        if n_cached >= self._n_ctx:
            return "context_full"
        if self._m.cancel.is_set():
            return "cancelled"
        return None

    def finish(self) -> None:
        """End of the reply: what the detokenizer, the stop check and the thinking split still hold."""
        out, track = self._out, self.track
        tail = self._stop_text.feed(self._detok.flush()) + self._stop_text.flush()
        if track is not None:
            rest = track.finish(tail)
            out.thought.append(rest.thinking)
            tail = rest.answer
        if tail:
            out.parts.append(tail)


def generate(
    m: Model,
    req: TurnRequest,
    t_submit: int,
    stops: tuple[str, ...],
    thinking: ThinkingFormat | None,
    preopened: bool,
    out: Generated,
) -> Iterator[Event]:
    """Sample and decode until a stop, yielding the token events; fills ``out``."""
    sampler = sampler_chain(req.sampling)
    step = TokenStep(m, req, t_submit, stops, thinking, preopened, out)
    track, events = step.track, step.events
    one = (lc.llama_token * 1)()
    batch = lc.llama_batch_get_one(one, 1)
    sample, decode, perf_ns = lc.llama_sampler_sample, lc.llama_decode, time.perf_counter_ns
    kv = m.kv
    ctx, cache, times, turn_id = kv.ptr, kv.tokens, out.times, req.turn_id
    try:
        while True:
            token = sample(sampler, ctx, -1)
            stop = step.take(token, perf_ns())
            if events:
                yield from events
                events.clear()
            if stop is None:
                stop = step.limits(len(cache))
                if stop == "context_full" and m.make_room is not None and m.make_room():
                    stop = step.limits(len(cache))
            if stop is not None:
                out.stop = stop
                break
            one[0] = token
            if decode(ctx, batch) != 0:
                out.stop = "error"
                break
            cache.append(token)
            if track is not None and thinking is not None and track.over_budget():
                closing = m.tokenize(thinking.forced_close)
                if len(cache) + len(closing) >= kv.n_ctx:
                    out.stop = "context_full"
                    break
                if not kv.decode(closing):
                    out.stop = "error"
                    break
                cache.extend(closing)
                t_end = perf_ns()
                track.force_close(t_end)
                yield ThinkingEnded(turn_id, track.thinking_tokens, ns_to_ms(t_end - times[0]), t_end, forced=True)
    finally:
        lc.llama_sampler_free(sampler)
        step.finish()
