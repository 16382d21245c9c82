"""The backends and devices llama.cpp's ggml sees, read through ggml's C API (``ggml-backend.h``).

llama-cpp-python binds llama.h only, so the registry calls (``ggml_backend_reg_*``, ``ggml_backend_dev_*``)
are bound here with ctypes on ``libggml`` from the folder the bindings loaded ``libllama`` from
(``LLAMA_CPP_LIB_PATH`` or the package's ``lib/``): the same library, already loaded, so the same registry.
The first registry call initialises every compiled-in backend (Vulkan enumerates its devices then, and
logs ``ggml_vulkan: ...`` lines through llama.cpp's log callback).
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache
from pathlib import Path
from typing import Any

from chatphase.engine.events import OFFLOAD_TYPES, BufferSize, DeviceInfo
from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.kv import kv_bytes_per_token, kv_capacity_bytes
from chatphase.units import fmt_bytes

#: ``enum ggml_backend_dev_type`` (ggml/include/ggml-backend.h), as words.
DEVICE_TYPES = ("cpu", "gpu", "igpu", "accel", "meta")


#: ggml's backend libraries (``libggml-<name>``) by the name their backend registers under; the CPU's own and
#: the always-present ones are not GPU backends.
GPU_BACKEND_LIBS = {"vulkan": "Vulkan", "cuda": "CUDA", "hip": "ROCm", "musa": "MUSA", "metal": "Metal",
                    "sycl": "SYCL", "opencl": "OpenCL", "cann": "CANN", "webgpu": "WebGPU"}  # fmt: skip
_PREFIX = "" if sys.platform == "win32" else "lib"
_SUFFIX = ".dylib" if sys.platform == "darwin" else ".dll" if sys.platform == "win32" else ".so"


def _lib_folder() -> Path:
    import llama_cpp.llama_cpp as bindings  # the folder it loaded libllama from

    return Path(bindings._base_path)


@cache
def _libggml() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(_lib_folder() / f"{_PREFIX}ggml{_SUFFIX}"))
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for name, res, args in (
        ("ggml_backend_reg_count", sz, []),
        ("ggml_backend_reg_get", vp, [sz]),
        ("ggml_backend_reg_name", ctypes.c_char_p, [vp]),
        ("ggml_backend_dev_count", sz, []),
        ("ggml_backend_dev_get", vp, [sz]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [vp]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [vp]),
        ("ggml_backend_dev_type", ctypes.c_int, [vp]),
        ("ggml_backend_dev_memory", None, [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]),
        ("ggml_backend_dev_by_type", vp, [ctypes.c_int]),
        ("ggml_backend_dev_buffer_type", vp, [vp]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


class TensorBuftOverride(ctypes.Structure):
    """``struct llama_model_tensor_buft_override`` (llama.h): tensors whose name matches ``pattern`` (a regex) go
    in the buffer type ``buft``; a list of them ends with a ``{NULL, NULL}`` entry."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


#: the expert tensors of a mixture-of-experts model (``blk.N.ffn_{gate,up,down}_exps``), llama.cpp's ``--cpu-moe``
#: pattern (common/arg.cpp: ``\.ffn_(up|down|gate)_exps``).
EXPERTS_PATTERN = rb"\.ffn_(up|down|gate)_exps"


@cache
def experts_on_host() -> ctypes.Array[TensorBuftOverride]:
    """The override list that keeps expert tensors in the CPU's buffer type (llama.cpp's ``-ot exps=CPU``), for
    ``llama_model_params.tensor_buft_overrides`` (kept here, alive for every load).

    Raises:
        RuntimeError: ggml has no CPU device (no build of llama.cpp lacks one).
    """
    lib = _libggml()
    cpu = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    if not cpu:
        raise RuntimeError("ggml reports no CPU device to keep the experts on")
    return (TensorBuftOverride * 2)(
        TensorBuftOverride(EXPERTS_PATTERN, lib.ggml_backend_dev_buffer_type(cpu)), TensorBuftOverride(None, None)
    )


def backends() -> tuple[str, ...]:
    """Names of the backends this build has (``("Vulkan", "CPU")``, ``("CUDA", "CPU")``): those ggml registered,
    after any GPU backend whose library is there but did not register. ggml leaves out a backend that cannot
    start (Vulkan with no driver: its instance fails, and it registers nothing), and that build is not
    CPU-only; it found no device."""
    lib = _libggml()
    registered = tuple(
        lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode() for i in range(lib.ggml_backend_reg_count())
    )
    return tuple(b for b in built_gpu_backends(_lib_folder()) if b not in registered) + registered


