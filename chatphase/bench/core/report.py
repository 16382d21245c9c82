"""Text output of a :class:`~chatphase.bench.core.results.SweepResult`: table, Markdown, CSV and JSON, and the
helpers the parallel sweep's result renders with (:func:`render_report`, :func:`setup_line`, :func:`peak_lines`).

``table`` and ``md`` show two tables (mean ± sample sd; median and min–max) of the cells, then the fits and
the roofline verdicts.
``csv``/``json`` are the file forms of :mod:`chatphase.bench.core.results`; plots are :mod:`chatphase.bench.core.plot`.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatphase.bench.core.results import CellResult, Sample, SweepResult
from chatphase.errors import UsageError
from chatphase.timing.stats import Stats
from chatphase.units import DASH, fmt_mib, fmt_ms, fmt_rate, fmt_term

FORMATS = ("table", "csv", "json", "md")
_METRICS = (("ttft_ms", "TTFT ms"), ("prefill_tokens_per_s", "prefill tok/s"), ("decode_tokens_per_s", "decode tok/s"))


def num(x: float | None, digits: int = 1) -> str:
    """``x`` with thousands separators and ``digits`` decimals; ``None``: a dash."""
    return DASH if x is None else f"{x:,.{digits}f}"


def mean_sd(s: Stats) -> str:
    """``"12.3 ± 0.4"`` (``"12.3"`` for one value, ``"–"`` when undefined)."""
    if s.mean is None:
        return DASH
    return num(s.mean) if s.sd is None else f"{num(s.mean)} ± {num(s.sd)}"


def median_range(s: Stats) -> str:
    """``"12.2 (11.9–12.8)"``: median, then min–max."""
    if s.median is None:
        return DASH
    return f"{num(s.median)} ({num(s.min)}–{num(s.max)})"


def sweep_rows(cells: Sequence[CellResult], fmt=mean_sd) -> list[list[str]]:
    """Table cells of prompt/depth cells, in :func:`sweep_headers` order; ``fmt`` formats a :class:`Stats`."""
    return [
        [
            c.kind,
            str(c.prompt_tokens),
            str(c.depth),
            str(c.reps),
            *(fmt(getattr(c, m)) for m, _ in _METRICS),
            fmt_mib(c.kv_cache_bytes),
        ]
        for c in cells
    ]


def sweep_headers(what: str = "") -> list[str]:
    """Column headers of :func:`sweep_rows`; ``what`` names the statistic (e.g. ``"mean ± sd"``)."""
    return ["kind", "prompt tok", "depth", "reps", *(f"{label} {what}".rstrip() for _, label in _METRICS), "KV MiB"]


def sample_progress(s: Sample) -> tuple[str, str]:
    """One run's progress line as ``(label, figures)``: ``("prompt 256 rep 2", "TTFT 41.0 ms, decode 80.3 tok/s")``
    (a parallel sample's: :func:`chatphase.bench.parallel.report.parallel_progress`)."""
    rep = "warm-up" if s.warmup else f"rep {s.rep + 1}"
    what = f"prompt {s.prompt_tokens}" if s.kind == "prompt" else f"depth {s.depth}"
    return f"{what} {rep}", f"TTFT {fmt_ms(s.ttft_ms)}, decode {fmt_rate(s.decode_tokens_per_s)}"


def _plain_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    left = {0}

    def line(cells):
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    align = ["---"] + ["--:"] * (len(headers) - 1)
    return "\n".join("| " + " | ".join(r) + " |" for r in [headers, align, *rows])


def fit_lines(result: SweepResult) -> list[str]:
    """The least-squares fits (TTFT against prompt tokens, decode rate against depth) as sentences."""
    fits, lines = result.fits or {}, []
    if f := fits.get("ttft_ms_vs_prompt_tokens"):
        slope, r2 = fmt_term(f["slope"], ".3f"), num(f["r2"], 3)
        lines.append(f"fit: TTFT ms = {f['intercept']:.1f} {slope} × prompt_tokens  (r² {r2}, n={f['n']})")
    if f := fits.get("decode_tokens_per_s_vs_depth"):
        slope, r2 = fmt_term(f["slope"] * 1000, ".3f"), num(f["r2"], 3)
        lines.append(f"fit: decode tok/s = {f['intercept']:.1f} {slope} × depth/1000  (r² {r2}, n={f['n']})")
    return lines


def setup_line(result, gen_unit: str = "tokens") -> str:
    """The first line of a sweep's or parallel sweep's report: model, engine settings and the plan's counts
    (``gen_unit``: what ``gen`` counts, tokens or decode steps). ``result`` has ``model`` and ``settings``."""
    m, s = result.model, result.settings
    eng = s.get("engine", {})
    plan = s.get("plan", {})
    return (
        f"model {m.get('name', '?')} ({m.get('quantization', '?')}, {m.get('n_params', 0) / 1e6:.0f} M params); "
        f"n_ctx {eng.get('n_ctx', '?')}, threads {eng.get('n_threads', '?')}, n_gpu_layers {eng.get('n_gpu_layers', '?')}, "
        f"flash_attn {eng.get('flash_attn', '?')}; gen {plan.get('gen_tokens', '?')} {gen_unit}, "
        f"{plan.get('reps', '?')} reps + {plan.get('warmup', '?')} warm-up, cache cleared each rep"
    )


def peak_lines(roofline: dict) -> list[str]:
    """The measured peaks of a roofline (bandwidth, copy bandwidth, matmul FLOP/s, conditions) as sentences."""
    r, lines = roofline, []
    if r:
        lines.append(f"memory bandwidth {r['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s ({r['bandwidth_method']})")
        if r.get("copy_bandwidth_bytes_per_s"):
            lines.append(f"memory bandwidth {r['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s ({r['copy_method']})")
        lines.append(f"matmul {r['flops_per_s'] / 1e9:.1f} GFLOP/s ({r['flops_method']})")
        if r.get("conditions"):
            lines.append(f"peaks {r['conditions']}")
    return lines


def summary_lines(result: SweepResult) -> list[str]:
    """Header, fits and roofline of a sweep as plain sentences (shared by the table and Markdown forms)."""
    lines = [setup_line(result)]
    if result.cancelled:
        lines.append("CANCELLED: partial results")
    lines.extend(fit_lines(result))
    r = result.roofline
    lines.extend(peak_lines(r))
    if r and "decode_verdict" in r:
        bounds = (
            f"decode bound {r['decode_bound_tokens_per_s_at_empty_context']:,.0f} tok/s = bandwidth / "
            f"({r['weight_bytes'] / 2**20:.0f} MiB weights + {r['kv_bytes_per_token']:,} B KV per token of context, "
            "or attention's FLOPs at the matmul peak where they take longer)"
        )
        if r.get("prefill_bound_tokens_per_s") is not None:  # None: not float32 weights, the verdict says why
            bounds += (
                f"; prefill bound {r['prefill_bound_tokens_per_s']:,.0f} tok/s = FLOP/s / (2 × "
                f"{r.get('prefill_params', r['n_params']) / 1e6:.0f} M params a prompt token multiplies)"
            )
        lines.append(bounds)
        lines.append(r["decode_verdict"])
        lines.append(r["prefill_verdict"])
        if r.get("attention_line"):
            lines.append(r["attention_line"])
    return lines


def render(result, fmt: str) -> str:
    """The sweep's :class:`SweepResult` (:func:`render_sweep`) or the parallel sweep's result (its own
    ``render``) as text in ``fmt``.

    Raises:
        UsageError: for an unknown format.
    """
    return render_sweep(result, fmt) if isinstance(result, SweepResult) else result.render(fmt)


def render_sweep(result: SweepResult, fmt: str) -> str:
    """The sweep's result as text in ``fmt`` (one of :data:`FORMATS`): two tables of its cells, then
    :func:`summary_lines`.

    Raises:
        UsageError: for an unknown format.
    """
    tables = [
        (sweep_headers("mean ± sd"), sweep_rows(result.results, mean_sd)),
        (sweep_headers("median (min–max)"), sweep_rows(result.results, median_range)),
    ]
    return render_report(result, fmt, tables, lines=summary_lines)


def render_report(result, fmt: str, tables: list[tuple[list[str], list[list[str]]]], lines) -> str:
    """The text forms every sweep-shaped result shares: ``json``/``csv`` its file forms; ``table``/``md``
    its first line (``lines(result)[0]``), ``tables`` (headers, rows), then the other lines (a list in ``md``).

    Raises:
        UsageError: for an unknown format.
    """
    if fmt == "json":
        return result.to_json() + "\n"
    if fmt == "csv":
        return result.to_csv()
    if fmt not in ("table", "md"):
        raise UsageError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    table = _plain_table if fmt == "table" else _md_table
    texts = [table(headers, rows) for headers, rows in tables]
    text = lines(result)
    if fmt == "md":
        head = [f"### chatphase bench — {result.display_label()}", text[0]]
        return "\n\n".join([*head, *texts, "\n".join(f"- {x}" for x in text[1:])]) + "\n"
    return "\n\n".join([text[0], *texts, "\n".join(text[1:])]) + "\n"
