"""System figures: engine process RSS and CPU %, system memory, model load time, threads, GPU offload
(layers offloaded/total, and on NVIDIA the engine process's GPU memory via :mod:`chatphase.system.gpu`).

Threads: with the auto policy (:mod:`chatphase.engine.threads.policy`) the last turn's prefill and decode
threads and the reason; before a turn, the most the policy may use.

Sampled with :class:`chatphase.system.process.ProcessSampler` from a timer every :data:`REFRESH_S` seconds
(the sampler itself also refuses to sample more often), never per token, and only while the figures are
on screen (the dashboard's System tab): a hidden widget's redraw still costs the UI a frame, taken from
the engine's CPU on a machine without a spare core. Showing them samples at once.
"""

from __future__ import annotations

from textual.widgets import Static

from chatphase.chat.exactness import flash_attn_text
from chatphase.engine.events import OFFLOAD_TYPES, LoadedModel, memory_by_place
from chatphase.engine.memory_plan import layer_ranges, offloaded_text
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.slow_paths import why_no_offload
from chatphase.engine.text import inert
from chatphase.system.gpu import gpu_memory_used_bytes
from chatphase.system.process import ProcessSampler, SystemSample
from chatphase.units import DASH, fmt_bytes, fmt_device_memory, fmt_value

#: seconds between samples.
REFRESH_S = 1.0


def offloaded_layers(offloaded: int, total: int) -> str:
    """llama.cpp's ``offloaded X/Y layers`` in the model's own count of layers (n_layer, as the panel says
    it): llama.cpp counts n_layer + 1 (``Y``), and its first offloaded layer is the output layer, then the
    last blocks (llama-model.cpp: layers from ``n_layer + 1 - n_gpu_layers`` up, the output layer numbered
    n_layer; "offloading output layer to GPU" comes with any count): ``31/31`` -> ``30/30 layers + output``,
    ``12/31`` -> ``11/30 layers + output``, ``0/31`` -> ``0/30 layers`` (:func:`offloaded_text`)."""
    return offloaded_text(offloaded, max(0, total - 1))


def gpu_offload_text(model: LoadedModel) -> str:
    """The model's GPU offload in words, for the panel and the System tab: ``on (30/30 layers + output)``
    (:func:`offloaded_layers`), ``off (CPU-only build)``, or what cannot be known (a server's, a build that
    did not say)."""
    s = model.settings
    if s.remote:
        return "the server's (not reported)"
    total = model.layers_total
    if model.backends and not model.layers_offloaded:  # the engine said what it has: say why nothing runs there
        why = why_no_offload(model.backends, model.devices, None)
        if not why:  # a device is there: n_gpu_layers 0, given or chosen by auto (its reason)
            why = s.n_gpu_layers_why or why_no_offload(model.backends, model.devices, s.n_gpu_layers)
        return f"off ({why or (offloaded_layers(0, total) if total else 'no layers')})"
    if not s.gpu_offload_supported:
        return "off (CPU-only build)"
    if model.layers_offloaded is None or total is None:
        return f"not reported (n_gpu_layers={s.n_gpu_layers})"
    on = "on" if model.layers_offloaded else "off"
    return f"{on} ({offloaded_layers(model.layers_offloaded, total)})"


#: memory kinds in the order shown, with their short labels.
_KIND_LABELS = {"weights": "weights", "kv_cache": "KV", "compute": "compute", "output": "output"}


def memory_text(model: LoadedModel) -> str | None:
    """What llama.cpp allocated where, from its own buffer lines: ``device: weights 98.1 MiB · KV 90.0 MiB ·
    compute 20.0 MiB; host: weights 0.3 MiB · compute 1.0 MiB`` (``None`` before any buffer was reported)."""
    if not model.buffers:
        return None
    parts = []
    for place, kinds in memory_by_place(model.buffers).items():
        order = [k for k in _KIND_LABELS if k in kinds] + [k for k in kinds if k not in _KIND_LABELS]
        if order:
            parts.append(f"{place}: {' · '.join(f'{_KIND_LABELS.get(k, k)} {fmt_bytes(kinds[k])}' for k in order)}")
    return "; ".join(parts)


