"""What-if for other hardware: TTFT and decode speed of a model on another machine, from the roofline.

A device's theoretical peaks (memory bandwidth, dense FLOP/s; :data:`DEVICES`, each row citing its
vendor's spec sheet) give its roofline bounds (:mod:`chatphase.models.roofline`); they are scaled by the
**efficiency** this machine reached against its own measured peaks (:mod:`chatphase.bench.core.peaks`):

- ``decode_efficiency`` = measured decode tok/s / the bound at that context (a depth-0 cell);
- ``prefill_efficiency`` = measured prefill tok/s / ``FLOP/s / (2 × params)``;

each at most 1.0: a local measurement above its bound is a measurement problem (the peak read low), flagged
in the assumptions, and never carried to another device as an efficiency above 100 %. So ``decode(D) ≈
decode_efficiency ×`` the roofline's decode bound at ``D`` (:func:`~chatphase.models.roofline.decode_bound`)
and ``TTFT(L) ≈ L × 2 × params / (prefill_efficiency × FLOP/s)``.

Only float32 weights have a prefill bound (:func:`~chatphase.models.roofline.float32_weight_type`): quantised
ones run integer kernels that can beat a float32 peak. For them ``prefill`` is not clamped and not called an
efficiency: it is this machine's measured prefill FLOP/s over its float32 peak, so ``TTFT(L)`` is this machine's
TTFT scaled by the ratio of the FLOP/s figures — an estimate that may be off either way, neither a bound nor
a measurement (:func:`assumptions` says so). The decode bound holds for any weight type.

These are upper bounds on speed (lower bounds on TTFT) under assumptions
:func:`assumptions` lists, never measurements; this machine's own row shows predicted beside measured at a
depth the efficiency was not taken from, so the user sees how far the model can be trusted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chatphase.errors import UsageError
from chatphase.models.roofline import (
    PEAK_OF_PHASE,
    BoundShare,
    decode_bound_tokens_per_s,
    float32_weight_type,
    no_prefill_bound_text,
    prefill_bound_tokens_per_s,
    share_of_bound,
    step_flops,
)


@dataclass(frozen=True)
class Device:
    """A machine's theoretical peaks: ``bandwidth_bytes_per_s`` (memory bandwidth), ``flops_per_s`` (dense,
    of ``flops_what``), and ``source`` (the vendor spec sheet the figures are from, and how a figure the
    vendor does not state was derived from the ones it does)."""

    key: str
    name: str
    bandwidth_bytes_per_s: float
    flops_per_s: float
    flops_what: str
    source: str


DEVICES: tuple[Device, ...] = (
    Device("m2", "Apple M2 (10-core GPU)", 100e9, 3.6e12, "FP32 GPU",
           "apple.com/newsroom/2022/06/apple-unveils-m2-with-breakthrough-performance-and-capabilities "
           "(100GB/s, 3.6 TFLOPS)"),
    Device("m3-pro", "Apple M3 Pro (18-core GPU)", 150e9, 6.5e12, "FP32 GPU",
           "apple.com/newsroom/2023/10 M3 family announcement (150GB/s); FLOP/s not published by Apple: "
           "derived, 18 cores × 128 ALUs × 2 × ~1.4 GHz"),
    Device("m4-max", "Apple M4 Max (40-core GPU)", 546e9, 16.2e12, "FP32 GPU",
           "apple.com/newsroom/2024/10 M4 Pro and M4 Max announcement (546GB/s); FLOP/s not published by "
           "Apple: derived, 40 cores × 128 ALUs × 2 × ~1.58 GHz"),
    Device("m2-ultra", "Apple M2 Ultra (76-core GPU)", 800e9, 27.2e12, "FP32 GPU",
           "apple.com/newsroom/2023/06 M2 Ultra announcement (800GB/s, 27.2 TFLOPS)"),
    Device("rtx-3090", "NVIDIA GeForce RTX 3090", 936e9, 71e12, "FP16 tensor, FP32 accumulate, dense",
           "NVIDIA Ampere GA102 GPU Architecture whitepaper (936 GB/s; 71 TFLOPS)"),
    Device("rtx-4090", "NVIDIA GeForce RTX 4090", 1008e9, 165.2e12, "FP16 tensor, FP32 accumulate, dense",
           "NVIDIA Ada GPU Architecture whitepaper (1,008 GB/s; 165.2 TFLOPS)"),
    Device("a100", "NVIDIA A100 80GB SXM", 2039e9, 312e12, "FP16 tensor, dense",
           "NVIDIA A100 Tensor Core GPU datasheet (2,039 GB/s; 312 TFLOPS)"),
    Device("h100", "NVIDIA H100 SXM", 3.35e12, 989e12, "FP16 tensor, dense",
           "NVIDIA H100 Tensor Core GPU datasheet (3.35 TB/s; 1,979 TFLOPS with sparsity, half dense)"),
    Device("h200", "NVIDIA H200 SXM", 4.8e12, 989e12, "FP16 tensor, dense",
           "NVIDIA H200 Tensor Core GPU datasheet (4.8 TB/s; 1,979 TFLOPS with sparsity, half dense)"),
    Device("rpi5", "Raspberry Pi 5 (4 × Cortex-A76, 2.4 GHz)", 17.1e9, 153.6e9, "FP32 NEON",
           "raspberrypi.com Raspberry Pi 5 product brief (LPDDR4X-4267); derived: 32-bit bus × 4267 MT/s, "
           "4 cores × 2.4 GHz × 16 FLOPs"),
    Device("ryzen-7950x", "AMD Ryzen 9 7950X (DDR5-5200, 2 channels)", 83.2e9, 2.3e12, "FP32 AVX-512",
           "amd.com Ryzen 9 7950X specifications (DDR5-5200, 16 cores, 4.5 GHz base); derived: 2 × 64-bit × "
           "5200 MT/s, 16 cores × 4.5 GHz × 32 FLOPs"),
)  # fmt: skip


def find_device(name: str) -> Device:
    """The device whose key is ``name`` (case-insensitive).

    Raises:
        UsageError: an unknown name (the message lists the keys).
    """
    for d in DEVICES:
        if d.key == name.strip().lower():
            return d
    raise UsageError(f"unknown device {name!r}: choose one of {', '.join(d.key for d in DEVICES)}")


@dataclass(frozen=True)
class Efficiency:
    """What this machine reached against its own measured peaks (fractions, 1.0 = at the bound), with the
    peaks and the cells they came from (``decode_depth``, ``prefill_tokens``). ``decode`` and ``prefill``
    are clamped to 1.0: a bound is never beaten, so a measurement above its bound (``decode_measured`` /
    ``prefill_measured`` above 1.0, :attr:`decode_above_bound`) is a measurement problem — the local peak
    read low — and another device is predicted at its bound, never above it. ``prefill_bound`` false (weights
    not float32, ``weight_type``): ``prefill`` is measured prefill FLOP/s / the float32 peak, unclamped, a scale
    factor rather than a share of a bound, and ``prefill_measured`` is ``None`` (module doc)."""

    decode: float
    prefill: float
    bandwidth_bytes_per_s: float
    flops_per_s: float
    decode_depth: int
    prefill_tokens: int
    decode_measured: float | None = None
    prefill_measured: float | None = None
    prefill_bound: bool = True
    weight_type: str | None = None

    @property
    def decode_above_bound(self) -> bool:
        return (self.decode_measured or 0.0) > 1.0

    @property
    def prefill_above_bound(self) -> bool:
        return self.prefill_bound and (self.prefill_measured or 0.0) > 1.0


@dataclass(frozen=True)
class ModelFacts:
    """The model's figures the roofline needs: weights read per token, parameters, KV bytes per token, and
    attention's FLOPs per token of context (0: unknown, e.g. a result saved before it was recorded)."""

    name: str
    weight_bytes: int
    n_params: int
    kv_bytes_per_token: int
    attention_flops_per_context: float = 0.0
    #: the parameters a prompt token multiplies (``n_params`` for a result saved before it was recorded)
    prefill_params: int | None = None

    @property
    def prefill_matmul_params(self) -> int:
        return self.prefill_params or self.n_params


