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
    ("offloaded", "shown"),
    [(31, "on (30/30 layers + output)"), (30, "on (29/30 layers + output)"), (12, "on (11/30 layers + output)")],
)
async def test_the_offload_counts_the_layers_the_panel_counts(offloaded, shown):
    """The panel says ``layers 30`` (the model's n_layer blocks); llama.cpp's log counts n_layer + 1 (its output
    layer too: ``offloaded 31/31 layers``), the output layer offloaded first. The offload is said in the panel's
    count, the output layer apart."""
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


def test_auto_chose_no_layer_on_a_gpu_build_says_its_reason():
    """``n_gpu_layers auto`` at 0 on a machine with a GPU device: the panel says auto's reason, not "n_gpu_layers
    is 0", which reads as the user's own setting; a CPU-only build still says the build."""
    from dataclasses import replace

    from chatphase.engine.events import DeviceInfo

    vulkan = DeviceInfo("Vulkan0", "llvmpipe", "gpu", 2 * GiB, 2 * GiB)
    gpu = replace(loaded_model(gpu=True), layers_offloaded=0, backends=("Vulkan", "CPU"), devices=(vulkan,))
    why = "auto: no layer fits: Vulkan0 keeps 900.0 MiB with none, under the 1.0 GiB margin (--gpu-margin-mib)"
    chosen = replace(gpu, settings=replace(gpu.settings, n_gpu_layers=0, n_gpu_layers_why=why))
    assert gpu_offload_text(chosen) == f"off ({why})"
    given = replace(gpu, settings=replace(gpu.settings, n_gpu_layers=0))
    assert gpu_offload_text(given) == "off (n_gpu_layers is 0 (--n-gpu-layers))"
    cpu_only = replace(chosen, backends=("CPU",), devices=())
    assert gpu_offload_text(cpu_only) == "off (CPU-only build: no GPU support in this llama.cpp)"


async def test_the_panel_shows_where_each_layer_lives_once_some_are_offloaded():
    from dataclasses import replace

    from textual.app import App
    from textual.widgets import Static

    from chatphase.engine.events import DeviceInfo, LayerPlacement
    from chatphase.ui.phases.panel import PhasePanel

    vulkan = DeviceInfo("Vulkan0", "llvmpipe", "gpu", 2 * GiB, 2 * GiB)
    places = (LayerPlacement("CPU", tuple(range(11)), False), LayerPlacement("Vulkan0", tuple(range(11, 30)), True))
    partial = replace(loaded_model(gpu=True), layers_offloaded=20, devices=(vulkan,), placement=places)
    none = replace(loaded_model(), placement=(LayerPlacement("CPU", tuple(range(30)), True),))
    shown = []
    app = App()
    async with app.run_test(size=(150, 40)) as pilot:
        for model in (partial, none):
            panel = PhasePanel()
            await app.mount(panel)
            panel.set_model(model)
            await pilot.pause()
            shown.append([line.strip() for line in text_of(panel.query_one("#model-figures", Static)).splitlines()])
    rows = [" ".join(line.split()) for line in shown[0]]
    assert "on Vulkan0 · layers 11-29 + output" in rows and "on host · layers 0-10" in rows
    assert not any(line.startswith("on ") for line in shown[1])  # a CPU-only load: all on the host, said elsewhere


async def test_the_layer_count_auto_chose_is_a_notice_at_load():
    """The load notice of ``n_gpu_layers auto`` (a note starting ``n_gpu_layers``) is said in the chat; other notes
    stay in the panel."""
    from ui_support import idle, make_app, wait_for

    from chatphase.ui.transcript.notice import Notice as ChatNotice

    note = "n_gpu_layers auto: 12 (11/30 layers + output) fit: Vulkan0 1.0 GiB of 2.0 GiB, 1.0 GiB left; …"
    app, _ = make_app(notes=(note, "fake engine: scripted events"))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        shown = [str(n.render()) for n in app.query(ChatNotice)]
    assert any(note in text for text in shown)
    assert not any("fake engine" in text for text in shown)
