"""Export a saved session: Markdown transcript with a metrics table, JSON of everything, CSV per turn.

- ``md``: title, model and settings, the transcript (partial and failed turns marked), then one
  metrics table row per turn. Each turn keeps the sampling it was generated with (a resumed chat may
  use other settings): the settings line says it when every turn shares it, else each turn says its
  own. Numbers are rounded for reading (2 decimals); use JSON or CSV for exact values.
- Text for people is inert (:func:`~chatphase.engine.text.inert`): ``md`` and ``csv`` show control characters
  (other than newline and tab) as pictures; ``json`` escapes them (``\u001b``, also DEL and C1).
- ``json``: ``{"format": "chatphase-session", "version": 1, "exported": ..., **Session.to_dict()}``;
  :func:`session_from_json` reads it back into an equal :class:`~chatphase.sessions.store.Session`.
- ``csv``: one row per turn: the turn's sampling (:data:`SAMPLING_KEYS`), then one column per metric.
  Column names are the ``TurnMetrics`` field names, which carry their units (``ttft_ms``,
  ``decode_tokens_per_s``, ``kv_cache_bytes``, ``*_tokens``); an undefined metric (``None``) is an empty
  cell. Floats are written with Python's shortest round-trip repr, so :func:`rows_from_csv` gives back
  the exact values.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.text import inert, json_inert
from chatphase.errors import UsageError
from chatphase.sessions.store import RecordedTurn, Session, utc_now
from chatphase.units import fmt_count

FORMATS = ("md", "json", "csv")
JSON_FORMAT_NAME = "chatphase-session"
METRIC_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(TurnMetrics))
#: the sampling settings an export shows for a turn (``SamplingParams`` fields).
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "max_tokens", "think_budget")
#: columns before the metrics in the CSV export.
CSV_LEAD_COLUMNS = ("session_id", "turn", "status", "replaced", "model", "started", "finished", *SAMPLING_KEYS)
CSV_COLUMNS = CSV_LEAD_COLUMNS + METRIC_COLUMNS + ("error",)
#: the metrics shown in the Markdown table (the CSV has them all).
MD_METRICS = (
    "prompt_tokens",
    "cached_tokens",
    "restored_tokens",
    "prefill_ms",
    "prefill_tokens_per_s",
    "ttft_ms",
    "decode_tokens",
    "decode_ms",
    "decode_tokens_per_s",
    "itl_ms_p50",
    "itl_ms_p95",
    "kv_cache_bytes",
    "stop_reason",
)
MD_NONE = "—"
_REPLACED_NOTE = "_replaced: this turn was regenerated or its message edited; it left the conversation._"
_STATUS_NOTE = {
    "partial": "_partial turn: interrupted before this reply finished; the text stops where it was cut._",
    "failed": "_failed turn: {error}_",
}
_DAMAGED_NOTE = (
    "_damaged turn: {lines} of the session file after this turn's start could not be read; its end may be "
    "among them, so the reply may stop early._"
)


def format_from_path(path: str | Path) -> str | None:
    """The export format a file name implies (``.md``/``.markdown``, ``.json``, ``.csv``), else ``None``."""
    suffix = Path(path).suffix.lower().lstrip(".")
    return {"markdown": "md"}.get(suffix, suffix) if suffix in (*FORMATS, "markdown") else None


def export_session(session: Session, fmt: str) -> str:
    """Render ``session`` as ``fmt`` (one of :data:`FORMATS`).

    Raises:
        UsageError: unknown format.
    """
    if fmt == "md":
        return to_markdown(session)
    if fmt == "json":
        return to_json(session)
    if fmt == "csv":
        return to_csv(session)
    raise UsageError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")


def default_export_path(session: Session, fmt: str, directory: Path | None = None) -> Path:
    """``<directory or cwd>/chatphase-<session id>.<fmt>``."""
    return (directory or Path.cwd()) / f"chatphase-{session.id}.{fmt}"


def write_export(session: Session, fmt: str, output: Path) -> Path:
    """Write the export to ``output`` (parent directories created); returns the path.

    Raises:
        UsageError: unknown format, or the file cannot be written (the message names it).
    """
    text = export_session(session, fmt)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8", newline="" if fmt == "csv" else None)
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None
    return output


# ---------------------------------------------------------------- JSON


def to_json(session: Session) -> str:
    """Everything in the session as indented JSON (UTF-8 text, not ASCII-escaped)."""
    doc = {"format": JSON_FORMAT_NAME, "version": 1, "exported": utc_now(), **session.to_dict()}
    return json_inert(json.dumps(doc, indent=2, ensure_ascii=False)) + "\n"


def session_from_json(text: str) -> Session:
    """Read a JSON export back.

    Raises:
        UsageError: not JSON, or not a chatphase session export.
    """
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"not a JSON file: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != JSON_FORMAT_NAME:
        raise UsageError('not a chatphase session export (no "format": "chatphase-session")')
    return Session.from_dict(doc)


# ---------------------------------------------------------------- CSV


def _csv_cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))  # as the replaced column: 0 or 1
    if isinstance(value, float):
        return repr(value)
    return str(value)


def to_csv(session: Session) -> str:
    """One row per turn (header row first); columns :data:`CSV_COLUMNS`. Metric cells of a partial
    turn are empty (it never finished, so nothing was measured)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for t in session.turns:
        m = t.metrics.to_dict() if t.metrics else {}
        lead = (session.id, t.index, t.status, int(t.replaced), t.model or session.model_name, t.started, t.finished)
        lead += tuple(_turn_sampling(session, t).get(k) for k in SAMPLING_KEYS)
        w.writerow([_csv_cell(v) for v in (*lead, *(m.get(c) for c in METRIC_COLUMNS), t.error)])
    return inert(buf.getvalue())  # model names and errors: no control character for a terminal or a sheet


