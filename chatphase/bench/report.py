"""Output of a :class:`~chatphase.bench.results.BenchResult`: table, Markdown, CSV, JSON, and a plot.

``table`` and ``md`` show two tables (mean ± sample sd; median and min–max) per cell, then the fits and
the roofline verdicts. ``csv``/``json`` are the file forms of :mod:`chatphase.bench.results`.
:func:`write_plot` draws TTFT vs prompt tokens and decode tokens/s vs depth with ±1 sd error bars using
matplotlib (the optional extra ``chatphase[plot]``); several results overlay for comparison.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from chatphase.bench.results import BenchResult, CellResult
from chatphase.bench.stats import Stats
from chatphase.errors import UsageError

FORMATS = ("table", "csv", "json", "md")
PLOT_SUFFIXES = (".svg", ".png")
_METRICS = (("ttft_ms", "TTFT ms"), ("prefill_tokens_per_s", "prefill tok/s"), ("decode_tokens_per_s", "decode tok/s"))


def _num(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def _signed(x: float, digits: int) -> str:
    """``"+ 1.500"`` / ``"− 1.500"``: a term's sign and magnitude, for printed equations."""
    return f"{'−' if x < 0 else '+'} {abs(x):.{digits}f}"


def mean_sd(s: Stats) -> str:
    """``"12.3 ± 0.4"`` (``"12.3"`` for one value, ``"–"`` when undefined)."""
    if s.mean is None:
        return "–"
    return _num(s.mean) if s.sd is None else f"{_num(s.mean)} ± {_num(s.sd)}"


def median_range(s: Stats) -> str:
    """``"12.2 (11.9–12.8)"``: median, then min–max."""
    if s.median is None:
        return "–"
    return f"{_num(s.median)} ({_num(s.min)}–{_num(s.max)})"


def _rows(cells: Sequence[CellResult], fmt) -> list[list[str]]:
    return [
        [
            c.kind,
            str(c.prompt_tokens),
            str(c.depth),
            str(c.reps),
            *(fmt(getattr(c, m)) for m, _ in _METRICS),
            "–" if c.kv_cache_bytes is None else f"{c.kv_cache_bytes / 2**20:.1f}",
        ]
        for c in cells
    ]


def _headers(what: str) -> list[str]:
    return ["kind", "prompt tok", "depth", "reps", *(f"{label} {what}" for _, label in _METRICS), "KV MiB"]


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


def summary_lines(result: BenchResult) -> list[str]:
    """Header, fits and roofline as plain sentences (shared by the table and Markdown forms)."""
    m, s = result.model, result.settings
    eng = s.get("engine", {})
    plan = s.get("plan", {})
    lines = [
        (
            f"model {m.get('name', '?')} ({m.get('quantization', '?')}, {m.get('n_params', 0) / 1e6:.0f} M params); "
            f"n_ctx {eng.get('n_ctx', '?')}, threads {eng.get('n_threads', '?')}, n_gpu_layers {eng.get('n_gpu_layers', '?')}, "
            f"flash_attn {eng.get('flash_attn', '?')}; gen {plan.get('gen_tokens', '?')} tokens, "
            f"{plan.get('reps', '?')} reps + {plan.get('warmup', '?')} warm-up, cache cleared each rep"
        )
    ]
    if result.cancelled:
        lines.append("CANCELLED: partial results")
    f = result.fits.get("ttft_ms_vs_prompt_tokens") if result.fits else None
    if f:
        lines.append(
            f"fit: TTFT ms = {f['intercept']:.1f} {_signed(f['slope'], 3)} × prompt_tokens  (r² {_num(f['r2'], 3)}, n={f['n']})"
        )
    f = result.fits.get("decode_tokens_per_s_vs_depth") if result.fits else None
    if f:
        lines.append(
            f"fit: decode tok/s = {f['intercept']:.1f} {_signed(f['slope'] * 1000, 3)} × depth/1000  (r² {_num(f['r2'], 3)}, n={f['n']})"
        )
    r = result.roofline
    if r:
        lines.append(f"memory bandwidth {r['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s read ({r['bandwidth_method']})")
        if r.get("copy_bandwidth_bytes_per_s"):
            lines.append(f"memory bandwidth {r['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s copy ({r['copy_method']})")
        lines.append(f"matmul {r['flops_per_s'] / 1e9:.1f} GFLOP/s ({r['flops_method']})")
        if r.get("conditions"):
            lines.append(f"peaks {r['conditions']}")
        lines.append(
            f"decode bound {r['decode_bound_tokens_per_s_at_empty_context']:,.0f} tok/s = bandwidth / "
            f"({r['weight_bytes'] / 2**20:.0f} MiB weights + {r['kv_bytes_per_token']:,} B KV per token of context); "
            f"prefill bound {r['prefill_bound_tokens_per_s']:,.0f} tok/s = FLOP/s / (2 × {r['n_params'] / 1e6:.0f} M params)"
        )
        lines.append(r["decode_verdict"])
        lines.append(r["prefill_verdict"])
    return lines


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
    t1 = table(_headers("mean ± sd"), _rows(result.results, mean_sd))
    t2 = table(_headers("median (min–max)"), _rows(result.results, median_range))
    lines = summary_lines(result)
    if fmt == "md":
        return (
            "\n\n".join(
                [
                    f"### chatphase bench — {result.display_label()}",
                    lines[0],
                    t1,
                    t2,
                    "\n".join(f"- {x}" for x in lines[1:]),
                ]
            )
            + "\n"
        )
    return "\n\n".join([lines[0], t1, t2, "\n".join(lines[1:])]) + "\n"