def predict_decode(bandwidth: float, eff: float, model: ModelFacts, depth: float, flops: float | None = None) -> float:
    """Decode tok/s at ``depth`` tokens of context: ``eff`` × the roofline's decode bound
    (:func:`~chatphase.models.roofline.decode_bound`: the weights' bytes, then attention's bytes or its
    FLOPs at ``flops`` FLOP/s, the larger), ``eff`` at most 1.0."""
    bound = decode_bound_tokens_per_s(
        bandwidth, model.weight_bytes, model.kv_bytes_per_token, depth, flops, model.attention_flops_per_context
    )
    return min(eff, 1.0) * bound


def predict_ttft_ms(flops: float, eff: float, model: ModelFacts, prompt_tokens: int, bounded: bool = True) -> float:
    """TTFT in ms of a prompt of ``prompt_tokens``: its prefill at ``eff × FLOP/s / (2 × params)``, ``eff``
    at most 1.0 where ``bounded`` (float32 weights); otherwise ``eff`` is a scale factor, not clamped
    (:class:`Efficiency`)."""
    share = min(eff, 1.0) if bounded else eff
    return 1000.0 * prompt_tokens * step_flops(model.prefill_matmul_params) / (share * flops)


def device_rows(
    devices: Sequence[Device], eff: Efficiency, model: ModelFacts, prompt_lengths: Sequence[int], depths: Sequence[int]
) -> list[dict]:
    """One row per device: ``ttft_ms`` per prompt length and ``decode_tokens_per_s`` per depth, as dicts
    keyed by the length/depth."""
    return [
        {
            "device": d.key,
            "name": d.name,
            "bandwidth_bytes_per_s": d.bandwidth_bytes_per_s,
            "flops_per_s": d.flops_per_s,
            "flops_what": d.flops_what,
            "source": d.source,
            "ttft_ms": {
                n: predict_ttft_ms(d.flops_per_s, eff.prefill, model, n, eff.prefill_bound) for n in prompt_lengths
            },
            "decode_tokens_per_s": {
                x: predict_decode(d.bandwidth_bytes_per_s, eff.decode, model, x, d.flops_per_s) for x in depths
            },
        }
        for d in devices
    ]


