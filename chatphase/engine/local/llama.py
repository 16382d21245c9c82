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

The context and the record of what its KV cache holds have one owner, :class:`~chatphase.engine.local.kv_context.
KvContext`: the turn below, the overflow's cut and the reply's shift, the decode loops, the prompt count and the
prefix store all change or read the cache through it.
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
    LayerPlacement,
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
from chatphase.engine.exactness import cold_batch_starts, turn_exactness
from chatphase.engine.llamalog import LlamaLogCapture
from chatphase.engine.local import ggml_devices, llama_params, rpc
from chatphase.engine.local.generation import Generated, Model, generate
from chatphase.engine.local.kv_context import Alternatives, KvContext
from chatphase.engine.local.llama_params import ALL_LAYERS, OffloadPlan, context_params, model_params, offload_plan
from chatphase.engine.local.overflow_turn import Overflow, ReplyShift, overflow_cut
from chatphase.engine.local.prefix_keeper import PrefixKeeper, Restored, cap_bytes_of, key_parts
from chatphase.engine.local.prefix_store import Entry
from chatphase.engine.local.projection import fit_layers
from chatphase.engine.local.speculative import SpecGenerated, Speculator, generate_speculative, speculator
from chatphase.engine.local.thread_clock import PhaseWaits
from chatphase.engine.local.token_record import TokenRecorder
from chatphase.engine.logfile import default_log_path
from chatphase.engine.memory_plan import LAYERS_NOTE
from chatphase.engine.metrics import StopReason, TurnMetrics, compute_turn_metrics, ns_to_ms
from chatphase.engine.overflow import EMPTIED_BY_CHANGE, low_water, miss_reason, reply_room, restore_miss
from chatphase.engine.prompting.chat_format import TemplateError, refusal
from chatphase.engine.prompting.loaded import model_prompting
from chatphase.engine.prompting.prompt import ChatTemplate, FittedPrompt, PromptTooLong
from chatphase.engine.prompting.thinking import opened_by_prompt
from chatphase.engine.prompting.vocab import Vocab
from chatphase.engine.restore_policy import RestoreDecision
from chatphase.engine.slow_paths import slow_paths, why_no_offload
from chatphase.engine.text import clean_text
from chatphase.engine.threads.governor import ThreadGovernor
from chatphase.errors import EngineError, UsageError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.kv import kv_bytes_per_token, kv_capacity_bytes
from chatphase.system import engine_registry


@dataclass(frozen=True)
class TurnPrompt:
    """A turn's prompt fitted to n_ctx (:meth:`LlamaEngine._fit`): ``tokens``; ``dropped`` the messages left out
    to fit; ``text`` / ``template_text`` its templated text as UTF-8 / as text (``None`` for a prompt given as
    token ids); ``ovf`` what an overflow did; ``cache_before`` the KV cache's tokens when the turn began (before
    an overflow's cut)."""

    tokens: list[int]
    dropped: int
    text: bytes | None
    template_text: str | None
    ovf: Overflow | None
    cache_before: int


@dataclass(frozen=True)
class CacheStart:
    """What the start of a turn made the KV cache hold (:meth:`LlamaEngine._start_cache`): ``cached`` tokens of
    the prompt kept or restored; ``restored`` a restore from the prefix store, ``restore_note`` why the store was
    not used; ``t_restore_ns`` when the restore began; ``miss`` the cache-miss reason."""

    cached: int
    restored: Restored | None
    restore_note: str | None
    t_restore_ns: int
    miss: str | None


def placement(layer_devices: dict[int, str], n_layer: int) -> tuple[LayerPlacement, ...]:
    """llama.cpp's layer assignment (``{layer: device}``, the output layer numbered ``n_layer``;
    :attr:`chatphase.engine.llamalog.LlamaLogCapture.layer_devices`) per device, in the order the devices first
    appear."""
    devices = list(dict.fromkeys(layer_devices.values()))
    return tuple(
        LayerPlacement(
            dev,
            tuple(sorted(i for i, d in layer_devices.items() if d == dev and i < n_layer)),
            layer_devices.get(n_layer) == dev,
        )
        for dev in devices
    )


