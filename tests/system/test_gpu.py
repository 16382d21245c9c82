"""GPU figures degrade to "unknown" without NVML or an NVIDIA GPU (never an exception)."""

import os
import sys

from chatphase.system.gpu import gpu_memory_used_bytes, gpu_names


def test_without_nvml_everything_is_unknown(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gpu_memory_used_bytes(os.getpid()) is None
    assert gpu_names() == []


def test_with_a_fake_nvml_the_process_memory_is_summed(monkeypatch):
    class Proc:
        def __init__(self, pid, used):
            self.pid, self.usedGpuMemory = pid, used

    class FakeNVML:
        nvmlInit = nvmlShutdown = staticmethod(lambda: None)
        nvmlDeviceGetCount = staticmethod(lambda: 2)
        nvmlDeviceGetHandleByIndex = staticmethod(lambda i: i)
        nvmlDeviceGetName = staticmethod(lambda h: b"NVIDIA H200")
        nvmlDeviceGetComputeRunningProcesses = staticmethod(lambda h: [Proc(42, 1000 + h), Proc(7, 5)])

    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML)
    assert gpu_memory_used_bytes(42) == 1000 + 1001
    assert gpu_memory_used_bytes(99) is None
    assert gpu_names() == ["NVIDIA H200", "NVIDIA H200"]
