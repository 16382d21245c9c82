"""Text output of a :class:`~chatphase.bench.core.results.BenchResult`: table, Markdown, CSV and JSON.

``table`` and ``md`` show two tables (mean ± sample sd; median and min–max) per cell — prompt/depth
cells and parallel-decode cells each in their own pair — then the fits and the roofline verdicts.
``csv``/``json`` are the file forms of :mod:`chatphase.bench.core.results`; plots are :mod:`chatphase.bench.core.plot`.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatphase.bench.core.parallel_results import ParallelCell, ParallelSample
from chatphase.bench.core.results import BenchResult, CellResult, Sample
from chatphase.bench.core.stats import Stats
from chatphase.errors import UsageError
from chatphase.units import DASH, fmt_mib, fmt_ms, fmt_rate

FORMATS = ("table", "csv", "json", "md")
_METRICS = (("ttft_ms", "TTFT ms"), ("prefill_tokens_per_s", "prefill tok/s"), ("decode_tokens_per_s", "decode tok/s"))
_PARALLEL_METRICS = (
    ("step_ms", "step ms"),
    ("decode_tokens_per_s", "per-seq tok/s"),
    ("aggregate_decode_tokens_per_s", "aggregate tok/s"),
    ("prefill_tokens_per_s", "prefill tok/s"),
    ("ttft_ms", "TTFT ms"),
)


def _num(x: float | None, digits: int = 1) -> str:
    return DASH if x is None else f"{x:,.{digits}f}"


def _signed(x: float, digits: int) -> str:
    """``"+ 1.500"`` / ``"− 1.500"``: a term's sign and magnitude, for printed equations."""
    return f"{'−' if x < 0 else '+'} {abs(x):.{digits}f}"


def mean_sd(s: Stats) -> str:
    """``"12.3 ± 0.4"`` (``"12.3"`` for one value, ``"–"`` when undefined)."""
    if s.mean is None:
        return DASH
    return _num(s.mean) if s.sd is None else f"{_num(s.mean)} ± {_num(s.sd)}"


def median_range(s: Stats) -> str:
    """``"12.2 (11.9–12.8)"``: median, then min–max."""
    if s.median is None:
        return DASH
    return f"{_num(s.median)} ({_num(s.min)}–{_num(s.max)})"


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


def parallel_rows(cells: Sequence[ParallelCell], fmt=mean_sd) -> list[list[str]]:
    """Table cells of parallel-decode cells, in :func:`parallel_headers` order."""
    return [
        [
            str(c.prompt_tokens),
            str(c.n_seq),
            str(c.reps),
            *(fmt(getattr(c, m)) for m, _ in _PARALLEL_METRICS),
            fmt_mib(c.kv_cache_bytes),
            fmt_mib(c.step_bytes),
            DASH if c.step_flops is None else f"{c.step_flops / 1e9:.2f}",
        ]
        for c in cells
    ]


def parallel_headers(what: str = "") -> list[str]:
    """Column headers of :func:`parallel_rows`."""
    labels = (f"{label} {what}".rstrip() for _, label in _PARALLEL_METRICS)
    return ["prompt tok", "N", "reps", *labels, "KV MiB", "step MiB", "step GFLOP"]


def sample_progress(s: Sample | ParallelSample) -> tuple[str, str]:
    """One run's progress line as ``(label, figures)``: ``("prompt 256 rep 2", "TTFT 41.0 ms, decode 80.3 tok/s")``,
    ``("N=4 prompt 64 warm-up", "aggregate 190.2 tok/s, per sequence 47.6 tok/s")``."""
    rep = "warm-up" if s.warmup else f"rep {s.rep + 1}"
    if isinstance(s, ParallelSample):
        aggregate, per_seq = fmt_rate(s.aggregate_decode_tokens_per_s), fmt_rate(s.decode_tokens_per_s)
        return f"N={s.n_seq} prompt {s.prompt_tokens} {rep}", f"aggregate {aggregate}, per sequence {per_seq}"
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


def fit_lines(result: BenchResult) -> list[str]:
    """The least-squares fits (TTFT against prompt tokens, decode rate against depth) as sentences."""
    fits, lines = result.fits or {}, []
    if f := fits.get("ttft_ms_vs_prompt_tokens"):
        slope, r2 = _signed(f["slope"], 3), _num(f["r2"], 3)
        lines.append(f"fit: TTFT ms = {f['intercept']:.1f} {slope} × prompt_tokens  (r² {r2}, n={f['n']})")
    if f := fits.get("decode_tokens_per_s_vs_depth"):
        slope, r2 = _signed(f["slope"] * 1000, 3), _num(f["r2"], 3)
        lines.append(f"fit: decode tok/s = {f['intercept']:.1f} {slope} × depth/1000  (r² {r2}, n={f['n']})")
    return lines


