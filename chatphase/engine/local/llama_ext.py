"""What llama-cpp-python's bindings lack for the memory projection, bound here with ctypes and guarded.

llama.cpp projects a load's memory itself: a model loaded with ``llama_model_params.no_alloc`` ("only load
metadata and simulate memory allocations"; the bindings have the field) and a context on it allocate nothing,
and ``llama_get_memory_breakdown(ctx)`` then returns the bytes each buffer type would hold: the model's weights,
the context's memory (the KV cache) and the compute buffers. It is what llama.cpp's own fit (``common_fit_params``,
``llama-fit-params``) reads. It is declared in ``src/llama-ext.h``, llama.cpp's staging header of C++ API, and
returns a ``std::map<ggml_backend_buffer_type_t, llama_memory_breakdown_data>`` by value: a C++ symbol
(``_Z26llama_get_memory_breakdownPK13llama_context``) returning a class, which ctypes can call only where the
ABI is known. On x86-64 Linux (System V ABI, libstdc++): the caller passes the address of the 48 bytes the map
occupies as a hidden first argument and gets it back; the map is libstdc++'s red-black tree (an empty comparator
padded to 8 bytes, then the header node ``{int color; node *parent, *left, *right}`` and the node count; each
node is that header followed by the key and ``{size_t model, context, compute}``).

Every assumption is checked before a figure is used: the platform, the symbol, the returned address, the tree's
shape (the root's parent is the header, the walk meets exactly the counted nodes) and each key being a buffer
type ggml lists (a device's default, host and extra buffer types, read through ggml's C API). Any mismatch
raises :class:`ProjectionUnavailable` with one line, never reads further. The map's nodes (about 64 bytes per
buffer type) are not freed: that needs libstdc++'s ``operator delete``; a load makes a handful of projections.

The buffer types are mapped to devices as llama.cpp's fit does (``common/fit.cpp``): a host buffer type
(``ggml_backend_buft_is_host``: ``CPU``, ``CPU_REPACK``, pinned ``Vulkan_Host``) is the host's, another is the
device ``ggml_backend_buft_get_device`` names.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from dataclasses import dataclass
from functools import cache
from typing import Any

from chatphase.engine.local.ggml_devices import _libggml

#: the C++ symbol of ``llama_get_memory_breakdown(const llama_context *)`` (Itanium mangling).
BREAKDOWN_SYMBOL = "_Z26llama_get_memory_breakdownPK13llama_context"
#: bytes of a libstdc++ ``std::map`` (comparator 8, header node 32, count 8); the buffer handed over is larger.
_MAP_BYTES = 48
_HEADER_OFFSET = 8
_NODE_VALUE_OFFSET = 32
#: a bound on buffer types per context (a few per device): more means the layout was misread.
_MAX_NODES = 256


class ProjectionUnavailable(RuntimeError):
    """llama.cpp's projection cannot be read in this build or on this platform; the message is one line."""


@dataclass(frozen=True)
class BufferUse:
    """One buffer type's projected bytes (``llama_memory_breakdown_data``): ``buffer`` its name (``CPU``,
    ``CPU_REPACK``, ``Vulkan0``), ``device`` the device holding it (``None``: host memory), ``model_bytes``
    (weights), ``context_bytes`` (the KV cache or recurrent state), ``compute_bytes`` (compute buffers);
    ``mappable``: it is the CPU device's own buffer type, whose weights a load with mmap maps from the file
    (``CPU_Mapped``) instead of allocating them (llama-model.cpp: only a device's default buffer type is mapped)."""

    buffer: str
    device: str | None
    model_bytes: int
    context_bytes: int
    compute_bytes: int
    mappable: bool = False