def _parse_cell(text: str) -> int | float | str | None:
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def rows_from_csv(text: str) -> list[dict[str, Any]]:
    """Parse a CSV export: one dict per turn with ``turn``, ``status``, ``replaced``, ``model``, ``started``,
    ``finished``, ``error``, ``sampling`` (the turn's :data:`SAMPLING_KEYS` that have a value) and
    ``metrics`` (a :class:`TurnMetrics`, or ``None`` for a turn without).

    Raises:
        UsageError: when the header is not the chatphase CSV header.
    """
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != CSV_COLUMNS:
        raise UsageError("not a chatphase CSV export (unexpected header)")
    rows = []
    for raw in reader:
        vals = {k: _parse_cell(v) for k, v in raw.items()}
        metric_vals: dict[str, Any] = {c: vals[c] for c in METRIC_COLUMNS}
        has_metrics = metric_vals["stop_reason"] is not None
        if has_metrics:  # the type says float, the cell may read as int ("12"): keep the declared kind
            for f in fields(TurnMetrics):
                v = metric_vals[f.name]
                if isinstance(v, int) and "float" in str(f.type) and "int" not in str(f.type):
                    metric_vals[f.name] = float(v)
                elif str(f.type) == "bool":
                    metric_vals[f.name] = bool(v)
        rows.append(
            {
                "session_id": str(vals["session_id"]),
                "turn": vals["turn"],
                "status": vals["status"],
                "replaced": bool(vals["replaced"]),
                "model": raw["model"],
                "started": raw["started"],
                "finished": vals["finished"],
                "error": vals["error"],
                "sampling": {k: vals[k] for k in SAMPLING_KEYS if vals[k] is not None},
                "metrics": TurnMetrics(**metric_vals) if has_metrics else None,
            }
        )
    return rows


# ---------------------------------------------------------------- Markdown


def _md_cell(value: object) -> str:
    if value is None:
        return MD_NONE
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "\\|")


