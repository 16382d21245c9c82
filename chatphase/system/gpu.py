"""GPU figures for the engine process, where the machine can tell them.

llama.cpp reports how many layers it offloaded (in its log; see :mod:`chatphase.engine.llamalog`). How
much GPU memory the engine process holds comes from NVIDIA's NVML (``nvidia-ml-py``, the optional extra
``chatphase[nvml]``); without NVML or an NVIDIA GPU every function here returns ``None``.
"""

from __future__ import annotations


def gpu_memory_used_bytes(pid: int) -> int | None:
    """GPU memory (bytes) that process ``pid`` holds, summed over all NVIDIA GPUs; ``None`` when unknown.

    Uses ``nvmlDeviceGetComputeRunningProcesses`` (``usedGpuMemory``). Never raises.
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        total, seen = 0, False
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    total += int(proc.usedGpuMemory)
                    seen = True
        return total if seen else None
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs NVML sees (empty when none or NVML is missing). Never raises."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        names = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
