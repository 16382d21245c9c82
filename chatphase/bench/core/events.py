"""What every benchmark run shares: its events, the ``system`` facts of a result, loading an engine.

Used by :mod:`chatphase.bench.sweep.run` (which re-exports the events) and :mod:`chatphase.bench.parallel.run`.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from typing import Any

from chatphase import __version__
from chatphase.bench.core.contract import Done, Progress
from chatphase.engine.base import Engine
from chatphase.engine.events import EngineFailed, LoadedModel, ModelLoaded, memory_by_place
from chatphase.errors import EngineError
from chatphase.system.cpu_features import cpu_name


@dataclass(frozen=True)
class BenchStatus:
    """A step started (``"measuring memory bandwidth"``, ``"loading model"``, ...)."""

    text: str


@dataclass(frozen=True)
class BenchNotice:
    """Something the user should read while the run goes on (e.g. N values a server cannot run)."""

    text: str


@dataclass(frozen=True)
class RunDone(Done):
    """The run is over; ``result`` holds everything measured (``result.cancelled`` when stopped early): the result of
    the experiment whose run it ends (the sweep's, the parallel sweep's, the interference or rate sweep's)."""

    result: Any


BenchEvent = BenchStatus | BenchNotice | Progress | RunDone


def system_facts(loaded: LoadedModel | None = None) -> dict:
    """The JSON ``system`` object: OS, Python, CPU, cores, memory, library versions, llama.cpp's system info."""
    import llama_cpp
    import numpy
    import psutil

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cpus": psutil.cpu_count(logical=True),
        "memory_bytes": psutil.virtual_memory().total,
        "chatphase": __version__,
        "llama_cpp_python": llama_cpp.__version__,
        "numpy": numpy.__version__,
        "llama_system_info": loaded.system_info if loaded else "",
        **(placement_facts(loaded) if loaded else {}),
    }


def placement_facts(loaded: LoadedModel) -> dict:
    """Where the load put the model: backends, devices (memory free/total, an RPC device's host), layers offloaded,
    each device's layers as llama.cpp placed them, KV bytes per token and llama.cpp's buffers by place and kind
    (:func:`chatphase.engine.events.memory_by_place`)."""
    return {
        "backends": list(loaded.backends),
        "devices": [asdict(d) for d in loaded.devices],
        "layers_offloaded": loaded.layers_offloaded,
        "n_gpu_layers": loaded.settings.n_gpu_layers,
        "n_gpu_layers_why": loaded.settings.n_gpu_layers_why,
        "layers_total": loaded.layers_total,
        "placement": [asdict(p) for p in loaded.placement],
        "kv_bytes_per_token": loaded.kv_bytes_per_token,
        "memory": memory_by_place(loaded.buffers),
        "slow_paths": list(loaded.slow_paths),
    }


def load_engine(engine: Engine) -> LoadedModel:
    for event in engine.load():
        if isinstance(event, EngineFailed):
            raise EngineError(event.message)
        if isinstance(event, ModelLoaded):
            return event.model
    raise EngineError("the engine finished loading without reporting the model")
