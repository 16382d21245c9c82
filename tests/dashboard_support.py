"""Scripted models and turns for the dashboard tests (no engine, no llama.cpp)."""

from __future__ import annotations

from fake_engine import fake_model_info
from textual.app import App, ComposeResult

from chatphase.engine.events import LoadedModel, LoadedSettings
from chatphase.engine.metrics import TurnMetrics, compute_turn_metrics
from chatphase.ui.dashboard.dashboard import Dashboard

MS = 1_000_000
KV_PER_TOKEN = 23_040  # SmolLM2-135M, f16 (docs/metrics.md)
N_CTX = 2048

INFO = fake_model_info(kv_bytes_per_token=KV_PER_TOKEN)


def loaded_model(pid: int = 0, gpu: bool = False) -> LoadedModel:
    """A LoadedModel as the engine would report it for :data:`INFO` with ``n_ctx`` = :data:`N_CTX`."""
    settings = LoadedSettings(
        n_ctx=N_CTX,
        n_batch=256,
        n_ubatch=256,
        n_threads=2,
        n_threads_batch=2,
        n_gpu_layers=-1 if gpu else 0,
        flash_attn="auto",
        type_k="f16",
        type_v="f16",
        use_extra_bufts=False,
        gpu_offload_supported=gpu,
    )
    return LoadedModel(
        info=INFO,
        settings=settings,
        load_ms=412.0,
        kv_bytes_per_token=KV_PER_TOKEN,
        kv_capacity_bytes=KV_PER_TOKEN * N_CTX,
        layers_offloaded=31 if gpu else None,
        layers_total=31 if gpu else None,
        pid=pid,
    )


def scripted_turn(
    prompt_tokens: int,
    cached_tokens: int,
    decode_tokens: int,
    kv_tokens: int,
    *,
    tokenize_ms: float = 2.0,
    prefill_tok_per_s: float = 320.0,
    first_ms: float = 20.0,
    itl_ms: float = 20.0,
    slow_every: int = 0,
    stop_reason: str = "stop",
    thinking_tokens: int | None = None,
    cut_short: bool = False,
) -> TurnMetrics:
    """A turn built with ``compute_turn_metrics`` from scripted timestamps.

    Prefill runs at ``prefill_tok_per_s``; tokens are ``itl_ms`` apart, every ``slow_every``-th gap 3× longer.
    ``thinking_tokens``: the first tokens are a thinking block that closes at its last token (unless
    ``cut_short``: the reply ends inside it).
    """
    t0 = 10_000 * MS
    t_ps = t0 + int(tokenize_ms * MS)
    prefill = prompt_tokens - cached_tokens
    t_pe = t_ps + int(prefill / prefill_tok_per_s * 1000 * MS)
    times, t = [], t_pe + int(first_ms * MS)
    for i in range(decode_tokens):
        if i:
            t += int(itl_ms * MS * (3 if slow_every and i % slow_every == 0 else 1))
        times.append(t)
    return compute_turn_metrics(
        t_submit_ns=t0,
        t_prefill_start_ns=t_ps,
        t_prefill_end_ns=t_pe,
        token_times_ns=times,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        kv_cache_tokens=kv_tokens,
        kv_bytes_per_token=KV_PER_TOKEN,
        kv_capacity_bytes=KV_PER_TOKEN * N_CTX,
        stop_reason=stop_reason,
        thinking_tokens=thinking_tokens,
        t_thinking_end_ns=times[thinking_tokens - 1] if thinking_tokens and not cut_short else None,
    )


#: three turns of one conversation: cold first turn, then cached prefixes and a growing context.
TURNS: list[TurnMetrics] = [
    scripted_turn(120, 0, 80, 200, itl_ms=20.0),
    scripted_turn(260, 199, 150, 410, itl_ms=21.0, slow_every=10),
    scripted_turn(480, 409, 60, 540, itl_ms=22.5, stop_reason="length"),
]


class DashboardApp(App):
    """A tiny host app: the Dashboard alone (it carries its own styles)."""

    def compose(self) -> ComposeResult:
        yield Dashboard()