@cache
def _ggml() -> ctypes.CDLL:
    lib = _libggml()
    vp = ctypes.c_void_p
    for name, res, args in (
        ("ggml_backend_buft_name", ctypes.c_char_p, [vp]),
        ("ggml_backend_buft_is_host", ctypes.c_bool, [vp]),
        ("ggml_backend_buft_get_device", vp, [vp]),
        ("ggml_backend_dev_buffer_type", vp, [vp]),
        ("ggml_backend_dev_host_buffer_type", vp, [vp]),
        ("ggml_backend_dev_backend_reg", vp, [vp]),
        ("ggml_backend_reg_get_proc_address", vp, [vp, ctypes.c_char_p]),
        ("ggml_backend_dev_by_type", vp, [ctypes.c_int]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def known_buffer_types() -> dict[int, str]:
    """Every buffer type ggml lists, by address: each device's default and host buffer types and its backend's
    extra ones (``ggml_backend_dev_get_extra_bufts``: ``CPU_REPACK``, AMX), with their names."""
    lib = _ggml()
    extra_fn = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
    out: dict[int, str] = {}
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        found = [lib.ggml_backend_dev_buffer_type(dev), lib.ggml_backend_dev_host_buffer_type(dev)]
        reg = lib.ggml_backend_dev_backend_reg(dev)
        proc = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts") if reg else None
        if proc:
            extra = extra_fn(proc)(dev)
            for j in range(64):
                if not extra or not extra[j]:
                    break
                found.append(extra[j])
        for buft in found:
            if buft:
                out[buft] = (lib.ggml_backend_buft_name(buft) or b"?").decode(errors="replace")
    return out


@cache
def _breakdown_fn() -> Any:
    """The bound ``llama_get_memory_breakdown``.

    Raises:
        ProjectionUnavailable: not x86-64 Linux, or the library lacks the symbol.
    """
    machine = platform.machine().lower()
    if not sys.platform.startswith("linux") or machine not in ("x86_64", "amd64"):
        raise ProjectionUnavailable(
            f"llama.cpp's memory projection is read through the x86-64 Linux C++ ABI; not on {sys.platform} {machine}"
        )
    import llama_cpp.llama_cpp as bindings

    try:
        fn = bindings._lib[BREAKDOWN_SYMBOL]
    except AttributeError:
        raise ProjectionUnavailable(
            "this libllama has no llama_get_memory_breakdown (llama-ext.h): no memory projection"
        ) from None
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p]
    return fn


def _word(address: int) -> int:
    return int(ctypes.c_uint64.from_address(address).value)


def memory_breakdown(ctx: Any) -> tuple[BufferUse, ...]:
    """llama.cpp's projection of context ``ctx`` (a ``llama_context *``; of a ``no_alloc`` model it is what a
    real load would allocate), one :class:`BufferUse` per buffer type, in the map's order.

    Raises:
        ProjectionUnavailable: one line saying which check failed (see the module docstring).
    """
    fn = _breakdown_fn()
    storage = (ctypes.c_uint64 * 16)()  # zeroed, larger than the map
    base = ctypes.addressof(storage)
    if fn(base, ctx) != base:
        raise ProjectionUnavailable("llama_get_memory_breakdown did not return its map where the ABI puts it")
    header = base + _HEADER_OFFSET
    root, leftmost, rightmost, count = (_word(header + off) for off in (8, 16, 24, 32))
    if any(storage[i] for i in range(_MAP_BYTES // 8, 16)):
        raise ProjectionUnavailable("llama_get_memory_breakdown wrote past a libstdc++ std::map")
    if count == 0:
        if root or leftmost != header or rightmost != header:
            raise ProjectionUnavailable("llama_get_memory_breakdown's map is not laid out as libstdc++'s")
        return ()
    if count > _MAX_NODES or not root or _word(root + 8) != header:
        raise ProjectionUnavailable("llama_get_memory_breakdown's map is not laid out as libstdc++'s")
    known = known_buffer_types()
    lib = _ggml()
    cpu = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    cpu_default = lib.ggml_backend_dev_buffer_type(cpu) if cpu else None
    out: list[BufferUse] = []
    stack: list[int] = []
    node = root
    while stack or node:  # in order: the map's order
        while node:
            if len(stack) + len(out) >= count:
                raise ProjectionUnavailable("llama_get_memory_breakdown's map has more nodes than it counts")
            stack.append(node)
            node = _word(node + 16)
        node = stack.pop()
        key = _word(node + _NODE_VALUE_OFFSET)
        if key not in known:
            raise ProjectionUnavailable("llama_get_memory_breakdown named a buffer type ggml does not list")
        model, context, compute = (_word(node + _NODE_VALUE_OFFSET + 8 * i) for i in (1, 2, 3))
        dev = None if lib.ggml_backend_buft_is_host(key) else lib.ggml_backend_buft_get_device(key)
        device = (lib.ggml_backend_dev_name(dev) or b"?").decode(errors="replace") if dev else None
        out.append(BufferUse(known[key], device, model, context, compute, key == cpu_default))
        node = _word(node + 24)
    if len(out) != count:
        raise ProjectionUnavailable("llama_get_memory_breakdown's map has fewer nodes than it counts")
    return tuple(out)
