"""``n_gpu_layers auto`` and ``n_ctx auto``: the searches that choose a load from memory plans
(:class:`~chatphase.engine.memory_plan.MemoryPlan`).

:func:`choose_layers` is ``n_gpu_layers auto``: the most layers whose plan leaves every GPU device at least the
margin (``gpu_margin_mib``), searched as llama.cpp's fit searches (``common/fit.cpp``, step 3): a plan with
every layer, one with none, then the method of false position on the plans' device bytes until one layer
separates what fits from what does not. Each plan is a projection (a fraction of a second, no weights read).
:func:`choose_placement` adds a mixture-of-experts model's placement with its experts on the host (``-ot
exps=CPU``); :func:`choose_context` is ``n_ctx auto`` (llama.cpp's fit, steps 1 and 2: the training context,
else the largest that fits with the layers, else its least and the layers fitted at it); :func:`with_draft`
counts a speculative draft model in a plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from chatphase.engine.memory_plan import AUTO_N_CTX_MIN, DevicePlan, MemoryPlan, offloaded_text
from chatphase.units import fmt_bytes

#: the step ``n_ctx auto`` rounds down to (llama.cpp's fit aligns to 256 cells, and sizes the cache in 256-cell blocks).
N_CTX_ALIGN = 256


@dataclass(frozen=True)
class LayerChoice:
    """``n_gpu_layers auto``'s answer: ``n_gpu_layers`` (0 to n_layer + 1), ``why`` in one line, the
    ``plan`` of that count (``None`` where no projection was made: no GPU device, or none available), and whether
    a mixture-of-experts model's experts stay on the host (:func:`choose_placement`)."""

    n_gpu_layers: int
    why: str
    plan: MemoryPlan | None = field(default=None, compare=False)
    experts_on_host: bool = False


def choose_layers(project: Callable[[int], MemoryPlan], n_layer: int) -> LayerChoice:
    """The most layers (0 to ``n_layer + 1``, the output layer last as llama.cpp counts) whose plan leaves every
    GPU device its margin; ``project(n_gpu_layers)`` makes a plan. Every layer when they all fit, none when even
    none leave the margin (the compute buffers a GPU device gets anyway), else llama.cpp's false-position search
    between the largest count that fits and the smallest that does not (``common/fit.cpp``), assuming a device's
    bytes grow with the count. ``why`` names the device that bounds the count and its figures."""
    top = n_layer + 1
    high = project(top)
    if not high.gpus:
        return LayerChoice(0, "no GPU device in llama.cpp's plan", high)
    if high.within_margin():
        return LayerChoice(top, f"all {n_layer} layers + output fit: {_left_text(high)}", high)
    low = project(0)
    if not low.within_margin():
        d = _tightest(low)
        return LayerChoice(
            0,
            f"no layer fits: {d.name} keeps {fmt_bytes(d.left_bytes)} with none, under the "
            f"{fmt_bytes(low.margin_bytes)} margin (--gpu-margin-mib)",
            low,
        )
    while high.n_gpu_layers - low.n_gpu_layers > 1:
        step = _false_position_step(low, high)
        test = project(low.n_gpu_layers + step)
        if test.within_margin():
            low = test
        else:
            high = test
    d = _tightest(high)
    return LayerChoice(
        low.n_gpu_layers,
        f"{low.n_gpu_layers} ({offloaded_text(low.n_gpu_layers, n_layer)}) fit: {_left_text(low)}; one more would leave "
        f"{d.name} {fmt_bytes(d.left_bytes)}, under the {fmt_bytes(high.margin_bytes)} margin (--gpu-margin-mib)",
        low,
    )


def choose_placement(project: Callable[[int, bool], MemoryPlan], n_layer: int, has_experts: bool) -> LayerChoice:
    """:func:`choose_layers`, and for a mixture-of-experts model (``has_experts``: ``ffn_*_exps`` tensors) the
    placement llama.cpp's ``--cpu-moe`` makes (``-ot exps=CPU``): where every layer does not fit the GPU devices
    with their experts but does with the experts kept in host memory, every layer with the experts on the host
    (the attention and the shared tensors, read every token, on the device; the experts, of which a token reads
    a few, on the host). ``project(n_gpu_layers, experts_on_host)`` makes a plan. (llama.cpp's own fit goes on to
    move some layers' experts back to a device with room left; this does not.)"""
    top = n_layer + 1
    plain: dict[int, MemoryPlan] = {}

    def project_plain(n: int) -> MemoryPlan:
        if n not in plain:
            plain[n] = project(n, False)
        return plain[n]

    everything = project_plain(top)
    if not has_experts or not everything.gpus or everything.within_margin():
        return choose_layers(project_plain, n_layer)
    experts_out = project(top, True)
    if experts_out.within_margin():
        return LayerChoice(
            top,
            f"all {n_layer} layers + output fit with the experts on the host (llama.cpp's -ot exps=CPU): "
            f"{_left_text(experts_out)}",
            experts_out,
            experts_on_host=True,
        )
    choice = choose_layers(project_plain, n_layer)
    d = _tightest(experts_out)
    return replace(
        choice,
        why=f"{choice.why}; with the experts on the host every layer would leave {d.name} {fmt_bytes(d.left_bytes)}",
    )


