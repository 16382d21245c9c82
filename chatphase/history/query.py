"""``chatphase logs`` and ``chatphase stats`` over the history database: filters, rows, groups, medians and fits.

Filters (:class:`Filters`) are substrings (model: its file name or content hash; backend: ``llama.cpp``, the
build, the server's address or its model; machine: host name, CPU or GPU), a session id prefix, a time window
(``--since`` / ``--until``: an ISO date or time, local unless it says its zone, or a span back from now such as
``2h``, ``7d``, ``3w``) and words every matching turn's texts hold (FTS5 over the user's message, the reply and
the thinking; each word is matched as a literal token, so any text is safe to pass).

Stats (:func:`group_stats`): per group, the turn count, the medians of TTFT, prefill and decode tokens/s
(:func:`statistics.median`), and two least-squares lines: ``ttft_ms = a + b × prompt tokens evaluated`` (the
prompt's tokens not served from the KV cache: all of them for a cold turn; a turn that reused a cached prefix pays
prefill for the rest only), a cost whose fixed part ``a`` is not negative (:func:`chatphase.timing.fits.cost_fit`:
through the origin when the free line's ``a`` comes out below 0), and ``decode_tokens_per_s = a + b × depth``
(``kv_cache_tokens`` after the turn; :func:`chatphase.timing.fits.linear_fit`). Each needs
:data:`MIN_FIT_X` distinct x values: through two, any law fits a line exactly.
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from chatphase.errors import UsageError
from chatphase.history.db import METRIC_COLUMNS
from chatphase.timing.fits import LinearFit, Moments, cost_line_of, line_of

#: how ``--by`` names a dimension -> its SQL expression over ``turn_log``.
GROUP_BY = {
    "model": "coalesce(model_name, '?')",
    "backend": "backend || coalesce(' ' || coalesce(backend_build, ''), '') || coalesce(' ' || server, '')",
    "machine": "coalesce(machine, cpu, 'unknown machine')",
    "version": "coalesce('chatphase ' || chatphase_version, 'unknown version')",
}
#: the columns of ``logs`` rows (JSON and CSV), in order; JSON adds ``metrics`` and ``sampling`` (objects).
LOG_COLUMNS: tuple[str, ...] = (
    "started",
    "finished",
    "session_id",
    "turn",
    "status",
    "replaced",
    "error",
    *METRIC_COLUMNS,
    "model_name",
    "model_hash",
    "model_quantization",
    "model_synthetic",
    "backend",
    "backend_build",
    "server",
    "remote_model",
    "n_ctx",
    "n_threads",
    "type_k",
    "type_v",
    "flash_attn",
    "n_gpu_layers",
    "spec",
    "machine",
    "cpu",
    "gpu",
    "chatphase_version",
    "user",
    "reply",
)
#: the distinct prompt sizes (depths) a line is fitted through, at least: two fit any law exactly (r² 1.00).
MIN_FIT_X = 3
_SPAN = re.compile(r"^(\d+)\s*([mhdw])$")
_SPAN_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass(frozen=True)
class Filters:
    """Which turns: each ``None`` field does not filter (see the module docstring)."""

    model: str | None = None
    session: str | None = None
    backend: str | None = None
    machine: str | None = None
    since: str | None = None
    until: str | None = None
    text: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        """The ``WHERE`` clause over ``turns`` as ``t`` joined with ``contexts`` (or the view ``turn_log`` as ``t``),
        and its parameters.

        Raises:
            UsageError: a time that cannot be read, or a text filter without a word.
        """
        sql, args = ["1"], []
        for value, columns in (
            (self.model, ("model_name", "model_hash")),
            (self.backend, ("backend", "backend_build", "server", "remote_model")),
            (self.machine, ("machine", "cpu", "gpu")),
        ):
            if value is not None:
                sql.append("(" + " OR ".join(f"instr(lower({c}), lower(?)) > 0" for c in columns) + ")")
                args += [value] * len(columns)
        if self.session is not None:
            sql.append("substr(session_id, 1, length(?)) = ?")
            args += [self.session, self.session]
        if self.since is not None:
            sql.append("started >= ?")
            args.append(parse_time(self.since, "--since"))
        if self.until is not None:
            sql.append("started < ?")
            args.append(parse_time(self.until, "--until"))
        if self.text is not None:
            sql.append("t.id IN (SELECT rowid FROM turns_fts WHERE turns_fts MATCH ?)")
            args.append(fts_query(self.text))
        return " AND ".join(sql), args


def parse_time(text: str, option: str, now: datetime | None = None) -> str:
    """A ``--since`` / ``--until`` value as the ISO 8601 UTC text the rows hold (seconds, ``+00:00``).

    Raises:
        UsageError: neither an ISO date/time nor a span like ``7d``.
    """
    now = now or datetime.now(timezone.utc)
    span = _SPAN.match(text.strip().lower())
    if span:
        when = now - timedelta(**{_SPAN_UNITS[span[2]]: int(span[1])})
    else:
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise UsageError(
                f"{option} needs a date or time (2026-12-01, 2026-12-01T09:30) or a span back from now (30m, 2h, 7d, 3w); got {text!r}"
            ) from None
        if when.tzinfo is None:
            when = when.astimezone()  # local time, as the user reads their clock
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")


def fts_query(text: str) -> str:
    """``text`` as an FTS5 query matching turns that hold every word (each word a quoted literal string).

    Raises:
        UsageError: ``text`` has no word.
    """
    words = text.split()
    if not words:
        raise UsageError("-q needs a word to search for")
    return " ".join('"' + w.replace('"', '""') + '"' for w in words)


def logs(conn: sqlite3.Connection, filters: Filters, limit: int = 20) -> list[dict[str, Any]]:
    """The last ``limit`` turns that pass ``filters``, newest first: :data:`LOG_COLUMNS` plus ``metrics`` and
    ``sampling`` (dicts; ``None`` when not recorded)."""
    where, args = filters.where()
    cols = ", ".join((*LOG_COLUMNS, "metrics", "sampling"))
    rows = conn.execute(
        f"SELECT {cols} FROM turn_log t WHERE {where} ORDER BY started DESC, t.id DESC LIMIT ?", (*args, limit)
    ).fetchall()
    out = []
    for row in rows:
        d = dict(zip((*LOG_COLUMNS, "metrics", "sampling"), row, strict=True))
        d["metrics"] = json.loads(d["metrics"]) if d["metrics"] else None
        d["sampling"] = json.loads(d["sampling"]) if d["sampling"] else None
        out.append(d)
    return out


@dataclass
class GroupStats:
    """One group's turns (with metrics) and what they say; times in ms, rates in tokens/s.

    ``prompt_sizes`` / ``depths``: the distinct prompt sizes (tokens evaluated) and depths the TTFT and decode
    lines run through. ``points_ttft``: ``(prompt tokens evaluated, ttft_ms)``; ``points_decode``: ``(depth,
    decode tokens/s)`` — for the plot, kept when :func:`group_stats` is asked for them. ``ttft_fit`` /
    ``decode_fit`` ``None`` when fewer than :data:`MIN_FIT_X` distinct x values.
    """

    group: str
    turns: int
    median_ttft_ms: float | None
    median_prefill_tokens_per_s: float | None
    median_decode_tokens_per_s: float | None
    ttft_fit: LinearFit | None
    decode_fit: LinearFit | None
    prompt_sizes: int = 0
    depths: int = 0
    points_ttft: list[tuple[float, float]] = field(default_factory=list, repr=False)
    points_decode: list[tuple[float, float]] = field(default_factory=list, repr=False)

    def distinct_x(self) -> tuple[int, int]:
        """How many distinct prompt sizes and depths the turns have: the fits need :data:`MIN_FIT_X` of each."""
        return self.prompt_sizes, self.depths

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (no points): the figures, the fits as ``{"intercept", "slope", "r2", "n", "through_origin"}``
        with their units (``None`` below :data:`MIN_FIT_X` distinct x values)."""
        return {
            "group": self.group,
            "turns": self.turns,
            "median_ttft_ms": self.median_ttft_ms,
            "median_prefill_tokens_per_s": self.median_prefill_tokens_per_s,
            "median_decode_tokens_per_s": self.median_decode_tokens_per_s,
            "ttft_ms_vs_prompt_tokens_evaluated": _fit_dict(self.ttft_fit, "ms", "ms per prompt token"),
            "decode_tokens_per_s_vs_depth": _fit_dict(self.decode_fit, "tokens/s", "tokens/s per token of depth"),
        }