def assumptions(eff: Efficiency, model: ModelFacts) -> list[str]:
    """The assumptions behind every prediction, as sentences (first, where this machine measured above a
    bound, that the efficiency was clamped and why)."""
    flagged = []
    for phase, measured, above in (
        ("decode", eff.decode_measured, eff.decode_above_bound),
        ("prefill", eff.prefill_measured, eff.prefill_above_bound),
    ):
        share = BoundShare(measured or 0.0, PEAK_OF_PHASE[phase])
        if above:
            flagged.append(
                f"this machine's {phase} {share.text()} — a measurement problem, not an efficiency: other devices "
                f"are predicted at 100% of their {share.peak}, their bound"
            )
    if eff.prefill_bound:
        kinds = "upper bounds on speed (TTFT: lower bounds), not measurements"
        prefill = f"{eff.prefill:.0%} of its matmul FLOP/s in prefill ({eff.prefill_tokens}-token prompt)"
    else:
        kinds = (
            f"decode: upper bounds on speed, not measurements; {no_prefill_bound_text(eff.weight_type)}, so TTFT is "
            "this machine's measured prefill scaled by the device's FLOP/s over this machine's float32 peak — "
            "an estimate that may be off either way, neither a bound nor a measurement"
        )
        prefill = (
            f"in prefill the same ratio of FLOP/s to its peak as here ({eff.prefill_tokens}-token prompt, "
            f"{eff.prefill:.2f}× the float32 peak)"
        )
    return flagged + [
        kinds,
        f"the other machine reaches the fraction of its peaks this one reached: {eff.decode:.0%} of its read "
        f"bandwidth in decode (at depth {eff.decode_depth}), {prefill}; a GPU's kernels and a CPU's reach "
        "different fractions",
        f"the whole model ({model.weight_bytes / 2**20:,.0f} MiB read per token) and its KV cache fit in the "
        "device's fastest memory (no offload, no paging)",
        f"decode reads every weight and the KV cache ({model.kv_bytes_per_token:,} B per token of context) once "
        "per token, attention's arithmetic counted where it takes longer than its bytes; prefill costs 2 × "
        "parameters FLOPs per token (attention's own FLOPs left out: optimistic at long prompts)",
        "one sequence, no batching; peaks are the vendor's theoretical figures (spec sheets), which no program reaches",
    ]


