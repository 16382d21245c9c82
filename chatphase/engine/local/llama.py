"""LlamaEngine: owns a llama.cpp model and context and runs one chat turn as a stream of events.

It drives llama.cpp's C API (through llama-cpp-python's ctypes bindings) directly rather than
``Llama.create_chat_completion``: stream chunks there are not tokens, and no prefill progress exists
(``docs/architecture.md``). Here the prompt is evaluated in ``n_batch`` chunks, each synchronised, with a
``PrefillProgress`` event and a cancel check between chunks; sampling runs in llama.cpp's sampler chain,
so the per-token Python work is one sample call, one piece lookup, one decode call and one event.

KV prefix reuse: the prompt's tokens are built from the cache where its text matches what the cache
holds (:mod:`chatphase.engine.local.prefix`; the previous reply keeps the ids the model sampled, which
re-tokenising its text often would not), then, as in ``Llama.generate``, the longest common prefix of
the cached tokens and the prompt is kept, the rest dropped (``llama_memory_seq_rm``) and only the new
tail evaluated; at least one token is always evaluated so that there are logits to sample from.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import llama_cpp as lc

from chatphase.engine.base import CancelEvent
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import (
    CountRequest,
    EngineFailed,
    Event,
    LoadedModel,
    LoadedSettings,
    Message,
    ModelLoaded,
    PrefillProgress,
    PrefillStarted,
    PromptCount,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.llamalog import LlamaLogCapture
from chatphase.engine.local import ggml_devices, kv_shift, llama_params
from chatphase.engine.local.generation import Generated, generate
from chatphase.engine.local.generation import Model as GenModel
from chatphase.engine.local.llama_params import context_params, model_params, offload_plan
from chatphase.engine.local.overflow_turn import Overflow, ReplyShift, overflow_cut, swa_trim_refusal
from chatphase.engine.local.prefix import CacheText, encode_prompt
from chatphase.engine.local.prefix_keeper import PrefixKeeper, Restored, cap_bytes_of, key_parts
from chatphase.engine.local.prefix_store import common_tokens
from chatphase.engine.local.speculative import SpecGenerated, Speculator, generate_speculative, speculator
from chatphase.engine.logfile import default_log_path
from chatphase.engine.metrics import StopReason, compute_turn_metrics, ns_to_ms
from chatphase.engine.overflow import EMPTIED_BY_CHANGE, low_water, miss_reason, reply_room, restore_miss
from chatphase.engine.prompting.chat_format import TemplateError, refusal
from chatphase.engine.prompting.loaded import model_prompting
from chatphase.engine.prompting.prompt import ChatTemplate, FittedPrompt, PromptTooLong
from chatphase.engine.prompting.thinking import opened_by_prompt
from chatphase.engine.prompting.vocab import Vocab
from chatphase.engine.slow_paths import slow_paths, why_no_offload
from chatphase.engine.text import clean_text
from chatphase.engine.threads.governor import ThreadGovernor
from chatphase.errors import EngineError, UsageError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.kv import kv_bytes_per_token, kv_capacity_bytes
from chatphase.system import engine_registry


@dataclass
class TurnPrompt:
    """A turn's prompt fitted to n_ctx (:meth:`LlamaEngine._fit`) and what its start did to the KV cache
    (:meth:`LlamaEngine._start_cache`).

    ``tokens`` the prompt; ``dropped`` the messages left out to fit; ``text`` / ``template_text`` its templated
    text as UTF-8 / as text (``None`` for a prompt given as token ids); ``ovf`` what an overflow did;
    ``cache_before`` the KV cache's tokens when the turn began (before an overflow's cut); ``cached`` the tokens
    kept or restored; ``restored`` a restore from the prefix store, ``restore_note`` why the store was not used;
    ``t_restore_ns`` when the restore began; ``miss`` the cache-miss reason."""

    tokens: list[int]
    dropped: int
    text: bytes | None
    template_text: str | None
    ovf: Overflow | None
    cache_before: int
    cached: int = 0
    restored: Restored | None = None
    restore_note: str | None = None
    t_restore_ns: int = 0
    miss: str | None = None


class LlamaEngine:
    """In-process llama.cpp engine (implements :class:`chatphase.engine.base.Engine`).

    Args:
        info: the validated model (:func:`chatphase.models.gguf_meta.read_model_info`).
        config: the engine settings.
        cancel_event: anything with ``is_set()`` (a ``threading.Event`` or ``multiprocessing.Event``);
            :meth:`cancel` sets a private one when not given.
        log_path: where llama.cpp's log goes (default :func:`default_log_path`).
    """

    def __init__(
        self,
        info: ModelInfo,
        config: EngineConfig,
        cancel_event: CancelEvent | None = None,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.info = info
        self.config = config
        self._cancel: CancelEvent = cancel_event if cancel_event is not None else threading.Event()
        self._owns_cancel = cancel_event is None  # a shared event is cleared by its owner (EngineHost)
        self.log_path = Path(log_path) if log_path else default_log_path()
        self._model: lc.llama_model_p | None = None
        self._ctx: lc.llama_context_p | None = None
        self._cache: list[int] = []
        self._known = CacheText()  # the text that prefixes of self._cache stand for
        self._stops: tuple[str, ...] = ()
        self._registered = False
        self._log: LlamaLogCapture | None = None
        self._spec: Speculator | None = None
        self._trim_failed: str | None = None  # why this turn's cache could not be trimmed (a miss reason)
        self._keeper: PrefixKeeper | None = None  # the prefix store (:mod:`chatphase.engine.local.prefix_keeper`)
        self._alternatives: list[tuple[Sequence[int], CacheText]] = []  # stored prefixes, for this turn's encoding
        self.loaded: LoadedModel | None = None

    # -- Engine protocol -------------------------------------------------------------------------
    def load(self) -> Iterator[Event]:
        """Load the model and create the context; yields ``ModelLoaded`` or ``EngineFailed(fatal=True)``."""
        try:
            yield ModelLoaded(self._load())
        except (TemplateError, UsageError) as exc:  # already one line the user can act on
            yield EngineFailed(str(exc), fatal=True)
        except Exception as exc:  # llama.cpp reports failures as NULL pointers; we raise with a message
            yield EngineFailed(f"model failed to load: {exc}", fatal=True)

    def run_turn(self, request: TurnRequest) -> Iterator[Event]:
        """Run one turn (see :mod:`chatphase.engine.events` for the event order).

        A message too long for the context yields one ``EngineFailed(fatal=False)`` and no
        ``TurnFinished``; a llama.cpp decode error ends the turn with ``stop_reason="error"``.
        """
        if self._ctx is None:
            yield EngineFailed("the model is not loaded", request.turn_id, fatal=True)
            return
        try:
            yield from self._run(request, self._ctx)
        finally:
            self.cancel_done()

    def cancel_done(self) -> None:
        """A turn (or batch) ended: a cancel asked for it is spent, so the next one runs (the engine's own
        flag; a shared one is cleared by its owner, :class:`~chatphase.engine.process.host.EngineHost`)."""
        if self._owns_cancel:
            self._cancel.clear()

    def watch(self) -> Iterator[Event]:
        """Nothing to watch in-process (a crash here takes the caller with it): returns at once."""
        return iter(())

    def cancel(self) -> None:
        """Ask the running turn to stop at the next prefill chunk or token (thread-safe)."""
        self._cancel.set()

    def idle(self) -> None:
        """The engine waits for a turn (the process host calls this about once a second): the prefix store
        saves the cache when its policy says so."""
        if self._keeper is not None:
            self._keeper.idle(self._cache, self._known)
            self._log_keeper()

    def close(self) -> None:
        """Save the cache's prefix (bounded, :meth:`PrefixKeeper.flush`), free the context and model. Idempotent."""
        if self._keeper is not None:
            self._keeper.flush(self._cache, self._known)
            self._keeper.close()
            self._log_keeper()
            self._keeper = None
        if self._spec is not None:
            self._spec.close()
            self._spec = None
        if self._ctx is not None:
            lc.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            lc.llama_model_free(self._model)
            self._model = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._registered:
            engine_registry.unregister()
            self._registered = False

    # -- public helpers --------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of ``text`` (special tokens such as ``<|im_start|>`` are parsed)."""
        return self._vocab.tokenize(text, add_special)

    def count_prompt(self, request: CountRequest) -> PromptCount | None:
        """Template and tokenise ``request.messages`` as :meth:`run_turn` would and say what the KV cache
        holds of them, changing nothing (call it between turns: the engine is one-turn-at-a-time)."""
        if self._ctx is None:
            return None
        messages = tuple(
            Message(m.role, clean_text(m.content)[0], clean_text(m.reasoning)[0]) for m in request.messages
        )
        texts = tuple(len(self._vocab.tokenize(clean_text(t)[0], False)) for t in request.texts)
        kv = len(self._cache)
        keeper = self._keeper
        self._alternatives = keeper.alternatives() if keeper is not None else []  # encoded as a turn would be
        try:  # fitted as the turn would be
            fitted = self._fit_messages(messages, request.max_tokens, request.enable_thinking,
                                        request.first_message, request.overflow, request.overflow_from)  # fmt: skip
        except PromptTooLong as exc:
            return PromptCount(None, 0, kv, self._n_ctx, text_tokens=texts, too_long=str(exc))
        finally:
            self._alternatives = []
        cache, known = list(self._cache), self._known.copy()  # what the turn's overflow cut would leave
        prompt = self._cut_overflow(request, fitted, messages, None, cache, known)[1].tokens
        cached = self._reusable(prompt, cache)
        dropped = max(fitted.dropped_messages - request.overflow_from, 0)
        count = PromptCount(len(prompt), cached, kv, self._n_ctx, dropped, texts)
        found = keeper.find(prompt, cached) if keeper is not None else None
        if keeper is None or found is None:
            return count
        decision = keeper.decide(found[0], found[1] - cached, found[1])
        if not decision.restore:
            return count
        return replace(count, restore_tokens=found[1] - cached, restore_ms=decision.predicted_restore_ms)

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (special tokens render empty unless ``special``)."""
        return self._vocab.piece(token, special)

    def _encode(self, text: str, add_special: bool) -> list[int]:
        """The prompt ``text`` as tokens, reusing the cached tokens for the text the cache holds — or a stored
        prefix's tokens (:attr:`_alternatives`) where one holds more of the text than the cache does."""
        tokens = encode_prompt(text, add_special, self._cache, self._known, self._vocab.tokenize, self._vocab.render)
        if not self._alternatives:
            return tokens
        data = text.encode("utf-8")
        alt_tokens, alt_known = max(self._alternatives, key=lambda alt: alt[1].split(data)[0])
        if alt_known.split(data)[0] <= self._known.split(data)[0]:
            return tokens
        alt = encode_prompt(text, add_special, alt_tokens, alt_known, self._vocab.tokenize, self._vocab.render)
        return alt if common_tokens(alt, alt_tokens) > common_tokens(tokens, self._cache) else tokens

    @property
    def cached_tokens(self) -> list[int]:
        """The tokens whose KV entries the cache holds, in order."""
        return list(self._cache)

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        """Decode and prompt threads from the next evaluation on (``llama_set_n_threads``, at no cost)."""
        lc.llama_set_n_threads(self._ctx, n_threads, n_threads_batch)

    def threads_now(self) -> tuple[int, int]:
        """The decode and prompt threads llama.cpp holds now."""
        return lc.llama_n_threads(self._ctx), lc.llama_n_threads_batch(self._ctx)

    @property
    def template(self) -> ChatTemplate:
        """The chat format turns are rendered with (after :meth:`load`)."""
        return self._template

    @property
    def vocab(self) -> Vocab:
        """The loaded model's vocabulary (after :meth:`load`)."""
        return self._vocab

    def time_verify_steps(self, context: list[int], steps: Sequence[Sequence[int]]) -> list[float]:
        """ms of each of ``steps`` evaluated after ``context`` as a speculative verify step is: one batch with
        logits at every position, timed to ``llama_synchronize``, then dropped from the KV cache. ``context``
        is evaluated first (in ``n_batch`` chunks) into a cleared cache, which is cleared again afterwards.

        Raises:
            EngineError: llama.cpp refuses the context or a step.
        """
        lc.llama_memory_clear(self._mem, True)
        self._cache.clear()
        self._known.clear()
        batch = lc.llama_batch_init(max(len(s) for s in steps), 0, 1)
        depth, out = len(context), []
        try:
            for start in range(0, depth, self._n_batch):
                if not self._decode(context[start : start + self._n_batch]):
                    raise EngineError("llama.cpp could not evaluate the context")
            for tokens in steps:
                for i, token in enumerate(tokens):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, depth + i, 1
                    batch.seq_id[i][0], batch.logits[i] = 0, 1
                batch.n_tokens = len(tokens)
                t0 = time.perf_counter_ns()
                if lc.llama_decode(self._ctx, batch) != 0:
                    raise EngineError(f"llama.cpp could not evaluate a batch of {len(tokens)}")
                lc.llama_synchronize(self._ctx)
                out.append((time.perf_counter_ns() - t0) / 1e6)
                lc.llama_memory_seq_rm(self._mem, 0, depth, -1)
        finally:
            lc.llama_batch_free(batch)
            lc.llama_memory_clear(self._mem, True)
        return out

    # -- loading ---------------------------------------------------------------------------------
    def _load(self) -> LoadedModel:
        t0 = time.perf_counter_ns()
        self._log = LlamaLogCapture(self.log_path)
        self._log.write(f"--- chatphase: loading {self.info.path} (pid {os.getpid()})")
        lc.llama_backend_init()
        s = self.config.resolved()
        self.threads = ThreadGovernor.for_config(self.config, self.set_threads)
        system_info = llama_params.cpu_system_info()  # the module attribute: tests fake the CPU there
        gpu_ok = bool(lc.llama_supports_gpu_offload())
        why_not = None if gpu_ok else why_no_offload(ggml_devices.backends(), ggml_devices.devices(), None)
        plan = offload_plan(s, system_info, gpu_ok, why_not)
        notes = list(plan.notes)
        if gpu_ok and (refusal := ggml_devices.kv_too_big_for_device(self.info, s, plan.n_gpu_layers)):
            raise UsageError(refusal)
        self._model = lc.llama_model_load_from_file(str(self.info.path).encode("utf-8"), model_params(plan))
        if not self._model:
            raise RuntimeError(
                ggml_devices.allocation_failure(self._log.failed_allocation, s)
                or f"llama.cpp could not load {self.info.path} (see {self.log_path})"
            )
        self._ctx = lc.llama_init_from_model(self._model, context_params(s))
        if not self._ctx:
            raise RuntimeError(
                ggml_devices.allocation_failure(self._log.failed_allocation, s)
                or f"llama.cpp could not create a context of {s['n_ctx']:,} tokens (see {self.log_path})"
            )
        devices = ggml_devices.devices()  # memory free after the model and context were allocated
        buffers = ggml_devices.buffer_sizes(self._log.buffer_mib(), devices)
        self._vocab = Vocab(lc.llama_model_get_vocab(self._model))
        self._mem: lc.llama_memory_t = lc.llama_get_memory(self._ctx)
        self._n_ctx: int = lc.llama_n_ctx(self._ctx)
        # the most tokens one llama_decode takes: n_batch, at most the n_ctx asked for (llama.cpp clamps it before it
        # pads n_ctx to 256): chunking by the setting instead made a prompt over a tiny n_ctx abort the process
        self._n_batch: int = lc.llama_n_batch(self._ctx)
        if self._n_ctx != s["n_ctx"]:
            notes.append(
                f"n_ctx {s['n_ctx']:,} -> {self._n_ctx:,}: llama.cpp sizes the context in blocks of 256 tokens"
            )

        prompting = model_prompting(self._model, self._vocab, self.info.architecture, s["chat_template"])
        self._format, self._template, self._stops = prompting.format, prompting.template, prompting.stops
        self._thinking = prompting.thinking
        notes.extend(prompting.notes)

        if self.info.attention is None:
            raise RuntimeError(f"{self.info.architecture} has no per-token KV cache; chatphase cannot measure it")
        self._kv_per_token = kv_bytes_per_token(self.info.attention, s["type_k"], s["type_v"])
        found = {
            "n_ctx": self._n_ctx,
            "n_gpu_layers": plan.n_gpu_layers_setting,
            "use_extra_bufts": plan.use_extra_bufts,
        }
        resolved = LoadedSettings(**{**s, **found, "gpu_offload_supported": gpu_ok, "amx_detected": plan.amx})
        self._spec = speculator(
            self.config.spec, self._model, self._vocab.ptr, s, system_info, gpu_ok, notes, str(self.info.path)
        )
        kv_mib = self._log.kv_cache_mib
        layers_offloaded = self._log.layers_offloaded if gpu_ok else 0
        layers_total = self._log.layers_total or (self.info.n_layer or 0) + 1
        gpus = ggml_devices.offload_devices(devices) if gpu_ok and s["op_offload"] else ()
        op_device = gpus[0].name if gpus and (layers_offloaded or 0) < layers_total else None
        slow = slow_paths(
            op_offload_device=op_device,
            layers_offloaded=layers_offloaded,
            layers_total=layers_total,
            buffers=buffers,
            amx=plan.amx,
            use_extra_bufts=plan.use_extra_bufts,
            flash_attn=s["flash_attn"],
            flash_attn_mismatch=self._log.flash_attn_mismatch,
            type_k=s["type_k"],
            type_v=s["type_v"],
            amx_why=plan.extra_bufts_why,
        )
        self.loaded = LoadedModel(
            info=self.info,
            settings=resolved,
            load_ms=ns_to_ms(time.perf_counter_ns() - t0),
            kv_bytes_per_token=self._kv_per_token,
            kv_capacity_bytes=kv_capacity_bytes(self._kv_per_token, self._n_ctx),
            layers_offloaded=layers_offloaded,
            layers_total=layers_total,
            llama_kv_cache_bytes=round(kv_mib * 2**20) if kv_mib is not None else None,
            system_info=system_info,
            notes=tuple(notes),
            log_path=str(self.log_path),
            pid=os.getpid(),
            chat_format=self._format.label,
            thinking_format=self._thinking.name if self._thinking else None,
            thinking_switch=prompting.switch,
            spec_mode=self._spec.kind if self._spec else "off",
            backends=ggml_devices.backends(),
            devices=devices,
            buffers=buffers,
            slow_paths=slow,
            kv_shift_refusal=kv_shift.shift_refusal(self._model, self._mem),
        )
        for note in notes:
            self._log.write(f"chatphase: {note}")
        for line in slow:
            self._log.write(f"chatphase: slow path: {line}")
        self._keeper = self._open_prefix_store(s, plan.use_extra_bufts, plan.n_gpu_layers)
        self._registered = engine_registry.register() is not None  # peak measurements wait while we are busy
        return self.loaded

    def _open_prefix_store(self, s: dict[str, Any], use_extra_bufts: bool, n_gpu_layers: int) -> PrefixKeeper | None:
        """The prefix store when it is on (one sequence per context only); ``None`` when off or unusable."""
        if self.config.prefix_cache != "on" or self.config.n_seq_max != 1 or not self._ctx or not self._model:
            return None
        try:
            parts = key_parts(str(self.info.path), s, use_extra_bufts, n_gpu_layers)
            return PrefixKeeper(
                self._ctx, self._mem, self._model, parts, self.info.name, self._n_ctx,
                cap_bytes_of(self.config.prefix_cache_mib),
            )  # fmt: skip
        except OSError as exc:
            if self._log is not None:
                self._log.write(f"chatphase: prefix store off: {exc}")
            return None

    def _log_keeper(self) -> None:
        if self._keeper is not None and self._log is not None:
            for line in self._keeper.lines:
                self._log.write(f"chatphase: {line}")
        if self._keeper is not None:
            self._keeper.lines.clear()

    # -- one turn --------------------------------------------------------------------------------
    def _decode(self, tokens: list[int]) -> bool:
        arr = (lc.llama_token * len(tokens))(*tokens)
        return int(lc.llama_decode(self._ctx, lc.llama_batch_get_one(arr, len(tokens)))) == 0

    def _reusable(self, prompt: list[int], cache: Sequence[int] | None = None) -> int:
        """The longest common prefix of the cache (or ``cache``) and ``prompt``, leaving at least one token to
        evaluate."""
        cache = self._cache if cache is None else cache
        keep, limit = 0, min(len(cache), len(prompt) - 1)
        while keep < limit and cache[keep] == prompt[keep]:
            keep += 1
        return keep

    def _reuse_prefix(self, prompt: list[int], reset: bool) -> int:
        """Keep the longest common prefix of the cache and ``prompt`` (at least one token left to evaluate)."""
        keep = 0 if reset else self._reusable(prompt)
        if keep and (why := swa_trim_refusal(self._mem, self._model, keep)):
            keep, self._trim_failed = 0, why  # the window before ``keep`` is gone: llama-server re-processes too
        if keep < len(self._cache):
            if not lc.llama_memory_seq_rm(self._mem, 0, keep, -1):
                lc.llama_memory_clear(self._mem, True)  # models whose memory cannot drop a tail (recurrent)
                keep, self._trim_failed = 0, "recurrent"
            del self._cache[keep:]
        return keep

    def _restore(
        self, keeper: PrefixKeeper, prompt: list[int], cached: int
    ) -> tuple[Restored | None, str | None, bool]:
        """Restore the stored prefix of ``prompt`` when the rule says it beats recomputing it (beyond the
        ``cached`` tokens). Returns ``(the restore or None, one line when the store was looked at and not
        used, whether sequence 0 was emptied)`` — a refused file empties it: the prompt is recomputed."""
        found = keeper.find(prompt, cached)
        refused = keeper.take_refused()
        if found is None:
            return None, refused, False
        entry, n = found
        decision = keeper.decide(entry, n - cached, n)
        if not decision.restore:
            return None, f"prefix store: {n:,} tokens saved, not restored: {decision.why}", False
        out = keeper.restore(entry, n, decision)
        self._log_keeper()
        return (out, None, False) if isinstance(out, Restored) else (None, out, True)

    def _fit_messages(
        self,
        messages: tuple[Message, ...],
        max_tokens: int,
        thinking: bool | None,
        first: int,
        overflow: str,
        before: int | None = None,
    ) -> FittedPrompt:
        """``messages`` templated and fitted to n_ctx less the reply's room, from the ``first`` message on (those
        before are left out already), dropping down to the low-water mark unless ``overflow`` is ``stop``.
        ``before`` (> ``first`` after a fresh engine): the messages the conversation had left out already; the fit
        brings back those that fit under the low-water mark, and leaves out no more than them unless they
        alone overflow (then it drops from them on, as the next turn would have). Its ``full_tokens`` is ``None``
        unless it left out more than ``before``: only that is an overflow.

        Raises:
            PromptTooLong: it does not fit.
        """
        budget = self._n_ctx - reply_room(max_tokens, self._n_ctx)
        low = low_water(budget, self._n_ctx)

        def fit(skip: int) -> FittedPrompt:
            return self._template.fit(messages, budget, self._encode, thinking, skip, low, drop=overflow != "stop")

        if before is None or before <= first:
            return fit(first)
        try:
            fitted = fit(first)
        except PromptTooLong:  # under stop, nothing is dropped: from ``before`` on it may fit as it did
            return fit(before)
        if fitted.full_tokens is None:
            return fitted
        if fitted.dropped_messages <= before:  # no more than the conversation had left out: no overflow
            return replace(fitted, full_tokens=None)
        return fit(before)

    def _fit(self, req: TurnRequest, messages: tuple[Message, ...]) -> Generator[Event, None, TurnPrompt | None]:
        """The turn's prompt fitted to n_ctx (:class:`TurnPrompt`), an overflow cut made in the KV cache; an
        :class:`EngineFailed` event and ``None`` when it cannot be (used as ``p = yield from self._fit(…)``)."""
        if req.prompt_token_ids is not None:
            tokens = list(req.prompt_token_ids)
            if not 0 < len(tokens) < self._n_ctx:
                yield EngineFailed(f"a prompt of {len(tokens)} tokens does not fit n_ctx={self._n_ctx}", req.turn_id)
                return None
            return TurnPrompt(tokens, 0, None, None, None, len(self._cache))
        try:
            fitted = self._fit_messages(
                messages, req.sampling.max_tokens, req.enable_thinking, req.first_message, req.overflow,
                req.overflow_from,
            )  # fmt: skip
        except PromptTooLong as exc:
            room = reply_room(req.sampling.max_tokens, self._n_ctx)
            yield EngineFailed(
                f"message refused (n_ctx {self._n_ctx:,}, {room:,} kept for the reply): {exc}", req.turn_id
            )
            return None
        except Exception as exc:  # the template raised on this conversation (e.g. a system message)
            yield EngineFailed(refusal(self._format, exc), req.turn_id)
            return None
        finally:
            self._alternatives = []
        if fitted.full_tokens is not None and req.overflow == "shift":  # an overflow to shift: can llama.cpp?
            if why := kv_shift.shift_refusal(self._model, self._mem):
                yield EngineFailed(f"overflow shift refused: {why} (use --overflow drop-oldest)", req.turn_id)
                return None
        ovf, fitted = self._cut_overflow(req, fitted, messages, self._mem, self._cache, self._known)
        text = fitted.text.encode("utf-8")
        cache_before = ovf.cache_before if ovf else len(self._cache)
        return TurnPrompt(fitted.tokens, fitted.dropped_messages, text, fitted.text, ovf, cache_before)

    def _cut_overflow(
        self,
        req: TurnRequest | CountRequest,
        fitted: FittedPrompt,
        messages: tuple[Message, ...],
        mem: lc.llama_memory_t | None,
        cache: list[int],
        known: CacheText,
    ) -> tuple[Overflow | None, FittedPrompt]:
        """The overflow of ``fitted`` (``None`` when it dropped nothing new) cut in ``cache`` / ``known``
        (:func:`overflow_cut`: under shift the dropped messages leave them, and llama.cpp's memory unless ``mem``
        is ``None``), and ``fitted`` with its tokens encoded again on what a shifted cache holds. The turn and the
        count (on copies) both call it, so the count's cached tokens are the turn's."""
        if fitted.full_tokens is None:
            return None, fitted
        n_messages = sum(m.role != "system" for m in messages)
        ovf = overflow_cut(req, fitted, n_messages, mem, cache, known, self._vocab.render)
        if ovf.shifted:  # as :meth:`_encode`, whose stored-prefix alternatives are cleared by now
            tokens = encode_prompt(fitted.text, fitted.add_special, cache, known, self._vocab.tokenize,
                                   self._vocab.render)  # fmt: skip
            fitted = replace(fitted, tokens=tokens)
        return ovf, fitted

    def _start_cache(
        self, req: TurnRequest, messages: tuple[Message, ...], keeper: PrefixKeeper | None, p: TurnPrompt
    ) -> None:
        """Make the KV cache hold the longest prefix of ``p``'s tokens it can (what it holds, else a restore from
        the prefix store) and fill in ``p``'s ``cached``, restore and ``miss`` fields."""
        self._trim_failed = None
        cached = self._reuse_prefix(p.tokens, req.reset_cache)
        p.t_restore_ns = time.perf_counter_ns()
        restored, p.restore_note, cleared = self._restore(keeper, p.tokens, cached) if keeper else (None, None, False)
        unsaved = keeper.take_unsaved() if keeper else None
        if unsaved is not None:  # said once, before the turn it may leave cold next time
            p.restore_note = f"{p.restore_note}; {unsaved}" if p.restore_note else unsaved
        if restored is not None:
            cached = restored.tokens
            self._cache[:] = p.tokens[:cached]
            self._known = restored.known
        elif cleared:  # a refused file: the sequence was emptied, the prompt is recomputed
            cached = 0
            self._cache.clear()
            self._known.clear()
        p.cached, p.restored = cached, restored
        self._known.truncate(cached, p.text)
        if p.ovf is not None:
            p.ovf.count_reprefill(p.tokens, self._vocab.render, p.text or b"", cached, restored is not None)
        p.miss = miss_reason(
            cache_before=p.cache_before,
            reused=cached,
            history=sum(m.role != "system" for m in messages) > 1,
            overflow=p.ovf.policy if p.ovf else None,
            trim_failed=self._trim_failed,
            change=req.history_change,
        )
        if restored is not None and p.miss in EMPTIED_BY_CHANGE:  # the cache came from disk: did it hold it all?
            p.miss = restore_miss(p.text, len(self._known.text), messages[-2].content, messages[-1].content)

    def _run(self, req: TurnRequest, ctx: lc.llama_context_p) -> Iterator[Event]:
        t_submit = time.perf_counter_ns()
        messages = tuple(  # never a surrogate
            Message(m.role, clean_text(m.content)[0], clean_text(m.reasoning)[0]) for m in req.messages
        )
        if req.reset_cache:
            self._known.clear()
        keeper = self._keeper if req.prefix_store and not req.reset_cache else None
        if keeper is not None:
            keeper.turn_started()
            self._alternatives = keeper.alternatives() if req.prompt_token_ids is None else []
        elif self._keeper is not None:
            self._keeper.other_turn()
        p: TurnPrompt | None = yield from self._fit(req, messages)
        if p is None:
            return
        self._start_cache(req, messages, keeper, p)
        prompt, dropped, text, ovf, cached, restored = p.tokens, p.dropped, p.text, p.ovf, p.cached, p.restored
        todo = prompt[cached:]
        threads = self.threads.start_turn()  # before the clock starts: it samples the load, sets the threads
        t_prefill_start = time.perf_counter_ns()
        yield PrefillStarted(
            req.turn_id,
            len(prompt),
            cached,
            len(todo),
            dropped,
            t_prefill_start,
            **threads.fields(),
            **(ovf.fields() if ovf else {}),
            cache_miss_reason=p.miss,
            restored_tokens=restored.tokens if restored else None,
            restore_ms=restored.ms if restored else None,
            restore_bytes=restored.state_bytes if restored else None,
            restore_prefill_ms=restored.decision.predicted_prefill_ms if restored else None,
            restore_note=p.restore_note,
        )

        stop: StopReason | None = None
        n_batch = self._n_batch
        done = 0
        while done < len(todo):
            if self._cancel.is_set():
                stop = "cancelled"
                break
            chunk = todo[done : done + n_batch]
            if not self._decode(chunk):
                stop = "error"
                break
            lc.llama_synchronize(self._ctx)
            self._cache.extend(chunk)
            done += len(chunk)
            yield PrefillProgress(req.turn_id, done, len(todo), ns_to_ms(time.perf_counter_ns() - t_prefill_start))
        t_prefill_end = time.perf_counter_ns()

        out = Generated()
        if stop is None:
            if text is not None:
                self._known.add_prompt(len(prompt), text)
            preopened = p.template_text is not None and opened_by_prompt(p.template_text, self._thinking)
            shifter = None
            if text is not None and self._spec is None and self.loaded is not None:
                render = self._template.render
                shifter = ReplyShift.for_turn(
                    req, self.loaded, messages, dropped, lambda ms: render(ms, req.enable_thinking)[0], text,
                    self._mem, self._cache, self._vocab.render, len(prompt), self._n_ctx, self._decode, self._n_batch,
                )  # fmt: skip
            model = GenModel(
                ctx,
                self._vocab.ptr,
                self._cache,
                self._n_ctx,
                self._cancel,
                self._vocab.render if self._thinking else self.piece,  # a thinking model's markers, as text
                lambda text: self._vocab.tokenize(text, False),
                self._decode,
                self.threads.on_token,
                shifter,
            )
            if self._spec is None:
                yield from generate(model, req, t_submit, self._stops, self._thinking, preopened, out)
            else:
                out = SpecGenerated()
                yield from generate_speculative(
                    model, self._mem, self._spec, req, t_submit, self._stops, self._thinking, preopened, out
                )
            stop = out.stop
            n_prompt = len(prompt)
            if shifter is not None and shifter.dropped_messages:  # the reply went on past n_ctx
                n_prompt, dropped = shifter.prompt_len, dropped + shifter.dropped_messages
                self._known.clear()
                self._known.add_prompt(n_prompt, shifter.text)
                ovf = ovf or Overflow(req.overflow, 0, cache_before=p.cache_before)
                ovf.dropped_messages += shifter.dropped_messages
                ovf.dropped_tokens += shifter.dropped_tokens
                ovf.reprefill += shifter.reprefill_tokens
                ovf.reply_reprefill_tokens, ovf.reply_reprefill_ms = shifter.reprefill_tokens, shifter.reprefill_ms
            if self._known.n_tokens == n_prompt:  # the reply's evaluated tokens, by their text
                self._known.add_pieces(self._vocab.render(t) for t in self._cache[n_prompt:])
        metrics = compute_turn_metrics(
            t_submit_ns=t_submit,
            t_prefill_start_ns=t_prefill_start,
            t_prefill_end_ns=t_prefill_end,
            token_times_ns=out.times,
            prompt_tokens=len(prompt),
            cached_tokens=len(prompt) - len(todo),
            evaluated_tokens=done,
            kv_cache_tokens=len(self._cache),
            kv_bytes_per_token=self._kv_per_token,
            kv_capacity_bytes=kv_capacity_bytes(self._kv_per_token, self._n_ctx),
            stop_reason=stop,
            dropped_messages=dropped,
            **(out.tracker.metrics_args() if out.tracker else {}),
            spec=getattr(out, "spec", None),
        )
        metrics = replace(metrics, cache_miss_reason=p.miss, **(ovf.metrics_fields(metrics) if ovf else {}))
        if restored is not None:
            metrics = replace(
                metrics,
                tokenize_ms=ns_to_ms(p.t_restore_ns - t_submit),
                restored_tokens=restored.tokens,
                restore_ms=restored.ms,
                restore_bytes=restored.state_bytes,
            )
        if keeper is not None:
            sample = (len(prompt), done, ns_to_ms(t_prefill_end - t_prefill_start)) if stop != "cancelled" else None
            keeper.turn_ended(len(self._cache), cached, sample)
            self._log_keeper()
        if stop == "error":
            yield EngineFailed("llama.cpp failed to evaluate a batch (see the engine log)", req.turn_id)
        metrics = self.threads.finish_turn(metrics)
        yield TurnFinished(req.turn_id, "".join(out.parts), metrics, thinking="".join(out.thought))