def summary_lines(result: BenchResult) -> list[str]:
    """Header, fits and roofline as plain sentences (shared by the table and Markdown forms)."""
    m, s = result.model, result.settings
    eng = s.get("engine", {})
    plan = s.get("plan", {})
    lines = [
        (
            f"model {m.get('name', '?')} ({m.get('quantization', '?')}, {m.get('n_params', 0) / 1e6:.0f} M params); "
            f"n_ctx {eng.get('n_ctx', '?')}, threads {eng.get('n_threads', '?')}, n_gpu_layers {eng.get('n_gpu_layers', '?')}, "
            f"flash_attn {eng.get('flash_attn', '?')}; gen {plan.get('gen_tokens', '?')} {'steps' if result.parallel else 'tokens'}, "
            f"{plan.get('reps', '?')} reps + {plan.get('warmup', '?')} warm-up, cache cleared each rep"
        )
    ]
    if result.parallel:
        lines.append(parallel_method_line(result))
    if result.cancelled:
        lines.append("CANCELLED: partial results")
    lines.extend(fit_lines(result))
    r = result.roofline
    if r:
        lines.append(f"memory bandwidth {r['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s ({r['bandwidth_method']})")
        if r.get("copy_bandwidth_bytes_per_s"):
            lines.append(f"memory bandwidth {r['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s ({r['copy_method']})")
        lines.append(f"matmul {r['flops_per_s'] / 1e9:.1f} GFLOP/s ({r['flops_method']})")
        if r.get("conditions"):
            lines.append(f"peaks {r['conditions']}")
    if r and "decode_verdict" in r:
        lines.append(
            f"decode bound {r['decode_bound_tokens_per_s_at_empty_context']:,.0f} tok/s = bandwidth / "
            f"({r['weight_bytes'] / 2**20:.0f} MiB weights + {r['kv_bytes_per_token']:,} B KV per token of context, "
            "or attention's FLOPs at the matmul peak where they take longer); "
            f"prefill bound {r['prefill_bound_tokens_per_s']:,.0f} tok/s = FLOP/s / (2 × {r['n_params'] / 1e6:.0f} M params)"
        )
        lines.append(r["decode_verdict"])
        lines.append(r["prefill_verdict"])
        if r.get("attention_line"):
            lines.append(r["attention_line"])
    lines.extend((r or {}).get("parallel_verdicts", []))
    if result.parallel:
        lines.extend(f"note: {n}" for n in s.get("notes", []))
    return lines


def parallel_method_line(result: BenchResult) -> str:
    """How the parallel sweep measured, in one sentence (remote: concurrent streams; local: one batch)."""
    plan = result.settings.get("plan", {})
    ns = ", ".join(str(n) for n in plan.get("n_seqs", sorted({c.n_seq for c in result.parallel})))
    if result.settings.get("engine", {}).get("backend") == "remote":
        return (
            f"parallel decode on the server: N = {ns} concurrent streams (token-id prompts, {plan.get('gen_tokens', '?')} "
            "tokens after the first); client clock, server counts; aggregate = Σ (tokens − 1) / decode span"
        )
    return (
        f"parallel decode: N = {ns} sequences in one context, each step one llama_decode of N tokens "
        f"({plan.get('gen_tokens', '?')} steps); aggregate tok/s = N × steps / decode time (llama-batched-bench's S_TG)"
    )


def render(result: BenchResult, fmt: str) -> str:
    """The result as text in ``fmt`` (one of :data:`FORMATS`).

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
    tables = []
    if result.results or not result.parallel:
        tables.append(table(sweep_headers("mean ± sd"), sweep_rows(result.results, mean_sd)))
        tables.append(table(sweep_headers("median (min–max)"), sweep_rows(result.results, median_range)))
    if result.parallel:
        tables.append(table(parallel_headers("mean ± sd"), parallel_rows(result.parallel, mean_sd)))
        tables.append(table(parallel_headers("median (min–max)"), parallel_rows(result.parallel, median_range)))
    lines = summary_lines(result)
    if fmt == "md":
        head = [f"### chatphase bench — {result.display_label()}", lines[0]]
        return "\n\n".join([*head, *tables, "\n".join(f"- {x}" for x in lines[1:])]) + "\n"
    return "\n\n".join([lines[0], *tables, "\n".join(lines[1:])]) + "\n"
