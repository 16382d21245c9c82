"""The TTFT prediction's points from the history database: the prefills this model file ran on this machine in
earlier chats.

The turns are those whose context has the same content hash (:func:`chatphase.history.context.model_hash`: the
file, not its name, so a renamed copy counts and another quantisation of one name does not), the same host
name and CPU (:func:`chatphase.system.machine_peaks.machine_identity`) and the same settings that set prefill's
speed (:data:`PREFILL_SETTINGS`, those given: two threads prefill at about half the rate of four, and a GPU many
times the CPU's), that evaluated tokens and completed their prefill (a first token came; a turn stopped during
decode counts, a failed one does not): the newest :data:`RECENT_TURNS` of them, with their restores and the TTFT
estimated for them before they ran (``ttft_estimate_ms``; a turn recorded before that field: the prediction shown),
as points of origin ``earlier chats`` (:class:`chatphase.timing.ttft_model.PrefillPoint`). A context that did not
record a setting (an older session file) matches any value of it.

The database is read as it is, without a catch-up of the session files (which can read many files): the chat's
live index keeps it current, and a turn a killed process did not index joins at the next ``logs`` or ``stats``.
No database, or one that cannot be read, gives no prior. Measured on a 10,000-turn database: under 1 ms warm,
5 ms on a first open — well under the 50 ms a UI thread can spare (``tests/chat/test_ttft_prior.py`` holds it to
that), so it runs where the chat starts and where the model is switched.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chatphase.history.context import model_hash
from chatphase.history.db import HistoryError, connect, db_path
from chatphase.system.machine_peaks import machine_identity
from chatphase.timing.ttft_model import PrefillPoint

#: the newest turns a prior is fitted on: enough to outweigh one odd turn, recent enough to follow a new build.
RECENT_TURNS = 50
#: the engine settings (``contexts`` columns, as the engine reports them resolved) that set prefill's speed.
PREFILL_SETTINGS = ("n_threads_batch", "n_ubatch", "n_gpu_layers", "offload_kqv", "flash_attn", "type_k", "type_v")


def recent_points(
    conn: sqlite3.Connection,
    model_hash: str,
    machine: str | None,
    cpu: str | None,
    settings: Mapping[str, Any] | None = None,
    limit: int = RECENT_TURNS,
) -> list[PrefillPoint]:
    """The newest ``limit`` measured prefills of the model with ``model_hash`` on the machine ``machine`` with
    ``cpu`` (each ``None`` only matches ``NULL``), run with ``settings``' values of :data:`PREFILL_SETTINGS` (a key
    absent or ``None`` there is not compared; a context without the value matches), newest first. A turn whose
    prefill ran on fewer threads than its context's ``n_threads_batch`` (``--threads auto`` gives cores to other
    processes) is left out when that setting is compared: a prefill on one busy core is neither a point nor a bound
    for one on two (seen: a 1,516-token prefill on 1 thread, 23.9 s, bounded a 2,772-token one "≥ 23.9 s" that took
    19.8 s on 2)."""
    wanted = {k: v for k, v in (settings or {}).items() if k in PREFILL_SETTINGS and v is not None}
    same = "".join(f" AND (c.{k} IS ? OR c.{k} IS NULL)" for k in wanted)
    threads: tuple[Any, ...] = ()
    if isinstance(wanted.get("n_threads_batch"), int):
        same += " AND coalesce(json_extract(t.metrics, '$.n_threads_prefill'), ?) = ?"
        threads = (wanted["n_threads_batch"],) * 2
    rows = conn.execute(
        "SELECT t.prefill_tokens, t.cached_tokens, t.prefill_ms, t.ttft_ms,"
        " json_extract(t.metrics, '$.restored_tokens'), json_extract(t.metrics, '$.restore_ms'),"
        " coalesce(json_extract(t.metrics, '$.ttft_estimate_ms'), json_extract(t.metrics, '$.ttft_predicted_ms'))"
        " FROM turns t"
        " JOIN contexts c ON c.id = t.context_id"
        " WHERE c.model_hash = ? AND c.machine IS ? AND c.cpu IS ? AND c.backend = 'llama.cpp'"
        + same
        + " AND t.stop_reason IS NOT NULL AND t.stop_reason != 'error'"
        " AND t.prefill_tokens > 0 AND t.prefill_ms > 0 AND t.ttft_ms >= t.prefill_ms"
        " ORDER BY t.started DESC, t.id DESC LIMIT ?",
        (model_hash, machine, cpu, *wanted.values(), *threads, limit),
    ).fetchall()
    return [
        PrefillPoint(int(n), int(depth or 0), float(p), float(t), int(rt or 0), float(rms or 0.0), "earlier chats",
                     float(estimate) if isinstance(estimate, (int, float)) and estimate > 0 else None)
        for n, depth, p, t, rt, rms, estimate in rows
    ]  # fmt: skip


def history_points(
    model_path: str, settings: Mapping[str, Any] | None = None, path: Path | None = None
) -> list[PrefillPoint]:
    """The earlier prefills of the model file at ``model_path`` on this machine with ``settings``
    (:func:`recent_points`; module docstring); ``[]`` without a database, a readable model file or a usable turn."""
    p = path or db_path()
    digest = model_hash(model_path)
    if digest is None or not p.is_file():
        return []
    try:
        conn = connect(p, timeout_s=0.2)
    except HistoryError:
        return []
    try:
        ident = machine_identity()
        return recent_points(conn, digest, ident["machine"], ident["cpu"], settings)
    except sqlite3.Error:
        return []
    finally:
        conn.close()