def _fit_dict(fit: LinearFit | None, y_unit: str, slope_unit: str) -> dict | None:
    return None if fit is None else {**fit.to_dict(), "intercept_unit": y_unit, "slope_unit": slope_unit}


def parse_by(text: str) -> tuple[str, ...]:
    """``--by``: dimensions of :data:`GROUP_BY`, comma-separated (``model,version``).

    Raises:
        UsageError: an unknown or repeated dimension.
    """
    dims = tuple(d.strip() for d in text.split(","))
    bad = [d for d in dims if d not in GROUP_BY]
    if bad or len(set(dims)) != len(dims) or not dims:
        raise UsageError(f"--by takes {', '.join(GROUP_BY)} (comma-separated, each once); got {text!r}")
    return dims


def group_stats(
    conn: sqlite3.Connection, filters: Filters, by: tuple[str, ...] = ("model",), *, points: bool = False
) -> list[GroupStats]:
    """:class:`GroupStats` of the turns with metrics that pass ``filters``, grouped by ``by`` (most turns first);
    with ``points``, each group's points too (the plot's).

    The rows come without their group's name (it is looked up once per context), ordered by context, the order
    of ``turns_figures``, which covers what is read (docs/history.md); each context's run of rows is split into
    columns at once, and the lines are fitted from the columns' sums (:class:`~chatphase.timing.fits.Moments`).
    Naming and grouping 100,000 rows one by one, and building NumPy arrays of them, was most of
    ``chatphase stats``; SQLite's own aggregates (sums, window-function medians) came out slower than this.
    """
    where, args = filters.where()
    key = " || ' · ' || ".join(GROUP_BY[d] for d in by)
    names: dict[int | None, str] = dict(
        conn.execute(
            f"SELECT x.cid, {key} FROM (SELECT NULL AS cid UNION ALL SELECT id FROM contexts) x"
            " LEFT JOIN contexts c ON c.id = x.cid"
        ).fetchall()
    )
    rows = conn.execute(
        f"SELECT t.context_id, {_EVALUATED}, ttft_ms, prefill_tokens_per_s, decode_tokens_per_s, kv_cache_tokens"
        f" FROM turns t LEFT JOIN contexts c ON c.id = t.context_id WHERE {where} AND stop_reason IS NOT NULL"
        " ORDER BY t.context_id",
        args,
    ).fetchall()
    columns: dict[str, list[list]] = {}
    for cid, run in itertools.groupby(rows, key=lambda r: r[0]):
        group_columns = columns.setdefault(names.get(cid, names[None]), [[] for _ in range(5)])
        for into, values in zip(group_columns, list(zip(*run, strict=True))[1:], strict=True):
            into.extend(values)
    out = []
    for name, (evaluated, ttft_ms, prefill_tps, decode_tps, depth) in columns.items():
        ttft = _pairs(evaluated, ttft_ms)
        decode = _pairs(depth, decode_tps)
        out.append(
            GroupStats(
                group=name,
                turns=len(ttft_ms),
                median_ttft_ms=_median(ttft_ms),
                median_prefill_tokens_per_s=_median(prefill_tps),
                median_decode_tokens_per_s=_median(decode_tps),
                ttft_fit=cost_line_of(ttft, MIN_FIT_X),
                decode_fit=line_of(decode, MIN_FIT_X),
                prompt_sizes=ttft.distinct_x,
                depths=decode.distinct_x,
                points_ttft=_points(evaluated, ttft_ms) if points else [],
                points_decode=_points(depth, decode_tps) if points else [],
            )
        )
    out.sort(key=lambda g: (-g.turns, g.group))
    return out


