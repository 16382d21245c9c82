"""The engine process's GPU memory in the system figures: sampled with the process at the bounded rate, from NVML
(faked here as in tests/system/test_gpu.py), shown as "–" when unknown and not at all on a CPU-only build."""

from __future__ import annotations

import os
import sys

import pytest
from dashboard_support import DashboardApp, loaded_model
from test_dashboard import text_of

from chatphase.system.gpu import gpu_memory_used_bytes
from chatphase.system.process import ProcessSampler
from chatphase.ui.dashboard.dashboard import Dashboard
from chatphase.ui.dashboard.system_figures import SystemFigures, gpu_offload_text, system_lines

GiB = 1024**3


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def fake_nvml(pid: int, used: int):
    """A stand-in for the ``pynvml`` module: one GPU on which ``pid`` holds ``used`` bytes."""

    class Proc:
        def __init__(self, p, u):
            self.pid, self.usedGpuMemory = p, u

    class FakeNVML:
        nvmlInit = nvmlShutdown = staticmethod(lambda: None)
        nvmlDeviceGetCount = staticmethod(lambda: 1)
        nvmlDeviceGetHandleByIndex = staticmethod(lambda i: i)
        nvmlDeviceGetComputeRunningProcesses = staticmethod(lambda h: [Proc(pid, used), Proc(1, 5)])

    return FakeNVML


def test_sampler_reads_gpu_memory_once_per_real_sample():
    calls = []

    def reader(pid):
        calls.append(pid)
        return 3 * GiB

    clock = FakeClock()
    sampler = ProcessSampler(os.getpid(), min_interval_s=1.0, clock=clock, gpu_memory=reader)
    assert sampler.sample().gpu_memory_bytes == 3 * GiB
    clock.t += 0.5
    sampler.sample()  # within the interval: the cached sample, NVML not asked again
    assert calls == [os.getpid()]
    clock.t += 0.5
    sampler.sample()
    assert calls == [os.getpid()] * 2


def test_sampler_without_reader_or_process_has_no_gpu_memory():
    assert ProcessSampler(os.getpid()).sample().gpu_memory_bytes is None
    asked = []
    assert ProcessSampler(None, gpu_memory=asked.append).sample().gpu_memory_bytes is None
    assert asked == []  # no process: NVML is not asked


def test_sampler_with_fake_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(os.getpid(), 1536 * 1024**2))
    sample = ProcessSampler(os.getpid(), gpu_memory=gpu_memory_used_bytes).sample()
    assert sample.gpu_memory_bytes == 1536 * 1024**2


@pytest.mark.parametrize("gpu_bytes, shown", [(int(1.5 * GiB), "GPU memory 1.5 GiB"), (None, "GPU memory –")])
def test_gpu_line_shows_memory_or_dash(gpu_bytes, shown):
    clock = FakeClock()
    sample = ProcessSampler(os.getpid(), clock=clock, gpu_memory=lambda pid: gpu_bytes).sample()
    lines = system_lines(loaded_model(pid=os.getpid(), gpu=True), sample)
    assert lines[-1] == f"GPU offload on (30/30 layers + output) · {shown}"
    # before the first sample the memory is unknown too
    assert system_lines(loaded_model(pid=os.getpid(), gpu=True), None)[-1].endswith("· GPU memory –")


def test_cpu_only_build_shows_no_gpu_memory():
    sample = ProcessSampler(os.getpid(), gpu_memory=lambda pid: 7).sample()
    line = system_lines(loaded_model(pid=os.getpid(), gpu=False), sample)[-1]
    assert line == "GPU offload off (CPU-only build)"


async def test_dashboard_shows_engine_gpu_memory_from_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(os.getpid(), 2 * GiB))
    app = DashboardApp()
    async with app.run_test(size=(120, 50)) as pilot:
        app.query_one(Dashboard).set_model(loaded_model(pid=os.getpid(), gpu=True))
        await pilot.pause()
        figures = app.query_one(SystemFigures)
        assert "GPU offload on (30/30 layers + output) · GPU memory 2.0 GiB" in text_of(figures)
        assert figures.sampler is not None and figures.sampler.samples_taken == 1


async def test_dashboard_cpu_build_does_not_ask_nvml(monkeypatch):
    asked = []
    fake = fake_nvml(os.getpid(), GiB)
    fake.nvmlInit = staticmethod(lambda: asked.append("init"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    app = DashboardApp()
    async with app.run_test(size=(120, 50)) as pilot:
        app.query_one(Dashboard).set_model(loaded_model(pid=os.getpid(), gpu=False))
        await pilot.pause()
        assert "GPU offload off (CPU-only build)" in text_of(app.query_one(SystemFigures))
    assert asked == []  # a CPU-only engine holds no GPU memory: NVML is never initialised


def test_one_wording_of_gpu_offload_for_every_case():
    """The panel's model section and the System tab share gpu_offload_text; a server's offload is unknown."""
    from dataclasses import replace

    gpu, cpu = loaded_model(gpu=True), loaded_model()
    assert gpu_offload_text(gpu) == "on (30/30 layers + output)"
    assert gpu_offload_text(replace(gpu, layers_offloaded=0)) == "off (0/30 layers)"
    assert gpu_offload_text(replace(gpu, layers_offloaded=None)).startswith("not reported (n_gpu_layers=-1)")
    assert gpu_offload_text(cpu) == "off (CPU-only build)"
    from chatphase.engine.events import LoadedSettings

    remote = replace(cpu, settings=LoadedSettings(backend="remote", n_ctx=4096))
    assert gpu_offload_text(remote) == "the server's (not reported)"


@pytest.mark.parametrize(
    ("offloaded", "shown"), [(31, "on (30/30 layers + output)"), (30, "on (30/30 layers)"), (12, "on (12/30 layers)")]
)
async def test_the_offload_counts_the_layers_the_panel_counts(offloaded, shown):
    """The panel says ``layers 30`` (the model's n_layer blocks); llama.cpp's log counts n_layer + 1 (its output
    layer too: ``offloaded 31/31 layers``). The offload is said in the panel's count, the output layer apart."""
    from dataclasses import replace

    from textual.app import App
    from textual.widgets import Static

    from chatphase.ui.phases.panel import PhasePanel

    model = replace(loaded_model(gpu=True), layers_offloaded=offloaded)
    assert model.layers_total == model.info.n_layer + 1 == 31
    app = App()
    async with app.run_test(size=(150, 40)) as pilot:
        panel = PhasePanel()
        await app.mount(panel)
        panel.set_model(model)
        await pilot.pause()
        lines = text_of(panel.query_one("#model-figures", Static)).splitlines()
    assert f"layers 30 · GPU offload {shown}" in [line.strip() for line in lines]
