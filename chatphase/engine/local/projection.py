"""llama.cpp's own projection of a load's memory, per device, before the load: the :class:`MemoryPlan`, and the
layer count ``n_gpu_layers auto`` chooses from such plans.

:func:`project` loads the model with ``llama_model_params.no_alloc`` ("only load metadata and simulate memory
allocations"; ``load_mode`` NONE, as llama.cpp's fit does: a memory-mapped no_alloc load asserts) and creates the
context on it with the engine's own parameters (:mod:`chatphase.engine.local.llama_params`): llama.cpp assigns
each layer to a device, sizes the KV cache and reserves the compute graphs, allocating nothing and reading no
weights. ``llama_get_memory_breakdown`` then gives the bytes per buffer type (:mod:`chatphase.engine.local.llama_ext`),
and llama.cpp's own lines, read and not written (:func:`chatphase.engine.llamalog.parse_only`), give each layer's
device, each KV cache and the output buffer. The plan is llama.cpp's figures laid out per device; no second formula.

:func:`fit_layers` is what a load does before it starts (the engine, in its own process, and ``chatphase info
--plan``): resolve ``n_gpu_layers auto`` (:func:`chatphase.engine.fit_search.choose_layers`; 0 with the reason on a
build or machine without a GPU device; a mixture-of-experts model's experts kept on the host where that is what
fits) or project the count asked, whose plan refuses a load that would not fit; with ``n_ctx auto``, choose the
context too (:func:`~chatphase.engine.fit_search.choose_context`). A speculative draft model (``spec
draft:MODEL``) is projected too and counted in each plan.

The projection runs where llama.cpp may run: in the engine's process, or in a child of its own for the command
line and the model picker (:func:`chatphase.engine.memory_plan.plan_in_child` runs ``python -m
chatphase.engine.local.projection``), never in the UI's process. A
projection llama.cpp cannot make here (:class:`~chatphase.engine.local.llama_ext.ProjectionUnavailable`, a file
it refuses) is one line.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from chatphase.engine.events import OFFLOAD_TYPES, DeviceInfo
from chatphase.engine.fit_search import LayerChoice, choose_context, choose_placement
from chatphase.engine.memory_plan import (
    AUTO_N_CTX_MIN,
    HOST,
    DevicePlan,
    FitResult,
    KvCachePlan,
    MemoryPlan,
    budget,
    with_draft,
)

#: ``llama_model_params.n_gpu_layers`` for every layer (llama.cpp clamps it), as llama_params' ALL_LAYERS.
_ALL = 0x7FFFFFFF


class ProjectionFailed(RuntimeError):
    """llama.cpp could not project this load (one line: why)."""


def has_experts(path: str) -> bool:
    """Whether the file has a mixture-of-experts model's expert tensors (``blk.N.ffn_{gate,up,down}_exps``); a
    file that cannot be read has none here (the projection, and the load, say why)."""
    from chatphase.errors import ModelError
    from chatphase.models.gguf_meta import read_metadata

    try:
        return any("_exps" in t.name for t in read_metadata(path)[1].tensors)
    except ModelError:
        return False


def _output_layer_bytes(path: str) -> int | None:
    """The output layer's weights in the file: ``output.weight`` (or the token embedding llama.cpp duplicates into
    it when the model ties them) and ``output_norm``; ``None`` where the file (a split model's first part) lacks
    them."""
    from chatphase.models.gguf_meta import read_metadata

    tensors = {t.name: int(t.n_bytes) for t in read_metadata(path)[1].tensors}
    matrix = tensors.get("output.weight", tensors.get("token_embd.weight"))
    if matrix is None:
        return None
    return matrix + sum(n for name, n in tensors.items() if name.startswith("output_norm."))


def project(
    path: str,
    settings: dict[str, Any],
    n_gpu_layers: int,
    use_extra_bufts: bool,
    margin_bytes: int,
    held_bytes: dict[str, int] | None = None,
    experts_on_host: bool = False,
) -> MemoryPlan:
    """llama.cpp's projection of loading ``path`` with ``n_gpu_layers`` (:data:`_ALL`-like counts are clamped)
    and the resolved engine ``settings`` (:meth:`chatphase.engine.config.EngineConfig.resolved`), per device.
    ``held_bytes``: what this process already holds per device (for a device that reports free = total);
    ``experts_on_host``: a mixture-of-experts model's expert tensors kept in host memory (``-ot exps=CPU``).

    Raises:
        ProjectionUnavailable: the projection cannot be read in this build (one line).
        ProjectionFailed: llama.cpp refused the file or the context (one line, its last error).
    """
    import llama_cpp as lc
    import psutil

    from chatphase.engine.llamalog import parse_only
    from chatphase.engine.local import ggml_devices
    from chatphase.engine.local.llama_ext import memory_breakdown
    from chatphase.engine.local.llama_params import OffloadPlan, context_params, model_params

    t0 = time.perf_counter_ns()
    lc.llama_backend_init()
    name = Path(path).name
    with parse_only() as log:
        params = model_params(OffloadPlan(n_gpu_layers, use_extra_bufts, False, (), experts_on_host=experts_on_host))
        params.no_alloc = True
        params.load_mode = lc.LLAMA_LOAD_MODE_NONE
        model = lc.llama_model_load_from_file(str(path).encode("utf-8"), params)
        if not model:
            raise ProjectionFailed(f"llama.cpp could not read {name} for its memory plan{_last(log.errors)}")
        try:
            ctx = lc.llama_init_from_model(model, context_params(settings))
            if not ctx:
                raise ProjectionFailed(
                    f"llama.cpp could not plan a context of {settings['n_ctx']:,} tokens for {name}{_last(log.errors)}"
                )
            try:
                uses = memory_breakdown(ctx)
                n_ctx = int(lc.llama_n_ctx(ctx))
            finally:
                lc.llama_free(ctx)
            n_layer = int(lc.llama_model_n_layer(model))
        finally:
            lc.llama_model_free(model)
    devices = ggml_devices.devices()
    held = held_bytes or {}
    gpus = [d for d in devices if d.type in OFFLOAD_TYPES]
    gpu_names = {d.name for d in gpus}
    output = {b: round(mib * 2**20) for (kind, b), mib in log.buffer_mib().items() if kind == "output"}

    def place(device: str | None) -> str:
        return device if device in gpu_names else HOST

    def entry(d: DeviceInfo | None) -> DevicePlan:
        key = d.name if d else HOST
        mine = [u for u in uses if place(u.device) == key]
        layers = tuple(sorted(i for i, dev in log.layer_devices.items() if place(dev) == key and i < n_layer))
        if d is None:
            cpu = next((x for x in devices if x.type == "cpu"), None)
            free, total = (cpu.free_bytes, cpu.total_bytes) if cpu else (0, 0)
            limit, note = budget(free, total, available_bytes=psutil.virtual_memory().available)
        else:
            free, total = d.free_bytes, d.total_bytes
            limit, note = budget(free, total, held.get(d.name, 0), d.name)
        return DevicePlan(
            name=key,
            description=d.description if d else "host memory",
            type=d.type if d else HOST,
            weights_bytes=sum(u.model_bytes for u in mine),
            kv_cache_bytes=sum(u.context_bytes for u in mine),
            compute_bytes=sum(u.compute_bytes for u in mine),
            output_bytes=sum(n for b, n in output.items() if place(b) == key),
            mapped_bytes=sum(u.model_bytes for u in mine if u.mappable),
            layers=layers,
            output_layer=place(log.layer_devices.get(n_layer)) == key,
            host=d.host if d else None,
            free_bytes=free,
            total_bytes=total,
            budget_bytes=limit,
            budget_note=note,
        )

    kv = tuple(KvCachePlan(c.kind, c.cells, c.layers, c.type_k, c.type_v, round(c.mib * 2**20)) for c in log.kv_caches)
    notes = ["the host's weights in the CPU's own buffer type are mapped from the file (page cache), not allocated"]
    return MemoryPlan(
        model=name,
        n_layer=n_layer,
        n_gpu_layers=max(0, min(n_gpu_layers, n_layer + 1)),
        n_ctx=n_ctx,
        devices=(*(entry(d) for d in gpus), entry(None)),
        kv_caches=kv,
        output_layer_bytes=_output_layer_bytes(path),
        margin_bytes=margin_bytes,
        projection_ms=(time.perf_counter_ns() - t0) / 1e6,
        notes=tuple(notes),
        experts_on_host=experts_on_host,
    )


def _last(errors: list[str]) -> str:
    return f": {errors[-1]}" if errors else ""


def fit_layers(
    path: str,
    settings: dict[str, Any],
    n_layer: int,
    use_extra_bufts: bool,
    gpu_ok: bool,
    why_not: str | None,
    *,
    plan_always: bool = False,
    n_ctx_train: int | None = None,
) -> FitResult:
    """Resolve ``settings["n_gpu_layers"]`` before a load (``None`` = auto), from llama.cpp's projection.

    auto: on a build without GPU offload, or with no GPU device, 0 and ``why_not`` (no projection unless
    ``plan_always``); else :func:`~chatphase.engine.fit_search.choose_placement` (a plan that cannot be made: every
    layer, as before auto, and why). A count given (-1 = all): its plan, and the refusal line when a GPU device
    cannot hold its share. ``plan_always``: make the plan of the count even where the load would not need it
    (``info --plan``: the host's plan on a CPU-only build). ``n_layer``: the model's repeating layers.
    ``settings["n_ctx"]`` ``None`` (auto): :func:`_fit_context`, with ``n_ctx_train`` the model's training context.
    """
    from chatphase.engine.local.llama_ext import ProjectionUnavailable

    margin = int(settings.get("gpu_margin_mib") or 0) * 2**20
    requested = settings["n_gpu_layers"]
    offload = gpu_ok and why_not is None
    if settings["n_ctx"] is None:
        return _fit_context(path, settings, n_layer, use_extra_bufts, gpu_ok, why_not, n_ctx_train, margin)

    plans = _Projector(path, settings, use_extra_bufts, margin, gpu_ok)

    def plan_of(n: int) -> MemoryPlan:
        return plans(n, settings["n_ctx"])

    if requested is None and not offload:
        why = f"auto: 0 layers, {why_not or 'no GPU offload in this llama.cpp build'}"
        if not plan_always:
            return FitResult(0, why, None)
        try:
            return FitResult(0, why, plan_of(0))
        except (ProjectionUnavailable, ProjectionFailed) as exc:
            return FitResult(0, why, None, unavailable=str(exc))
    try:
        if requested is None:
            n_ctx = settings["n_ctx"]
            choice: LayerChoice = choose_placement(lambda n, x: plans(n, n_ctx, x), n_layer, has_experts(path))
            return FitResult(
                choice.n_gpu_layers, f"auto: {choice.why}", choice.plan, experts_on_host=choice.experts_on_host
            )
        count = _ALL if requested == -1 else requested
        if not offload:
            count = 0
        if not offload and not plan_always:
            return FitResult(0, None, None)
        plan = plan_of(count)
        return FitResult(plan.n_gpu_layers, _margin_note(plan), plan, refusal=plan.overflow_line())
    except (ProjectionUnavailable, ProjectionFailed) as exc:
        if requested is None:
            return FitResult(n_layer + 1, f"auto: every layer, as without a plan ({exc})", None, unavailable=str(exc))
        return FitResult(n_layer + 1 if requested == -1 else requested, None, None, unavailable=str(exc))


class _Projector:
    """``(n_gpu_layers, n_ctx) -> MemoryPlan``: :func:`project` of the model, with a speculative draft model
    (``spec`` ``draft:MODEL``) counted in (:func:`~chatphase.engine.memory_plan.with_draft`): projected once per
    context, with the layers the engine gives it (every layer where the target's count is auto or -1, else that
    count; none on a build without GPU offload). A draft that cannot be found is left out, and the plan says why
    (the load refuses it in its own words)."""

    def __init__(self, path: str, settings: dict[str, Any], use_extra_bufts: bool, margin: int, gpu_ok: bool):
        self.path, self.settings, self.use_extra_bufts, self.margin = path, settings, use_extra_bufts, margin
        requested = settings["n_gpu_layers"]
        self.draft_layers = 0 if not gpu_ok else _ALL if requested in (None, -1) else requested
        self.draft_path: str | None = None
        self.draft_note: str | None = None
        self._drafts: dict[int, MemoryPlan] = {}
        try:
            from chatphase.engine.spec_modes import parse_spec
            from chatphase.models.resolve import resolve_model

            mode = parse_spec(settings.get("spec"))
            if mode.kind == "draft":
                self.draft_path = str(resolve_model(None if mode.draft == "default" else mode.draft))
        except Exception as exc:  # the load says it in full; the plan says what it left out
            self.draft_note = f"the draft model is not counted: {str(exc).splitlines()[0] if str(exc) else exc!r}"

    def __call__(self, n_gpu_layers: int, n_ctx: int, experts_on_host: bool = False) -> MemoryPlan:
        s = {**self.settings, "n_ctx": n_ctx}
        plan = project(self.path, s, n_gpu_layers, self.use_extra_bufts, self.margin, experts_on_host=experts_on_host)
        if self.draft_note:
            return replace(plan, notes=(*plan.notes, self.draft_note))
        if self.draft_path is None:
            return plan
        if n_ctx not in self._drafts:
            draft_settings = {**s, "n_seq_max": 1}  # as the engine's DraftModel makes its context
            self._drafts[n_ctx] = project(self.draft_path, draft_settings, self.draft_layers, self.use_extra_bufts, 0)
        return with_draft(plan, self._drafts[n_ctx])


def _fit_context(
    path: str,
    settings: dict[str, Any],
    n_layer: int,
    use_extra_bufts: bool,
    gpu_ok: bool,
    why_not: str | None,
    n_ctx_train: int | None,
    margin: int,
) -> FitResult:
    """``n_ctx auto``: :func:`~chatphase.engine.fit_search.choose_context` on llama.cpp's projections, with the
    layers asked (auto: chosen with the context; 0 where nothing can be offloaded). Where no plan can be made,
    the least context auto chooses, and why."""
    from chatphase.engine.local.llama_ext import ProjectionUnavailable

    requested = settings["n_gpu_layers"]
    offload = gpu_ok and why_not is None
    train = n_ctx_train or AUTO_N_CTX_MIN
    if not offload:
        count: int | None = 0
    else:
        count = None if requested is None else _ALL if requested == -1 else requested

    try:
        choice = choose_context(_Projector(path, settings, use_extra_bufts, margin, gpu_ok), n_layer, train, count)
    except (ProjectionUnavailable, ProjectionFailed) as exc:
        n_ctx = min(AUTO_N_CTX_MIN, train)
        layers = n_layer + 1 if requested is None and offload else 0 if not offload else requested
        return FitResult(
            layers, f"auto: every layer, as without a plan ({exc})" if requested is None and offload else None,
            None, unavailable=str(exc), n_ctx=n_ctx,
            n_ctx_why=f"auto: {n_ctx:,}, the least auto chooses, as without a plan ({exc})",
        )  # fmt: skip
    plan = choice.layers.plan
    if requested is None and offload:
        why: str | None = f"auto: {choice.layers.why}"
    elif requested is None:
        why = f"auto: 0 layers, {why_not or 'no GPU offload in this llama.cpp build'}"
    else:
        why = _margin_note(plan) if plan else None
    refusal = plan.overflow_line() if plan and requested is not None and offload else None
    n = choice.layers.n_gpu_layers
    return FitResult(n, why, plan, refusal=refusal, n_ctx=choice.n_ctx, n_ctx_why=choice.why)


def _margin_note(plan: MemoryPlan) -> str | None:
    """Where a count the user gave fits but leaves a GPU device less than the margin auto keeps: say so."""
    from chatphase.units import fmt_bytes

    short = [d for d in plan.gpus if 0 <= d.left_bytes < plan.margin_bytes]
    if not short:
        return None
    d = short[0]
    return (
        f"{plan.n_gpu_layers_text()} leaves {d.name} {fmt_bytes(d.left_bytes)}, under the "
        f"{fmt_bytes(plan.margin_bytes)} margin auto keeps (--gpu-margin-mib)"
    )


# -- the child process: ``chatphase info --plan``, the model picker (:func:`~chatphase.engine.memory_plan.plan_in_child`)
def _child_main() -> int:
    """Read ``{"path", "engine"}`` on stdin, print one JSON line: :meth:`FitResult.to_dict` or ``{"error"}``."""
    import os

    from chatphase.engine.config import EngineConfig
    from chatphase.engine.logfile import default_log_path, redirect_stdio
    from chatphase.engine.slow_paths import why_no_offload

    request = json.loads(sys.stdin.read())
    out = os.fdopen(os.dup(1), "w")  # the plan's line; llama.cpp's fds 1/2 go to the engine log
    redirect_stdio(default_log_path())
    try:
        from chatphase.engine.local import ggml_devices, rpc
        from chatphase.engine.local.llama_params import cpu_system_info, offload_plan
        from chatphase.models.gguf_meta import read_model_info

        info = read_model_info(request["path"])
        config = EngineConfig(**request["engine"]).validate()
        rpc.register(config.rpc_endpoints(), config.rpc_unauthenticated_ok)  # the plan splits across them too
        s = config.resolved()
        gpu_ok = ggml_devices.can_offload()
        why_not = why_no_offload(ggml_devices.backends(), ggml_devices.devices(), s["n_gpu_layers"])
        extra = offload_plan({**s, "n_gpu_layers": 0}, cpu_system_info(), gpu_ok).use_extra_bufts
        result = fit_layers(
            str(info.path), s, info.n_layer or 0, extra, gpu_ok, why_not, plan_always=True,
            n_ctx_train=info.n_ctx_train,
        )  # fmt: skip
        out.write(json.dumps(result.to_dict()) + "\n")
    except Exception as exc:  # one line for the parent; the traceback to the engine log
        import traceback

        traceback.print_exc()
        out.write(json.dumps({"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
