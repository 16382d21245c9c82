"""The backends and devices llama.cpp's ggml sees, read through ggml's C API (``ggml-backend.h``).

llama-cpp-python binds llama.h only, so the registry calls (``ggml_backend_reg_*``, ``ggml_backend_dev_*``)
are bound here with ctypes on ``libggml`` from the folder the bindings loaded ``libllama`` from
(``LLAMA_CPP_LIB_PATH`` or the package's ``lib/``): the same library, already loaded, so the same registry.
The first registry call initialises every compiled-in backend (Vulkan enumerates its devices then, and
logs ``ggml_vulkan: ...`` lines through llama.cpp's log callback).

llama.cpp's RPC backend (a build with ``-DGGML_RPC=ON``) enumerates no devices of its own: each rpc-server's are
added with the ``ggml_backend_rpc_add_server`` its registry hands out and registered like a backend
(:func:`add_rpc_server`, as llama.cpp's ``--rpc`` does in common/arg.cpp ``add_rpc_devices``), after which
``llama_model_load`` splits the layers across them with the local devices.
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

#: the RPC backend's registry name (ggml/src/ggml-rpc/ggml-rpc.cpp ``ggml_backend_rpc_reg_get_name``).
RPC_BACKEND = "RPC"
#: ``ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint)`` (ggml/include/ggml-rpc.h).
_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
#: the endpoints registered in this process (ggml's add_server hands the same registry back for an endpoint it
#: knows, and registering it again would list its devices twice).
_registered_rpc: dict[str, int] = {}

#: ``enum ggml_backend_dev_type`` (ggml/include/ggml-backend.h), as words.
DEVICE_TYPES = ("cpu", "gpu", "igpu", "accel", "meta")


#: ggml's backend libraries (``libggml-<name>``) by the name their backend registers under; the CPU's own and
#: the always-present ones are not GPU backends.
GPU_BACKEND_LIBS = {"vulkan": "Vulkan", "cuda": "CUDA", "hip": "ROCm", "musa": "MUSA", "metal": "Metal",
                    "sycl": "SYCL", "opencl": "OpenCL", "cann": "CANN", "webgpu": "WebGPU"}  # fmt: skip
_PREFIX = "" if sys.platform == "win32" else "lib"
_SUFFIX = ".dylib" if sys.platform == "darwin" else ".dll" if sys.platform == "win32" else ".so"


def lib_folder() -> Path:
    """The folder the bindings loaded llama.cpp's libraries from (``LLAMA_CPP_LIB_PATH`` or the package's)."""
    import llama_cpp.llama_cpp as bindings  # the folder it loaded libllama from

    return Path(bindings._base_path)


@cache
def _libggml() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(lib_folder() / f"{_PREFIX}ggml{_SUFFIX}"))
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
        ("ggml_backend_dev_backend_reg", vp, [vp]),
        ("ggml_backend_dev_buffer_type", vp, [vp]),
        ("ggml_backend_buft_name", ctypes.c_char_p, [vp]),
        ("ggml_backend_reg_by_name", vp, [ctypes.c_char_p]),
        ("ggml_backend_reg_get_proc_address", vp, [vp, ctypes.c_char_p]),
        ("ggml_backend_register", None, [vp]),
        ("ggml_backend_dev_by_type", vp, [ctypes.c_int]),
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
    return tuple(b for b in built_gpu_backends(lib_folder()) if b not in registered) + registered


def built_gpu_backends(folder: Path) -> tuple[str, ...]:
    """The GPU backends whose ggml library is in ``folder`` (``libggml-vulkan.so`` -> ``Vulkan``), sorted."""
    names = set()
    for path in folder.glob(f"{_PREFIX}ggml-*{_SUFFIX}*"):
        stem = path.name[len(_PREFIX) + len("ggml-") :].split(".", 1)[0]
        if stem in GPU_BACKEND_LIBS:
            names.add(GPU_BACKEND_LIBS[stem])
    return tuple(sorted(names))


def devices() -> tuple[DeviceInfo, ...]:
    """The devices ggml sees, in its order, with memory free/total now (``ggml_backend_dev_memory``); an
    rpc-server's with its endpoint (their description, ggml-rpc.cpp) and buffer type name."""
    lib = _libggml()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = lib.ggml_backend_dev_type(dev)
        description = (lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace")
        reg = lib.ggml_backend_dev_backend_reg(dev)
        rpc = bool(reg) and lib.ggml_backend_reg_name(reg) == RPC_BACKEND.encode()
        buft = lib.ggml_backend_buft_name(lib.ggml_backend_dev_buffer_type(dev)) if rpc else None
        out.append(
            DeviceInfo(
                name=lib.ggml_backend_dev_name(dev).decode(errors="replace"),
                description=description,
                type=DEVICE_TYPES[kind] if 0 <= kind < len(DEVICE_TYPES) else str(kind),
                free_bytes=free.value,
                total_bytes=total.value,
                host=description if rpc else None,
                buffer_type=buft.decode(errors="replace") if buft else None,
            )
        )
    return tuple(out)


class RpcUnavailable(RuntimeError):
    """This llama.cpp build has no RPC backend (or its registry hands out no ``ggml_backend_rpc_add_server``)."""


def has_rpc() -> bool:
    """Whether the loaded ggml has the RPC backend (built with ``-DGGML_RPC=ON``)."""
    return bool(_libggml().ggml_backend_reg_by_name(RPC_BACKEND.encode()))


def add_rpc_server(endpoint: str) -> int:
    """Register the devices of the rpc-server at ``endpoint`` (``HOST:PORT``) with ggml's registry, before a model
    loads; the count of devices it added (0 for an endpoint already registered in this process).

    ggml connects here (a device count request), and aborts the process where it cannot connect or the
    handshake fails (ggml-rpc.cpp ``rpc_dispatcher::start``): check the server answers first
    (:func:`chatphase.engine.local.rpc.probe`).

    Raises:
        RpcUnavailable: no RPC backend in this build.
        RuntimeError: the server offers no devices (one line).
    """
    if endpoint in _registered_rpc:
        return 0
    lib = _libggml()
    reg = lib.ggml_backend_reg_by_name(RPC_BACKEND.encode())
    address = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
    if not address:
        raise RpcUnavailable(f"this llama.cpp build ({lib_folder()}) has no RPC backend")
    before = lib.ggml_backend_dev_count()
    server = _ADD_SERVER(address)(endpoint.encode())
    if not server:
        raise RuntimeError(f"rpc-server {endpoint} offers no devices")
    lib.ggml_backend_register(server)
    _registered_rpc[endpoint] = lib.ggml_backend_dev_count() - before
    return _registered_rpc[endpoint]


def offload_devices(all_devices: tuple[DeviceInfo, ...]) -> tuple[DeviceInfo, ...]:
    """The devices llama.cpp offloads layers to (GPU and integrated GPU types; not the CPU or accelerators)."""
    return tuple(d for d in all_devices if d.type in OFFLOAD_TYPES)


def can_offload() -> bool:
    """Whether layers have somewhere to go now: a GPU, an integrated GPU or a registered rpc-server's device.
    Not llama.cpp's ``llama_supports_gpu_offload``, which is true for every build with the RPC backend, servers
    or none, and would send ``n_gpu_layers`` to no device at all."""
    return bool(offload_devices(devices()))


def buffer_sizes(mib: dict[tuple[str, str], float], all_devices: tuple[DeviceInfo, ...]) -> tuple[BufferSize, ...]:
    """llama.cpp's printed buffers (``{(kind, buffer type name): MiB}``,
    :meth:`chatphase.engine.llamalog.LlamaLogCapture.buffer_mib`) as :class:`BufferSize`, each on the device
    when its buffer type is an offload device's (:attr:`~chatphase.engine.events.DeviceInfo.buffer_name`:
    ``Vulkan0``, ``CUDA0``, a device's default buffer type being named after it; ``RPC0[HOST:PORT]``), else on
    the host."""
    on_device = {d.buffer_name for d in offload_devices(all_devices)}
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
    free = next((d.free_bytes for d in devices() if d.buffer_name == buffer), None)
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
