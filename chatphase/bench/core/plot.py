"""Plots of :class:`~chatphase.bench.core.results.SweepResult` s with matplotlib (the optional extra ``chatphase[plot]``).

:func:`write_plot` draws TTFT vs prompt tokens and decode tokens/s vs depth with ±1 sd error bars, and, for
parallel-decode cells, aggregate and per-sequence decode tokens/s and the step time against N; several
results overlay for comparison (one colour each).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from chatphase.bench.core.results import SweepResult
from chatphase.plotting import write_rows


def write_plot(results: Sequence[SweepResult], path: str | os.PathLike) -> Path:
    """Draw the sweep results' plots, one series per result (±1 sd error bars): TTFT vs prompt tokens with the
    fitted line, decode tok/s vs depth (:func:`plot_sweep`); format from the suffix (SVG or PNG). Returns the path.

    Raises:
        UsageError: as :func:`chatphase.plotting.write_rows`.
    """
    return write_rows([(plot_sweep, results)], path)


def plot_sweep(results: Sequence[SweepResult], ax1, ax2) -> None:
    """TTFT vs prompt tokens (with the fitted line) and decode tok/s vs depth."""
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