def device_lines(model: LoadedModel) -> list[str]:
    """One line per offload device llama.cpp sees, its memory as read after the load beside llama.cpp's
    buffers on it (:func:`chatphase.units.fmt_device_memory`): ``Vulkan0 · llvmpipe (LLVM 15.0.6, 256 bits)
    · gpu · 2.0 GiB · reports no usage (free = total) · engine holds 231.2 MiB``."""
    return [
        f"{d.name} · {d.description} · {d.type} · "
        + fmt_device_memory(
            d.free_bytes,
            d.total_bytes,
            sum(b.bytes for b in model.buffers if b.on_device and b.buffer == d.buffer_name) if model.buffers else None,
        )
        for d in model.devices
        if d.type in OFFLOAD_TYPES
    ]


def placement_lines(model: LoadedModel) -> list[str]:
    """Where each layer lives, one line per place, from llama.cpp's own lines at the load: each GPU device, then
    the host, with its layers and what llama.cpp allocated there (:func:`memory_text`'s kinds): ``Vulkan0 ·
    layers 19-29 + output · weights 68.1 MiB · KV 60.0 MiB · compute 10.0 MiB``, ``host · layers 0-18 · …``; an
    rpc-server's device with its endpoint (``RPC0 at 192.168.1.20:50052 · layers 0-14 · …``). Empty where the
    engine did not say (a server's)."""
    gpus = {d.name: d for d in model.devices if d.type in OFFLOAD_TYPES}
    lines = []
    for p in sorted(model.placement, key=lambda p: p.device not in gpus):  # the GPU devices first, as ggml lists
        dev = gpus.get(p.device)
        where = [f"layers {layer_ranges(p.layers)}"] if p.layers else []
        if p.output_layer:
            where.append("output")
        buffer = dev.buffer_name if dev else None  # the device's buffer type; None: the host's buffers
        mine = [
            b for b in model.buffers if (b.on_device and b.buffer == buffer) or (buffer is None and not b.on_device)
        ]
        kinds = memory_by_place(tuple(mine))["device" if dev else "host"]
        order = [k for k in _KIND_LABELS if k in kinds] + [k for k in kinds if k not in _KIND_LABELS]
        name = "host" if dev is None else f"{p.device} at {dev.host}" if dev.host else p.device
        parts = [name, " + ".join(where) or "no layers"]
        parts += [f"{_KIND_LABELS.get(k, k)} {fmt_bytes(kinds[k])}" for k in order]
        lines.append(" · ".join(parts))
    return lines


def threads_lines(model: LoadedModel, turn: TurnMetrics | None = None) -> tuple[str, str | None]:
    """The threads figure (``threads 1 decode / 1 prefill, auto``) and, after a turn of an engine with a
    thread policy, its reason (``threads: 2 → 1: one core busy elsewhere (other load 1.00 cores)``)."""
    s = model.settings
    policy = s.threads_policy
    if turn is not None and turn.n_threads_decode is not None:
        figure = f"threads {turn.n_threads_decode} decode / {turn.n_threads_prefill} prefill"
        return (f"{figure}, {policy}" if policy else figure), f"threads: {turn.threads_reason}"
    if policy == "auto":
        return f"threads auto, up to {fmt_value(s.n_threads)} (the cores this machine gives the engine)", None
    figure = f"threads {fmt_value(s.n_threads)} decode / {fmt_value(s.n_threads_batch)} batch"
    return (f"{figure}, {policy}" if policy else figure), None


