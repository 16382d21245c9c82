"""The lever grid (``chatphase bench`` with comma lists in a lever): every combination, interleaved."""

from chatphase.bench.grid.levers import LEVERS, GridPoint, LeverGrid
from chatphase.bench.grid.run import GridDone, GridResult, GridRun, lever_lines

__all__ = ["LEVERS", "GridDone", "GridPoint", "GridResult", "GridRun", "LeverGrid", "lever_lines"]
