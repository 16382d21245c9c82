"""Benchmark records and their file forms (JSON and CSV), shared by ``chatphase bench`` and the TUI.

- :class:`Sample` — one measured repetition (one turn, or the measured turn of a depth run).
- :class:`CellResult` — the summary of the repetitions of one (kind, prompt_tokens, depth) cell.
- :class:`SweepResult` — one whole sweep: ``{"kind": "sweep", "version", "model", "settings", "system",
  "results", "fits", "roofline", "samples"}`` in JSON (docs/bench.md); the CSV form holds
  the cells only, one row each and one column per statistic (``ttft_ms_mean``, ``ttft_ms_sd``, ...). The
  parallel-decode sweep has its own result (:mod:`chatphase.bench.parallel.result`);
  :func:`chatphase.bench.experiments.read_csv` reads both kinds' rows (a parallel cell is a row of kind
  ``"parallel"``).

Cell kinds: ``"prompt"`` cells start from an empty KV cache with a prompt of ``prompt_tokens`` tokens
(``depth`` 0); ``"depth"`` cells first fill the cache with ``depth`` tokens, then send a prompt of
``prompt_tokens`` tokens that extends them (so ``prompt_tokens - depth`` tokens are evaluated) and decode.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

from chatphase.bench.core.contract import saved_version, stamp
from chatphase.errors import UsageError
from chatphase.timing.stats import Stats, stat_columns, stats_of_row, stats_row

CellKind = Literal["prompt", "depth"]

#: per-cell metrics summarised as :class:`Stats` (name = unit-carrying metric name).
STAT_METRICS: tuple[str, ...] = ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "tpot_ms")
_CELL_KEYS = ("kind", "prompt_tokens", "depth", "gen_tokens", "reps")
CSV_COLUMNS: tuple[str, ...] = (
    *_CELL_KEYS,
    *stat_columns(STAT_METRICS),
    "kv_cache_bytes",
)


@dataclass(frozen=True)
class Sample:
    """One measured repetition: the cell it belongs to and the metrics of its measured turn.

    ``cached_tokens`` is what the engine actually reused (``depth`` for a depth run when prefix reuse
    works); ``None`` rates are undefined (e.g. the decode rate of a single token).
    """

    kind: CellKind
    prompt_tokens: int
    depth: int
    rep: int
    warmup: bool
    ttft_ms: float | None
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    tpot_ms: float | None
    prefill_tokens: int | None
    cached_tokens: int | None
    decode_tokens: int | None
    kv_cache_bytes: int | None
    stop_reason: str

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Sample:
        """Inverse of :meth:`to_dict` (unknown keys ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class CellResult:
    """Summary of one cell's measured repetitions (warm-up runs excluded)."""

    kind: CellKind
    prompt_tokens: int
    depth: int
    gen_tokens: int
    reps: int
    ttft_ms: Stats
    prefill_tokens_per_s: Stats
    decode_tokens_per_s: Stats
    tpot_ms: Stats
    kv_cache_bytes: int | None

    def to_dict(self) -> dict:
        """The JSON ``results`` entry: stats as ``{"mean","sd","median","min","max","n"}`` objects."""
        out: dict = {k: getattr(self, k) for k in _CELL_KEYS}
        for m in STAT_METRICS:
            out[m] = getattr(self, m).to_dict()
        out["kv_cache_bytes"] = self.kv_cache_bytes
        return out

    @classmethod
    def from_dict(cls, data: dict) -> CellResult:
        """Inverse of :meth:`to_dict`.

        Raises:
            KeyError / ValueError: on a malformed entry (callers turn these into a one-line message).
        """
        return cls(
            kind=data["kind"],
            prompt_tokens=int(data["prompt_tokens"]),
            depth=int(data["depth"]),
            gen_tokens=int(data["gen_tokens"]),
            reps=int(data["reps"]),
            **{m: Stats.from_dict(data.get(m)) for m in STAT_METRICS},
            kv_cache_bytes=int(data.get("kv_cache_bytes") or 0),
        )

    def csv_row(self) -> dict:
        """One CSV row keyed by :data:`CSV_COLUMNS` (undefined values are empty cells)."""
        return {**{k: getattr(self, k) for k in _CELL_KEYS}, **stats_row(self, STAT_METRICS),
                "kv_cache_bytes": self.kv_cache_bytes}  # fmt: skip

    @classmethod
    def from_csv_row(cls, row: dict) -> CellResult:
        """Inverse of :meth:`csv_row` (values arrive as strings)."""
        data = {k: row[k] for k in _CELL_KEYS}
        return cls.from_dict(
            {**data, **stats_of_row(row, STAT_METRICS), "kv_cache_bytes": row.get("kv_cache_bytes") or 0}
        )


class Labelled:
    """What names a saved result in overlays and legends: its ``label``, else its model's name."""

    label: str
    model: dict

    def display_label(self) -> str:
        """``label``, else the model name, else ``"run"``."""
        return self.label or str(self.model.get("name") or "run")


@dataclass
class SweepResult(Labelled):
    """One prompt-length and depth sweep. ``label`` names it in overlays (the model name by default)."""

    model: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    system: dict = field(default_factory=dict)
    results: list[CellResult] = field(default_factory=list)
    fits: dict = field(default_factory=dict)
    roofline: dict = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    cancelled: bool = False
    label: str = ""

    kind = "sweep"

    def to_dict(self) -> dict:
        """The JSON object (``kind``, ``version``, the module docstring's keys, ``cancelled`` and ``label``)."""
        return stamp(
            self.kind,
            {
                "model": self.model,
                "settings": self.settings,
                "system": self.system,
                "results": [c.to_dict() for c in self.results],
                "fits": self.fits,
                "roofline": self.roofline,
                "samples": [s.to_dict() for s in self.samples],
                "cancelled": self.cancelled,
                "label": self.label,
            },
        )

    @classmethod
    def from_dict(cls, data: dict) -> SweepResult:
        """Inverse of :meth:`to_dict`.

        Raises:
            UsageError: when ``data`` is not a benchmark result.
        """
        check_saved(data, "results", "bench")
        try:
            return cls(
                **header_fields(data, "model", "settings", "system", "fits", "roofline"),
                results=[CellResult.from_dict(c) for c in data["results"]],
                samples=[Sample.from_dict(s) for s in data.get("samples") or []],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise malformed(exc) from None

    def to_json(self) -> str:
        """Indented JSON text."""
        return json.dumps(self.to_dict(), indent=2)

    def to_csv(self) -> str:
        """CSV text, one row per cell, the columns :data:`CSV_COLUMNS`."""
        return cells_csv(CSV_COLUMNS, self.results)


def check_saved(data: object, list_key: str, what: str) -> None:
    """Check that ``data`` is a saved result holding a ``list_key`` list and a version this chatphase reads.

    Raises:
        UsageError: ``not a chatphase {what} result (no "{list_key}" list)``, or a future version.
    """
    if not isinstance(data, dict) or not isinstance(data.get(list_key), list):
        raise UsageError(f'not a chatphase {what} result (no "{list_key}" list)')
    saved_version(data)


def header_fields(data: dict, *dict_keys: str) -> dict:
    """The fields every saved result shares, as keyword arguments: each of ``dict_keys`` (``"model"``,
    ``"settings"``, ...) as a dict (absent: empty), ``cancelled`` and ``label``.

    Raises:
        TypeError, ValueError: an entry of the wrong kind (callers turn it into :func:`malformed`).
    """
    dicts = {key: dict(data.get(key) or {}) for key in dict_keys}
    return {**dicts, "cancelled": bool(data.get("cancelled", False)), "label": str(data.get("label") or "")}


def header_of(result: object, *dict_keys: str) -> dict:
    """The saved form of the fields :func:`header_fields` reads back: ``dict_keys``, then ``cancelled`` and
    ``label``, in that order (the order of the JSON file's keys)."""
    return {key: getattr(result, key) for key in (*dict_keys, "cancelled", "label")}


def malformed(exc: Exception) -> UsageError:
    """The one line for a saved result whose entries do not read (``exc``: the ``KeyError``, ``TypeError`` or
    ``ValueError`` that reading one raised)."""
    what = f"has no {exc}" if isinstance(exc, KeyError) else "holds a value of the wrong kind"
    return UsageError(f"malformed bench result: an entry {what} (is it a chatphase bench file?)")


def cells_csv(columns: Iterable[str], cells: Iterable) -> str:
    """CSV text, a header of ``columns`` and one row per cell (its ``csv_row()``)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n", restval="")
    writer.writeheader()
    for cell in cells:
        writer.writerow(cell.csv_row())
    return buf.getvalue()


def rows_csv(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """CSV text, a header of ``columns`` and one line per row (its values in ``columns`` order)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buf.getvalue()


def parse_csv(text: str) -> list[CellResult]:
    """The prompt/depth cells of CSV text written by :meth:`SweepResult.to_csv` (rows of another kind are skipped;
    :func:`chatphase.bench.experiments.read_csv` reads the parallel ones too).

    Raises:
        UsageError: when the header lacks the expected columns or a row is malformed.
    """
    return [CellResult.from_csv_row(row) for row in csv_rows(text) if row["kind"] != "parallel"]


def csv_rows(text: str) -> list[dict[str, str]]:
    """The rows of a bench CSV (a sweep's or a parallel sweep's cells), checked for the columns every cell has.

    Raises:
        UsageError: when the header lacks the expected columns.
    """
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in ("kind", "prompt_tokens", "gen_tokens", "reps") if c not in (reader.fieldnames or [])]
    if missing:
        raise UsageError(f"not a chatphase bench CSV (missing columns: {', '.join(missing)})")
    return list(reader)


def malformed_row(exc: Exception) -> UsageError:
    """The one line for a CSV row that does not read."""
    return UsageError(f"malformed bench CSV row: {exc}")


def save_result(result, path: str | os.PathLike) -> Path:
    """Write ``result`` as JSON or CSV by the file suffix; returns the path. Any result with ``to_json()``
    and ``to_csv()`` will do (a parallel sweep's or a lever grid's too).

    Raises:
        UsageError: an unknown suffix or a write error.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".json", ".csv"):
        raise UsageError(f"unknown result file type {suffix or '(none)'!r}: use .json or .csv")
    try:
        p.write_text(result.to_json() if suffix == ".json" else result.to_csv(), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {p}: {exc.strerror or exc}") from None
    return p
