"""Plot files with matplotlib (the optional extra ``chatphase[plot]``, imported only when a plot is drawn): the
check of a ``--plot`` path before any work, a figure of rows of two axes, and its writing. The bench's experiments
and ``chatphase stats --plot`` draw with them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

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


def write_rows(rows: Sequence[tuple[Callable[[Sequence, object, object], None], Sequence]], path) -> Path:
    """A figure of one row of two axes per ``(draw, results)``: ``draw(results, ax1, ax2)`` fills them (each
    experiment that plots and ``stats --plot`` have their own ``draw``); a grid, y from 0 and legends added. Returns the path.

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
