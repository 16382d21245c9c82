"""The offload sweep: ``chatphase bench --gpu-layers 0,8,16,auto,all`` (llama-bench's ``-ngl`` list).

``auto`` loads with ``n_gpu_layers auto`` (the most layers the memory plan fits, :mod:`chatphase.engine.memory_plan`):
its row, and any other row that offloaded the same count, is marked ``auto``, the row one layer past it ``auto+1``
(the table, the JSON's ``auto`` and each placement's ``mark``, the plot's line), so the speed at the fit and one
layer past read side by side.

For each layer count the model is loaded with that many layers on the device and the usual sweep runs
(the sweep's run, given as ``placement_run``: the prompt lengths and depths asked for); each placement gets its
prefill and decode tokens/s and a roofline of its own: the bytes one decode token reads from device memory
and from host memory — the weights each side holds and the KV cache of the context, split as llama.cpp placed
it (its ``KV buffer`` lines) — and which of the two bounds the token. The device's weights are its ``model
buffer`` lines; the host's are the model's weight bytes less those, because llama.cpp's host buffer of a
memory-mapped model is the mapped file range (``CPU_Mapped model buffer size`` stays near the whole file at
8 of 31 layers offloaded), not the tensors the host computes with.

The layers run one after another, so a token takes at least ``device_bytes / device_bandwidth +
host_bytes / host_bandwidth``; the side with the larger share binds. The host bandwidth is measured here
(:mod:`chatphase.bench.core.peaks`); a GPU's is not measurable from the host, so it is taken from
``--device-bandwidth`` (GB/s) when given, from the host's for an integrated GPU (its memory is host memory),
and otherwise it is unknown, and so is the bound of any placement with bytes on the device: no bound is
printed rather than the host side's alone (which read 20,580 tok/s beside 2.8 measured with every layer
on a software GPU).

Prefill is reported as one prompt cell's (the longest prompt's) rate beside that cell's TTFT, so the two
agree; a mean of rates over cells mixed in the depth cells' few-token extensions (on a Vulkan build at 0
layers those run on the CPU while a 64-token batch goes to the device: 164 tok/s beside a 7 s TTFT).

The layers run one after another: :class:`OffloadRun` numbers the runs across placements, and
:meth:`OffloadRun.partial` gives what ran so far (the finished placements and the current one's runs)
to a caller that must stop at once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from chatphase.bench.core.contract import Done, check_format, saved_version, stamp
from chatphase.bench.core.events import BenchEvent, BenchStatus, RunDone
from chatphase.bench.core.experiment import number, plan_field
from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.results import SweepResult
from chatphase.bench.core.run import acquire_peaks
from chatphase.bench.sweep.loop import SweepPlan, SweepProgress
from chatphase.engine.config import EngineConfig
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.plotting import check_plot_path, save_figure
from chatphase.units import fmt_bytes


def parse_gpu_layers(text: str) -> tuple[int | None, ...]:
    """``"0,8,16,auto,all"`` -> ``(0, 8, 16, None, -1)`` (``all`` or ``-1`` = every layer, ``auto`` = ``None``,
    as :class:`~chatphase.engine.config.EngineConfig`'s ``n_gpu_layers``).

    Raises:
        ValueError: an entry that is neither a whole number >= 0, ``all`` nor ``auto``.
    """
    out: list[int | None] = []
    for part in (p.strip() for p in text.split(",")):
        if part.lower() in ("all", "-1"):
            out.append(-1)
        elif part.lower() == "auto":
            out.append(None)
        elif part.isdigit():
            out.append(int(part))
        else:
            raise ValueError(f"--gpu-layers takes layer counts, 'auto' and 'all', comma-separated (got {part!r})")
    if not out:
        raise ValueError("--gpu-layers needs at least one layer count")
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class OffloadPlan(SweepPlan):
    """The sweep (:class:`SweepPlan`) at each layer count of ``gpu_layers`` (-1: all), with the device's memory
    bandwidth in GB/s for the roofline (``None``: see the module docstring)."""

    gpu_layers: tuple[int | None, ...] = plan_field(
        (0, -1), flag="--gpu-layers", metavar="N,N,...|auto|all", parse=parse_gpu_layers,
        help="instead: the offload sweep, one load per layer count on the GPU (e.g. 0,8,16,auto,all), prefill and "
        "decode with the roofline of each placement; the count auto fits is marked, and the row one past it",
    )  # fmt: skip
    device_bandwidth_gbps: float | None = plan_field(
        None, flag="--device-bandwidth", metavar="GB/s", parse=number,
        help="with --gpu-layers: the GPU's memory bandwidth for the roofline (not measurable from the host)",
    )  # fmt: skip

    @property
    def sweep(self) -> SweepPlan:
        """Each placement's sweep."""
        return SweepPlan(**{f.name: getattr(self, f.name) for f in fields(SweepPlan)})

    @property
    def total_runs(self) -> int:
        return self.sweep.total_runs * len(self.gpu_layers)

    def validate(self, n_ctx: int | None, n_batch: int | None = None) -> OffloadPlan:
        """``self`` when its sweep fits (:meth:`SweepPlan.validate`) and it names a layer count. Raises UsageError."""
        self.sweep.validate(n_ctx, n_batch)
        if not self.gpu_layers:
            raise UsageError("--gpu-layers needs at least one layer count")
        return self

    def to_dict(self) -> dict:
        bandwidth = self.device_bandwidth_gbps
        return {**self.sweep.to_dict(), "gpu_layers": list(self.gpu_layers), "device_bandwidth_gbps": bandwidth}


def placement_roofline(
    system: dict,
    weight_bytes: int,
    kv_bytes_per_token: int,
    context_tokens: float,
    host_bw: float | None,
    device_bw: float | None,
) -> dict:
    """Bytes per decode token from device and host memory for one placement, and the bound.

    ``system`` is the result's ``system`` object (its ``memory`` by place and kind); ``weight_bytes`` the
    model's (the GGUF size, as :mod:`chatphase.bench.core.roofline` takes it); bandwidths in bytes/s (``None``:
    unknown). Weights: every weight is read once per token, the device's from its model buffers, the rest
    from the host; KV cache: the ``kv_bytes_per_token × context_tokens`` read, split between the places in
    proportion to where llama.cpp allocated it.
    """
    memory = system.get("memory") or {"device": {}, "host": {}}
    dev, host = memory.get("device", {}), memory.get("host", {})
    kv_total = dev.get("kv_cache", 0) + host.get("kv_cache", 0)
    kv_read = kv_bytes_per_token * context_tokens
    dev_kv = kv_read * dev.get("kv_cache", 0) / kv_total if kv_total else 0.0
    device_bytes = dev.get("weights", 0) + dev_kv
    host_bytes = max(0, weight_bytes - dev.get("weights", 0)) + (kv_read - dev_kv)
    host_s = host_bytes / host_bw if host_bw and host_bytes else (0.0 if not host_bytes else None)
    device_s = device_bytes / device_bw if device_bw and device_bytes else (0.0 if not device_bytes else None)
    bound = None
    if device_s is None:  # unknown stays unknown: the host side alone is no bound
        binds = "unknown: device bandwidth unknown, give --device-bandwidth GB/s"
    elif host_s is None:
        binds = "unknown: host bandwidth not measured"
    elif host_s + device_s > 0:
        bound = 1.0 / (host_s + device_s)
        binds = "device memory" if device_s >= host_s else "host memory"
    else:
        binds = "unknown"
    return {
        "context_tokens": context_tokens,
        "device_bytes_per_token": device_bytes,
        "host_bytes_per_token": host_bytes,
        "device_bandwidth_bytes_per_s": device_bw,
        "host_bandwidth_bytes_per_s": host_bw,
        "decode_bound_tokens_per_s": bound,
        "bound_by": binds,
    }


def layers_label(n_gpu_layers: int | None) -> str:
    """``--gpu-layers``'s word for a count: ``all`` (-1), ``auto`` (``None``), else the number."""
    return "auto" if n_gpu_layers is None else "all" if n_gpu_layers == -1 else str(n_gpu_layers)


@dataclass
class Placement:
    """One layer count's run: the ``n_gpu_layers`` asked (``None``: auto), its :class:`SweepResult` and its
    roofline."""

    n_gpu_layers: int | None
    result: SweepResult
    roofline: dict = field(default_factory=dict)

    @property
    def layers(self) -> tuple[int | None, int | None]:
        """``(offloaded, total)`` as llama.cpp reported them."""
        return self.result.system.get("layers_offloaded"), self.result.system.get("layers_total")

    @property
    def auto_why(self) -> str | None:
        """Why auto chose its count (the load's ``n_gpu_layers_why``), for an auto placement."""
        return self.result.system.get("n_gpu_layers_why") if self.n_gpu_layers is None else None

    def mean(self, metric: str) -> float | None:
        """The mean of ``metric`` (``decode_tokens_per_s``) over the run's cells."""
        values = [getattr(c, metric).mean for c in self.result.results if getattr(c, metric).mean is not None]
        return sum(values) / len(values) if values else None

    def prefill(self) -> tuple[int | None, float | None, float | None]:
        """``(prompt tokens, TTFT ms, prefill tokens/s)`` of one prompt cell, the longest prompt's (means over
        its reps), so that rate and TTFT describe the same turns; ``(None, None, None)`` without one."""
        cells = [c for c in self.result.results if c.kind == "prompt" and c.prefill_tokens_per_s.mean is not None]
        if not cells:
            return None, None, None
        c = max(cells, key=lambda c: c.prompt_tokens)
        return c.prompt_tokens, c.ttft_ms.mean, c.prefill_tokens_per_s.mean

    def to_dict(self, auto: int | None = None) -> dict:
        """JSON-ready; ``auto``: the count auto chose in this sweep (:func:`auto_count`), for the ``mark``."""
        offloaded, total = self.layers
        prompt_tokens, ttft_ms, prefill_rate = self.prefill()
        return {
            "n_gpu_layers": self.n_gpu_layers,
            "mark": auto_mark(self, auto),
            "layers_offloaded": offloaded,
            "layers_total": total,
            "prefill_prompt_tokens": prompt_tokens,
            "ttft_ms": ttft_ms,
            "prefill_tokens_per_s": prefill_rate,
            "decode_tokens_per_s": self.mean("decode_tokens_per_s"),
            "memory": self.result.system.get("memory"),
            "roofline": self.roofline,
            "result": self.result.to_dict(),
        }


def auto_count(placements: list[Placement]) -> int | None:
    """The layers an ``auto`` placement offloaded (llama.cpp's count: the output layer counts as one); ``None``
    without an auto placement that reported it."""
    return next((p.layers[0] for p in placements if p.n_gpu_layers is None and p.layers[0] is not None), None)


def auto_mark(p: Placement, auto: int | None) -> str:
    """``auto`` where ``p`` offloaded the count auto chose, ``auto+1`` one layer past it, else ``""``."""
    offloaded = p.layers[0]
    if auto is None or offloaded is None:
        return ""
    return {auto: "auto", auto + 1: "auto+1"}.get(offloaded, "")


#: the text forms of an offload result.
OFFLOAD_FORMATS = ("table", "json")


@dataclass(frozen=True)
class OffloadDone(Done):
    """The sweep is over: one :class:`Placement` per layer count run (fewer when cancelled). It is its own
    result (:attr:`result`): it renders as ``table`` or ``json``."""

    placements: list[Placement]
    cancelled: bool = False
    plan: dict = field(default_factory=dict)

    @property
    def result(self) -> OffloadDone:
        return self

    def render(self, fmt: str) -> str:
        """:func:`render_offload` for ``table``, the JSON text for ``json``. Raises UsageError for another format."""
        if check_format(fmt, OFFLOAD_FORMATS) == "json":
            return self.to_json()
        return render_offload(self)

    def to_json(self) -> str:
        return json.dumps(offload_json(self), indent=2) + "\n"

    def to_csv(self) -> str:
        """Refused: the offload result has no CSV form. Raises UsageError."""
        check_format("csv", OFFLOAD_FORMATS)
        return ""


#: ``placement_run(info, config, plan, peaks)``: the sweep's run of one placement (the registry gives the sweep's).
PlacementRun = Callable[[ModelInfo, EngineConfig, SweepPlan, MachinePeaks | None], Any]


class OffloadRun:
    """The offload sweep; iterate to run it (blocking). Events: those of each :class:`SweepRun`, then one
    :class:`OffloadDone`. ``device_bandwidth`` in bytes/s (see the module docstring)."""

    def __init__(
        self,
        info: ModelInfo,
        config: EngineConfig,
        plan: SweepPlan,
        gpu_layers: tuple[int | None, ...],
        roofline: bool = True,
        device_bandwidth: float | None = None,
        placement_run: PlacementRun | None = None,
    ):
        self.info, self.config, self.plan, self.gpu_layers = info, config, plan, gpu_layers
        self.roofline, self.device_bandwidth = roofline, device_bandwidth
        self._placement_run = placement_run
        self._current = None
        self._current_n: int | None = None
        self._running = False
        self._placements: list[Placement] = []
        self._peaks: MachinePeaks | None = None
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True
        if self._current is not None:
            self._current.cancel()

    def make_run(self, n_gpu_layers: int | None, peaks: MachinePeaks | None):
        """The sweep's run of one placement (``placement_run``; tests replace this with a fake)."""
        assert self._placement_run is not None, "OffloadRun needs placement_run"
        return self._placement_run(self.info, replace(self.config, n_gpu_layers=n_gpu_layers), self.plan, peaks)

    def __iter__(self) -> Iterator[BenchEvent | OffloadDone]:
        if self.roofline and not self._cancelled:
            self._peaks = yield from acquire_peaks(self.config)
        peaks = self._peaks
        placements = self._placements
        per_run, total = self.plan.total_runs, self.plan.total_runs * len(self.gpu_layers)
        for i, n in enumerate(self.gpu_layers):
            if self._cancelled:
                break
            yield BenchStatus(f"n_gpu_layers {layers_label(n)} ({i + 1}/{len(self.gpu_layers)}): loading")
            run = self._current = self.make_run(n, peaks)
            self._current_n, self._running = n, True
            for event in run:
                if isinstance(event, RunDone):
                    placements.append(self._placement(n, event.result, peaks))
                    self._cancelled |= event.result.cancelled
                elif isinstance(event, SweepProgress):  # numbered across the placements
                    yield replace(event, done_runs=i * per_run + event.done_runs, total_runs=total)
                else:
                    yield event
            self._current, self._current_n, self._running = None, None, False
        yield OffloadDone(list(placements), cancelled=self._cancelled, plan=self.plan_record())

    def partial(self) -> OffloadDone:
        """What ran so far, while the sweep may still be running (another thread): the finished placements and
        the current one's measured runs (its run's ``partial()``), marked cancelled."""
        placements = list(self._placements)
        run, n = self._current, self._current_n
        result = run.partial() if run is not None else None
        if result is not None and self._running and result.results:
            placements.append(self._placement(n, result, self._peaks))
        return OffloadDone(placements, cancelled=True, plan=self.plan_record())

    def partial_done(self) -> OffloadDone:
        """:meth:`partial` (the name every run's partial result has)."""
        return self.partial()

    def plan_record(self) -> dict:
        """The plan as saved: the sweep's, the layer counts and the device bandwidth (GB/s)."""
        bandwidth = self.device_bandwidth / 1e9 if self.device_bandwidth else None
        return {**self.plan.to_dict(), "gpu_layers": list(self.gpu_layers), "device_bandwidth_gbps": bandwidth}

    def _placement(self, n: int | None, result: SweepResult, peaks: MachinePeaks | None) -> Placement:
        host_bw = peaks.bandwidth_bytes_per_s if peaks else None
        device_bw = self.device_bandwidth
        if device_bw is None and any(d.get("type") == "igpu" for d in result.system.get("devices", ())):
            device_bw = host_bw  # an integrated GPU reads host memory
        cells = result.results
        context = sum(c.prompt_tokens + c.depth + c.gen_tokens / 2 for c in cells) / len(cells) if cells else 0.0
        kv_per_token = int(result.system.get("kv_bytes_per_token") or 0)
        weights = int(result.model.get("size_bytes") or 0)
        return Placement(
            n, result, placement_roofline(result.system, weights, kv_per_token, context, host_bw, device_bw)
        )


def render_offload(done: OffloadDone) -> str:
    """A table: per layer count the layers llama.cpp offloaded, the longest prompt's length, TTFT and prefill
    tokens/s (one cell: :meth:`Placement.prefill`), decode tokens/s, bytes per decode token from device and
    host memory, the decode bound (``–`` when unknown) and what binds it; the rows at auto's count and one past
    it marked (:func:`auto_mark`), and why auto chose its count below."""

    def rate(v: float | None) -> str:
        return "–" if v is None else f"{v:,.1f}"

    head = (
        f"{'n_gpu_layers':>12}  {'offloaded':>9}  {'prompt tok':>10}  {'TTFT ms':>9}  {'prefill tok/s':>13}  "
        f"{'decode tok/s':>12}  {'device B/tok':>12}  {'host B/tok':>10}  {'bound tok/s':>11}  bound by"
    )
    rows = [head]
    auto = auto_count(done.placements)
    for p in done.placements:
        off, total = p.layers
        r = p.roofline
        prompt_tokens, ttft_ms, prefill_rate = p.prefill()
        mark = auto_mark(p, auto)
        rows.append(
            f"{layers_label(p.n_gpu_layers):>12}  {f'{off}/{total}':>9}  "
            f"{'–' if prompt_tokens is None else prompt_tokens:>10}  {rate(ttft_ms):>9}  "
            f"{rate(prefill_rate):>13}  {rate(p.mean('decode_tokens_per_s')):>12}  "
            f"{fmt_bytes(r['device_bytes_per_token']):>12}  {fmt_bytes(r['host_bytes_per_token']):>10}  "
            f"{rate(r['decode_bound_tokens_per_s']):>11}  {r['bound_by']}" + (f"  ◀ {mark}" if mark else "")
        )
    for p in done.placements:
        if p.auto_why:
            rows.append(f"n_gpu_layers {p.auto_why}")
    if done.cancelled:
        rows.append("(cancelled: the placements above are the ones that ran)")
    return "\n".join(rows) + "\n"


def offload_json(done: OffloadDone) -> dict:
    """The JSON object: ``{"kind": "offload", "version", "offload": [placement…], "cancelled": bool, "auto"}``
    (each placement with its whole result and its ``mark``; ``auto`` the count an auto placement offloaded, or
    ``null``)."""
    plan = {"plan": done.plan} if done.plan else {}
    auto = auto_count(done.placements)
    placements = [p.to_dict(auto) for p in done.placements]
    return stamp("offload", {"offload": placements, "cancelled": done.cancelled, "auto": auto, **plan})


def write_offload_plot(done: OffloadDone, path: str | os.PathLike) -> Path:
    """Prefill and decode tokens/s against layers on the device, the decode bound beside decode; a dashed line
    at the count auto chose, where the sweep had an auto placement.

    Raises:
        UsageError: as :func:`chatphase.bench.core.plot.check_plot_path`, or when the file cannot be written.
    """
    p = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p_.layers[0] or 0 for p_ in done.placements]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    ax1.plot(xs, [pl.prefill()[2] or 0 for pl in done.placements], "o-", color="C0", label="measured")
    ax2.plot(xs, [pl.mean("decode_tokens_per_s") or 0 for pl in done.placements], "o-", color="C1", label="measured")
    bounds = [pl.roofline.get("decode_bound_tokens_per_s") for pl in done.placements]
    if any(b is not None for b in bounds):
        ax2.plot(xs, [b or float("nan") for b in bounds], "--", color="C1", alpha=0.6, label="memory bound")
    ax1.set(
        title="Prefill (longest prompt) vs layers on the device", xlabel="layers offloaded", ylabel="prefill tokens/s"
    )
    ax2.set(title="Decode vs layers on the device", xlabel="layers offloaded", ylabel="decode tokens/s")
    auto = auto_count(done.placements)
    for ax in (ax1, ax2):
        if auto is not None:
            ax.axvline(auto, color="0.4", linestyle=":", label=f"auto ({auto})")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
    return save_figure(fig, p)


