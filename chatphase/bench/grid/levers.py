"""Lever grids for ``chatphase bench``: llama-bench-style comma lists that combine into every combination.

The levers are ``--model A,B``, ``--cache-type-k`` / ``--cache-type-v f16,q8_0,q4_0``, ``--flash-attn
on,off``, ``--n-ubatch 64,256,512`` and ``--threads 1,2``. :class:`LeverGrid` holds the values given and
:meth:`LeverGrid.points` their product, in the order given, model slowest. llama.cpp refuses a quantised V
cache without flash attention (``llama_init_from_model``), so such a point is left out with a note; with
``--flash-attn`` not given, llama.cpp's ``auto`` turns flash attention on for it.

Each measured cell gets the roofline's prediction beside it (:func:`predict`, from
:mod:`chatphase.models.roofline`): decode tokens/s from the bytes one step reads (the weights read per token
plus the KV cache at the cell's context, at the point's KV types) or attention's FLOPs where they take
longer, prefill tokens/s from FLOPs, TTFT as the prefill of the cell's evaluated tokens at that rate — the
last two for float32 weights only (:func:`~chatphase.models.roofline.float32_peak_bounds`: other weights run
kernels the float32 matmul peak does not bound, so they get no prefill or TTFT prediction). Peaks
are measured at each point's thread count. A measurement above its bound is said in words
(:func:`bound_share`), never as a ratio above 1.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.results import CellResult
from chatphase.bench.core.roofline import cell_context_tokens
from chatphase.engine.config import TRI_STATE
from chatphase.errors import UsageError
from chatphase.models.kv import KV_TYPE_BYTES
from chatphase.models.roofline import (
    BoundShare,
    decode_bound_tokens_per_s,
    prefill_bound_tokens_per_s,
    share_of_bound,
)

#: lever -> (flag, short name in a point's label), in the order points vary (first slowest).
LEVERS: dict[str, tuple[str, str]] = {
    "model": ("--model", "model"),
    "type_k": ("--cache-type-k", "ctk"),
    "type_v": ("--cache-type-v", "ctv"),
    "flash_attn": ("--flash-attn", "fa"),
    "n_ubatch": ("--n-ubatch", "ub"),
    "n_threads": ("--threads", "t"),
}
#: the most points one run takes (each one is an engine loaded at once).
MAX_POINTS = 24


@dataclass(frozen=True)
class GridPoint:
    """One combination: ``values`` maps each lever given to its value here (``model`` a spec, the others
    :class:`~chatphase.engine.config.EngineConfig` fields); ``varying`` names the levers with more than one
    value (what its label shows)."""

    values: dict
    varying: tuple[str, ...] = ()

    def label(self) -> str:
        """``model=a.gguf ctk=q8_0 t=2``: the varying levers (``base`` when none varies)."""
        shown = [f"{LEVERS[k][1]}={_short(k, self.values[k])}" for k in self.varying]
        return " ".join(shown) or "base"

    def engine_overrides(self) -> dict:
        """The :class:`EngineConfig` fields this point sets (a pinned thread count pins prefill's too;
        ``auto`` threads are ``None``, ``auto`` flash attention stays ``auto``)."""
        out = {k: None if k == "n_threads" and v == "auto" else v for k, v in self.values.items() if k != "model"}
        if "n_threads" in out:
            out["n_threads_batch"] = out["n_threads"]
        return out


def _short(lever: str, value) -> str:
    """A model spec by its file name (a path is too long for a label); other values as they are."""
    return str(value).replace("\\", "/").rsplit("/", 1)[-1] if lever == "model" else str(value)


@dataclass(frozen=True)
class LeverGrid:
    """The values given per lever (only levers given; each a non-empty tuple)."""

    values: dict[str, tuple] = field(default_factory=dict)

    @property
    def varying(self) -> tuple[str, ...]:
        return tuple(k for k in LEVERS if len(self.values.get(k, ())) > 1)

    @property
    def is_sweep(self) -> bool:
        """Whether any lever has more than one value (else ``bench`` runs its plain sweep)."""
        return bool(self.varying)

    def points(self) -> tuple[list[GridPoint], list[str]]:
        """Every valid combination, and a note per left-out one.

        Raises:
            UsageError: more than :data:`MAX_POINTS` points, or none valid.
        """
        keys = [k for k in LEVERS if k in self.values]
        points, notes = [], []
        for combo in itertools.product(*(self.values[k] for k in keys)):
            values = dict(zip(keys, combo, strict=True))
            point = GridPoint(values, self.varying)
            if values.get("flash_attn") == "off" and values.get("type_v", "f16") not in ("f16", "f32", "bf16"):
                notes.append(f"left out {point.label()}: llama.cpp needs flash attention for a quantised V cache")
                continue
            points.append(point)
        if not points:
            raise UsageError("no valid combination of levers: a quantised V cache needs --flash-attn on or auto")
        if len(points) > MAX_POINTS:
            raise UsageError(
                f"{len(points)} combinations of levers; at most {MAX_POINTS} run at once (give fewer values)"
            )
        return points, notes


def parse_lever(lever: str, text: str) -> tuple:
    """One lever's comma list as a tuple of values (counts as ints; ``auto`` threads kept as text).

    Raises:
        UsageError: an empty item or a bad count.
    """
    items = [x.strip() for x in str(text).split(",")]
    if not all(items):
        raise UsageError(f"{LEVERS[lever][0]} {text!r}: an empty item in the list")
    if lever in ("n_ubatch", "n_threads"):
        try:
            return tuple(x.lower() if x.lower() == "auto" else int(x) for x in items)
        except ValueError:
            raise UsageError(f"{LEVERS[lever][0]} {text!r}: expected whole numbers") from None
    if lever in ("type_k", "type_v", "flash_attn"):
        items = [x.lower() for x in items]
    return tuple(dict.fromkeys(items))


def check_values(lever: str, items: tuple) -> tuple:
    """``items`` (from :func:`parse_lever`) if the lever takes them all.

    Raises:
        UsageError: one line naming the flag and the choices (or the bound) for the first bad value.
    """
    flag = LEVERS[lever][0]
    choices = {"type_k": list(KV_TYPE_BYTES), "type_v": list(KV_TYPE_BYTES), "flash_attn": list(TRI_STATE)}
    for v in items:
        if lever in choices and v not in choices[lever]:
            raise UsageError(f"{flag} {v!r}: choose from {', '.join(choices[lever])}")
        if lever == "n_ubatch" and v == "auto":
            raise UsageError(f"{flag}: expected whole numbers")
        if lever in ("n_ubatch", "n_threads") and v != "auto" and int(v) < 1:
            raise UsageError(f"{flag} {v}: must be at least 1")
    return items


@dataclass(frozen=True)
class Prediction:
    """The roofline's figures for one cell: ``decode_tokens_per_s``, ``prefill_tokens_per_s`` and ``ttft_ms``
    (the prefill of the cell's evaluated tokens at that rate; both ``None`` where the weights are not float32),
    with the bytes and FLOPs behind them (``attention_flops`` a decoded token's attention at the cell's context)."""

    decode_tokens_per_s: float
    prefill_tokens_per_s: float | None
    ttft_ms: float | None
    step_bytes: float
    flops_per_token: float
    attention_flops: float = 0.0

    def to_dict(self) -> dict:
        return {
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "ttft_ms": self.ttft_ms,
            "step_bytes": self.step_bytes,
            "flops_per_token": self.flops_per_token,
            "attention_flops": self.attention_flops,
        }


def predict(
    peaks: MachinePeaks,
    *,
    weight_bytes: int,
    n_params: int,
    kv_bytes_per_token: int,
    cell: CellResult,
    attention_flops_per_context: float = 0.0,
    prefill_params: int | None = None,
    prefill_bounded: bool,
) -> Prediction:
    """The roofline for ``cell`` (see the module doc); ``weight_bytes`` as read per token,
    ``attention_flops_per_context`` attention's FLOPs per token of context
    (:func:`~chatphase.models.roofline.attention_flops_per_context_token`), ``prefill_params`` the parameters a
    prompt token multiplies (:func:`~chatphase.models.roofline.prefill_params`; default ``n_params``),
    ``prefill_bounded`` whether the float32 matmul peak bounds the model's prefill
    (:func:`~chatphase.models.roofline.float32_peak_bounds`; false: no prefill or TTFT prediction)."""
    from chatphase.models.roofline import step_bytes, step_flops

    context = cell_context_tokens(cell)
    decode = decode_bound_tokens_per_s(
        peaks.bandwidth_bytes_per_s, weight_bytes, kv_bytes_per_token, context, peaks.flops_per_s,
        attention_flops_per_context,
    )  # fmt: skip
    prefill = prefill_bound_tokens_per_s(peaks.flops_per_s, prefill_params or n_params) if prefill_bounded else None
    evaluated = cell.prompt_tokens - cell.depth
    return Prediction(
        decode_tokens_per_s=decode,
        prefill_tokens_per_s=prefill,
        ttft_ms=None if prefill is None else 1000.0 * evaluated / prefill,
        step_bytes=step_bytes(weight_bytes, kv_bytes_per_token, context),
        flops_per_token=step_flops(n_params),
        attention_flops=attention_flops_per_context * context,
    )


def ratio(measured: float | None, predicted: float | None) -> float | None:
    """``measured / predicted`` (``None`` when either is missing or the prediction is zero)."""
    if measured is None or not predicted:
        return None
    return measured / predicted


#: the metrics a grid cell predicts, and the phase whose bound each is.
PREDICTED = {"ttft_ms": "prefill", "prefill_tokens_per_s": "prefill", "decode_tokens_per_s": "decode"}


def bound_share(metric: str, measured: float | None, predicted: float | None) -> BoundShare | None:
    """``measured`` against the roofline's ``predicted`` for ``metric`` (a key of :data:`PREDICTED`), as a
    rate: TTFT's prediction is a lower bound on time, so its share is predicted / measured."""
    if metric == "ttft_ms":
        return share_of_bound(predicted, measured, PREDICTED[metric]) if measured else None
    return share_of_bound(measured, predicted, PREDICTED[metric])
