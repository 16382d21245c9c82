"""This machine's measured matmul FLOP/s peaks, kept in a small file of the user cache so that the chat can bound
a TTFT before any turn ran (:mod:`chatphase.chat.ttft_prior`).

Why a file of its own and not the saved bench results: results are saved only where the user asks (``-o``),
and the Experiments screen and the lever grid measure peaks without saving a result; every measurement goes
through :func:`chatphase.bench.core.peaks.measure_peaks`, which records here. A peak is a fact of the machine,
remeasurable, so it belongs in the cache (:func:`chatphase.system.paths.cache_dir`).

``machine-peaks.json``: ``{"version": 1, "machines": {KEY: {"machine", "cpu", "flops": {THREADS: {...}}}}}``
with ``KEY`` :func:`machine_key` (host name and CPU: a home directory shared between machines keeps each
one's own) and, per BLAS thread count, the highest FLOP/s measured (a peak is the best a machine reached: a
lower later pass, under load, does not replace it), its method and when. A file that cannot be read counts
as empty; one that cannot be written is left (a peak is a help, not a requirement).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from chatphase.system.cpu_features import cpu_name
from chatphase.system.paths import cache_dir

FILE_NAME = "machine-peaks.json"
VERSION = 1


@dataclass(frozen=True)
class FlopsPeak:
    """A measured matmul peak: ``flops_per_s`` on ``threads`` BLAS threads, by ``method``; ``measured`` ISO 8601 UTC."""

    flops_per_s: float
    threads: int
    method: str
    measured: str


def machine_identity() -> dict[str, str | None]:
    """This machine as the history names it: ``machine`` (host name) and ``cpu`` (model name), cheap to read."""
    return {"machine": platform.node() or None, "cpu": cpu_name() or platform.processor() or None}


def machine_key() -> str:
    """``host name · CPU``: the key of this machine's entry."""
    ident = machine_identity()
    return f"{ident['machine'] or '?'} · {ident['cpu'] or '?'}"


def peaks_file() -> Path:
    """``machine-peaks.json`` in :func:`chatphase.system.paths.cache_dir` (``$CHATPHASE_CACHE_DIR``)."""
    return cache_dir() / FILE_NAME


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("version") == VERSION else {}


def record_flops(flops_per_s: float, threads: int, method: str, path: Path | None = None) -> None:
    """Keep ``flops_per_s`` measured on ``threads`` threads as this machine's peak there, unless a higher one is
    kept already. Written aside and renamed (a reader never sees half a file); an error writing is ignored."""
    if not flops_per_s > 0 or threads < 1:
        return
    p = path or peaks_file()
    data = _read(p) or {"version": VERSION, "machines": {}}
    machines = data.setdefault("machines", {})
    entry = machines.setdefault(machine_key(), {**machine_identity(), "flops": {}})
    kept = entry.setdefault("flops", {}).get(str(threads)) or {}
    if float(kept.get("flops_per_s") or 0.0) >= flops_per_s:
        return
    entry["flops"][str(threads)] = {
        "flops_per_s": flops_per_s,
        "method": method,
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=p.parent, delete=False, suffix=".part") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(fh.name, p)
    except OSError:
        return


def flops_peak(threads: int, path: Path | None = None) -> FlopsPeak | None:
    """This machine's peak for a prefill on ``threads`` threads: the one measured on the fewest threads at or above
    ``threads`` (more threads measure a higher peak: a looser bound, still a bound; fewer would not be one);
    ``None`` when none is kept."""
    entry = (_read(path or peaks_file()).get("machines") or {}).get(machine_key()) or {}
    found = []
    for key, value in (entry.get("flops") or {}).items():
        try:
            n, flops = int(key), float(value["flops_per_s"])
        except (KeyError, TypeError, ValueError):
            continue
        if n >= threads and flops > 0:
            found.append(FlopsPeak(flops, n, str(value.get("method") or ""), str(value.get("measured") or "")))
    return min(found, key=lambda p: p.threads, default=None)