@dataclass(frozen=True)
class RestorePlan:
    """What the prefix store would do for a prompt (:meth:`LlamaEngine._restore_plan`): restore ``entry``'s first
    ``upto`` of the ``shared`` tokens it shares with the prompt, as the rule's ``decision`` says; ``exact``: ``upto``
    is where the run that saved it began a batch (under ``prefix_cache = exact`` it is cut there, the shared tokens
    after it evaluated again); ``note`` one line when an exact restore cannot be exact."""

    entry: Entry
    shared: int
    upto: int
    exact: bool
    decision: RestoreDecision
    note: str | None


@dataclass(frozen=True)
class PromptCells:
    """How a turn's prompt cells were computed, read when its prefill ended (:func:`~chatphase.engine.exactness.
    turn_exactness`): their batch starts and whether a shift moved any (``None``: unknown)."""

    starts: list[int] | None
    shifted: bool | None


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
        self._kv: KvContext | None = None  # the context and the record of its KV cache
        self._stops: tuple[str, ...] = ()
        self._registered = False
        self._log: LlamaLogCapture | None = None
        self._spec: Speculator | None = None
        self._keeper: PrefixKeeper | None = None  # the prefix store (:mod:`chatphase.engine.local.prefix_keeper`)
        # prefix_cache = exact: reuse the KV cache (kept or restored) only up to a batch start of the run that made it
        self._exact = config.prefix_cache == "exact"
        self._cpu_only = True  # no layer and no batch on a GPU (set at load)
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
        if self._kv is None:
            yield EngineFailed("the model is not loaded", request.turn_id, fatal=True)
            return
        try:
            yield from self._run(request, self._kv)
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
            self._keeper.idle()
            self._log_keeper()

    def close(self) -> None:
        """Save the cache's prefix (bounded, :meth:`PrefixKeeper.flush`), free the context and model. Idempotent."""
        if self._keeper is not None:
            self._keeper.flush()
            self._keeper.close()
            self._log_keeper()
            self._keeper = None
        if self._spec is not None:
            self._spec.close()
            self._spec = None
        if self._kv is not None:
            self._kv.free()
            self._kv = None
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
        kv = self._kv
        if kv is None:
            return None
        messages = tuple(
            Message(m.role, clean_text(m.content)[0], clean_text(m.reasoning)[0]) for m in request.messages
        )
        texts = tuple(len(self._vocab.tokenize(clean_text(t)[0], False)) for t in request.texts)
        keeper = self._keeper
        alternatives = keeper.alternatives() if keeper is not None else []  # encoded as a turn would be
        try:  # fitted as the turn would be
            fitted = self._fit_messages(kv, messages, request, request.max_tokens, alternatives)
        except PromptTooLong as exc:
            return PromptCount(None, 0, len(kv.tokens), kv.n_ctx, text_tokens=texts, too_long=str(exc))
        after = kv.what_if()  # what the turn's overflow cut would leave
        prompt = self._cut_overflow(request, fitted, messages, after)[1].tokens
        cached = after.reusable(prompt)
        if self._exact:
            cached = after.exact_keep(cached)
        dropped = max(fitted.dropped_messages - request.overflow_from, 0)
        count = PromptCount(len(prompt), cached, len(kv.tokens), kv.n_ctx, dropped, texts)
        plan = self._restore_plan(keeper, prompt, cached) if keeper is not None else None
        if plan is None or not plan.decision.restore:
            return count
        return replace(count, restore_tokens=plan.upto - cached, restore_ms=plan.decision.predicted_restore_ms)

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (special tokens render empty unless ``special``)."""
        return self._vocab.piece(token, special)

    @property
    def cached_tokens(self) -> list[int]:
        """The tokens whose KV entries the cache holds, in order."""
        return list(self._kv.tokens) if self._kv is not None else []

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        """Decode and prompt threads from the next evaluation on (``llama_set_n_threads``, at no cost)."""
        lc.llama_set_n_threads(self._loaded_kv().ptr, n_threads, n_threads_batch)

    def threads_now(self) -> tuple[int, int]:
        """The decode and prompt threads llama.cpp holds now."""
        ctx = self._loaded_kv().ptr
        return lc.llama_n_threads(ctx), lc.llama_n_threads_batch(ctx)

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
        kv = self._loaded_kv()
        kv.clear()
        batch = lc.llama_batch_init(max(len(s) for s in steps), 0, 1)
        depth, out = len(context), []
        try:
            for start in range(0, depth, kv.n_batch):
                if not kv.decode(context[start : start + kv.n_batch]):
                    raise EngineError("llama.cpp could not evaluate the context")
            for tokens in steps:
                for i, token in enumerate(tokens):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, depth + i, 1
                    batch.seq_id[i][0], batch.logits[i] = 0, 1
                batch.n_tokens = len(tokens)
                t0 = time.perf_counter_ns()
                if lc.llama_decode(kv.ptr, batch) != 0:
                    raise EngineError(f"llama.cpp could not evaluate a batch of {len(tokens)}")
                lc.llama_synchronize(kv.ptr)
                out.append((time.perf_counter_ns() - t0) / 1e6)
                lc.llama_memory_seq_rm(kv.mem, 0, depth, -1)
        finally:
            lc.llama_batch_free(batch)
            kv.clear()
        return out

    def _loaded_kv(self) -> KvContext:
        """The context (after :meth:`load`).

        Raises:
            RuntimeError: the model is not loaded.
        """
        if self._kv is None:
            raise RuntimeError("the model is not loaded")
        return self._kv

    # -- loading ---------------------------------------------------------------------------------
    def _load(self) -> LoadedModel:
        t0 = time.perf_counter_ns()
        self._log = LlamaLogCapture(self.log_path)
        self._log.write(f"--- chatphase: loading {self.info.path} (pid {os.getpid()})")
        lc.llama_backend_init()
        rpc.register(self.config.rpc_endpoints(), self.config.rpc_unauthenticated_ok)  # devices before the load
        s = self.config.resolved()
        self.threads = ThreadGovernor.for_config(self.config, self.set_threads)
        system_info = llama_params.cpu_system_info()  # the module attribute: tests fake the CPU there
        gpu_ok = ggml_devices.can_offload()
        why_not = why_no_offload(ggml_devices.backends(), ggml_devices.devices(), None)
        plan = offload_plan(s, system_info, gpu_ok, None if gpu_ok else why_not)
        notes = list(plan.notes)
        plan, layers_why, n_ctx_why = self._fit_layers(s, plan, gpu_ok, why_not, notes)
        self._model = lc.llama_model_load_from_file(str(self.info.path).encode("utf-8"), model_params(plan))
        if not self._model:
            raise RuntimeError(
                ggml_devices.allocation_failure(self._log.failed_allocation, s)
                or f"llama.cpp could not load {self.info.path} (see {self.log_path})"
            )
        ctx = lc.llama_init_from_model(self._model, context_params(s))
        if not ctx:
            raise RuntimeError(
                ggml_devices.allocation_failure(self._log.failed_allocation, s)
                or f"llama.cpp could not create a context of {s['n_ctx']:,} tokens (see {self.log_path})"
            )
        devices = ggml_devices.devices()  # memory free after the model and context were allocated
        buffers = ggml_devices.buffer_sizes(self._log.buffer_mib(), devices)
        self._vocab = Vocab(lc.llama_model_get_vocab(self._model))
        self._tokens = TokenRecorder(self._vocab)
        kv = self._kv = KvContext.of(ctx, self._model, self._vocab)
        if kv.n_ctx != s["n_ctx"]:
            notes.append(f"n_ctx {s['n_ctx']:,} -> {kv.n_ctx:,}: llama.cpp sizes the context in blocks of 256 tokens")

        prompting = model_prompting(self._model, self._vocab, self.info.architecture, s["chat_template"])
        self._format, self._template, self._stops = prompting.format, prompting.template, prompting.stops
        self._thinking = prompting.thinking
        notes.extend(prompting.notes)

        if self.info.attention is None:
            raise RuntimeError(f"{self.info.architecture} has no per-token KV cache; chatphase cannot measure it")
        self._kv_per_token = kv_bytes_per_token(self.info.attention, s["type_k"], s["type_v"])
        found = {
            "n_ctx": kv.n_ctx,
            "n_gpu_layers": plan.n_gpu_layers_setting,
            "n_gpu_layers_why": layers_why,
            "n_ctx_why": n_ctx_why,
            "use_extra_bufts": plan.use_extra_bufts,
        }
        flash_attn_enabled = {"on": True, "off": False}.get(s["flash_attn"], self._log.flash_attn_enabled)
        resolved = LoadedSettings(
            **{**s, **found},
            gpu_offload_supported=gpu_ok,
            amx_detected=plan.amx,
            flash_attn_enabled=flash_attn_enabled,
        )
        self._spec = speculator(
            self.config.spec, self._model, self._vocab.ptr, s, system_info, gpu_ok, notes, str(self.info.path)
        )
        kv_mib = self._log.kv_cache_mib
        layers_offloaded = self._log.layers_offloaded if gpu_ok else 0
        layers_total = self._log.layers_total or (self.info.n_layer or 0) + 1
        # an rpc-server's device takes no op offload (ggml-rpc.cpp: its offload_op is NULL)
        gpus = (
            tuple(d for d in ggml_devices.offload_devices(devices) if d.host is None)
            if gpu_ok and s["op_offload"]
            else ()
        )
        op_device = gpus[0].name if gpus and (layers_offloaded or 0) < layers_total else None
        self._cpu_only = not layers_offloaded and op_device is None
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
            kv_capacity_bytes=kv_capacity_bytes(self._kv_per_token, kv.n_ctx),
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
            kv_shift_refusal=kv.shift_refusal,
            placement=placement(self._log.layer_devices, lc.llama_model_n_layer(self._model)),
        )
        for note in notes:
            self._log.write(f"chatphase: {note}")
        for line in slow:
            self._log.write(f"chatphase: slow path: {line}")
        self._keeper = self._open_prefix_store(kv, s, plan.use_extra_bufts, plan.n_gpu_layers)
        self._registered = engine_registry.register() is not None  # peak measurements wait while we are busy
        return self.loaded

    def _fit_layers(
        self, s: dict[str, Any], plan: OffloadPlan, gpu_ok: bool, why_not: str | None, notes: list[str]
    ) -> tuple[OffloadPlan, str | None, str | None]:
        """The layer count to load, from llama.cpp's memory projection (:func:`fit_layers`), and why it is that:
        ``auto`` resolved (0 and the reason where nothing can be offloaded, with no projection); a count given
        refused when a GPU device cannot hold its share, and said when it leaves less than the margin. ``n_ctx``
        auto resolved into ``s`` (the largest context that fits, with its projections on any build), and why.

        Raises:
            UsageError: the count given would not fit (the plan's one line).
        """
        auto_ctx = s["n_ctx"] is None
        if not gpu_ok and not auto_ctx:
            return plan, (f"auto: 0 layers, {why_not}" if s["n_gpu_layers"] is None and why_not else None), None
        fit = fit_layers(
            str(self.info.path), s, self.info.n_layer or 0, plan.use_extra_bufts, gpu_ok, why_not,
            n_ctx_train=self.info.n_ctx_train,
        )  # fmt: skip
        if auto_ctx:
            s["n_ctx"] = fit.n_ctx
            notes.append(f"n_ctx {fit.n_ctx_why}")
        if fit.refusal:
            raise UsageError(fit.refusal)
        if fit.unavailable:
            notes.append(f"no memory plan before the load: {fit.unavailable}")
            if fit.plan is None and (refusal := ggml_devices.kv_too_big_for_device(self.info, s, plan.n_gpu_layers)):
                raise UsageError(refusal)
        if s["n_gpu_layers"] is None:
            n = ALL_LAYERS if fit.n_gpu_layers > (self.info.n_layer or 0) else fit.n_gpu_layers
            plan = replace(plan, n_gpu_layers=n, experts_on_host=fit.experts_on_host)
        if fit.why:
            notes.append(fit.why if fit.why.startswith(LAYERS_NOTE) else LAYERS_NOTE + fit.why)
        return plan, fit.why, fit.n_ctx_why

    def _open_prefix_store(
        self, kv: KvContext, s: dict[str, Any], use_extra_bufts: bool, n_gpu_layers: int
    ) -> PrefixKeeper | None:
        """The prefix store of ``kv`` when it is on (one sequence per context only); ``None`` when off or unusable."""
        if self.config.prefix_cache == "off" or self.config.n_seq_max != 1 or not kv.ptr or not kv.model:
            return None
        try:
            parts = key_parts(str(self.info.path), s, use_extra_bufts, n_gpu_layers)
            return PrefixKeeper(kv, parts, self.info.name, cap_bytes_of(self.config.prefix_cache_mib))
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
    def _run(self, req: TurnRequest, kv: KvContext) -> Iterator[Event]:
        """The turn: fit the prompt, start the cache from what it holds, prefill the rest, generate the reply,
        then its metrics."""
        t_submit = time.perf_counter_ns()
        messages = tuple(  # never a surrogate
            Message(m.role, clean_text(m.content)[0], clean_text(m.reasoning)[0]) for m in req.messages
        )
        if req.reset_cache:
            kv.known.clear()
        keeper = self._keeper if req.prefix_store and not req.reset_cache else None
        if keeper is not None:
            keeper.turn_started()
        elif self._keeper is not None:
            self._keeper.other_turn()
        alternatives = keeper.alternatives() if keeper is not None and req.prompt_token_ids is None else []
        p: TurnPrompt | None = yield from self._fit(req, messages, kv, alternatives)
        if p is None:
            return
        start = self._start_cache(req, messages, kv, keeper, p)
        prompt, cached, restored = p.tokens, start.cached, start.restored
        todo = prompt[cached:]
        threads = self.threads.start_turn()  # before the clock starts: it samples the load, sets the threads
        waits = PhaseWaits() if self.config.rpc else None  # the time spent waiting on RPC devices
        t_prefill_start = time.perf_counter_ns()
        if waits is not None:
            waits.start()
        yield PrefillStarted(
            req.turn_id,
            len(prompt),
            cached,
            len(todo),
            p.dropped,
            t_prefill_start,
            **threads.fields(),
            **(p.ovf.fields() if p.ovf else {}),
            cache_miss_reason=start.miss,
            restored_tokens=restored.tokens if restored else None,
            restore_ms=restored.ms if restored else None,
            restore_bytes=restored.state_bytes if restored else None,
            restore_prefill_ms=restored.decision.predicted_prefill_ms if restored else None,
            restore_note=start.restore_note,
        )
        stop, done = yield from self._prefill_chunks(req.turn_id, kv, todo, t_prefill_start)
        t_prefill_end = time.perf_counter_ns()
        cells = PromptCells(kv.starts_below(len(prompt)), kv.shifted_below(len(prompt)))

        out = Generated()
        dropped, ovf = p.dropped, p.ovf
        if stop is None:
            out, room = yield from self._reply(req, messages, kv, p, t_submit, waits)
            stop = out.stop
            if room is not None and room.dropped_messages:  # the reply went on past n_ctx
                dropped += room.dropped_messages
                ovf = ovf or Overflow(req.overflow, 0, cache_before=p.cache_before)
                ovf.add_reply_room(room)
        metrics = compute_turn_metrics(
            t_submit_ns=t_submit,
            t_prefill_start_ns=t_prefill_start,
            t_prefill_end_ns=t_prefill_end,
            token_times_ns=out.times,
            prompt_tokens=len(prompt),
            cached_tokens=len(prompt) - len(todo),
            evaluated_tokens=done,
            kv_cache_tokens=len(kv.tokens),
            kv_bytes_per_token=self._kv_per_token,
            kv_capacity_bytes=kv_capacity_bytes(self._kv_per_token, kv.n_ctx),
            stop_reason=stop,
            dropped_messages=dropped,
            **(out.tracker.metrics_args() if out.tracker else {}),
            spec=getattr(out, "spec", None),
        )
        metrics = replace(metrics, cache_miss_reason=start.miss, **(ovf.metrics_fields(metrics) if ovf else {}))
        if restored is not None:
            metrics = replace(
                metrics,
                tokenize_ms=ns_to_ms(start.t_restore_ns - t_submit),
                restored_tokens=restored.tokens,
                restore_ms=restored.ms,
                restore_bytes=restored.state_bytes,
            )
        metrics = self._exactness(metrics, kv, cells, restored)
        if waits is not None:
            metrics = replace(
                metrics, remote_wait_prefill_ms=waits.prefill_ms(), remote_wait_decode_ms=waits.decode_ms()
            )
        if keeper is not None:
            sample = (len(prompt), done, ns_to_ms(t_prefill_end - t_prefill_start)) if stop != "cancelled" else None
            keeper.turn_ended(len(kv.tokens), cached, sample)
            self._log_keeper()
        if stop == "error":
            yield EngineFailed("llama.cpp failed to evaluate a batch (see the engine log)", req.turn_id)
        metrics = self.threads.finish_turn(metrics)
        tokens = self._tokens.turn(prompt, restored.tokens if restored else 0, cached, done, ovf, out, t_submit,
                                   metrics.thinking_tokens or 0)  # fmt: skip
        yield TurnFinished(req.turn_id, "".join(out.parts), metrics, thinking="".join(out.thought), tokens=tokens)

    def _exactness(self, m: TurnMetrics, kv: KvContext, cells: PromptCells, restored: Restored | None) -> TurnMetrics:
        """``m`` with the turn's statement of exactness (:func:`~chatphase.engine.exactness.turn_exactness`);
        none for a turn that generated nothing."""
        if not m.decode_tokens or m.prompt_tokens is None or self.loaded is None:
            return m
        exact, why = turn_exactness(
            flash_attn_enabled=self.loaded.settings.flash_attn_enabled,
            cpu_only=self._cpu_only,
            prompt_starts=cells.starts,
            shifted=cells.shifted,
            cold_starts=cold_batch_starts(m.prompt_tokens, kv.n_batch, kv.n_ubatch),
            cached_tokens=m.cached_tokens or 0,
            restored=restored is not None,
            exact_restore=restored is not None and restored.exact,
            verify_batches=m.spec_drafted or 0,
        )
        return replace(m, logits_exact=exact, logits_exact_reason=why)

    def _fit(
        self, req: TurnRequest, messages: tuple[Message, ...], kv: KvContext, alternatives: Alternatives
    ) -> Generator[Event, None, TurnPrompt | None]:
        """The turn's prompt fitted to n_ctx (:class:`TurnPrompt`; its encoding may reuse a stored prefix of
        ``alternatives``), an overflow cut made in the KV cache; an :class:`EngineFailed` event and ``None`` when
        it cannot be (used as ``p = yield from self._fit(…)``)."""
        if req.prompt_token_ids is not None:
            tokens = list(req.prompt_token_ids)
            if not 0 < len(tokens) < kv.n_ctx:
                yield EngineFailed(f"a prompt of {len(tokens)} tokens does not fit n_ctx={kv.n_ctx}", req.turn_id)
                return None
            return TurnPrompt(tokens, 0, None, None, None, len(kv.tokens))
        try:
            fitted = self._fit_messages(kv, messages, req, req.sampling.max_tokens, alternatives)
        except PromptTooLong as exc:
            room = reply_room(req.sampling.max_tokens, kv.n_ctx)
            yield EngineFailed(f"message refused (n_ctx {kv.n_ctx:,}, {room:,} kept for the reply): {exc}", req.turn_id)
            return None
        except Exception as exc:  # the template raised on this conversation (e.g. a system message)
            yield EngineFailed(refusal(self._format, exc), req.turn_id)
            return None
        if fitted.full_tokens is not None and req.overflow == "shift" and kv.shift_refusal:  # llama.cpp cannot
            yield EngineFailed(f"overflow shift refused: {kv.shift_refusal} (use --overflow drop-oldest)", req.turn_id)
            return None
        cache_before = len(kv.tokens)
        ovf, fitted = self._cut_overflow(req, fitted, messages, kv)
        return TurnPrompt(
            fitted.tokens,
            fitted.dropped_messages,
            fitted.text.encode("utf-8"),
            fitted.text,
            ovf,
            ovf.cache_before if ovf else cache_before,
        )

    def _fit_messages(
        self,
        kv: KvContext,
        messages: tuple[Message, ...],
        req: TurnRequest | CountRequest,
        max_tokens: int,
        alternatives: Alternatives,
    ) -> FittedPrompt:
        """``messages`` templated (encoded on what ``kv`` holds, or a stored prefix of ``alternatives``) and fitted
        to n_ctx less the reply's room for ``max_tokens``, from ``req.first_message`` on (those before are left
        out already), dropping down to the low-water mark unless ``req.overflow`` is ``stop``. ``req.overflow_from``
        (> ``first_message`` after a fresh engine): the messages the conversation had left out already; the fit
        brings back those that fit under the low-water mark, and leaves out no more than them unless they alone
        overflow (then it drops from them on, as the next turn would have). Its ``full_tokens`` is ``None`` unless
        it left out more than ``overflow_from``: only that is an overflow.

        Raises:
            PromptTooLong: it does not fit.
        """
        budget = kv.n_ctx - reply_room(max_tokens, kv.n_ctx)
        low = low_water(budget, kv.n_ctx)
        first, before, drop = req.first_message, req.overflow_from, req.overflow != "stop"

        def encode(text: str, add_special: bool) -> list[int]:
            return kv.encode(text, add_special, alternatives)

        def fit(skip: int) -> FittedPrompt:
            return self._template.fit(messages, budget, encode, req.enable_thinking, skip, low, drop=drop)

        if before <= first:
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

    def _cut_overflow(
        self, req: TurnRequest | CountRequest, fitted: FittedPrompt, messages: tuple[Message, ...], kv: KvContext
    ) -> tuple[Overflow | None, FittedPrompt]:
        """The overflow of ``fitted`` (``None`` when it dropped nothing new) cut in ``kv`` (:func:`overflow_cut`:
        under shift the dropped messages leave it), and ``fitted`` with its tokens encoded again on what a shifted
        cache holds. The turn and the count (on a :meth:`~KvContext.what_if` copy) both call it, so the count's
        cached tokens are the turn's."""
        if fitted.full_tokens is None:
            return None, fitted
        n_messages = sum(m.role != "system" for m in messages)
        ovf = overflow_cut(req, fitted, n_messages, kv)
        if ovf.shifted:  # encoded on the shifted cache alone (no stored prefix)
            fitted = replace(fitted, tokens=kv.encode(fitted.text, fitted.add_special))
        return ovf, fitted

    def _start_cache(
        self,
        req: TurnRequest,
        messages: tuple[Message, ...],
        kv: KvContext,
        keeper: PrefixKeeper | None,
        p: TurnPrompt,
    ) -> CacheStart:
        """Make the KV cache hold the longest prefix of ``p``'s tokens it can (what it holds, else a restore from
        the prefix store); what it holds then and why it missed the rest."""
        cached, trim_failed = kv.keep_prefix(p.tokens, req.reset_cache, self._exact)
        t_restore_ns = time.perf_counter_ns()
        restored, note = self._restore(keeper, p.tokens, cached) if keeper else (None, None)
        unsaved = keeper.take_unsaved() if keeper else None
        if unsaved is not None:  # said once, before the turn it may leave cold next time
            note = f"{note}; {unsaved}" if note else unsaved
        cached = len(kv.tokens)  # kept or restored (a refused file emptied the sequence: the prompt is recomputed)
        kv.known.truncate(cached, p.text)
        if restored is not None and kv.known.n_tokens < cached:
            # the entry's record ends past the restored tokens (its boundaries are its prompt's end and its reply's
            # tokens): the restored tokens are the prompt's own, so their pieces spell the prompt's text
            kv.known.add_pieces(kv.vocab.render(t) for t in kv.tokens[kv.known.n_tokens : cached])
            kv.known.truncate(cached, p.text)
        if p.ovf is not None:
            p.ovf.count_reprefill(p.tokens, kv.vocab.render, p.text or b"", cached, restored is not None)
        miss = miss_reason(
            cache_before=p.cache_before,
            reused=cached,
            history=sum(m.role != "system" for m in messages) > 1,
            overflow=p.ovf.policy if p.ovf else None,
            trim_failed=trim_failed,
            change=req.history_change,
        )
        if restored is not None and miss in EMPTIED_BY_CHANGE:  # the cache came from disk: did it hold it all?
            miss = restore_miss(p.text, len(kv.known.text), messages[-2].content, messages[-1].content)
        return CacheStart(cached, restored, note, t_restore_ns, miss)

    def _restore_plan(self, keeper: PrefixKeeper, prompt: list[int], cached: int) -> RestorePlan | None:
        """What the prefix store would restore of ``prompt`` beyond the ``cached`` tokens (``None``: nothing it
        holds is worth a look): under ``prefix_cache = exact`` cut at a batch start of the run that saved it
        (:meth:`PrefixKeeper.exact_cut`), the rule's decision counting the tokens evaluated again."""
        found = keeper.find(prompt, cached)
        if found is None:
            return None
        entry, n = found
        cut, note = keeper.exact_cut(entry, n)
        if self._exact:
            upto, exact = cut, note is None
        else:  # all n: exact only where the saving run began a batch there (the end of its cells, a decode step)
            upto, exact, note = n, cut == n and note is None, None
        if upto <= cached:  # the cache already holds all an exact restore would give
            return None
        decision = keeper.decide(entry, upto - cached, n, reprefill_tokens=n - upto)
        return RestorePlan(entry, n, upto, exact, decision, note)

    def _restore(self, keeper: PrefixKeeper, prompt: list[int], cached: int) -> tuple[Restored | None, str | None]:
        """Restore the stored prefix of ``prompt`` when the rule says it beats recomputing it (beyond the
        ``cached`` tokens). Returns ``(the restore or None, one line when the store was looked at and not
        used, or a restore could not be exact)`` — a refused file empties the cache: the prompt is recomputed."""
        plan = self._restore_plan(keeper, prompt, cached)
        refused = keeper.take_refused()
        if plan is None:
            return None, refused
        if not plan.decision.restore:
            return None, f"prefix store: {plan.shared:,} tokens saved, not restored: {plan.decision.why}"
        out = keeper.restore(plan.entry, plan.upto, plan.decision, plan.exact)
        self._log_keeper()
        return (out, plan.note) if isinstance(out, Restored) else (None, out)

    def _prefill_chunks(
        self, turn_id: int, kv: KvContext, todo: list[int], t_start: int
    ) -> Generator[Event, None, tuple[StopReason | None, int]]:
        """Evaluate ``todo`` after the cache, ``n_batch`` tokens a chunk, a :class:`PrefillProgress` after each;
        returns ``(stop reason or None, tokens evaluated)`` (used as ``stop, done = yield from …``)."""
        done = 0
        while done < len(todo):
            if self._cancel.is_set():
                return "cancelled", done
            chunk = todo[done : done + kv.n_batch]
            if not kv.prefill_chunk(chunk):
                return "error", done
            done += len(chunk)
            yield PrefillProgress(turn_id, done, len(todo), ns_to_ms(time.perf_counter_ns() - t_start))
        return None, done

    def _reply(
        self,
        req: TurnRequest,
        messages: tuple[Message, ...],
        kv: KvContext,
        p: TurnPrompt,
        t_submit: int,
        waits: PhaseWaits | None = None,
    ) -> Generator[Event, None, tuple[Generated, ReplyShift | None]]:
        """Generate the reply after the prefilled prompt ``p`` (plain or speculative decode); the cache's text
        record follows; ``waits`` marks each token (the time waiting on RPC devices). Returns what was generated
        and the room the reply made past n_ctx (``None``: it could make none)."""
        if p.text is not None:
            kv.known.add_prompt(len(p.tokens), p.text)
        room = None
        if p.text is not None and self._spec is None:
            render = self._template.render
            room = ReplyShift.for_turn(
                req, kv, messages, p.dropped, lambda ms: render(ms, req.enable_thinking)[0], p.text
            )
        preopened = p.template_text is not None and opened_by_prompt(p.template_text, self._thinking)
        piece = self._vocab.render if self._thinking else self.piece  # a thinking model's markers, as text
        policy = self.threads.on_token
        on_token = policy if waits is None else waits.before(policy)  # each token marks the thread's clock too
        model = Model(kv, self._cancel, piece, lambda text: self._vocab.tokenize(text, False), on_token, room)
        if self._spec is None:
            out = Generated()
            yield from generate(model, req, t_submit, self._stops, self._thinking, preopened, out)
        else:
            out = SpecGenerated()
            yield from generate_speculative(
                model, self._spec, req, t_submit, self._stops, self._thinking, preopened, out
            )
        n_prompt = len(p.tokens)
        if room is not None and room.dropped_messages:  # the cache holds a shorter prompt now
            n_prompt = room.prompt_len
            kv.known.clear()
            kv.known.add_prompt(n_prompt, room.text)
        if kv.known.n_tokens == n_prompt:  # the reply's evaluated tokens, by their text
            kv.known.add_pieces(kv.vocab.render(t) for t in kv.tokens[n_prompt:])
        return out, room