def _turn_sampling(session: Session, turn: RecordedTurn) -> dict[str, Any]:
    """The sampling ``turn`` was generated with (the session's settings for a turn recorded without)."""
    return turn.sampling or (session.settings or {}).get("sampling") or {}


def _sampling_text(sampling: dict[str, Any]) -> str:
    return ", ".join(f"{k}={sampling[k]}" for k in SAMPLING_KEYS if sampling.get(k) is not None)


def _settings_line(settings: dict[str, Any], sampling: dict[str, Any] | None) -> str:
    """The engine settings, then ``sampling`` (``None``: the turns differ, each says its own)."""
    keys = ("n_ctx", "n_batch", "n_threads", "n_gpu_layers", "flash_attn", "type_k", "type_v")
    parts = [f"{k}={settings[k]}" for k in keys if settings.get(k) is not None]
    parts.append(_sampling_text(sampling) if sampling is not None else "sampling per turn (below)")
    return ", ".join(p for p in parts if p)


def metrics_table(session: Session) -> str:
    """The Markdown metrics table: a ``turn`` and ``status`` column (``damaged`` and ``replaced`` appended to
    the status of a damaged or taken-back turn) then :data:`MD_METRICS`."""
    head = ("turn", "status", *MD_METRICS)
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" if h not in ("status", "stop_reason") else "---" for h in head) + "|",
    ]
    for t in session.turns:
        m = t.metrics.to_dict() if t.metrics else {}
        status = t.status + (", damaged" if t.damaged_lines else "") + (", replaced" if t.replaced else "")
        cells = [str(t.index), status, *(_md_cell(m.get(k)) for k in MD_METRICS)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def to_markdown(session: Session) -> str:
    """A readable transcript: header facts, each turn's user and assistant text, then the metrics table; inert
    (:func:`~chatphase.engine.text.inert`: control characters other than newline and tab shown as pictures)."""
    m = session.model or {}
    model = m.get("name") or "unknown model"
    extra = ", ".join(str(m[k]) for k in ("architecture", "quantization") if m.get(k))
    out = [
        f"# {session.title or 'Untitled session'}",
        "",
        f"- Session: `{session.id}`",
        f"- Model: {model}" + (f" ({extra})" if extra else ""),
        f"- Created: {session.created}; last used: {session.last_used or session.created}",
    ]
    if session.corrupt_lines:
        out.append(f"- Damaged: {fmt_count(session.corrupt_lines, 'line')} of the session file could not be read")
    samplings = [_turn_sampling(session, t) for t in session.turns] or [(session.settings or {}).get("sampling") or {}]
    shared = samplings[0] if all(x == samplings[0] for x in samplings) else None
    if session.settings:
        out.append(f"- Settings: {_settings_line(session.settings, shared)}")
        if session.settings.get("system_prompt"):
            out.append(f"- System prompt: {session.settings['system_prompt']}")
    out += ["", "## Transcript", ""]
    for t, sampling in zip(session.turns, samplings, strict=False):  # no turns: one stand-in sampling
        out += [f"### Turn {t.index}", ""]
        if shared is None:
            out += [f"_sampling: {_sampling_text(sampling)}_", ""]
        out += ["**User**", "", t.user, "", "**Assistant**", ""]
        if t.thinking:  # a reasoning model's thinking, folded as the chat shows it
            out += ["<details><summary>Thinking</summary>", "", t.thinking, "", "</details>", ""]
        out += [t.reply or MD_NONE, ""]
        if t.damaged_lines:
            out += [_DAMAGED_NOTE.format(lines=fmt_count(t.damaged_lines, "line")), ""]
        elif t.status in _STATUS_NOTE:
            out += [_STATUS_NOTE[t.status].format(error=t.error or "unknown error"), ""]
        if t.replaced:
            out += [_REPLACED_NOTE, ""]
    out += ["## Metrics", "", metrics_table(session), ""]
    return inert("\n".join(out))  # the model's escape sequences shown, not obeyed, when the file is read
