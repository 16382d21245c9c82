"""Plots of the parallel-decode sweep's results (``chatphase bench --parallel --plot``), in the core's figure
(:func:`~chatphase.bench.core.plot.write_rows`): aggregate and per-sequence decode tok/s, and the step time, against N."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from chatphase.bench.parallel.result import ParallelResult
from chatphase.plotting import write_rows


def write_parallel_plot(results: Sequence[ParallelResult], path: str | os.PathLike) -> Path:
    """Draw the results' plots (:func:`plot_parallel`), one series per result and prompt length; format from the
    suffix (SVG or PNG). Returns the path.

    Raises:
        UsageError: a bad suffix, no matplotlib, or a file that cannot be written.
    """
    return write_rows([(plot_parallel, results)], path)


def plot_parallel(results: Sequence[ParallelResult], ax1, ax2) -> None:
    """Aggregate (solid) and per-sequence (dashed) decode tok/s vs N, and the step time vs N; the roofline's
    aggregate bound and bound step time dotted where the result has one. One series per result and prompt length."""
    series, all_ns = 0, set()
    for res in results:
        bounds = {(b["prompt_tokens"], b["n_seq"]): b for b in (res.roofline or {}).get("parallel_cells", [])}
        for length in dict.fromkeys(c.prompt_tokens for c in res.parallel):
            cells = sorted((c for c in res.parallel if c.prompt_tokens == length), key=lambda c: c.n_seq)
            color, ns = f"C{series}", [c.n_seq for c in cells]
            series += 1
            all_ns.update(ns)
            label = res.display_label() + (
                f", prompt {length}" if len({c.prompt_tokens for c in res.parallel}) > 1 else ""
            )
            for metric, fmt, what in (
                ("aggregate_decode_tokens_per_s", "o-", "aggregate"),
                ("decode_tokens_per_s", "s--", "per sequence"),
            ):
                stats = [getattr(c, metric) for c in cells]
                ax1.errorbar(
                    ns,
                    [s.mean or 0 for s in stats],
                    yerr=[s.sd or 0 for s in stats],
                    fmt=fmt,
                    capsize=3,
                    color=color,
                    label=f"{label}: {what}",
                )
            step = [c.step_ms for c in cells]
            ax2.errorbar(
                ns,
                [s.mean or 0 for s in step],
                yerr=[s.sd or 0 for s in step],
                fmt="o-",
                capsize=3,
                color=color,
                label=label,
            )
            bound = [b for n in ns if (b := bounds.get((length, n))) is not None]
            if len(bound) == len(ns):
                for ax, key in ((ax1, "aggregate_bound_tokens_per_s"), (ax2, "bound_step_ms")):
                    ax.plot(ns, [b[key] for b in bound], ":", color=color, alpha=0.7, label=f"{label}: roofline bound")
    ax1.set(
        title="Parallel decode: tok/s vs sequences", xlabel="N (sequences decoded together)", ylabel="decode tokens/s"
    )
    ax2.set(
        title="Parallel decode: step time vs sequences", xlabel="N (sequences decoded together)", ylabel="step (ms)"
    )
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(all_ns), [str(n) for n in sorted(all_ns)])
        ax.minorticks_off()
