"""Typed events an engine emits, and the request it takes (plain, picklable dataclasses).

One turn yields, in order: ``PrefillStarted``, zero or more ``PrefillProgress``, ``FirstToken``, zero or
more ``TokensDecoded``, then exactly one ``TurnFinished`` — or ``EngineFailed`` at any point. Loading a
model yields ``ModelLoaded`` or ``EngineFailed``. The same events drive the TUI, ``ask`` and ``bench``.
All ``*_ns`` timestamps are ``time.perf_counter_ns()`` values taken inside the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from chatphase.engine.metrics import TurnMetrics
from chatphase.models.gguf_meta import ModelInfo

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class Message:
    """One chat message."""

    role: Role
    content: str


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one turn. ``temperature <= 0`` means greedy; ``seed=None`` a random seed."""

    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class TurnRequest:
    """Run one turn: template ``messages`` (the whole conversation, newest last) and generate a reply.

    For experiments (``bench``): ``prompt_token_ids`` replaces the templated conversation with exactly
    these tokens; ``reset_cache`` clears the KV cache first (a cold prefill); ``ignore_eos`` keeps
    decoding until ``max_tokens`` (or the context is full).
    """

    turn_id: int
    messages: tuple[Message, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_token_ids: tuple[int, ...] | None = None
    reset_cache: bool = False
    ignore_eos: bool = False


@dataclass(frozen=True)
class LoadedModel:
    """What the engine reports once a model is loaded.

    ``settings`` holds the resolved engine settings (``n_ctx, n_batch, n_ubatch, n_threads,
    n_threads_batch, n_gpu_layers, flash_attn, type_k, type_v, use_extra_bufts, gpu_offload_supported``).
    ``layers_offloaded`` / ``layers_total`` come from llama.cpp's own log (``offloaded X/Y layers to GPU``);
    ``llama_kv_cache_bytes`` is the size llama.cpp printed for the cache, if seen.
    """

    info: ModelInfo
    settings: dict
    load_ms: float
    kv_bytes_per_token: int
    kv_capacity_bytes: int
    layers_offloaded: int | None = None
    layers_total: int | None = None
    llama_kv_cache_bytes: int | None = None
    system_info: str = ""
    notes: tuple[str, ...] = ()
    log_path: str = ""
    pid: int = 0


@dataclass(frozen=True)
class ModelLoaded:
    model: LoadedModel


@dataclass(frozen=True)
class PrefillStarted:
    """Templating and tokenisation are done; ``prefill_tokens`` of ``prompt_tokens`` will be evaluated.

    ``dropped_messages`` older messages were left out so the prompt fits ``n_ctx`` (system prompt kept).
    ``n_threads_prefill`` / ``n_threads_decode`` / ``threads_reason``: the threads the turn starts with and
    why (:mod:`chatphase.engine.threads`; ``None`` from an engine without a thread policy).
    """

    turn_id: int
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    dropped_messages: int
    t_ns: int
    n_threads_prefill: int | None = None
    n_threads_decode: int | None = None
    threads_reason: str | None = None


@dataclass(frozen=True)
class PrefillProgress:
    """``done_tokens`` of ``total_tokens`` (the prefill tokens) evaluated after ``elapsed_ms``."""

    turn_id: int
    done_tokens: int
    total_tokens: int
    elapsed_ms: float


@dataclass(frozen=True)
class FirstToken:
    """The first generated token (``text`` may be empty while a multi-byte character is incomplete)."""

    turn_id: int
    text: str
    ttft_ms: float
    t_ns: int


@dataclass(frozen=True)
class TokensDecoded:
    """``n_tokens`` more generated tokens whose text is ``text``; ``decode_tokens`` counted so far.

    The engine emits one per token; :class:`~chatphase.engine.host.EngineHost` coalesces them in time
    before they cross the process boundary.
    """

    turn_id: int
    text: str
    n_tokens: int
    decode_tokens: int
    t_ns: int


@dataclass(frozen=True)
class TurnFinished:
    """The turn is over; ``reply`` is the full text (partial when cancelled).

    ``server_timings``: a remote server's own figures for the turn (llama-server's ``timings``:
    ``prompt_n, prompt_ms, predicted_n, predicted_ms, cache_n``… plus ``network_queue_ms``), ``None``
    for the local engine and for servers that send none (see :mod:`chatphase.engine.remote_wire`).
    """

    turn_id: int
    reply: str
    metrics: TurnMetrics
    server_timings: dict | None = None


@dataclass(frozen=True)
class EngineFailed:
    """Something went wrong. ``fatal`` means the engine is gone and must be restarted."""

    message: str
    turn_id: int | None = None
    fatal: bool = False


Event = ModelLoaded | PrefillStarted | PrefillProgress | FirstToken | TokensDecoded | TurnFinished | EngineFailed
