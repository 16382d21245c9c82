"""Old path of :mod:`chatphase.bench.grid.run`, kept for ``commands/whatif.py`` and ``benchmarks/`` until they import the new one."""

from chatphase.bench.grid.run import GridDone, GridRun, lever_lines

__all__ = ["GridDone", "GridRun", "lever_lines"]
