"""What the engine asks llama.cpp for: model and context parameters from the resolved engine settings.

Two decisions live here because llama.cpp's defaults are wrong for some machines: llama.cpp's extra
weight buffer types are turned off on CPUs with Intel AMX when this llama.cpp build's AMX kernels fail a
probe (builds made with GCC 12 fault on batched prompt evaluation; :mod:`chatphase.engine.local.amx_probe`), and
GPU layers asked for on a CPU-only build are dropped with a note rather than an error.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import llama_cpp as lc

from chatphase.engine.local.amx_probe import AmxVerdict, amx_verdict
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
    whether AMX was detected, the notes that explain a choice the user did not make, why extra buffer
    types are as they are (``""`` where nothing but the setting decided), and whether a mixture-of-experts model's
    expert tensors stay in host memory (llama.cpp's ``-ot exps=CPU``, :func:`chatphase.engine.local.ggml_devices.experts_on_host`)."""

    n_gpu_layers: int
    use_extra_bufts: bool
    amx: bool
    notes: tuple[str, ...]
    extra_bufts_why: str = ""
    experts_on_host: bool = False

    @property
    def n_gpu_layers_setting(self) -> int:
        """The layer count as a setting (-1 = all)."""
        return -1 if self.n_gpu_layers == ALL_LAYERS else self.n_gpu_layers


def offload_plan(
    settings: dict[str, Any],
    system_info: str,
    gpu_ok: bool,
    why_not: str | None = None,
    amx_check: Callable[[], AmxVerdict] | None = None,
) -> OffloadPlan:
    """Decide GPU layers and extra buffer types from the resolved ``settings``
    (:meth:`chatphase.engine.config.EngineConfig.resolved`), llama.cpp's system info and GPU support;
    ``why_not`` says why there is none (:func:`chatphase.engine.slow_paths.why_no_offload`).

    ``extra_bufts = auto`` keeps llama.cpp's extra buffer types on, except on an AMX CPU whose llama.cpp build
    fails ``amx_check`` (:func:`chatphase.engine.local.amx_probe.amx_verdict`, asked only there). AMX with extra
    buffer types off is said once, as a slow path (:func:`chatphase.engine.slow_paths.slow_paths`)."""
    notes: list[str] = []
    amx = detect_amx(system_info, read_cpu_flags())
    why = ""
    if settings["extra_bufts"] == "auto":
        use_extra_bufts = True
        if amx:
            verdict = (amx_check or amx_verdict)()
            use_extra_bufts, why = verdict.safe, verdict.why
            if verdict.safe:
                notes.append(f"AMX CPU: llama.cpp extra buffer types on: {why}; --extra-bufts off overrides")
    else:
        use_extra_bufts = settings["extra_bufts"] == "on"
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
    return OffloadPlan(n_gpu_layers, use_extra_bufts, amx, tuple(notes), why)


def batch_positions(b: lc.llama_batch) -> ctypes.Array[ctypes.c_int32]:
    """``b.pos`` as what it is, a ``llama_pos *`` (llama-cpp-python 0.3.36 annotates it as an array of arrays)."""
    return cast("ctypes.Array[ctypes.c_int32]", b.pos)


def model_params(plan: OffloadPlan) -> lc.llama_model_params:
    """``llama_model_params`` for ``plan``."""
    params: lc.llama_model_params = lc.llama_model_default_params()
    params.n_gpu_layers = plan.n_gpu_layers
    params.use_extra_bufts = plan.use_extra_bufts
    if plan.experts_on_host:
        from chatphase.engine.local.ggml_devices import experts_on_host

        # the bindings annotate an array; the ctypes field is a c_void_p, which takes the list's address
        params.tensor_buft_overrides = ctypes.addressof(experts_on_host())  # type: ignore[assignment]
    return params


def cpu_system_info() -> str:
    """llama.cpp's system info line (``llama_print_system_info``: the CPU features this build uses, ``AMX_INT8 = 1``
    among them). The one place the engine reads it, beside :func:`read_cpu_flags` and :func:`amx_verdict`: the three
    readings of the machine's CPU that :func:`offload_plan` depends on."""
    return str(lc.llama_print_system_info().decode("utf-8", "replace").strip())


def cpu_auto_plan() -> OffloadPlan:
    """:func:`offload_plan` for ``extra_bufts = auto`` and no GPU layers on this CPU and llama.cpp build: what
    chatphase does by default, e.g. for llama.cpp's own tools to run the same way (llama-bench's
    ``--repack`` is ``use_extra_bufts``)."""
    return offload_plan({"extra_bufts": "auto", "n_gpu_layers": 0}, cpu_system_info(), gpu_ok=False)


def cpu_safe_model_defaults(default_params: Callable[[], Any]) -> Callable[[], Any]:
    """``default_params`` (llama.cpp's ``llama_model_default_params``) with the extra-buffer-type choice
    :func:`offload_plan` makes for ``extra_bufts = auto`` on this CPU: for third-party code that builds its own
    model parameters (llama-cpp-python's ``Llama`` and its server), so that it runs as safely as the engine."""
    plan = cpu_auto_plan()

    def params() -> Any:
        p = default_params()
        p.use_extra_bufts = plan.use_extra_bufts
        return p

    return params


def context_params(settings: dict[str, Any]) -> lc.llama_context_params:
    """``llama_context_params`` for the resolved ``settings`` (perf counters on)."""
    params: lc.llama_context_params = lc.llama_context_default_params()
    params.n_ctx = settings["n_ctx"]
    params.n_batch = settings["n_batch"]
    params.n_ubatch = settings["n_ubatch"]
    params.n_threads = settings["n_threads"]
    params.n_threads_batch = settings["n_threads_batch"]
    params.n_seq_max = settings.get("n_seq_max", 1)
    params.kv_unified = bool(settings.get("kv_unified", False))
    params.flash_attn_type = FLASH_ATTN[settings["flash_attn"]]
    params.type_k = GGML_TYPES[settings["type_k"]]
    params.type_v = GGML_TYPES[settings["type_v"]]
    params.offload_kqv = settings.get("offload_kqv", True)
    params.op_offload = settings.get("op_offload", True)
    params.no_perf = False
    return params
