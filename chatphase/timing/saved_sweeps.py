"""The one reader of saved prompt-length sweeps' prefills (``chatphase bench -o FILE.json``) as the TTFT model's
points (:class:`~chatphase.timing.ttft_model.PrefillPoint`): the chat's prior reads them here, below the bench, which
it may not import.

A saved sweep is a JSON object whose ``kind`` is ``"sweep"`` (an older file without one counts as a sweep), whose
``model.path`` names the model file and whose ``samples`` are the sweep's samples under the field names of
:class:`chatphase.bench.core.results.Sample`. A file that is not such an object, not JSON or unreadable is passed
over: a prior is a help, not a requirement.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chatphase.timing.ttft_model import PrefillPoint


def points_from_sweep(samples: Iterable[dict[str, Any]], origin: str) -> list[PrefillPoint]:
    """The points of a bench sweep's JSON ``samples`` (``prompt_tokens``, ``depth``, ``ttft_ms``,
    ``prefill_tokens_per_s``, ``warmup``; ``prefill_tokens`` and ``cached_tokens`` where the engine reported
    them); warm-ups and samples without a TTFT or a prefill rate are left out."""
    points = []
    for s in samples:
        if s.get("warmup") or not s.get("ttft_ms") or not s.get("prefill_tokens_per_s"):
            continue
        tokens = s.get("prefill_tokens") or s.get("prompt_tokens")
        depth = s.get("cached_tokens") if s.get("cached_tokens") is not None else s.get("depth", 0)
        if tokens:
            prefill_ms = 1000.0 * tokens / s["prefill_tokens_per_s"]
            points.append(PrefillPoint(int(tokens), int(depth or 0), prefill_ms, float(s["ttft_ms"]), origin=origin))
    return points


def sweep_points(data: object, model_path: str, origin: str) -> list[PrefillPoint]:
    """The points of the saved sweep ``data`` (a JSON file's object) when it is one of ``model_path`` (by its
    ``model.path``, else its file name); ``[]`` for anything else."""
    if not isinstance(data, dict) or data.get("kind", "sweep") != "sweep" or not isinstance(data.get("samples"), list):
        return []
    saved = str((data.get("model") or {}).get("path") or "")
    if saved != model_path and Path(saved).name != Path(model_path).name:
        return []
    return points_from_sweep([s for s in data["samples"] if isinstance(s, dict)], origin)


def saved_points(model_path: str, folder: str | os.PathLike[str]) -> list[PrefillPoint]:
    """The points of the newest sweep of ``model_path`` in ``folder`` that has any (none: ``[]``), named by its
    file (``bench results smollm.json``)."""
    try:
        files = sorted(Path(folder).glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return []
    for path in files:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        points = sweep_points(data, model_path, f"bench results {path.name}")
        if points:
            return points
    return []
