"""FakeEngine: a scripted :class:`~chatphase.engine.base.Engine` (no llama.cpp) for the UI tests and
``benchmarks/ui_memory.py``.

It behaves like the real engine where the UI can tell: it "tokenises" the conversation (one token per
whitespace-separated word, plus 2 tokens of template per message and 2 for the assistant header),
reuses the longest common token prefix with what its pretend KV cache holds, drops the oldest messages
when the prompt does not fit ``n_ctx`` (system prompt kept), refuses a single message that cannot fit,
stops with ``context_full`` when the reply fills the context, honours :meth:`cancel` between prefill
chunks and tokens, and can "crash" (yield ``EngineFailed(fatal=True)`` and stay dead).

Timestamps are scripted, not measured: turn ``n`` starts at ``n * 10**12`` ns and every phase advances
a virtual clock by the configured per-token costs, so the metrics (built with
:func:`~chatphase.engine.metrics.compute_turn_metrics`) are exact and known in advance. Wall-clock delays
(``*_delay_s``) are separate and only pace the event stream; ``hold`` pauses the stream at a chosen
phase until :meth:`release` (or :meth:`cancel`), which lets tests look at a live prefill or decode.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from chatphase.engine.events import (
    CountRequest,
    EngineFailed,
    Event,
    FirstToken,
    LoadedModel,
    LoadedSettings,
    Message,
    ModelLoaded,
    PrefillProgress,
    PrefillStarted,
    PromptCount,
    SpecLive,
    ThinkingEnded,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.fit_hints import fit_hint
from chatphase.engine.metrics import NS_PER_MS, StopReason, compute_turn_metrics, spec_figures
from chatphase.engine.prompting.thinking import ThinkingFormat, ThinkingSplitter, ThinkingTracker
from chatphase.engine.tokens import Piece, TurnTokens
from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.kv import kv_capacity_bytes

Phase = Literal["load", "prefill", "decode"]
_PIECE = re.compile(r"\s*\S+|\s+")
#: KV bytes per token used when the model info has none (SmolLM2-135M, f16; ``docs/metrics.md``).
DEFAULT_KV_BYTES_PER_TOKEN = 23_040


def fake_model_info(**overrides: Any) -> ModelInfo:
    """A :class:`ModelInfo` shaped like the bundled SmolLM2-135M Q4_1 (no file behind it)."""
    values: dict[str, Any] = dict(
        path="/models/SmolLM2-135M-Instruct.Q4_1.gguf",
        name="SmolLM2 135M Instruct",
        architecture="llama",
        n_params=134_515_008,
        size_bytes=98_000_000,
        n_layer=30,
        quantization="Q4_1",
        n_ctx_train=8192,
        kv_bytes_per_token=DEFAULT_KV_BYTES_PER_TOKEN,
        has_chat_template=True,
    )
    values.update(overrides)
    return ModelInfo(**values)


def template_tokens(messages: Sequence[Message]) -> list[str]:
    """The fake chat template: ``<|im_start|> role words… <|im_end|>`` per message, then the assistant header."""
    tokens: list[str] = []
    for m in messages:
        tokens += ["<|im_start|>", m.role, *m.content.split(), "<|im_end|>"]
    return tokens + ["<|im_start|>", "assistant"]


def fake_tokens(
    prompt: Sequence[str], restored: int, cached: int, done: int, reply: Sequence[str], t_ns: Sequence[int]
) -> TurnTokens:
    """The fake template's tokens as a :class:`TurnTokens`: one id per distinct piece (a word of the prompt, with
    a space after it but for the markers and the role, with a newline; a piece of the reply)."""
    ids: dict[str, int] = {}

    def shown(word: str) -> str:
        return word if word.startswith("<|") else f"{word}\n" if word in ("system", "user", "assistant") else word + " "

    texts = [shown(w) for w in prompt]
    prompt_ids = tuple(ids.setdefault(w, len(ids) + 1) for w in texts)
    reply_ids = tuple(ids.setdefault(w, len(ids) + 1) for w in reply)
    pieces = {i: Piece(w, w.startswith("<|")) for w, i in ids.items()}
    return TurnTokens(
        prompt_ids, min(restored, cached), cached, done, (), "dropped", reply_ids, tuple(t_ns), pieces=pieces
    )


def split_reply(text: str) -> list[str]:
    """Split reply text into token pieces (each word with its leading whitespace); ``"".join`` restores it."""
    return _PIECE.findall(text)


def default_reply(request: TurnRequest) -> str:
    """A small Markdown reply quoting the last user message."""
    last = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
    return f"Reply {request.turn_id}: you said *{last[:60]}*.\n\n- prefill reads the prompt\n- decode writes **this**\n"


@dataclass
class FakeTiming:
    """Virtual per-phase costs in ms that the scripted timestamps advance by. A prefill of ``n`` tokens on
    ``depth`` cached ones takes ``prefill_once_ms + prefill_ms_per_token·n + prefill_ms_per_context·Σ (start +
    u/2)`` over its chunks of ``chunk_tokens`` (a fixed cost, the weights', the attention's: each chunk reads the
    KV context it sits on, as llama.cpp's CPU prefill measures); a restore of ``n`` tokens from the fake prefix
    store ``restore_once_ms + restore_ms_per_token·n``, which the count estimates as
    ``restore_estimate_ms_per_token·n``."""

    load_ms: float = 120.0
    tokenize_ms: float = 1.0
    prefill_ms_per_token: float = 2.0
    decode_ms_per_token: float = 20.0
    prefill_once_ms: float = 0.0
    prefill_ms_per_context: float = 0.0
    chunk_tokens: int = 256
    restore_once_ms: float = 0.0
    restore_ms_per_token: float = 0.0
    restore_estimate_ms_per_token: float = 0.0

    def prefill_ms(self, n: int, depth: int) -> float:
        """The scripted prefill time of ``n`` tokens evaluated on ``depth`` cached ones."""
        if n <= 0:
            return 0.0
        context = sum(depth + start + min(self.chunk_tokens, n - start) / 2 for start in range(0, n, self.chunk_tokens))
        return self.prefill_once_ms + self.prefill_ms_per_token * n + self.prefill_ms_per_context * context

    def restore_ms(self, n: int) -> float:
        """The scripted restore time of ``n`` tokens."""
        return self.restore_once_ms + self.restore_ms_per_token * n if n else 0.0


class FakeEngine:
    """Scripted engine (see the module docstring). Thread-safe for one turn at a time plus :meth:`cancel`.

    Args:
        info: the model to pretend to load; ``config``: an object with ``n_ctx`` and ``n_batch``
            (an :class:`~chatphase.engine.config.EngineConfig`), or ``None`` for 4096 / 256.
        replies: reply texts used in turn order (cycled), or a function ``TurnRequest -> str``;
            default :func:`default_reply`. A reply may be a list of pieces: one token each (else a text
            is split into words, :func:`split_reply`).
        thinking / thinking_preopened: the model's thinking format (:data:`chatphase.engine.prompting.thinking.FORMATS`)
            and whether its template opens the block in the generation prompt; replies are split as the
            real engine splits them (a ``think_budget`` closes the block and goes on with the scripted answer).
        timing: the virtual costs behind the scripted metrics.
        prefill_delay_s / token_delay_s / load_delay_s: wall-clock pauses per prefill chunk, per token, on load.
        crash_at: ``"load"``, ``"prefill"`` or ``"decode"`` makes turn ``crash_turn`` (or the load) fail fatally.
        hold: ``"prefill"`` (after the first progress event) or ``"decode"`` (after ``hold_after_tokens``
            tokens) blocks the stream until :meth:`release` or :meth:`cancel`; :attr:`held` is set meanwhile.
        notes / log_path: copied into :class:`LoadedModel`.
        spec: speculative decoding's live figures, sent with every ``TokensDecoded``, and ``spec_*`` metrics.
        drafted: indices of tokens (0 = the first) sent as accepted draft tokens (``drafted_spans``: all their
            text): each is in the step of the next other token, which also drafted one rejected token.
        spec_note: the turns' ``spec_note`` (drafting did not pay).
        restore_note: the turns' ``PrefillStarted.restore_note`` (a saved prefix restored, or not and why).
        saved_prefix: the tokens a prefix store holds: a prompt that shares more of them than the cache does (32
            more at least, as the real store's rule) restores them first (``FakeTiming``'s restore costs).
        esc_turns: turn ids the user stops (as Esc) once their first token has come: ``stop_reason="cancelled"``
            after a completed prefill.
    """

    def __init__(
        self,
        info: ModelInfo,
        config: object = None,
        *,
        replies: Sequence[str | Sequence[str]] | Callable[[TurnRequest], str] | None = None,
        thinking: ThinkingFormat | None = None,
        thinking_preopened: bool = False,
        timing: FakeTiming | None = None,
        prefill_delay_s: float = 0.0,
        token_delay_s: float = 0.0,
        load_delay_s: float = 0.0,
        crash_at: Phase | None = None,
        crash_turn: int = 1,
        hold: Literal["prefill", "decode"] | None = None,
        hold_after_tokens: int = 3,
        notes: tuple[str, ...] = ("fake engine: scripted events",),
        log_path: str = "",
        spec: SpecLive | None = None,
        drafted: Collection[int] = (),
        spec_note: str | None = None,
        restore_note: str | None = None,
        saved_prefix: Sequence[str] = (),
        esc_turns: Collection[int] = (),
    ) -> None:
        self.info = info
        self.n_ctx = int(getattr(config, "n_ctx", 4096))
        self.n_batch = int(getattr(config, "n_batch", 256))
        self.n_threads = int(getattr(config, "n_threads", None) or 2)
        self._replies = replies
        self.thinking, self.thinking_preopened = thinking, thinking_preopened
        self.timing = timing or FakeTiming()
        self.prefill_delay_s, self.token_delay_s, self.load_delay_s = prefill_delay_s, token_delay_s, load_delay_s
        self.crash_at, self.crash_turn = crash_at, crash_turn
        self.hold, self.hold_after_tokens = hold, hold_after_tokens
        self.notes, self.log_path = notes, log_path
        self.spec, self.drafted, self.spec_note = spec, frozenset(drafted), spec_note
        self.restore_note = restore_note
        self.saved_prefix, self.esc_turns = list(saved_prefix), frozenset(esc_turns)
        self.kv_bytes_per_token = info.kv_bytes_per_token or DEFAULT_KV_BYTES_PER_TOKEN
        self._cache: list[str] = []
        self._cancel = threading.Event()
        self._release = threading.Event()
        self.held = threading.Event()
        self.closed = False
        self.dead = False
        self._gone = threading.Event()  # set when dead or closed (ends watch())
        self.requests: list[TurnRequest] = []
        self.counts: list[CountRequest] = []

    # -- Engine protocol -------------------------------------------------------------------------
    def load(self) -> Iterator[Event]:
        """Yield ``ModelLoaded`` (or ``EngineFailed(fatal=True)`` when ``crash_at == "load"``)."""
        self._cancel.wait(self.load_delay_s)
        if self.crash_at == "load":
            self.dead = True
            yield EngineFailed("engine process died while loading the model (signal SIGSEGV)", fatal=True)
            return
        per_token = self.kv_bytes_per_token
        yield ModelLoaded(
            LoadedModel(
                info=self.info,
                settings=LoadedSettings(
                    n_ctx=self.n_ctx,
                    n_batch=self.n_batch,
                    n_threads=self.n_threads,
                    n_gpu_layers=0,
                    flash_attn="on",
                ),
                load_ms=self.timing.load_ms,
                kv_bytes_per_token=per_token,
                kv_capacity_bytes=kv_capacity_bytes(per_token, self.n_ctx),
                layers_offloaded=0,
                layers_total=(self.info.n_layer or 0) + 1,
                system_info="fake",
                notes=tuple(self.notes),
                log_path=self.log_path,
                pid=0,
                thinking_format=self.thinking.name if self.thinking else None,
            )
        )

    def run_turn(self, request: TurnRequest) -> Iterator[Event]:
        """Yield one scripted turn (see the module docstring for the rules)."""
        self.requests.append(request)
        self._cancel.clear()
        if self.dead or self.closed:
            yield EngineFailed("engine is not running", turn_id=request.turn_id, fatal=True)
            return
        t = self.timing
        messages, dropped = self._fit(list(request.messages))
        if messages is None:
            yield EngineFailed(
                f"message too long: it needs more than the context of {self.n_ctx} tokens ({fit_hint('message')})",
                turn_id=request.turn_id,
            )
            return
        prompt = template_tokens(messages)
        cached = _common_prefix(self._cache, prompt)
        if cached == len(prompt):  # llama.cpp always evaluates at least the last prompt token
            cached -= 1
        restored = self._restorable(prompt, cached)
        if restored:
            self._cache = prompt[: cached + restored]
            cached += restored
        restore_ms = t.restore_ms(restored)
        prefill = len(prompt) - cached
        t_submit = request.turn_id * 10**12
        t_pre0 = t_submit + _ns(t.tokenize_ms + restore_ms)
        yield PrefillStarted(
            request.turn_id, len(prompt), cached, prefill, dropped, t_pre0, restore_note=self.restore_note,
            **({"restored_tokens": restored, "restore_ms": restore_ms} if restored else {}),
        )  # fmt: skip
        done = 0
        while done < prefill:
            if self._should_crash("prefill", request):
                yield from self._die(request)
                return
            done = min(prefill, done + self.n_batch)
            yield PrefillProgress(request.turn_id, done, prefill, t.prefill_ms(done, cached))
            if self._pause("prefill") or self._cancel.wait(self.prefill_delay_s):
                break
        cancelled = self._cancel.is_set()
        t_pre1 = t_pre0 + _ns(t.prefill_ms(done, cached))
        self._cache = prompt[: cached + done]
        pieces = [] if cancelled else self._reply_pieces(request)[: request.sampling.max_tokens]
        room = self.n_ctx - (cached + done)
        stop: StopReason = "stop"
        if len(pieces) > room:
            pieces, stop = pieces[: max(room, 0)], "context_full"
        elif len(pieces) == request.sampling.max_tokens:
            stop = "length"
        times: list[int] = []
        text: list[str] = []
        thought: list[str] = []
        tracker = ThinkingTracker(self.thinking, self.thinking_preopened, request.sampling.think_budget)
        i = 0
        while i < len(pieces):
            piece = pieces[i]
            if self._should_crash("decode", request) and i == 1:
                yield from self._die(request)
                return
            t_i = t_pre1 + _ns(t.decode_ms_per_token * (len(times) + 1))
            times.append(t_i)
            self._cache += piece.split()  # what the template will show of this reply next turn
            split = tracker.token(piece, t_i)
            text.append(split.answer)
            thought.append(split.thinking)
            if len(times) == 1:
                yield FirstToken(request.turn_id, split.answer, (t_i - t_submit) / NS_PER_MS, t_i, split.thinking)
            else:
                yield TokensDecoded(
                    request.turn_id,
                    split.answer,
                    1,
                    len(times),
                    t_i,
                    split.thinking,
                    tracker.thinking_tokens,
                    self.spec,
                    ((0, len(split.answer)),) if split.answer and len(times) - 1 in self.drafted else (),
                )
            i += 1
            if tracker.over_budget() and self.thinking:  # the engine closes the block itself, goes on with the answer
                tracker.force_close(t_i)
                self._cache += [self.thinking.close]
                i = _answer_start(pieces, self.thinking, self.thinking_preopened)
            if split.closed or (tracker.forced and tracker.t_end_ns == t_i):
                yield ThinkingEnded(
                    request.turn_id, tracker.thinking_tokens, (t_i - times[0]) / NS_PER_MS, t_i, tracker.forced
                )
            if request.turn_id in self.esc_turns:
                self._cancel.set()  # the user's Esc, once the first token is in
            if (len(times) == self.hold_after_tokens and self._pause("decode")) or self._cancel.wait(
                self.token_delay_s
            ):
                break
        tail = tracker.finish()
        text.append(tail.answer)
        thought.append(tail.thinking)
        if self._cancel.is_set():
            stop = "cancelled"
        metrics = compute_turn_metrics(
            t_submit_ns=t_submit,
            t_prefill_start_ns=t_pre0,
            t_prefill_end_ns=t_pre1,
            token_times_ns=times,
            prompt_tokens=len(prompt),
            cached_tokens=cached,
            kv_cache_tokens=cached + done + len(times),
            kv_bytes_per_token=self.kv_bytes_per_token,
            kv_capacity_bytes=kv_capacity_bytes(self.kv_bytes_per_token, self.n_ctx),
            stop_reason=stop,
            dropped_messages=dropped,
            spec=self._spec_figures(self.spec, times) if self.spec is not None and times else None,
            **tracker.metrics_args(),
        )
        if restored:
            metrics = replace(metrics, restored_tokens=restored, restore_ms=restore_ms)
        reply, thought_text = "".join(text), "".join(thought)
        tokens = fake_tokens(prompt, restored, cached, done, pieces[: len(times)], [t - t_submit for t in times])
        yield TurnFinished(request.turn_id, reply, metrics, thinking=thought_text, tokens=tokens)

    def count_prompt(self, request: CountRequest) -> PromptCount | None:
        """Count as :meth:`run_turn` would template (one token a word; a text alone: its words); ``None``
        once closed or dead. Each call is kept in :attr:`counts`."""
        self.counts.append(request)
        if self.dead or self.closed:
            return None
        texts = tuple(len(t.split()) for t in request.texts)
        messages, dropped = self._fit(list(request.messages))
        if messages is None:
            too_long = f"the message needs more than the context of {self.n_ctx} tokens"
            return PromptCount(None, 0, len(self._cache), self.n_ctx, text_tokens=texts, too_long=too_long)
        prompt = template_tokens(messages)
        cached = min(_common_prefix(self._cache, prompt), len(prompt) - 1)
        dropped = max(dropped - request.overflow_from, 0)  # newly left out, as the engine counts them
        restored = self._restorable(prompt, cached)
        estimate = self.timing.restore_estimate_ms_per_token * restored if restored else None
        return PromptCount(len(prompt), cached, len(self._cache), self.n_ctx, dropped, texts, None, restored, estimate)

    def _restorable(self, prompt: Sequence[str], cached: int) -> int:
        """The tokens beyond ``cached`` a prompt would restore from the saved prefix (0: none, or fewer than 32)."""
        more = min(_common_prefix(self.saved_prefix, prompt), len(prompt) - 1) - cached
        return more if more >= 32 else 0

    def _spec_figures(self, spec: SpecLive, times: Sequence[int]) -> dict[str, Any]:
        """The ``spec_*`` metrics of tokens at ``times`` (ns), in the steps that ``drafted`` implies."""
        steps, run = [], 0  # (end ns, tokens, drafted, accepted, plain) per step; run: its accepted drafts
        for k in range(1, len(times)):
            run += k in self.drafted
            if k not in self.drafted or k == len(times) - 1:  # a sampled token ends a step, as the reply's end does
                sampled = k not in self.drafted
                steps.append((times[k], run + sampled, run + (sampled and run > 0), run, not run))
                run = 0
        columns = [list(c) for c in zip(*steps, strict=True)] or [[]] * 5
        return spec_figures(spec.mode, times[0], *columns, note=self.spec_note)

    def watch(self) -> Iterator[Event]:
        """Block until the engine dies or is closed; yield ``EngineFailed(fatal=True)`` when it died."""
        self._gone.wait()
        if self.dead and not self.closed:
            yield EngineFailed("engine process died (signal SIGKILL)", fatal=True)

    def kill(self) -> None:
        """Die now, as a child process killed while idle would (:meth:`watch` reports it)."""
        self.dead = True
        self._gone.set()

    def cancel(self) -> None:
        """Stop the running turn at the next chunk or token (it finishes with ``stop_reason="cancelled"``)."""
        self._cancel.set()
        self._release.set()

    def release(self) -> None:
        """Let a stream paused by ``hold`` continue."""
        self._release.set()

    def close(self) -> None:
        """Mark the engine closed and wake any pause. Idempotent."""
        self.closed = True
        self._gone.set()
        self.cancel()

    # -- helpers ---------------------------------------------------------------------------------
    def _fit(self, messages: list[Message]) -> tuple[list[Message] | None, int]:
        """Drop the oldest non-system messages until the prompt leaves room to reply; ``None`` if impossible."""
        dropped = 0
        head = [m for m in messages[:1] if m.role == "system"]
        rest = messages[len(head) :]
        while len(template_tokens(head + rest)) >= self.n_ctx:
            if len(rest) <= 1:
                return None, dropped
            rest, dropped = rest[1:], dropped + 1
        return head + rest, dropped

    def _reply_pieces(self, request: TurnRequest) -> list[str]:
        if callable(self._replies):
            reply: str | Sequence[str] = self._replies(request)
        elif self._replies:
            reply = self._replies[(request.turn_id - 1) % len(self._replies)]
        else:
            reply = default_reply(request)
        return split_reply(reply) if isinstance(reply, str) else list(reply)

    def _should_crash(self, phase: Phase, request: TurnRequest) -> bool:
        return self.crash_at == phase and request.turn_id == self.crash_turn

    def _die(self, request: TurnRequest) -> Iterator[Event]:
        self.dead = True
        self._gone.set()
        yield EngineFailed("engine process died (signal SIGSEGV)", turn_id=request.turn_id, fatal=True)

    def _pause(self, phase: str) -> bool:
        """Block while ``hold == phase`` until released; returns whether the turn was cancelled."""
        if self.hold != phase:
            return False
        self.held.set()
        self._release.wait()
        self._release.clear()
        self.held.clear()
        self.hold = None  # hold once per engine
        return self._cancel.is_set()


def _answer_start(pieces: Sequence[str], fmt: ThinkingFormat, preopened: bool) -> int:
    """The index of the first scripted piece after the script's own closing marker (its end if none)."""
    splitter = ThinkingSplitter(fmt, preopened)
    for i, piece in enumerate(pieces):
        if splitter.feed(piece).closed:
            return i + 1
    return len(pieces)


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _ns(ms: float) -> int:
    return round(ms * NS_PER_MS)