def built_gpu_backends(folder: Path) -> tuple[str, ...]:
    """The GPU backends whose ggml library is in ``folder`` (``libggml-vulkan.so`` -> ``Vulkan``), sorted."""
    names = set()
    for path in folder.glob(f"{_PREFIX}ggml-*{_SUFFIX}*"):
        stem = path.name[len(_PREFIX) + len("ggml-") :].split(".", 1)[0]
        if stem in GPU_BACKEND_LIBS:
            names.add(GPU_BACKEND_LIBS[stem])
    return tuple(sorted(names))


def devices() -> tuple[DeviceInfo, ...]:
    """The devices ggml sees, in its order, with memory free/total now (``ggml_backend_dev_memory``)."""
    lib = _libggml()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = lib.ggml_backend_dev_type(dev)
        out.append(
            DeviceInfo(
                name=lib.ggml_backend_dev_name(dev).decode(errors="replace"),
                description=(lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                type=DEVICE_TYPES[kind] if 0 <= kind < len(DEVICE_TYPES) else str(kind),
                free_bytes=free.value,
                total_bytes=total.value,
            )
        )
    return tuple(out)


def offload_devices(all_devices: tuple[DeviceInfo, ...]) -> tuple[DeviceInfo, ...]:
    """The devices llama.cpp offloads layers to (GPU and integrated GPU types; not the CPU or accelerators)."""
    return tuple(d for d in all_devices if d.type in OFFLOAD_TYPES)


def buffer_sizes(mib: dict[tuple[str, str], float], all_devices: tuple[DeviceInfo, ...]) -> tuple[BufferSize, ...]:
    """llama.cpp's printed buffers (``{(kind, buffer type name): MiB}``,
    :meth:`chatphase.engine.llamalog.LlamaLogCapture.buffer_mib`) as :class:`BufferSize`, each on the device
    when its buffer type bears an offload device's name (``Vulkan0``, ``CUDA0``; a device's default buffer
    type is named after it), else on the host."""
    on_device = {d.name for d in offload_devices(all_devices)}
    return tuple(
        BufferSize(kind=kind, buffer=buffer, bytes=round(value * 2**20), on_device=buffer in on_device)
        for (kind, buffer), value in mib.items()
    )


def allocation_failure(failed: tuple[str, int] | None, settings: dict[str, Any]) -> str | None:
    """The one line for a load that failed on a buffer ggml could not allocate (``failed``: its buffer type
    name and bytes, :attr:`chatphase.engine.llamalog.LlamaLogCapture.failed_allocation`; a request the
    device, or the host, cannot hold), with the device's free memory; ``None`` when no allocation failed."""
    if failed is None:
        return None
    buffer, size = failed
    free = next((d.free_bytes for d in devices() if d.name == buffer), None)
    has = f" ({fmt_bytes(free)} free)" if free is not None else ""
    return (
        f"{buffer} could not allocate {fmt_bytes(size)}{has} for a context of {settings['n_ctx']:,} tokens with "
        f"n_batch {settings['n_batch']}: use a smaller --n-ctx or --n-batch, fewer --n-gpu-layers, or --no-kv-offload"
    )


def kv_too_big_for_device(info: ModelInfo, settings: dict[str, Any], n_gpu_layers: int) -> str | None:
    """The one line refusing a KV cache the offload devices cannot hold, before llama.cpp allocates it
    (some drivers, llvmpipe among them, over-commit and back the excess with host memory); ``None`` when
    it fits. The cache's bytes for all layers are llama.cpp's own figure (:func:`chatphase.models.kv.kv_capacity_bytes`);
    the offloaded layers' share of it lives on the devices (``offload_kqv`` on), against the devices' total
    memory (``ggml_backend_dev_memory``)."""
    gpus = offload_devices(devices())
    total = sum(d.total_bytes for d in gpus)
    if not settings.get("offload_kqv", True) or info.attention is None or not total or n_gpu_layers <= 0:
        return None
    n_layer = info.n_layer or 0  # a file's count (only a served model's is unknown)
    per_token = kv_bytes_per_token(info.attention, settings["type_k"], settings["type_v"])
    on_device = kv_capacity_bytes(per_token, settings["n_ctx"]) * min(n_gpu_layers, n_layer) / max(1, n_layer)
    if on_device <= total:
        return None
    return (
        f"the KV cache on {'+'.join(d.name for d in gpus)} would take {fmt_bytes(on_device)} at n_ctx "
        f"{settings['n_ctx']:,}, more than its {fmt_bytes(total)}: use a smaller --n-ctx, fewer --n-gpu-layers, "
        "or --no-kv-offload"
    )
