"""The TTFT prediction's prior (:mod:`chatphase.timing.ttft_prediction`): the prefills measured before this chat,
fitted together with the chat's own (:func:`ttft_predictor`, again with the loaded engine's settings by
:func:`prior_after_load`): the turns this model file ran on this machine with the same prefill settings in earlier
chats (the history database, :mod:`chatphase.history.ttft_prior`) and the samples of the model's newest saved
prompt-length sweep (``chatphase bench -o FILE.json``) in :func:`results_dir`
(:func:`chatphase.timing.saved_sweeps.saved_points`); and the roofline's least TTFT
(:func:`roofline_bound`), when this machine's matmul peak is known and bounds the model's weights, as a bound where
the prediction is withheld.

The newest sweep JSON of the same model file (by its ``model.path``, else its file name) gives its samples as
points named by it (``bench results smollm.json``); a file that is not a sweep, not JSON or unreadable is passed
over (:mod:`chatphase.timing.saved_sweeps`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import LoadedSettings
from chatphase.history.ttft_prior import history_points
from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.roofline import attention_flops_per_context_token, float32_peak_bounds, prefill_flops
from chatphase.system.machine_peaks import flops_peak
from chatphase.system.paths import data_dir
from chatphase.timing.saved_sweeps import saved_points
from chatphase.timing.ttft_model import attention_ratio
from chatphase.timing.ttft_prediction import TtftBound, TtftPredictor


def results_dir() -> Path:
    """Where saved bench results are looked for: ``data_dir() / "results"`` (not created here)."""
    return data_dir() / "results"


def roofline_bound(info: ModelInfo, threads_batch: int) -> TtftBound | None:
    """The least TTFT of ``info``'s prefill on ``threads_batch`` threads: its weight matmuls' FLOPs
    (:func:`~chatphase.models.roofline.prefill_flops`) at this machine's measured float32 matmul peak
    (:func:`~chatphase.system.machine_peaks.flops_peak`). ``None`` when no peak is kept, the FLOPs are unknown, or
    the weights are not float32: quantised weights run integer kernels that beat a float32 peak, so its "bound"
    could be above the truth (:func:`~chatphase.models.roofline.float32_peak_bounds`)."""
    if not float32_peak_bounds(info):
        return None
    once, per_token = prefill_flops(info, 0), prefill_flops(info, 1)
    peak = flops_peak(threads_batch)
    if peak is None or once is None or per_token is None:
        return None
    return TtftBound(peak.flops_per_s, per_token - once, once)


def _predictor(info: ModelInfo, settings: Mapping[str, Any]) -> TtftPredictor:
    k = attention_ratio(attention_flops_per_context_token(info.attention), info.n_params)
    prior = [*history_points(info.path, settings), *saved_points(info.path, results_dir())]
    n_ctx = settings.get("n_ctx")  # absent before the load for n_ctx auto (at least AUTO_N_CTX_MIN, above n_batch)
    chunk = min(int(settings["n_batch"]), int(n_ctx)) if n_ctx else int(settings["n_batch"])  # llama.cpp clamps
    return TtftPredictor(k, prior, roofline_bound(info, settings["n_threads_batch"]), chunk=chunk)


def ttft_predictor(info: ModelInfo, engine: EngineConfig) -> TtftPredictor:
    """A TTFT predictor for ``info`` run with ``engine``'s settings: its ``k`` from the model's shape
    (:func:`~chatphase.timing.ttft_model.attention_ratio`), its prior the prefills of earlier chats on this
    machine with the same prefill settings (:func:`~chatphase.history.ttft_prior.recent_points`; before the load,
    an automatic value only the load resolves is not compared) and of the saved bench results; its bound from the
    roofline (module docstring)."""
    unresolved = {("flash_attn", "auto"), ("n_ctx", None)}  # only the load resolves these
    settings = {k: v for k, v in engine.resolved().items() if (k, v) not in unresolved}
    return _predictor(info, settings)


def prior_after_load(predictor: TtftPredictor, info: ModelInfo, loaded: LoadedSettings) -> None:
    """Set ``predictor``'s prior and bound again from the settings a local engine reports once loaded (the
    automatic ones resolved: flash attention, the GPU layers); the chat's own turns stay."""
    fresh = _predictor(info, asdict(loaded))
    predictor.prior, predictor.bound = fresh.prior, fresh.bound
