"""The TTFT prediction's prior (:mod:`chatphase.engine.ttft_prediction`): the prefills measured before this chat,
fitted together with the chat's own (:func:`ttft_predictor`, again with the loaded engine's settings by
:func:`prior_after_load`): the turns this model file ran on this machine with the same prefill settings in earlier
chats (the history database, :mod:`chatphase.history.ttft_prior`) and the samples of the model's newest saved
prompt-length sweep (``chatphase bench -o FILE.json``) in :func:`results_dir`; and the roofline's least TTFT
(:func:`roofline_bound`), when this machine's matmul peak is known and bounds the model's weights, as a bound where
the prediction is withheld.

The newest sweep JSON of the same model file (by its ``model.path``, else its file name) gives its samples as
points named by it (``bench results smollm.json``). A file that is not a sweep, not JSON or unreadable is passed
over: a prior is a help, not a requirement.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import LoadedSettings
from chatphase.engine.ttft_prediction import PrefillPoint, TtftBound, TtftPredictor, attention_ratio, points_from_sweep
from chatphase.history.ttft_prior import history_points
from chatphase.models.gguf_meta import ModelInfo
from chatphase.models.roofline import attention_flops_per_context_token, float32_peak_bounds, prefill_flops
from chatphase.system.machine_peaks import flops_peak
from chatphase.system.paths import data_dir


def results_dir() -> Path:
    """Where saved bench results are looked for: ``data_dir() / "results"`` (not created here)."""
    return data_dir() / "results"


def saved_points(model_path: str, folder: str | os.PathLike[str]) -> list[PrefillPoint]:
    """The points of the newest sweep of ``model_path`` in ``folder`` that has any (none: ``[]``)."""
    try:
        files = sorted(Path(folder).glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return []
    for path in files:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if (
            not isinstance(data, dict)
            or data.get("kind", "sweep") != "sweep"
            or not isinstance(data.get("samples"), list)
        ):
            continue
        saved = str((data.get("model") or {}).get("path") or "")
        if saved != model_path and Path(saved).name != Path(model_path).name:
            continue
        samples = [s for s in data["samples"] if isinstance(s, dict)]
        points = points_from_sweep(samples, f"bench results {path.name}")
        if points:
            return points
    return []


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
    chunk = min(int(settings["n_batch"]), int(settings["n_ctx"]))  # llama.cpp clamps n_batch to n_ctx
    return TtftPredictor(k, prior, roofline_bound(info, settings["n_threads_batch"]), chunk=chunk)


def ttft_predictor(info: ModelInfo, engine: EngineConfig) -> TtftPredictor:
    """A TTFT predictor for ``info`` run with ``engine``'s settings: its ``k`` from the model's shape
    (:func:`~chatphase.engine.ttft_prediction.attention_ratio`), its prior the prefills of earlier chats on this
    machine with the same prefill settings (:func:`~chatphase.history.ttft_prior.recent_points`; before the load,
    an automatic value only the load resolves is not compared) and of the saved bench results; its bound from the
    roofline (module docstring)."""
    settings = {k: v for k, v in engine.resolved().items() if not (k == "flash_attn" and v == "auto")}
    return _predictor(info, settings)


def prior_after_load(predictor: TtftPredictor, info: ModelInfo, loaded: LoadedSettings) -> None:
    """Set ``predictor``'s prior and bound again from the settings a local engine reports once loaded (the
    automatic ones resolved: flash attention, the GPU layers); the chat's own turns stay."""
    fresh = _predictor(info, asdict(loaded))
    predictor.prior, predictor.bound = fresh.prior, fresh.bound
