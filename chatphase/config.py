"""Settings: one typed object for the engine, sampling and UI defaults.

Precedence (highest first): CLI flag > environment > config file > built-in default. The config file
and environment layers live in :mod:`chatphase.settings_file`; this module holds the typed values and
the pure derivations (threads = physical cores, and so on).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace

from chatphase.engine.events import SamplingParams
from chatphase.engine.kv import KV_TYPE_BYTES
from chatphase.errors import UsageError

TRI_STATE = ("auto", "on", "off")


def physical_cores() -> int:
    """Physical CPU cores (psutil), falling back to logical CPUs, at least 1."""
    import psutil

    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


@dataclass
class Settings:
    """User-facing settings, with the defaults chatphase chooses by itself.

    Engine: ``n_ctx`` (tokens of context), ``n_batch`` (prompt tokens per prefill chunk; also the
    granularity of the live prefill progress), ``n_ubatch`` (physical batch), ``n_threads`` /
    ``n_threads_batch`` (``None`` = physical cores; llama-cpp-python's own default is half the cores,
    which halves decode speed on small machines, DESIGN.md §3), ``n_gpu_layers`` (``None`` = all layers
    when the build supports GPU offload, else 0; -1 = all), ``flash_attn`` (auto lets llama.cpp enable it
    where the backend supports it), ``type_k``/``type_v`` (KV cache element types), ``extra_bufts``
    (llama.cpp's extra weight buffer types, e.g. AMX and repacking: auto turns them off on CPUs with AMX,
    whose batched path crashes, DESIGN.md §3).

    Remote: ``server`` (an OpenAI-compatible server URL; ``None`` = run the local model), ``api_key_env``
    (the environment variable holding its API key: the key itself is never a setting, so never saved),
    ``remote_model`` (the served model to ask for). See :mod:`chatphase.engine.remote`.
    """

    model: str | None = None
    models_dir: str | None = None
    n_ctx: int = 4096
    n_batch: int = 256
    n_ubatch: int = 256
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_gpu_layers: int | None = None
    flash_attn: str = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    extra_bufts: str = "auto"
    system_prompt: str | None = None
    server: str | None = None
    api_key_env: str | None = None
    remote_model: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    theme: str = "textual-dark"

    def validate(self) -> "Settings":
        """Check ranges and choices; returns ``self``.

        Raises:
            UsageError: naming the first bad setting.
        """
        if self.n_ctx < 16:
            raise UsageError(f"n_ctx must be at least 16 (got {self.n_ctx})")
        if self.n_batch < 1 or self.n_ubatch < 1:
            raise UsageError("n_batch and n_ubatch must be positive")
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"{name} must be positive (got {value})")
        if self.n_gpu_layers is not None and self.n_gpu_layers < -1:
            raise UsageError(f"n_gpu_layers must be -1 (all) or >= 0 (got {self.n_gpu_layers})")
        for name in ("flash_attn", "extra_bufts"):
            if getattr(self, name) not in TRI_STATE:
                raise UsageError(f"{name} must be one of {', '.join(TRI_STATE)} (got {getattr(self, name)!r})")
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_TYPE_BYTES:
                raise UsageError(f"{name} must be one of {', '.join(KV_TYPE_BYTES)} (got {getattr(self, name)!r})")
        s = self.sampling
        if s.max_tokens < 1:
            raise UsageError(f"max_tokens must be positive (got {s.max_tokens})")
        if s.temperature < 0:
            raise UsageError(f"temperature must be >= 0 (got {s.temperature})")
        if not 0 < s.top_p <= 1:
            raise UsageError(f"top_p must be in (0, 1] (got {s.top_p})")
        return self

    def with_overrides(self, **overrides) -> "Settings":
        """A copy with the given non-``None`` fields replaced; sampling fields are accepted by name too."""
        sampling_names = {f.name for f in fields(SamplingParams)}
        top = {k: v for k, v in overrides.items() if v is not None and k not in sampling_names}
        samp = {k: v for k, v in overrides.items() if v is not None and k in sampling_names}
        out = replace(self, **top)
        if samp:
            out = replace(out, sampling=replace(out.sampling, **samp))
        return out

    def engine_settings(self) -> dict:
        """The engine part, with automatic values resolved (threads), as a plain dict."""
        cores = physical_cores()
        return {
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_ubatch": min(self.n_ubatch, self.n_batch),
            "n_threads": self.n_threads or cores,
            "n_threads_batch": self.n_threads_batch or self.n_threads or cores,
            "n_gpu_layers": self.n_gpu_layers,
            "flash_attn": self.flash_attn,
            "type_k": self.type_k,
            "type_v": self.type_v,
            "extra_bufts": self.extra_bufts,
        }

    def to_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return asdict(self)