def check_plot_path(path: str | os.PathLike) -> Path:
    """Validate a ``--plot`` path before any work: suffix .svg/.png and matplotlib installed.

    Raises:
        UsageError: otherwise.
    """
    p = Path(path)
    if p.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot needs a .svg or .png file name (got {p.name!r})")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'chatphase[plot]'") from None
    return p


def write_plot(results: Sequence[BenchResult], path: str | os.PathLike) -> Path:
    """Draw TTFT vs prompt tokens (with the fitted line) and decode tok/s vs depth, ±1 sd error bars,
    one series per result; format from the suffix (SVG or PNG). Returns the path.

    Raises:
        UsageError: as :func:`check_plot_path`, or when the file cannot be written.
    """
    p = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for i, res in enumerate(results):
        color = f"C{i}"
        label = res.display_label()
        prompt = [c for c in res.results if c.kind == "prompt" and c.ttft_ms.mean is not None]
        depth = [c for c in res.results if c.kind == "depth" and c.decode_tokens_per_s.mean is not None]
        if prompt:
            xs = [c.prompt_tokens for c in prompt]
            ax1.errorbar(
                xs,
                [c.ttft_ms.mean for c in prompt],
                yerr=[c.ttft_ms.sd or 0 for c in prompt],
                fmt="o",
                capsize=3,
                color=color,
                label=label,
            )
            fit = (res.fits or {}).get("ttft_ms_vs_prompt_tokens")
            if fit:
                lo, hi = min(xs), max(xs)
                ax1.plot(
                    [lo, hi],
                    [fit["intercept"] + fit["slope"] * lo, fit["intercept"] + fit["slope"] * hi],
                    "--",
                    color=color,
                    alpha=0.6,
                    label=f"{label}: {fit['slope']:.2f} ms/token",
                )
        if depth:
            ax2.errorbar(
                [c.depth for c in depth],
                [c.decode_tokens_per_s.mean for c in depth],
                yerr=[c.decode_tokens_per_s.sd or 0 for c in depth],
                fmt="o-",
                capsize=3,
                color=color,
                label=label,
            )
    ax1.set(title="Prefill: TTFT vs prompt length", xlabel="prompt tokens", ylabel="TTFT (ms)")
    ax2.set(title="Decode: speed vs context depth", xlabel="depth (tokens in KV cache)", ylabel="decode tokens/s")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    try:
        fig.savefig(p)
    except OSError as exc:
        raise UsageError(f"cannot write plot {p}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return p
