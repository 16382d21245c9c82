"""RedrawBudget with scripted clocks: cheap redraws keep their rate, costly ones are spaced out."""

from __future__ import annotations

import pytest

from chatphase.ui.redraw_budget import SHARE_NO_SPARE_CORE, SHARE_SPARE_CORE, RedrawBudget, ui_cpu_share


class Clocks:
    def __init__(self):
        self.wall = 0.0
        self.cpu = 0.0


def budget(clocks, share=0.15, max_interval_s=1.0):
    return RedrawBudget(share, max_interval_s, clock=lambda: clocks.wall, cpu_clock=lambda: clocks.cpu)


def test_cheap_redraws_are_always_due():
    c = Clocks()
    b = budget(c)
    c.wall, c.cpu = 0.1, 0.005  # 5 ms of CPU in 100 ms: 5 % < 15 %
    assert b.due()


def test_costly_redraw_waits_until_its_cpu_fits_the_share():
    c = Clocks()
    b = budget(c)
    c.wall, c.cpu = 0.1, 0.045  # the last redraw cost 45 ms: not due until 45 / 0.15 = 300 ms
    assert not b.due()
    c.wall = 0.29
    assert not b.due()
    c.wall = 0.3
    assert b.due()
    b.mark()
    c.wall, c.cpu = 0.35, 0.046
    assert b.due()


def test_always_due_after_the_max_interval():
    c = Clocks()
    b = budget(c, max_interval_s=1.0)
    c.wall, c.cpu = 1.0, 0.9
    assert b.due()


def test_share_depends_on_a_spare_core():
    assert ui_cpu_share(2, cpu_count=2) == SHARE_NO_SPARE_CORE
    assert ui_cpu_share(2, cpu_count=4) == SHARE_SPARE_CORE
    assert ui_cpu_share(None, cpu_count=8) == SHARE_NO_SPARE_CORE
    with pytest.raises(ValueError):
        RedrawBudget(0)
