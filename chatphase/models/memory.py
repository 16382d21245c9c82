"""Memory needed to load a model and run it at ``n_ctx``, against what the machine has free.

Estimate = weights + KV cache + compute buffers:

- weights: the GGUF file size (tensor data dominates; llama.cpp memory-maps the file, so these pages
  are page cache the kernel can drop and re-read — slow, but not an allocation failure);
- KV cache: ``kv_bytes_per_token(type_k, type_v) × cells`` with cells = n_ctx rounded up to 256, exactly
  the ``llama_kv_cache: size`` llama.cpp prints (:mod:`chatphase.models.kv`);
- compute: ``4 × n_ubatch × (n_vocab + 8 × n_embd)`` bytes (f32 logits of one micro-batch plus
  activations) + the output buffer ``4 × n_vocab``. An approximation calibrated against llama.cpp's own
  ``CPU compute buffer size`` log for SmolLM2-135M: it gives 13.1 / 52.5 MiB where llama.cpp reports
  12.3-12.4 / 49.1-49.7 MiB at n_ubatch 64 / 256 and n_ctx 512-4096 (flash attention off), so it errs high.

Verdict (:func:`assess`): ``ok`` when the total fits in ``psutil.virtual_memory().available``; ``warn``
when it does not (weights would be paged from disk); ``refuse`` only when the KV cache + compute buffers
alone — allocations llama.cpp must make in RAM — exceed available memory plus free swap, where loading
would fail or invite the out-of-memory killer. GPU offload moves weights and KV to the GPU; the estimate
is for a CPU-only load and says so.

Kept for speed (the picker's list, no llama.cpp call) beside llama.cpp's own projection
(:mod:`chatphase.engine.memory_plan`), and checked against it: the KV cache to the byte, the total within 10 %,
compute between the projection's and 25 % above it (``tests/engine/test_projection.py``, four models).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.kv import kv_bytes_per_token, kv_capacity_bytes, kv_cells
from chatphase.units import fmt_bytes


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes needed for one model at one context size (see the module docstring for each term)."""

    n_ctx: int
    kv_cells: int
    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int

    @property
    def total_bytes(self) -> int:
        """weights + KV cache + compute."""
        return self.weights_bytes + self.kv_cache_bytes + self.compute_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict, ``total_bytes`` included."""
        return {**asdict(self), "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class MemoryVerdict:
    """``level`` is ``ok`` | ``warn`` | ``refuse``; ``message`` one line with the figures."""

    level: str
    message: str
    available_bytes: int
    swap_free_bytes: int


def estimate(
    info: ModelInfo, n_ctx: int, n_ubatch: int = 256, type_k: str = "f16", type_v: str = "f16"
) -> MemoryEstimate:
    """Estimate the memory to load ``info`` with a context of ``n_ctx`` tokens.

    Raises:
        ValueError: ``n_ctx`` or ``n_ubatch`` not positive, or an unknown KV cache type.
    """
    if n_ubatch <= 0:
        raise ValueError("n_ubatch must be positive")
    cells = kv_cells(n_ctx)
    if info.attention is not None:
        kv = kv_capacity_bytes(kv_bytes_per_token(info.attention, type_k, type_v), n_ctx)
    else:
        kv = 0  # recurrent models: state is not per token (not modelled)
    compute = 4 * n_ubatch * (info.n_vocab + 8 * info.n_embd) + 4 * info.n_vocab
    return MemoryEstimate(n_ctx, cells, info.size_bytes or 0, kv, compute)  # a file's size is known


def assess(
    est: MemoryEstimate, available_bytes: int | None = None, swap_free_bytes: int | None = None
) -> MemoryVerdict:
    """Compare an estimate with free memory (``psutil`` when the figures are not given); see the module docstring."""
    if available_bytes is None or swap_free_bytes is None:
        import psutil

        available_bytes = psutil.virtual_memory().available if available_bytes is None else available_bytes
        swap_free_bytes = psutil.swap_memory().free if swap_free_bytes is None else swap_free_bytes
    need = f"needs ~{fmt_bytes(est.total_bytes)} (weights {fmt_bytes(est.weights_bytes)} + KV {fmt_bytes(est.kv_cache_bytes)} at n_ctx {est.n_ctx} + compute {fmt_bytes(est.compute_bytes)})"
    have = f"{fmt_bytes(available_bytes)} available"
    resident = est.kv_cache_bytes + est.compute_bytes
    if resident > available_bytes + swap_free_bytes:
        return MemoryVerdict(
            "refuse",
            f"model will not fit: KV cache + compute alone need {fmt_bytes(resident)} but only {have}"
            f" (+{fmt_bytes(swap_free_bytes)} swap); lower --n-ctx or use --cache-type-k/v q8_0",
            available_bytes,
            swap_free_bytes,
        )
    if est.total_bytes > available_bytes:
        return MemoryVerdict(
            "warn",
            f"{need}, more than the {have}: weights will be read from disk, slowly",
            available_bytes,
            swap_free_bytes,
        )
    return MemoryVerdict("ok", f"{need}; {have}", available_bytes, swap_free_bytes)


def preflight(
    info: ModelInfo, n_ctx: int, n_ubatch: int = 256, type_k: str = "f16", type_v: str = "f16"
) -> MemoryVerdict:
    """Check before loading: returns the verdict (``ok``/``warn``; show a ``warn`` message to the user).

    Raises:
        ModelError: when the verdict is ``refuse`` (one line with the figures; CLI exit 2).
    """
    from chatphase.errors import ModelError

    verdict = assess(estimate(info, n_ctx, n_ubatch, type_k, type_v))
    if verdict.level == "refuse":
        raise ModelError(verdict.message)
    return verdict
