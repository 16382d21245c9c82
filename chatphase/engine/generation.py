"""One reply's generation loop for :class:`~chatphase.engine.llama.LlamaEngine`: sample, decode, split.

Per token the Python work stays small: one ``llama_sampler_sample``, one piece lookup, the incremental
UTF-8 decode, the end-of-turn text check (:class:`~chatphase.engine.stops.StopText`), the thinking split
(:class:`~chatphase.engine.thinking.ThinkingTracker`, only for a model that thinks), one event, the thread
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

from chatphase.engine.detok import IncrementalDetokenizer
from chatphase.engine.events import Event, FirstToken, ThinkingEnded, TokensDecoded, TurnRequest
from chatphase.engine.metrics import ns_to_ms
from chatphase.engine.sampling import sampler_chain
from chatphase.engine.stops import StopText
from chatphase.engine.thinking import ThinkingFormat, ThinkingTracker


@dataclass
class Generated:
    """What a reply's generation produced: each sampled token's time (ns), the answer's and the thinking
    block's text pieces, the thinking tracker (``None`` for a model that does not think) and why it stopped."""

    times: list[int] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    thought: list[str] = field(default_factory=list)
    tracker: ThinkingTracker | None = None
    stop: str = "length"


@dataclass(frozen=True)
class Model:
    """The llama.cpp handles and callbacks the loop needs: ``piece(token)`` the bytes to show (markers of a
    thinking model as their text), ``tokenize(text)``, ``decode(tokens)`` (evaluate, ``False`` on error),
    ``on_token(t_ns)`` the thread policy's per-token check."""

    ctx: object
    vocab: object
    cache: list[int]
    n_ctx: int
    cancel: object
    piece: Callable[[int], bytes]
    tokenize: Callable[[str], list[int]]
    decode: Callable[[list[int]], bool]
    on_token: Callable[[int], None]


def generate(
    m: Model,
    req: TurnRequest,
    t_submit: int,
    stops: tuple,
    thinking: ThinkingFormat | None,
    preopened: bool,
    out: Generated,
) -> Iterator[Event]:
    """Sample and decode until a stop, yielding the token events; fills ``out``."""
    sp = req.sampling
    sampler = sampler_chain(sp)
    detok = IncrementalDetokenizer()
    stop_text = StopText(() if req.ignore_eos else stops)
    track = out.tracker = ThinkingTracker(thinking, preopened, sp.think_budget) if thinking else None
    one = (lc.llama_token * 1)()
    batch = lc.llama_batch_get_one(one, 1)
    sample, decode, perf_ns, is_eog = (
        lc.llama_sampler_sample,
        lc.llama_decode,
        time.perf_counter_ns,
        lc.llama_vocab_is_eog,
    )
    ctx, vocab, cache, cancel, piece, on_token = m.ctx, m.vocab, m.cache, m.cancel, m.piece, m.on_token
    times, parts, thought, turn_id = out.times, out.parts, out.thought, req.turn_id
    filtered = bool(stop_text.stops)
    try:
        while True:
            token = sample(sampler, ctx, -1)
            t = perf_ns()
            if not req.ignore_eos and is_eog(vocab, token):
                out.stop = "stop"
                break
            text = detok.feed(piece(token))
            if filtered:
                text = stop_text.feed(text)
                if stop_text.stopped and not text:
                    out.stop = "stop"
                    break
            times.append(t)
            on_token(t)  # the thread policy: may change decode threads before this token is evaluated
            thinking_text, closed = "", False
            if track is not None:
                split = track.token(text, t)
                text, thinking_text, closed = split.answer, split.thinking, split.closed
                thought.append(thinking_text)
            parts.append(text)
            if len(times) == 1:
                yield FirstToken(turn_id, text, ns_to_ms(t - t_submit), t, thinking_text)
            else:
                yield TokensDecoded(
                    turn_id, text, 1, len(times), t, thinking_text, track.thinking_tokens if track else 0
                )
            if closed:
                yield ThinkingEnded(turn_id, track.thinking_tokens, ns_to_ms(t - times[0]), t)
            if stop_text.stopped:  # the token ended with a marker: the text before it was the last
                out.stop = "stop"
                break
            if len(times) >= sp.max_tokens:
                break
            if len(cache) >= m.n_ctx:
                out.stop = "context_full"
                break
            if cancel.is_set():
                out.stop = "cancelled"
                break
            one[0] = token
            if decode(ctx, batch) != 0:
                out.stop = "error"
                break
            cache.append(token)
            if track is not None and track.over_budget():
                closing = m.tokenize(thinking.forced_close)
                if len(cache) + len(closing) >= m.n_ctx:
                    out.stop = "context_full"
                    break
                if not m.decode(closing):
                    out.stop = "error"
                    break
                cache.extend(closing)
                t_end = perf_ns()
                track.force_close(t_end)
                yield ThinkingEnded(turn_id, track.thinking_tokens, ns_to_ms(t_end - times[0]), t_end, forced=True)
    finally:
        lc.llama_sampler_free(sampler)
        tail = stop_text.feed(detok.flush()) + stop_text.flush()
        if track is not None:
            rest = track.finish(tail)
            thought.append(rest.thinking)
            tail = rest.answer
        if tail:
            parts.append(tail)
