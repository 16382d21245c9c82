"""Capture llama.cpp's own log (``llama_log_set``) into a file and read the facts it alone reports.

llama.cpp reports some figures only in its log: the layers offloaded to the GPU
(``load_tensors: offloaded 31/31 layers to GPU``), the KV cache it allocated
(``llama_kv_cache: size =   45.00 MiB (  2048 cells, ...``), each buffer it allocated and where
(``load_tensors:   Vulkan0 model buffer size =    98.12 MiB``, ``llama_kv_cache:   Vulkan0 KV buffer size = …``,
``llama_context: Vulkan_Host compute buffer size = …``) and how it resolved ``flash_attn`` auto
(``llama_context: Flash Attention not supported, set to disabled``, after ``layer 0 is assigned to device
Vulkan0 but Flash Attention is assigned to device CPU``). :class:`LlamaLogCapture` writes its lines
to the log file (never to the terminal, where it would draw over the TUI) and keeps those figures.

What is kept: lines at or above :func:`log_level` (``info`` by default; ``CHATPHASE_LOG_LEVEL=debug``
keeps llama.cpp's debug lines too, about 1,000 graph lines of ~236 KB per engine start). The levels are
ggml's (``enum ggml_log_level`` in the vendored ``ggml/include/ggml.h``: 1 debug, 2 info, 3 warn, 4 error,
5 continuation of the previous line; llama-cpp-python's ``_logger.py`` comment has an older order).
The file (:mod:`chatphase.engine.logfile`: where it is, its rotation) is shared by every engine process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import llama_cpp

from chatphase.engine.logfile import default_log_path, rotate_log

#: ggml's log levels (``enum ggml_log_level``).
LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4}
_CONT = 5
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_KV_SIZE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells")
_BUFFER = re.compile(r"^\w+:\s+(\S+)\s+(model|KV|compute|output|RS) buffer size =\s*([\d.]+) MiB")
_ALLOC_FAILED = re.compile(r"failed to allocate (\S+) buffer of size (\d+)")
_FA_MISMATCH = re.compile(r"layer \d+ is assigned to device (\S+) but Flash Attention is assigned to device (\S+)")
#: how llama.cpp resolved ``flash_attn = auto`` for the context (``resolve_fused_ops``, llama-context.cpp)
_FA_AUTO = re.compile(r"resolve_fused_ops: Flash Attention (enabled|not supported, set to disabled)")
#: a layer's device, at debug level (``load_tensors: layer  12 assigned to device Vulkan0, is_swa = 1``; the layer
#: numbered n_layer is the output layer), llama-model.cpp
_LAYER_DEVICE = re.compile(r"load_tensors: layer\s+(\d+) assigned to device (\S+), is_swa = (\d)")
#: each KV cache's own line (an iSWA model has two, each after ``creating (non-SWA|SWA) KV cache``), llama-kv-cache.cpp
_KV_LINE = re.compile(
    r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers.*K \((\w+)\):\s*([\d.]+) MiB, "
    r"V \((\w+)\):\s*([\d.]+) MiB"
)
_KV_KIND = re.compile(r"llama_kv_cache_iswa: creating\s+(non-SWA|SWA) KV cache")


@dataclass(frozen=True)
class KvCacheLine:
    """One KV cache as llama.cpp printed it (``llama_kv_cache: size = 60.00 MiB (4096 cells, 15 layers, …), K (f16):
    30.00 MiB, V (f16): 30.00 MiB``): ``kind`` ``swa`` or ``full`` (an iSWA model's two caches; ``full`` for a
    model with one), ``cells``, ``layers``, the K and V types and MiB as printed (2 decimals)."""

    kind: str
    mib: float
    cells: int
    layers: int
    type_k: str
    k_mib: float
    type_v: str
    v_mib: float


def model_buffers(log_text: str) -> list[str]:
    """The buffer types llama.cpp put a model's weights in, from its load lines in ``log_text``
    (``load_tensors:   AMX model buffer size = …`` -> ``AMX``), in log order, each once."""
    names = (m.group(1) for line in log_text.splitlines() if (m := _BUFFER.search(line)) and m.group(2) == "model")
    return list(dict.fromkeys(names))


def log_level() -> int:
    """The lowest ggml level written: ``$CHATPHASE_LOG_LEVEL`` (debug, info, warn, error; default info)."""
    return LEVELS.get(os.environ.get("CHATPHASE_LOG_LEVEL", "").strip().lower(), LEVELS["info"])


@contextlib.contextmanager
def llama_quiet(path: str | os.PathLike[str] | None = None) -> Iterator[LlamaLogCapture]:
    """Within the block, llama.cpp's log (``llama_log_set``) and whatever it writes to fd 2 (``ggml_vulkan``
    and CUDA print some lines with ``std::cerr``) go to the log ``path`` (default :func:`default_log_path`)
    instead of the terminal; for commands that call llama.cpp in their own process (``info``). Yields the
    :class:`LlamaLogCapture`."""
    log = Path(path or default_log_path())
    capture = LlamaLogCapture(log)
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        os.dup2(fd, 2)
        yield capture
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
        capture.close()


class LlamaLogCapture:
    """Installs a process-wide llama.cpp log callback writing to ``path`` (appending).

    Lines below ``min_level`` (default :func:`log_level`) are dropped, with their continuations.
    Attributes filled as lines arrive: ``layers_offloaded``, ``layers_total`` (ints or ``None``),
    ``kv_cache_mib`` (float, as printed, 2 decimals) and ``kv_cache_cells`` (int); ``buffers``, a list of
    ``(kind, buffer type name, MiB)`` in log order; ``flash_attn_mismatch`` (``(layer device, flash-attention device)`` when it turned
    it off for want of a kernel on the layer's device); ``flash_attn_enabled`` (how ``auto`` resolved: ``True`` /
    ``False``, ``None`` before the context or when it was not ``auto``); ``failed_allocation`` (``(buffer type name, bytes)``
    of the last buffer ggml could not allocate: ``failed to allocate Vulkan0 buffer of size …``);
    ``kv_caches``, each KV cache's line (:class:`KvCacheLine`); ``layer_devices``, the device of each layer
    (``{layer: device name}``, the output layer numbered n_layer) and ``swa_layers``, from llama.cpp's debug lines,
    read whatever ``min_level`` (they are not written below it); ``errors``, the error lines.
    ``path=None`` captures without a file (what :func:`parse_only` installs).
    One capture is active per process: a new one replaces the previous one. llama.cpp keeps calling
    the C callback for the life of the process (llama.cpp objects log when freed, after ``close()``),
    so the ctypes callback is one module-level object that is never freed, and it forwards to the
    active capture, if any.
    """

    def __init__(self, path: str | os.PathLike[str] | None, min_level: int | None = None):
        self.path = Path(path) if path is not None else None
        self.min_level = log_level() if min_level is None else min_level
        self._file: TextIO | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            rotate_log(self.path)
            self._file = open(self.path, "a", encoding="utf-8", errors="replace", buffering=1)
        self._closed = False
        self._lock = threading.Lock()
        self._partial = ""
        self._last_level = 0
        self.layers_offloaded: int | None = None
        self.layers_total: int | None = None
        self.kv_cache_mib: float | None = None
        self.kv_cache_cells: int | None = None
        self.buffers: list[tuple[str, str, float]] = []
        self.flash_attn_mismatch: tuple[str, str] | None = None
        self.flash_attn_enabled: bool | None = None
        self.failed_allocation: tuple[str, int] | None = None
        self.kv_caches: list[KvCacheLine] = []
        self.layer_devices: dict[int, str] = {}
        self.swa_layers: set[int] = set()
        self.errors: list[str] = []
        self._kv_kind = "full"
        _install(self)

    def write(self, text: str) -> None:
        """Append chatphase's own line to the same log (nothing without a file)."""
        with self._lock:
            if self._file is not None and not self._closed:
                self._file.write(text if text.endswith("\n") else text + "\n")

    def on_log(self, level: int, text: bytes, user_data: object) -> None:
        """llama.cpp's log callback (ggml level, text, user data): lines at or above :attr:`min_level` go to the file."""
        if level != _CONT:
            self._last_level = level
        if self._last_level < self.min_level:
            # per-graph debug chatter would bury what a user looks for in the log; a layer's device is read from it
            if b"assigned to device" in text and (m := _LAYER_DEVICE.search(text.decode("utf-8", "replace"))):
                self._layer(m)
            return
        try:
            chunk = text.decode("utf-8", errors="replace")
            with self._lock:
                if self._closed:
                    return
                if self._file is not None:
                    self._file.write(chunk)
                self._partial += chunk
                if "\n" not in self._partial:
                    return
                *lines, self._partial = self._partial.split("\n")
            for line in lines:
                self._parse(line)
        except Exception:  # a logging failure must never reach C
            pass

    def _layer(self, m: re.Match[str]) -> None:
        layer = int(m.group(1))
        self.layer_devices[layer] = m.group(2)
        if m.group(3) == "1":
            self.swa_layers.add(layer)

    def _parse(self, line: str) -> None:
        if m := _OFFLOADED.search(line):
            self.layers_offloaded, self.layers_total = int(m.group(1)), int(m.group(2))
        elif m := _KV_SIZE.search(line):
            self.kv_cache_mib, self.kv_cache_cells = float(m.group(1)), int(m.group(2))
            if k := _KV_LINE.search(line):
                mib, cells, layers, type_k, k_mib, type_v, v_mib = k.groups()
                self.kv_caches.append(
                    KvCacheLine(
                        self._kv_kind, float(mib), int(cells), int(layers), type_k, float(k_mib), type_v, float(v_mib)
                    )
                )
        elif m := _KV_KIND.search(line):
            self._kv_kind = "full" if m.group(1) == "non-SWA" else "swa"
        elif m := _LAYER_DEVICE.search(line):
            self._layer(m)
        elif m := _BUFFER.search(line):
            self.buffers.append((m.group(2), m.group(1), float(m.group(3))))
        elif m := _ALLOC_FAILED.search(line):
            self.failed_allocation = (m.group(1), int(m.group(2)))
        elif m := _FA_MISMATCH.search(line):
            self.flash_attn_mismatch = (m.group(1), m.group(2))
        elif m := _FA_AUTO.search(line):
            self.flash_attn_enabled = m.group(1) == "enabled"
        if self._last_level == LEVELS["error"]:
            self.errors.append(line.strip())

    def buffer_mib(self) -> dict[tuple[str, str], float]:
        """MiB per ``(kind, buffer type name)`` so far: model, KV and output buffers summed (an iSWA model
        prints one KV line per cache), compute buffers as last printed (llama.cpp re-reserves its graph
        and prints them again)."""
        out: dict[tuple[str, str], float] = {}
        for kind, buffer, mib in list(self.buffers):
            key = (kind, buffer)
            out[key] = mib if kind == "compute" else out.get(key, 0.0) + mib
        return out

    def close(self) -> None:
        """Stop capturing: flush and close the file (later llama.cpp lines are dropped). Idempotent."""
        global _active
        if _active is self:
            _active = None
        with self._lock:
            self._closed = True
            if self._file is not None and not self._file.closed:
                self._file.close()


@contextlib.contextmanager
def parse_only() -> Iterator[LlamaLogCapture]:
    """Within the block, llama.cpp's lines are read (every level) but written nowhere, and the capture active
    before (the engine's log) is back after it: for llama.cpp calls whose ~200 load lines each would bury the
    engine log (the memory projection, :mod:`chatphase.engine.local.projection`). Yields the capture."""
    before = _active
    capture = LlamaLogCapture(None, min_level=LEVELS["debug"])
    try:
        yield capture
    finally:
        capture.close()
        if before is not None and not before._closed:
            _install(before)


_active: LlamaLogCapture | None = None


def _forward(level: int, text: bytes, user_data: object) -> None:
    capture = _active
    if capture is not None:
        capture.on_log(level, text, user_data)


#: the one C callback of this process; module-level so it lives as long as llama.cpp may call it.
_CALLBACK = llama_cpp.llama_log_callback(_forward)
_installed = False


def _install(capture: LlamaLogCapture) -> None:
    global _active, _installed
    _active = capture
    if not _installed:
        llama_cpp.llama_log_set(_CALLBACK, ctypes.c_void_p(0))
        _installed = True
