"""The memory plan of a load, per device, before it happens (the searches that choose a load from such plans:
:mod:`chatphase.engine.fit_search`).

A :class:`MemoryPlan` holds llama.cpp's own projection of one load (made by
:mod:`chatphase.engine.local.projection`: the model and a context created with ``no_alloc``, read with
``llama_get_memory_breakdown``), laid out per device: for each GPU device ggml reports, and for the host, the
weights llama.cpp places there (the layers it assigned there, the output layer where it is), the KV cache at the
chosen n_ctx with its K/V types (an iSWA model's sliding-window cache as llama.cpp sizes it), the compute buffers,
and the memory the device has free against the margin left. Plain data, with no llama.cpp import: the command line,
the engine and the UI read it.

What a device is planned against (:func:`budget`): the free memory it reports; where it reports free = total
(it counts no usage: a Vulkan driver without ``VK_EXT_memory_budget`` such as Mesa's llvmpipe), its total less what
this process holds there, which the plan says; the host against the OS's available memory (ggml's CPU device
reports free = total by design, and the OS knows better).

:class:`FitResult` is what a load's fit found, and
:func:`plan_in_child` asks for one from a child process (the command line, the model picker).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

from chatphase.errors import ModelError
from chatphase.units import fmt_bytes

#: the name of the host's entry in a plan.
HOST = "host"
#: how a load's note on its layer count starts (``n_gpu_layers auto: …``; the TUI shows such notes as notices).
LAYERS_NOTE = "n_gpu_layers "
#: the most seconds the projection's child may take (its imports, a few projections).
CHILD_TIMEOUT_S = 120.0
#: the least context ``n_ctx auto`` chooses (llama.cpp's ``fit_params_min_ctx``, common/common.h), or the model's
#: training context where that is smaller: before a load, the context an auto n_ctx is checked against.
AUTO_N_CTX_MIN = 4096
#: ``gpu_margin_mib``'s default: llama.cpp's ``--fit-target`` (1024 MiB per device, common/common.h).
DEFAULT_MARGIN_MIB = 1024


@dataclass(frozen=True)
class KvCachePlan:
    """One KV cache as llama.cpp sizes it: ``kind`` ``full`` or ``swa`` (an iSWA model's sliding-window layers),
    ``cells``, ``layers``, the K and V types, ``bytes`` (llama.cpp's printed MiB × 2**20, within 5 KiB)."""

    kind: str
    cells: int
    layers: int
    type_k: str
    type_v: str
    bytes: int


@dataclass(frozen=True)
class DevicePlan:
    """One device's share of a load, in bytes, as llama.cpp projects it.

    ``name`` ggml's device name (``Vulkan0``) or :data:`HOST`; ``type`` ggml's (``gpu``, ``igpu``) or ``host``;
    ``weights_bytes``, ``kv_cache_bytes``, ``compute_bytes`` from ``llama_get_memory_breakdown`` (model, context,
    compute) summed over the device's buffer types; ``draft_bytes`` a speculative draft model's whole share
    here (its own projection, :func:`with_draft`); ``output_bytes`` the output (logits) buffer llama.cpp makes in
    host memory with the context (its log line: the breakdown leaves it out); ``mapped_bytes`` the part of the
    host's weights a load maps from the file (page cache the OS can drop and read again) rather than allocates:
    those in the CPU's own buffer type, not repacked ones nor a GPU backend's pinned host buffers. ``layers``: the repeating layers
    llama.cpp assigned here; ``output_layer``: the output layer too; ``host`` an rpc-server's address (``None``: a
    device of this machine). ``free_bytes`` / ``total_bytes`` as the
    device reports them; ``budget_bytes`` what the plan is made against and ``budget_note`` why
    (:func:`budget`)."""

    name: str
    description: str
    type: str
    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    output_bytes: int = 0
    mapped_bytes: int = 0
    draft_bytes: int = 0
    layers: tuple[int, ...] = ()
    output_layer: bool = False
    host: str | None = None
    free_bytes: int = 0
    total_bytes: int = 0
    budget_bytes: int = 0
    budget_note: str = ""

    @property
    def planned_bytes(self) -> int:
        """Everything the load puts here: weights + KV cache + compute + output buffer (+ the draft model's)."""
        return self.weights_bytes + self.kv_cache_bytes + self.compute_bytes + self.output_bytes + self.draft_bytes

    @property
    def allocated_bytes(self) -> int:
        """What the load allocates here: all but the weights mapped from the file."""
        return self.planned_bytes - self.mapped_bytes

    @property
    def left_bytes(self) -> int:
        """What the budget keeps after the load (negative: it would not fit)."""
        return self.budget_bytes - self.planned_bytes

    @property
    def is_host(self) -> bool:
        return self.name == HOST

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with ``planned_bytes``, ``left_bytes`` and ``layers`` as ranges (``"0-11"``)."""
        out = asdict(self)
        out.update(
            layers=layer_ranges(self.layers),
            planned_bytes=self.planned_bytes,
            allocated_bytes=self.allocated_bytes,
            left_bytes=self.left_bytes,
        )
        return out


@dataclass(frozen=True)
class MemoryPlan:
    """llama.cpp's projection of one load, per device (:class:`DevicePlan`: the GPU devices in ggml's order, the
    host last).

    ``model`` the file's name, ``n_layer`` its repeating layers; ``n_gpu_layers`` the count asked of llama.cpp
    (0 to ``n_layer + 1``: llama.cpp counts the output layer as the last); ``n_ctx`` the context's cells as
    llama.cpp sizes them; ``kv_caches`` each cache llama.cpp made; ``output_layer_bytes`` the output layer's weights
    (the file's ``output`` tensors, or the token embedding it shares); ``margin_bytes`` what each GPU device must
    keep free (``gpu_margin_mib``); ``projection_ms`` what the projection took; ``notes`` what the plan assumes;
    ``draft_model`` the speculative draft model counted in it (``None``: none); ``experts_on_host``: a
    mixture-of-experts model's expert tensors kept in host memory (llama.cpp's ``-ot exps=CPU``).
    """

    model: str
    n_layer: int
    n_gpu_layers: int
    n_ctx: int
    devices: tuple[DevicePlan, ...]
    kv_caches: tuple[KvCachePlan, ...] = ()
    output_layer_bytes: int | None = None
    margin_bytes: int = DEFAULT_MARGIN_MIB * 2**20
    projection_ms: float = 0.0
    notes: tuple[str, ...] = ()
    draft_model: str | None = None
    experts_on_host: bool = False

    @property
    def gpus(self) -> tuple[DevicePlan, ...]:
        """The GPU devices' entries."""
        return tuple(d for d in self.devices if not d.is_host)

    @property
    def host(self) -> DevicePlan | None:
        return next((d for d in self.devices if d.is_host), None)

    @property
    def total_bytes(self) -> int:
        """Everything the load allocates, every device and the host."""
        return sum(d.planned_bytes for d in self.devices)

    def over(self) -> tuple[DevicePlan, ...]:
        """The GPU devices the load would not fit (planned above the budget)."""
        return tuple(d for d in self.gpus if d.left_bytes < 0)

    def within_margin(self) -> bool:
        """Every GPU device keeps at least the margin."""
        return all(d.left_bytes >= self.margin_bytes for d in self.gpus)

    def fits(self) -> bool:
        """What ``n_ctx auto`` asks of a plan: every GPU device keeps the margin; with no GPU device, the host keeps
        it after what the load allocates there (its mapped weights are page cache, as llama.cpp's fit counts
        the host with no device)."""
        if self.gpus:
            return self.within_margin()
        host = self.host
        return host is None or host.budget_bytes - host.allocated_bytes >= self.margin_bytes

    def used_bytes(self) -> int:
        """What the fit weighs: the GPU devices' planned bytes together, or the host's allocated bytes without one."""
        if self.gpus:
            return sum(d.planned_bytes for d in self.gpus)
        return self.host.allocated_bytes if self.host else 0

    def target_bytes(self) -> int:
        """What :meth:`used_bytes` may reach: the devices' budgets less their margins (the host's, without one)."""
        if self.gpus:
            return sum(d.budget_bytes - self.margin_bytes for d in self.gpus)
        return self.host.budget_bytes - self.margin_bytes if self.host else 0

    def overflow_line(self) -> str | None:
        """The one line refusing this load before it starts, with the plan's numbers (``None`` when every
        GPU device holds its share)."""
        over = self.over()
        if not over:
            return None
        d = over[0]
        return (
            f"{self.n_gpu_layers_text()} would not fit {d.name}: it needs {fmt_bytes(d.planned_bytes)} there "
            f"({parts_text(d)}) and has {fmt_bytes(d.budget_bytes)}{budget_suffix(d)}; use fewer --n-gpu-layers "
            "(auto chooses), a smaller --n-ctx, or --no-kv-offload"
        )

    def n_gpu_layers_text(self) -> str:
        """``n_gpu_layers 12 (11/30 layers + output)``: llama.cpp offloads the output layer first, then the last
        blocks (llama-model.cpp), so a count of k ≥ 1 is the output layer and k - 1 blocks."""
        return f"n_gpu_layers {self.n_gpu_layers} ({offloaded_text(self.n_gpu_layers, self.n_layer)})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``devices`` as :meth:`DevicePlan.to_dict`)."""
        out = asdict(self)
        out["devices"] = [d.to_dict() for d in self.devices]
        out["total_bytes"] = self.total_bytes
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryPlan:
        """The plan :meth:`to_dict` wrote (what the projection's child process prints).

        Raises:
            KeyError, TypeError, ValueError: not such a dict.
        """
        derived = ("planned_bytes", "allocated_bytes", "left_bytes")
        devices = tuple(
            DevicePlan(
                **{k: v for k, v in x.items() if k not in (*derived, "layers")},
                layers=parse_layer_ranges(x.get("layers", "")),
            )
            for x in d["devices"]
        )
        kv = tuple(KvCachePlan(**k) for k in d.get("kv_caches", ()))
        rest = {k: v for k, v in d.items() if k not in ("devices", "kv_caches", "total_bytes", "notes")}
        return cls(devices=devices, kv_caches=kv, notes=tuple(d.get("notes", ())), **rest)


@dataclass(frozen=True)
class FitResult:
    """What :func:`chatphase.engine.local.projection.fit_layers` found: ``n_gpu_layers`` for llama.cpp (0 to n_layer + 1), ``why`` it is that
    (``None`` for a count the user gave that the plan does not question), ``plan`` of that count (``None`` where
    none was made), ``refusal`` the one line refusing the load (a count that would not fit), ``unavailable`` why
    there is no plan (one line); ``n_ctx`` / ``n_ctx_why`` what ``n_ctx auto`` chose and why; ``experts_on_host``
    a mixture-of-experts model's experts kept in host memory (:func:`chatphase.engine.fit_search.choose_placement`)."""

    n_gpu_layers: int
    why: str | None
    plan: MemoryPlan | None
    refusal: str | None = None
    unavailable: str | None = None
    n_ctx: int | None = None
    n_ctx_why: str | None = None
    experts_on_host: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_gpu_layers": self.n_gpu_layers,
            "why": self.why,
            "plan": self.plan.to_dict() if self.plan else None,
            "refusal": self.refusal,
            "unavailable": self.unavailable,
            "n_ctx": self.n_ctx,
            "n_ctx_why": self.n_ctx_why,
            "experts_on_host": self.experts_on_host,
        }

    def summary(self) -> str:
        """One line for a list of models (the picker): the count and where it puts the model, per device —
        ``fit: n_gpu_layers 12 (11/30 layers + output) · Vulkan0 1.5 GiB of 2.0 GiB, 512.0 MiB left · host 300.0
        MiB`` — or the refusal, or why there is no plan."""
        if self.refusal:
            return f"will not fit: {self.refusal}"
        if self.plan is None:
            return f"no memory plan: {self.unavailable or self.why or 'none was made'}"
        p = self.plan
        experts = ", experts on the host" if p.experts_on_host else ""
        parts = [f"fit: n_gpu_layers {self.n_gpu_layers} ({offloaded_text(self.n_gpu_layers, p.n_layer)}{experts})"]
        parts += [
            f"{d.name} {fmt_bytes(d.planned_bytes)} of {fmt_bytes(d.budget_bytes)}, {fmt_bytes(d.left_bytes)} left"
            for d in p.gpus
        ]
        if p.host is not None:
            mapped = f" ({fmt_bytes(p.host.mapped_bytes)} mapped from the file)" if p.host.mapped_bytes else ""
            parts.append(f"host {fmt_bytes(p.host.planned_bytes)}{mapped}")
        if not p.gpus and self.why:
            parts.append(self.why)
        return " · ".join(parts)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FitResult:
        plan = MemoryPlan.from_dict(d["plan"]) if d.get("plan") else None
        return cls(
            d["n_gpu_layers"], d.get("why"), plan, d.get("refusal"), d.get("unavailable"), d.get("n_ctx"),
            d.get("n_ctx_why"), bool(d.get("experts_on_host")),
        )  # fmt: skip


