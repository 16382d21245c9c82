"""What a turn ran on: the model's identity, the engine settings that change speed, the backend, the machine and
chatphase's version.

The session writer stores it as a ``context`` record (:func:`live_context`, from the loaded model) before the
next turn; :func:`context_row` flattens a session's header (model, settings) and that record into the
``contexts`` columns of :mod:`chatphase.history.db`. A file written before context records existed gives the
header's figures only: the machine, build and hash are then unknown (``NULL``).

The model's content hash (:func:`model_hash`) is cheap on purpose: SHA-256 of the file's first MiB (the GGUF
header, its metadata and the start of the tensor data) followed by the file's size in bytes as decimal text;
the first 16 hex digits. Two files that differ only past their first MiB with the same size would share it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from chatphase import __version__
from chatphase.history.db import CONTEXT_COLUMNS
from chatphase.system.cpu_features import physical_cores
from chatphase.system.gpu import gpu_names
from chatphase.system.machine_peaks import machine_identity

if TYPE_CHECKING:  # at run time only the live chat passes one: logs and stats need not import the engine's events
    from chatphase.engine.events import LoadedModel

HASH_HEAD_BYTES = 1 << 20
#: the speed-changing engine settings a context keeps (the resolved ones when the engine reports them).
ENGINE_KEYS = (
    "n_ctx",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "n_threads_batch",
    "type_k",
    "type_v",
    "flash_attn",
    "n_gpu_layers",
    "offload_kqv",
    "spec",
)


@functools.lru_cache(maxsize=16)
def _hash_of(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read(HASH_HEAD_BYTES))
    h.update(str(size).encode())
    return h.hexdigest()[:16]


def model_hash(path: str | os.PathLike | None) -> str | None:
    """The model file's content hash (the module docstring), ``None`` when there is no readable file (a served model)."""
    if not path:
        return None
    try:
        st = os.stat(path)
        return _hash_of(str(path), st.st_size, st.st_mtime_ns)
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def machine_facts() -> dict[str, Any]:
    """This machine: ``machine`` (host name), ``cpu`` (name), ``physical_cores``, ``logical_cpus``,
    ``memory_bytes``, ``gpu`` (NVIDIA GPUs NVML sees, comma-separated; ``None`` when none). Read once."""
    import psutil

    gpus = gpu_names()
    return {
        **machine_identity(),
        "physical_cores": physical_cores(),
        "logical_cpus": psutil.cpu_count(logical=True),
        "memory_bytes": psutil.virtual_memory().total,
        "gpu": ", ".join(gpus) or None,
    }


def llama_cpp_build() -> str:
    """The local backend's build, e.g. ``llama-cpp-python 0.3.36`` (from the installed package's metadata, so
    this process need not import llama.cpp)."""
    from importlib import metadata  # here: ``chatphase logs`` and ``stats`` import this module, not this

    try:
        return f"llama-cpp-python {metadata.version('llama_cpp_python')}"
    except metadata.PackageNotFoundError:
        return "llama-cpp-python (version unknown)"


def live_context(loaded: LoadedModel) -> dict[str, Any]:
    """The body of a ``context`` record for turns run on ``loaded`` (in this process, on this machine)."""
    settings = asdict(loaded.settings)
    remote = settings.get("backend") == "remote"
    devices = [d.description or d.name for d in loaded.devices if d.type != "cpu"]
    return {
        "model_hash": None if remote else model_hash(loaded.info.path),
        "backend": "remote" if remote else "llama.cpp",
        "backend_build": settings.get("server_kind") if remote else llama_cpp_build(),
        "server": settings.get("server"),
        "remote_model": settings.get("remote_model"),
        "engine": {k: settings.get(k) for k in ENGINE_KEYS},
        "spec_mode": loaded.spec_mode,
        "layers_offloaded": loaded.layers_offloaded,
        "layers_total": loaded.layers_total,
        "devices": ", ".join(devices) or None,
        "system_info": loaded.system_info or None,
        **machine_facts(),
        "chatphase_version": __version__,
    }


def context_row(model: dict[str, Any], settings: dict[str, Any], record: dict[str, Any] | None) -> dict[str, Any]:
    """The ``contexts`` columns (:data:`~chatphase.history.db.CONTEXT_COLUMNS`, plus ``key`` and ``extra``) of a
    turn recorded with the session's ``model`` and ``settings`` dicts and the last ``context`` record before it
    (``None`` for files older than those records: what the header says, the rest unknown)."""
    rec = record or {}
    settings = settings or {}
    engine = rec.get("engine") or {}
    remote = bool(settings.get("server")) if not rec else rec.get("backend") == "remote"
    row: dict[str, Any] = {
        "model_name": model.get("name"),
        "model_path": model.get("path"),
        "model_size_bytes": model.get("size_bytes"),
        "model_hash": rec.get("model_hash"),
        "model_architecture": model.get("architecture"),
        "model_n_params": model.get("n_params"),
        "model_quantization": model.get("quantization"),
        "model_synthetic": _bool(model.get("synthetic")),
        "backend": rec.get("backend") or ("remote" if remote else "llama.cpp"),
        "backend_build": rec.get("backend_build"),
        "server": rec.get("server", settings.get("server") if remote else None),
        "remote_model": rec.get("remote_model", settings.get("remote_model") if remote else None),
        **{k: engine.get(k, settings.get(k)) for k in ENGINE_KEYS if k != "spec"},
        "offload_kqv": _bool(engine.get("offload_kqv", settings.get("offload_kqv"))),
        "spec": rec.get("spec_mode") or engine.get("spec") or settings.get("spec"),
        "layers_offloaded": rec.get("layers_offloaded"),
        "devices": rec.get("devices"),
        **{k: rec.get(k) for k in ("machine", "cpu", "physical_cores", "logical_cpus", "memory_bytes", "gpu")},
        "chatphase_version": rec.get("chatphase_version"),
    }
    known = set(CONTEXT_COLUMNS) | {"engine", "spec_mode", "type"}
    extra = {k: v for k, v in rec.items() if k not in known}
    if rec.get("layers_total") is not None:
        extra["layers_total"] = rec["layers_total"]
    row["extra"] = json.dumps(extra, sort_keys=True) if extra else None
    row["key"] = hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return row


def _bool(value: Any) -> int | None:
    return None if value is None else int(bool(value))
