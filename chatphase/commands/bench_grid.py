"""``chatphase bench`` with comma lists in its levers: the lever grid (:mod:`chatphase.bench.grid.levers`).

:func:`split_levers` reads the lever flags (kept as text by ``add_model_options(lists=True)``): a single
value goes back into ``args`` as the plain bench expects it; lists make a :class:`LeverGrid`, which
:func:`run_grid` runs with the same progress bar, Ctrl+C handling and output flags as the plain sweep.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chatphase.bench.grid.levers import LEVERS, LeverGrid, check_values, parse_lever
from chatphase.commands.options import count_or_auto, refuse_flags
from chatphase.engine.text import inert


def split_levers(args: argparse.Namespace) -> LeverGrid:
    """The grid of the lever flags in ``args``; single values are written back into ``args`` as the plain
    bench reads them (``--n-ubatch`` an int, ``--threads`` an int or ``auto``), lists set to ``None``.

    Raises:
        UsageError: a value a lever does not take (one line naming the flag and the choices).
    """
    values: dict[str, tuple] = {}
    for lever in LEVERS:  # each lever's flag fills the ``args`` attribute of its name (the setting's key)
        text = getattr(args, lever, None)
        if text is None:
            continue
        # a model file whose name holds a comma is one model, not a list
        items = (text,) if lever == "model" and Path(text).expanduser().is_file() else parse_lever(lever, text)
        values[lever] = check_values(lever, items)
        single = items[0] if len(items) == 1 else None
        if lever == "n_threads" and single is not None:
            single = count_or_auto(str(single))
        setattr(args, lever, single)
    return LeverGrid(values)


def run_grid(args: argparse.Namespace, grid: LeverGrid, settings, plan, execute) -> int:
    """Run the grid on ``plan`` (the plain bench's, validated) through the command's ``execute``
    (:func:`chatphase.commands.bench.execute`: progress, Ctrl+C, output, exit code) and write its output
    (``--format``, ``--output``).

    Raises:
        UsageError: flags that do not combine with a grid, or unusable models.
    """
    from chatphase.bench.grid.run import GridDone, GridRun
    from chatphase.models.gguf_meta import read_model_info
    from chatphase.models.resolve import resolve_model

    refuse_flags(
        (("--parallel", args.parallel), ("--server", settings.server)),
        "does not combine with a lever grid (comma lists in the levers)",
    )
    points, notes = grid.points()
    specs = grid.values.get("model", (None,))
    infos = {spec: read_model_info(resolve_model(spec or settings.model, settings.models_dir)) for spec in specs}
    run = GridRun(points, infos, settings.engine, plan, notes=notes, roofline=args.roofline)
    for note in notes:
        print(inert(f"chatphase: {note}"), file=sys.stderr)
    return execute(
        args,
        run,
        len(points) * plan.total_runs,
        GridDone,
        partial=run.partial,
    )
