"""Plots of :class:`~chatphase.bench.core.results.SweepResult` s with matplotlib (the optional extra ``chatphase[plot]``).

:func:`write_plot` draws TTFT vs prompt tokens and decode tokens/s vs depth with ±1 sd error bars, and, for
parallel-decode cells, aggregate and per-sequence decode tokens/s and the step time against N; several
results overlay for comparison (one colour each).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from chatphase.bench.core.results import SweepResult
from chatphase.errors import UsageError

PLOT_SUFFIXES = (".svg", ".png")


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


def write_plot(results: Sequence[SweepResult], path: str | os.PathLike) -> Path:
    """Draw the sweep results' plots, one series per result (±1 sd error bars): TTFT vs prompt tokens with the
    fitted line, decode tok/s vs depth (:func:`plot_sweep`); format from the suffix (SVG or PNG). Returns the path.

    Raises:
        UsageError: as :func:`check_plot_path`, or when the file cannot be written.
    """
    return write_rows([(plot_sweep, results)], path)


def write_rows(rows: Sequence[tuple[Callable[[Sequence, object, object], None], Sequence]], path) -> Path:
    """A figure of one row of two axes per ``(draw, results)``: ``draw(results, ax1, ax2)`` fills them (each
    experiment that plots has its own ``draw``); a grid, y from 0 and legends added. Returns the path.

    Raises:
        UsageError: as :func:`check_plot_path`, or when the file cannot be written.
    """
    p = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 4.2 * len(rows)), layout="constrained", squeeze=False)
    for (draw, results), (ax1, ax2) in zip(rows, axes, strict=True):
        draw(results, ax1, ax2)
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small")
    return save_figure(fig, p)


def save_figure(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` and close it; returns the path.

    Raises:
        UsageError: when the file cannot be written.
    """
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path)
    except OSError as exc:
        raise UsageError(f"cannot write plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return path


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
