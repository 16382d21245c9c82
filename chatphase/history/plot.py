"""``chatphase stats --plot``: every recorded turn, one colour per group, with each group's least-squares line —
drawn by :func:`chatphase.plotting.write_rows`, as the bench's plots are."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from chatphase.history.query import GroupStats
from chatphase.plotting import write_rows
from chatphase.units import fmt_count


def plot_history(groups: Sequence[GroupStats], ax1, ax2) -> None:
    """TTFT vs prompt tokens evaluated and decode tok/s vs depth: each group's turns as points and its fitted line."""
    for i, g in enumerate(groups):
        color = f"C{i % 10}"
        for ax, points, fit, unit in (
            (ax1, g.points_ttft, g.ttft_fit, "ms/token"),
            (ax2, g.points_decode, g.decode_fit, "tok/s per token"),
        ):
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            ax.scatter(xs, ys, s=6, alpha=0.35, color=color, label=f"{g.group} ({fmt_count(len(points), 'turn')})")
            if fit is not None:
                lo, hi = min(xs), max(xs)
                r2 = ("" if fit.r2 is None else f", r² {fit.r2:.2f}") + (", through 0" if fit.through_origin else "")
                ax.plot(
                    [lo, hi], [fit.predict(lo), fit.predict(hi)], "-", color=color, label=f"{fit.slope:.3g} {unit}{r2}"
                )
    ax1.set(title="Prefill: TTFT vs prompt tokens evaluated", xlabel="prompt tokens evaluated", ylabel="TTFT (ms)")
    ax2.set(title="Decode: speed vs context depth", xlabel="depth (tokens in KV cache)", ylabel="decode tokens/s")


def write_history_plot(groups: Sequence[GroupStats], path: str | os.PathLike) -> Path:
    """Draw :func:`plot_history` to ``path`` (.svg or .png).

    Raises:
        UsageError: as :func:`chatphase.plotting.write_rows`.
    """
    return write_rows([(plot_history, groups)], path)