def system_lines(model: LoadedModel, sample: SystemSample | None, turn: TurnMetrics | None = None) -> list[str]:
    """The figure lines for ``model``, the latest ``sample`` (``None`` before the first sample) and the
    last finished ``turn`` (for its threads)."""
    s = model.settings
    lines = []
    if not model.pid:
        lines.append("engine process: not reported by this engine")
    elif sample is None or not sample.process_alive:
        lines.append(f"engine pid {model.pid}: {'not sampled yet' if sample is None else 'not running'}")
    else:
        cpu = DASH if sample.cpu_percent is None else f"{sample.cpu_percent:.0f} %"
        lines.append(
            f"engine pid {sample.pid} · RSS {fmt_bytes(sample.rss_bytes or 0)} · CPU {cpu} "
            f"· {sample.num_threads} OS threads"
        )
    if sample is not None:
        lines.append(f"memory available {fmt_bytes(sample.mem_available_bytes)} of {fmt_bytes(sample.mem_total_bytes)}")
    threads, why = threads_lines(model, turn)
    lines.append(f"model load {model.load_ms:,.0f} ms · {threads}")
    if why:
        lines.append(why)
    lines.append(
        f"n_ctx {fmt_value(s.n_ctx)} · n_batch {fmt_value(s.n_batch)} · "
        f"flash attn {flash_attn_text(s)} · KV {fmt_value(s.type_k)}/{fmt_value(s.type_v)}"
    )
    gpu_line = f"GPU offload {gpu_offload_text(model)}"
    if s.gpu_offload_supported:
        gpu_bytes = None if sample is None else sample.gpu_memory_bytes
        gpu_line += f" · GPU memory {fmt_bytes(gpu_bytes)}"
    if model.backends:
        gpu_line += f" · backends {', '.join(model.backends)}"
    lines.append(gpu_line)
    lines += [f"device {line}" for line in device_lines(model)]
    lines += [f"layers on {line}" for line in placement_lines(model)]
    if memory := memory_text(model):
        lines.append(f"memory {memory}")
    lines += [f"slow path: {line}" for line in model.slow_paths]
    return lines


def _rows(text: str, width: int) -> int:
    """Screen rows ``text`` takes when wrapped to ``width`` cells (an upper-bound estimate by length)."""
    width = max(1, width)
    return sum(max(1, -(-len(line) // width)) for line in text.splitlines())


class SystemFigures(Static):
    """The system figure lines, refreshed every :data:`REFRESH_S` s once a model is set."""

    DEFAULT_CSS = """
    SystemFigures { height: auto; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("no model loaded", markup=False, **kwargs)  # device names: plain text
        self.model: LoadedModel | None = None
        self.sampler: ProcessSampler | None = None
        self.last_sample: SystemSample | None = None
        self.turn: TurnMetrics | None = None
        self._rows = -1

    def on_resize(self) -> None:
        self._rows = -1

    def on_mount(self) -> None:
        self.set_interval(REFRESH_S, self._sample_if_shown)

    def on_show(self) -> None:
        self.sample_now()

    def _sample_if_shown(self) -> None:
        if self.is_on_screen:
            self.sample_now()

    def set_model(self, model: LoadedModel) -> None:
        """Watch ``model.pid`` from now on and show the model's figures."""
        self.model = model
        # NVML is asked only on a GPU build: a CPU-only engine holds no GPU memory
        gpu = gpu_memory_used_bytes if model.settings.gpu_offload_supported else None
        self.sampler = ProcessSampler(model.pid, min_interval_s=REFRESH_S / 2, gpu_memory=gpu)
        self.last_sample = None
        self.turn = None
        self.sample_now()

    def set_turn(self, metrics: TurnMetrics) -> None:
        """A turn finished: show its threads (at the next sample, which the timer takes only while shown)."""
        self.turn = metrics

    def sample_now(self) -> None:
        """Take a sample (rate-bounded by the sampler) and redraw."""
        if self.model is None or self.sampler is None:
            return
        self.last_sample = self.sampler.sample()
        text = inert("\n".join(system_lines(self.model, self.last_sample, self.turn)))
        width = self.content_size.width
        if not width:  # on a hidden tab: showing the tab lays it out anyway
            self.update(text, layout=False)
            self._rows = -1
            return
        rows = _rows(text, width)
        # a screen layout pass only when the height changes (its cost grows with the chat log)
        self.update(text, layout=rows != self._rows)
        self._rows = rows