def plan_in_child(path: str, engine: dict[str, Any], timeout_s: float = CHILD_TIMEOUT_S) -> FitResult:
    """:func:`chatphase.engine.local.projection.fit_layers` for ``path`` with the engine settings ``engine`` (``EngineConfig.to_dict()``) in a child
    process (``python -m chatphase.engine.local.projection``), with ``plan_always``: llama.cpp's lines go to the
    engine log, and a crash there is one line here.

    Raises:
        ModelError: the child failed (its one line) or printed no plan.
    """
    request = json.dumps({"path": str(path), "engine": engine})
    cmd = [sys.executable, "-m", "chatphase.engine.local.projection"]
    try:
        done = subprocess.run(
            cmd, input=request, capture_output=True, text=True, timeout=timeout_s, check=False
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ModelError(f"llama.cpp's memory plan took more than {timeout_s:.0f} s") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
        raise ModelError(f"llama.cpp's memory plan failed ({how}); see the engine log")
    out = json.loads(lines[-1])
    if "error" in out:
        raise ModelError(out["error"])
    return FitResult.from_dict(out)


def budget(
    free_bytes: int, total_bytes: int, held_bytes: int = 0, name: str = "", available_bytes: int | None = None
) -> tuple[int, str]:
    """What a device is planned against, and why, in words: its reported free memory; where it reports free =
    total (no usage counted), its total less ``held_bytes`` (what this process already holds there); for the
    host (``available_bytes`` given: the OS's available memory), that figure."""
    if available_bytes is not None:
        return available_bytes, "the OS's available memory (ggml's CPU device reports free = total)"
    if total_bytes > 0 and free_bytes >= total_bytes:
        return max(0, total_bytes - held_bytes), (
            f"{name or 'the device'} reports free = total (it counts no usage): planned against its total less the "
            f"{fmt_bytes(held_bytes)} this process holds there; other processes' use is not seen"
        )
    return free_bytes, "free as the device reports it"


def budget_suffix(d: DevicePlan) -> str:
    """`` (its total; it reports no usage)`` where the budget is not the device's own free figure."""
    return "" if d.budget_note.startswith("free as") else f" ({d.budget_note.split(':')[0]})"


def parts_text(d: DevicePlan) -> str:
    """``weights 92.1 MiB + KV 90.0 MiB + compute 49.1 MiB`` (the output buffer where there is one)."""
    parts = [("weights", d.weights_bytes), ("KV", d.kv_cache_bytes), ("compute", d.compute_bytes)]
    if d.output_bytes:
        parts.append(("output", d.output_bytes))
    if d.draft_bytes:
        parts.append(("draft model", d.draft_bytes))
    return " + ".join(f"{label} {fmt_bytes(n)}" for label, n in parts)


def offloaded_text(n_gpu_layers: int, n_layer: int) -> str:
    """What ``n_gpu_layers`` puts on the GPU in the model's count of layers: ``0/30 layers``, ``11/30 layers +
    output`` (12), ``30/30 layers + output`` (31)."""
    if n_gpu_layers <= 0:
        return f"0/{n_layer} layers"
    return f"{min(n_gpu_layers - 1, n_layer)}/{n_layer} layers + output"


def layer_ranges(layers: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2,5"``; ``()`` -> ``""``."""
    out: list[str] = []
    for i in sorted(layers):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        elif out and "-" not in out[-1] and int(out[-1]) == i - 1:
            out[-1] = f"{out[-1]}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


def parse_layer_ranges(text: str) -> tuple[int, ...]:
    """:func:`layer_ranges`'s text back to layers: ``"0-2,5"`` -> ``(0, 1, 2, 5)``."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return tuple(out)


def with_draft(plan: MemoryPlan, draft: MemoryPlan) -> MemoryPlan:
    """``plan`` with a speculative draft model's own plan (``draft``: its load and context, as the engine makes
    them) added on each device as ``draft_bytes`` (its mapped weights to the host's ``mapped_bytes``), as llama.cpp's
    fit counts an extra model (``common_fit_extra_model``): the target's layers are then fitted in what is left."""
    theirs = {d.name: d for d in draft.devices}

    def add(d: DevicePlan) -> DevicePlan:
        x = theirs.get(d.name)
        if x is None:
            return d
        return replace(d, draft_bytes=d.draft_bytes + x.planned_bytes, mapped_bytes=d.mapped_bytes + x.mapped_bytes)

    where = ", ".join(f"{x.name} {fmt_bytes(x.planned_bytes)}" for x in draft.devices if x.planned_bytes)
    note = f"with the draft model {draft.model} (spec draft:): {where}"
    return replace(
        plan, devices=tuple(add(d) for d in plan.devices), draft_model=draft.model, notes=(*plan.notes, note)
    )


def device_line(d: DevicePlan, margin_bytes: int) -> str:
    """One device's plan: ``weights 68.1 MiB (layers 12-29 + output) · KV 60.0 MiB · compute 10.0 MiB = 138.1 MiB
    of 2.0 GiB, 1.9 GiB left`` (the margin where a GPU device keeps less; the host's mapped weights)."""
    where = [f"layers {layer_ranges(d.layers)}"] if d.layers else []
    if d.output_layer:
        where.append("output")
    placed = f" ({' + '.join(where)})" if where else ""
    mapped = f", {fmt_bytes(d.mapped_bytes)} mapped from the file" if d.mapped_bytes else ""
    parts = [f"weights {fmt_bytes(d.weights_bytes)}{placed}{mapped}"]
    parts += [f"KV {fmt_bytes(d.kv_cache_bytes)}", f"compute {fmt_bytes(d.compute_bytes)}"]
    if d.output_bytes:
        parts.append(f"output {fmt_bytes(d.output_bytes)}")
    if d.draft_bytes:
        parts.append(f"draft model {fmt_bytes(d.draft_bytes)}")
    left = f"{fmt_bytes(d.left_bytes)} left" if d.left_bytes >= 0 else f"{fmt_bytes(-d.left_bytes)} short"
    if not d.is_host and 0 <= d.left_bytes < margin_bytes:
        left += f", under the {fmt_bytes(margin_bytes)} margin"
    return f"{' · '.join(parts)} = {fmt_bytes(d.planned_bytes)} of {fmt_bytes(d.budget_bytes)}, {left}"


def plan_lines(plan: MemoryPlan) -> list[tuple[str, str]]:
    """The plan as ``(label, text)`` rows for people: one per device (its name, :func:`device_line`, and where its
    budget is not the device's own free figure, why), the KV caches, the output layer, the assumptions."""
    experts = " · experts on the host (-ot exps=CPU)" if plan.experts_on_host else ""
    rows = [
        (
            "memory plan",
            f"{plan.n_gpu_layers_text()}{experts} · n_ctx {plan.n_ctx:,} · projected in {plan.projection_ms:.0f} ms",
        )
    ]
    for d in plan.devices:
        rows.append((f"{d.name} at {d.host}" if d.host else d.name, device_line(d, plan.margin_bytes)))
        if not d.budget_note.startswith("free as"):
            rows.append(("", d.budget_note))
    kv = " · ".join(
        f"{c.kind} {fmt_bytes(c.bytes)} ({c.cells:,} cells × {c.layers} layers, K {c.type_k} / V {c.type_v})"
        for c in plan.kv_caches
    )
    if kv:
        rows.append(("KV caches", kv))
    if plan.output_layer_bytes is not None:
        where = next((d.name for d in plan.devices if d.output_layer), "?")
        rows.append(("output layer", f"{fmt_bytes(plan.output_layer_bytes)} on {where}"))
    rows += [("", note) for note in plan.notes]
    return rows