#: prompt tokens evaluated: ``prefill_tokens``, else prompt minus cached, else the prompt (a server's); NULL
#: without a prompt count
_EVALUATED = "coalesce(prefill_tokens, prompt_tokens - coalesce(cached_tokens, 0))"


def _pairs(xs: list, ys: list) -> Moments:
    """The moments of the points where both ``x`` and ``y`` are defined."""
    both = [x is not None and y is not None for x, y in zip(xs, ys, strict=True)]
    return Moments.of_points(list(itertools.compress(xs, both)), list(itertools.compress(ys, both)))


def _points(xs: list, ys: list) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in zip(xs, ys, strict=True) if x is not None and y is not None]


def _median(values: Iterable[float | None]) -> float | None:
    """The median of the defined values (``None`` when none): :func:`statistics.median`, as
    :func:`chatphase.timing.stats.summarize` takes it (without its standard deviation, slow over 100,000)."""
    xs = [v for v in values if v is not None]
    return float(statistics.median(xs)) if xs else None


def model_points(
    conn: sqlite3.Connection, model_name: str, exclude_session: str | None = None, limit: int = 5000
) -> list[dict[str, Any]]:
    """The latest ``limit`` recorded turns of the model named exactly ``model_name`` (outside ``exclude_session``),
    oldest first, as dicts of the metric fields the dashboard's plots read."""
    keys = ("prompt_tokens", "cached_tokens", "ttft_ms", "decode_tokens_per_s", "kv_cache_tokens")
    rows = conn.execute(
        f"SELECT {', '.join(keys)} FROM turns t JOIN contexts c ON c.id = t.context_id WHERE model_name = ?"
        " AND session_id IS NOT ? AND stop_reason IS NOT NULL ORDER BY started DESC, t.id DESC LIMIT ?",
        (model_name, exclude_session, limit),
    ).fetchall()
    return [dict(zip(keys, r, strict=True)) for r in reversed(rows)]
