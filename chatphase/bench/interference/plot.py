"""The interference experiment's plots (``chatphase bench --interference --plot``), in the core's figure
(:func:`~chatphase.bench.core.plot.write_rows`): the running streams' stall against the newcomer's TTFT (one point per
policy: the curve chunked prefill moves along), the window's ITL p50/p99/max against the chunk, and two swim-lane
timelines (the whole prompt first, and the smallest chunk): one lane per sequence, each token a tick, each step that
held prompt tokens a block, so the gap in every lane under a big block is plain."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from chatphase.bench.interference.analysis import Timeline
from chatphase.bench.interference.plan import policy_name
from chatphase.bench.interference.result import InterferenceResult
from chatphase.plotting import write_rows


def write_interference_plot(results: Sequence[InterferenceResult], path: str | os.PathLike) -> Path:
    """Draw the plots (module docstring); format from the suffix (SVG or PNG). Returns the path.

    Raises:
        UsageError: a bad suffix, no matplotlib, or a file that cannot be written.
    """
    return write_rows([(plot_tradeoff, results), (plot_lanes, results[:1])], path)


def plot_tradeoff(results: Sequence[InterferenceResult], ax1, ax2) -> None:
    """Stall (ms) against the newcomer's TTFT (ms), one point per policy; ITL p50/p99/max against the chunk."""
    for i, res in enumerate(results):
        color = f"C{i}"
        rows = [r for r in res.rows() if r.stall_ms is not None and r.newcomer_ttft_ms.mean is not None]
        rows.sort(key=lambda r: float("inf") if r.chunk is None else r.chunk)
        xs = [r.newcomer_ttft_ms.mean for r in rows]
        ax1.plot(xs, [r.stall_ms for r in rows], "o-", color=color, label=res.display_label())
        for r, x in zip(rows, xs, strict=True):
            ax1.annotate(policy_name(r.chunk), (x, r.stall_ms), textcoords="offset points", xytext=(4, 4),
                         fontsize="x-small")  # fmt: skip
        chunked = [r for r in rows if r.chunk is not None]
        for metric, fmt in (("itl_ms_p50", "o:"), ("itl_ms_p99", "s--"), ("itl_ms_max", "^-")):
            ax2.plot([r.chunk for r in chunked], [getattr(r, metric) for r in chunked], fmt, color=color,
                     label=f"{res.display_label()}: {metric.removeprefix('itl_ms_')}")  # fmt: skip
        whole = next((r for r in rows if r.chunk is None), None)
        if whole is not None and whole.itl_ms_max is not None:
            ax2.axhline(whole.itl_ms_max, color=color, alpha=0.5, linestyle="-.", label="whole prompt: max")
    ax1.set(title="Stall of the running streams vs newcomer TTFT", xlabel="newcomer TTFT (ms)", ylabel="stall (ms)")
    ax2.set(title="Running streams' ITL in the arrival window", xlabel="chunk C (prompt tokens per step)",
            ylabel="ITL (ms)")  # fmt: skip
    ax2.set_xscale("log", base=2)


def draw_lanes(ax, timeline: Timeline, title: str) -> None:
    """One swim lane per sequence (the newcomer last): a tick per token, a block per prompt-holding step."""
    n = len(timeline.lanes)
    lanes = list(range(1, n + 1))  # from 1: the core's figure starts every y axis at 0
    ax.eventplot([list(t) for t in timeline.lanes], lineoffsets=lanes, linelengths=0.7, colors="C0")
    for start, end, _tokens in timeline.blocks:
        ax.broken_barh([(start, end - start)], (n - 0.4, 0.8), facecolors="C3", edgecolors="white", alpha=0.7)
        ax.axvspan(start, end, color="C3", alpha=0.08)
    ax.axvline(timeline.arrival_ms, color="gray", linestyle="--", label="newcomer arrives")
    ax.set_yticks(lanes, [*(f"stream {j}" for j in range(n - 1)), "newcomer"])
    ax.set(title=title, xlabel="time (ms)")


def plot_lanes(results: Sequence[InterferenceResult], ax1, ax2) -> None:
    """Swim lanes of the whole prompt first and of the smallest chunk (the first result's)."""
    res = results[0]
    chunks = sorted({s.chunk for s in res.samples if s.chunk is not None})
    for ax, chunk in ((ax1, None), (ax2, chunks[0] if chunks else None)):
        timeline = res.timeline(chunk)
        if timeline is not None:
            draw_lanes(ax, timeline, f"Swim lanes: {policy_name(chunk)}")