def offload_from_dict(data: dict) -> OffloadDone:
    """Inverse of :func:`offload_json`.

    Raises:
        UsageError: a future version, or not an offload result.
    """
    saved_version(data)
    try:
        placements = [
            Placement(
                None if p["n_gpu_layers"] is None else int(p["n_gpu_layers"]),
                SweepResult.from_dict(p["result"]),
                dict(p.get("roofline") or {}),
            )
            for p in data["offload"]
        ]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UsageError("malformed offload result (is it a chatphase bench --gpu-layers file?)") from None
    return OffloadDone(placements, cancelled=bool(data.get("cancelled", False)), plan=dict(data.get("plan") or {}))


def make_run(
    info: ModelInfo, config: EngineConfig, plan: OffloadPlan, roofline: bool, log_path: str | None, **options
) -> OffloadRun:
    """The run of an :class:`OffloadPlan`: each placement runs the sweep's run
    (:func:`chatphase.bench.sweep.run.placement_run`)."""
    from chatphase.bench.sweep.run import placement_run

    bandwidth = plan.device_bandwidth_gbps * 1e9 if plan.device_bandwidth_gbps else None
    return OffloadRun(info, config, plan.sweep, plan.gpu_layers, roofline, bandwidth, placement_run)


def write_offload_plots(results: list[OffloadDone], path: str | os.PathLike) -> Path:
    """:func:`write_offload_plot` of the one result (the registry's ``plot(results, path)``)."""
    return write_offload_plot(results[0], path)


def offload_rows(done: OffloadDone) -> list[dict]:
    """One row per placement: layers on the device, prefill (longest prompt) and mean decode tokens/s, and the
    decode bound."""
    rows = []
    for p in done.placements:
        _, _, prefill = p.prefill()
        n = p.layers[0] if p.n_gpu_layers is None else p.n_gpu_layers  # auto: the count it chose
        rows.append({"n_gpu_layers": float(n if n is not None else -1), "prefill_tokens_per_s": prefill,
                     "decode_tokens_per_s": p.mean("decode_tokens_per_s"),
                     "decode_bound_tokens_per_s": p.roofline.get("decode_bound_tokens_per_s")})  # fmt: skip
    return rows
