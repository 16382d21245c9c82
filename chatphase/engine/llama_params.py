"""What the engine asks llama.cpp for: model and context parameters from the resolved engine settings.

Two decisions live here because llama.cpp's defaults are wrong for some machines: llama.cpp's extra
weight buffer types are turned off on CPUs with Intel AMX (its AMX batched path crashes on prompt
evaluation, llama.cpp #20824; :mod:`chatphase.system.cpu_features`), and GPU layers asked for on a
CPU-only build are dropped with a note rather than an error.
"""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp as lc

from chatphase.system.cpu_features import detect_amx, read_cpu_flags

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30, "iq4_nl": 20}
FLASH_ATTN = {
    "auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
ALL_LAYERS = 0x7FFFFFFF  # llama.cpp clamps to the model's layer count


@dataclass(frozen=True)
class OffloadPlan:
    """``n_gpu_layers`` as passed to llama.cpp (:data:`ALL_LAYERS` for all), ``use_extra_bufts``,
    whether AMX was detected, and the notes that explain a choice the user did not make."""

    n_gpu_layers: int
    use_extra_bufts: bool
    amx: bool
    notes: tuple[str, ...]

    @property
    def n_gpu_layers_setting(self) -> int:
        """The layer count as a setting (-1 = all)."""
        return -1 if self.n_gpu_layers == ALL_LAYERS else self.n_gpu_layers


def offload_plan(settings: dict, system_info: str, gpu_ok: bool, why_not: str | None = None) -> OffloadPlan:
    """Decide GPU layers and extra buffer types from the resolved ``settings``
    (:meth:`chatphase.engine.config.EngineConfig.resolved`), llama.cpp's system info and GPU support;
    ``why_not`` says why there is none (:func:`chatphase.engine.slow_paths.why_no_offload`)."""
    notes: list[str] = []
    amx = detect_amx(system_info, read_cpu_flags())
    use_extra_bufts = {"auto": not amx, "on": True, "off": False}[settings["extra_bufts"]]
    # AMX with extra buffer types off is said once, as a slow path (chatphase.engine.slow_paths)
    if amx and use_extra_bufts:
        notes.append("AMX CPU with extra buffer types on (--extra-bufts on): batched prefill may crash")
    requested = settings["n_gpu_layers"]
    if requested is None:
        n_gpu_layers = ALL_LAYERS if gpu_ok else 0
    elif not gpu_ok and requested != 0:
        n_gpu_layers = 0
        notes.append(f"n_gpu_layers={requested} ignored: {why_not or 'this llama.cpp build has no GPU support'}")
    else:
        n_gpu_layers = ALL_LAYERS if requested == -1 else requested
    return OffloadPlan(n_gpu_layers, use_extra_bufts, amx, tuple(notes))


def model_params(plan: OffloadPlan):
    """``llama_model_params`` for ``plan``."""
    params = lc.llama_model_default_params()
    params.n_gpu_layers = plan.n_gpu_layers
    params.use_extra_bufts = plan.use_extra_bufts
    return params


def context_params(settings: dict):
    """``llama_context_params`` for the resolved ``settings`` (perf counters on)."""
    params = lc.llama_context_default_params()
    params.n_ctx = settings["n_ctx"]
    params.n_batch = settings["n_batch"]
    params.n_ubatch = settings["n_ubatch"]
    params.n_threads = settings["n_threads"]
    params.n_threads_batch = settings["n_threads_batch"]
    params.n_seq_max = settings.get("n_seq_max", 1)
    params.flash_attn_type = FLASH_ATTN[settings["flash_attn"]]
    params.type_k = GGML_TYPES[settings["type_k"]]
    params.type_v = GGML_TYPES[settings["type_v"]]
    params.offload_kqv = settings.get("offload_kqv", True)
    params.no_perf = False
    return params
