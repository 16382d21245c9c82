"""The app's full garbage collections in the user's pauses (:mod:`chatphase.ui.idle_gc`): a fake clock and a
recorded ``collect``, Python's thresholds put back."""

from __future__ import annotations

import gc

import pytest

from chatphase.ui.idle_gc import SAFETY_THRESHOLD, IdleCollector


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield saved
    gc.set_threshold(*saved)


def test_python_s_own_full_collections_wait_while_the_collector_is_on_and_come_back_after(thresholds):
    collector = IdleCollector()
    collector.start()
    assert gc.get_threshold() == (thresholds[0], thresholds[1], max(thresholds[2], SAFETY_THRESHOLD))
    collector.start()  # twice: still Python's own kept to put back
    collector.stop()
    assert gc.get_threshold() == thresholds


def test_it_collects_only_once_the_user_paused_and_the_middle_generation_was_collected_enough(thresholds, monkeypatch):
    now = [100.0]
    done: list[int] = []
    counts = [(0, 0, 0)]
    monkeypatch.setattr(gc, "get_count", lambda: counts[0])
    collector = IdleCollector(idle_s=1.0, clock=lambda: now[0], collect=lambda gen: done.append(gen) or 0)
    collector.start()
    counts[0] = (5, 3, thresholds[2])  # as many middle collections as Python waits for
    collector.input()
    now[0] += 0.5
    assert not collector.check() and done == []  # a key half a second ago: not now
    now[0] += 0.6
    assert collector.check() and done == [2]  # a pause: a full collection
    counts[0] = (5, 3, thresholds[2] - 1)
    now[0] += 5
    assert not collector.check() and done == [2]  # nothing much can have reached the oldest generation since
    counts[0] = (5, 3, thresholds[2] + 4)
    collector.input()
    now[0] += 0.2
    assert not collector.check()  # keys keep coming
    now[0] += 1.0
    assert collector.check() and done == [2, 2] and collector.collections == 2
    collector.stop()


async def test_the_app_turns_it_on_tells_it_of_keys_and_turns_it_off(thresholds):
    from tests.ui_support import make_app

    app, _ = make_app()
    async with app.run_test() as pilot:
        await pilot.pause()
        assert gc.get_threshold()[2] == max(thresholds[2], SAFETY_THRESHOLD)
        before = app.idle_gc._input_at
        await pilot.press("a")
        assert app.idle_gc._input_at > before
    assert gc.get_threshold() == thresholds