@dataclass(frozen=True)
class ContextChoice:
    """``n_ctx auto``'s answer: ``n_ctx`` (cells), ``why`` in one line, and the layer count at it (``layers``:
    :func:`choose_layers`'s where the layers were auto too, else the count given, with the plan of both)."""

    n_ctx: int
    why: str
    layers: LayerChoice


def choose_context(
    project: Callable[[int, int], MemoryPlan], n_layer: int, n_ctx_train: int, n_gpu_layers: int | None
) -> ContextChoice:
    """The largest context that fits, as llama.cpp's fit chooses it (``common/fit.cpp``, steps 1 and 2): the
    model's training context ``n_ctx_train`` with the layers asked (``n_gpu_layers``; ``None`` = auto, tried
    with every layer) when its plan fits (:meth:`MemoryPlan.fits`); else, where the least context
    (:data:`AUTO_N_CTX_MIN`, or ``n_ctx_train`` where smaller) fits, the context between the two where the line
    through their plans' bytes meets the devices' budgets less the margin, rounded down to :data:`N_CTX_ALIGN`
    and checked (stepped down by the same line until its plan fits); else the least context, and with auto
    layers :func:`choose_layers` at it. ``project(n_gpu_layers, n_ctx)`` makes a plan."""
    top = n_layer + 1
    ngl = top if n_gpu_layers is None else n_gpu_layers
    hi_ctx = max(n_ctx_train, 1)
    lo_ctx = min(AUTO_N_CTX_MIN, hi_ctx)

    def layers_of(plan: MemoryPlan) -> LayerChoice:
        if n_gpu_layers is not None:
            return LayerChoice(plan.n_gpu_layers, "", plan)
        return LayerChoice(top, f"all {n_layer} layers + output fit at n_ctx {plan.n_ctx:,}: {_left_text(plan)}", plan)

    full = project(ngl, hi_ctx)
    if full.fits():
        return ContextChoice(
            hi_ctx, f"auto: {hi_ctx:,}, the model's training context, fits: {_fit_text(full)}", layers_of(full)
        )
    low = project(ngl, lo_ctx) if lo_ctx < hi_ctx else full
    if low.fits():
        lo_n, hi_n, high = lo_ctx, hi_ctx, full  # the contexts asked (a plan's n_ctx is llama.cpp's, padded)
        tries = 0
        while hi_n - lo_n > N_CTX_ALIGN:
            grow = high.used_bytes() - low.used_bytes()
            room = low.target_bytes() - low.used_bytes()
            step = (hi_n - lo_n) * room // grow if grow > 0 and tries < 4 else (hi_n - lo_n) // 2  # then bisect
            n = min(
                max(lo_n + N_CTX_ALIGN, (lo_n + step) // N_CTX_ALIGN * N_CTX_ALIGN),
                (hi_n - 1) // N_CTX_ALIGN * N_CTX_ALIGN,
            )
            if n <= lo_n:
                break
            tries += 1
            test = project(ngl, n)
            if test.fits():
                lo_n, low = n, test
            else:
                hi_n, high = n, test
        return ContextChoice(
            lo_n, f"auto: {lo_n:,} of the training context's {hi_ctx:,} fits: {_fit_text(low)}", layers_of(low)
        )
    why = f"auto: {lo_ctx:,}, the least auto chooses (llama.cpp's fit_params_min_ctx)"
    if n_gpu_layers is not None:
        return ContextChoice(lo_ctx, f"{why}; even it does not fit: {_fit_text(low)}", layers_of(low))
    layers = choose_layers(lambda k: project(k, lo_ctx), n_layer)
    return ContextChoice(lo_ctx, f"{why}, the layers fitted at it", layers)


def _fit_text(plan: MemoryPlan) -> str:
    """The devices' figures of a plan at its n_ctx (the host's allocation where there is no GPU device)."""
    if plan.gpus:
        return _left_text(plan)
    host = plan.host
    if host is None:
        return "no device in the plan"
    return (
        f"host allocates {fmt_bytes(host.allocated_bytes)} of {fmt_bytes(host.budget_bytes)}, "
        f"{fmt_bytes(host.budget_bytes - host.allocated_bytes)} left"
    )


def _false_position_step(low: MemoryPlan, high: MemoryPlan) -> int:
    """Layers to add to ``low``'s count: where the line between the two plans' bytes meets the margin on the
    device that binds first, at least 1 and short of ``high``'s count (``common/fit.cpp``'s step)."""
    delta = high.n_gpu_layers - low.n_gpu_layers
    steps = []
    for lo, hi in zip(low.gpus, high.gpus, strict=True):
        grow = hi.planned_bytes - lo.planned_bytes
        room = lo.budget_bytes - high.margin_bytes - lo.planned_bytes
        if grow > 0:
            steps.append(delta * room // grow)
    return max(1, min(min(steps, default=1), delta - 1))


def _tightest(plan: MemoryPlan) -> DevicePlan:
    return min(plan.gpus, key=lambda d: d.left_bytes - plan.margin_bytes)


def _left_text(plan: MemoryPlan) -> str:
    return ", ".join(
        f"{d.name} {fmt_bytes(d.planned_bytes)} of {fmt_bytes(d.budget_bytes)}, {fmt_bytes(d.left_bytes)} left"
        for d in plan.gpus
    )
