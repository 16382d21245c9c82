"""The TTFT prediction's prior (:mod:`chatphase.engine.ttft_prediction`) before a chat's first turn: the model's
saved prompt-length sweeps (``chatphase bench -o FILE.json``) in :func:`results_dir`.

The newest sweep JSON of the same model file (by its ``model.path``, else its file name) is fitted with the
same law as a chat's turns; its name is the prediction's source (``bench results smollm.json``). A file that
is not a sweep, not JSON or unreadable is passed over: a prior is a help, not a requirement.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from chatphase.engine.ttft_prediction import TtftModel, prior_from_sweep
from chatphase.sessions.store import data_dir


def results_dir() -> Path:
    """Where saved bench results are looked for: ``data_dir() / "results"`` (not created here)."""
    return data_dir() / "results"


def saved_prior(model_path: str, k: float, folder: str | os.PathLike[str]) -> TtftModel | None:
    """The prior from the newest sweep of ``model_path`` in ``folder``, ``None`` when there is none."""
    try:
        files = sorted(Path(folder).glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
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
        prior = prior_from_sweep(samples, k, f"bench results {path.name}")
        if prior is not None:
            return prior
    return None