def efficiency_from(result) -> tuple[Efficiency, ModelFacts, dict]:
    """The efficiency of a bench :class:`~chatphase.bench.core.results.SweepResult` with a roofline: decode from
    its depth-0 cell (else its shallowest), prefill from its longest prompt cell. Also returns the model's
    facts and ``measured``: ``{"decode": {depth: tok/s}, "ttft_ms": {prompt_tokens: ms}}``.

    Raises:
        UsageError: no roofline (peaks) in the result, or no prompt or depth cell measured.
    """
    from chatphase.bench.core.roofline import cell_context_tokens

    r = result.roofline or {}
    if not r.get("bandwidth_bytes_per_s"):
        raise UsageError("the bench result has no roofline (measured peaks): run bench without --no-roofline")
    prompts = [c for c in result.results if c.kind == "prompt" and c.prefill_tokens_per_s.mean]
    depths = sorted(
        (c for c in result.results if c.kind == "depth" and c.decode_tokens_per_s.mean), key=lambda c: c.depth
    )
    if not prompts or not depths:
        raise UsageError("the bench result needs a prompt cell and a depth cell (--prompt-lengths and --depths)")
    model = ModelFacts(
        str(result.model.get("name") or "model"),
        int(r["weight_bytes"]),
        int(r["n_params"]),
        int(r["kv_bytes_per_token"]),
        float(r.get("attention_flops_per_context_token") or 0.0),
        int(r["prefill_params"]) if r.get("prefill_params") else None,
    )
    bw, flops = float(r["bandwidth_bytes_per_s"]), float(r["flops_per_s"])
    d0, p = depths[0], max(prompts, key=lambda c: c.prompt_tokens)
    decode = share_of_bound(d0.decode_tokens_per_s.mean, predict_decode(bw, 1.0, model, cell_context_tokens(d0), flops))
    weight_type = result.model.get("quantization")
    bounded = float32_weight_type(weight_type)
    p_rate = p.prefill_tokens_per_s.mean
    bound = prefill_bound_tokens_per_s(flops, model.prefill_matmul_params) if bounded else None
    prefill = share_of_bound(p_rate, bound, "prefill")
    assert decode is not None and p_rate  # both cells have a rate, the decode bound is positive
    eff = Efficiency(
        decode=decode.clamped,
        # not float32: the FLOP/s the prefill reached over the float32 peak, unclamped (no bound, module doc)
        prefill=prefill.clamped if prefill else p_rate * step_flops(model.prefill_matmul_params) / flops,
        bandwidth_bytes_per_s=bw,
        flops_per_s=flops,
        decode_depth=d0.depth,
        prefill_tokens=p.prompt_tokens,
        decode_measured=decode.fraction,
        prefill_measured=prefill.fraction if prefill else None,
        prefill_bound=bounded,
        weight_type=weight_type,
    )
    measured = {
        "decode": {c.depth: (c.decode_tokens_per_s.mean, cell_context_tokens(c)) for c in depths},
        "ttft_ms": {c.prompt_tokens: c.ttft_ms.mean for c in prompts},
    }
    return eff, model, measured
