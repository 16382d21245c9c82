"""The thread policy on scripted inputs: cores, other load and inter-token gaps (no timing, no model)."""

from __future__ import annotations

import pytest

from chatphase.engine.metrics import compute_turn_metrics
from chatphase.engine.threads.governor import REASON_CHANGES, ThreadGovernor
from chatphase.engine.threads.policy import (
    MIN_GAPS,
    WINDOW,
    busy_cores,
    choose_turn_threads,
    decode_step,
    free_threads,
    preempted,
)
from chatphase.system.cpu_load import OtherCpuLoad

MS = 1_000_000


# -- before a turn --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("load", "busy"), [(0.0, 0), (0.49, 0), (0.5, 1), (1.0, 1), (1.49, 1), (1.5, 2), (7.2, 7), (-0.1, 0)]
)
def test_a_core_is_busy_from_half_a_core_of_other_load(load, busy):
    assert busy_cores(load) == busy


def test_free_threads_never_below_one_and_all_cores_when_unknown():
    assert free_threads(2, 0.1) == 2
    assert free_threads(2, 1.0) == 1
    assert free_threads(2, 5.0) == 1
    assert free_threads(8, 2.6) == 5
    assert free_threads(4, None) == 4


def test_quiet_machine_gets_every_core_for_prefill_and_decode():
    choice = choose_turn_threads(2, 0.1)
    assert (choice.n_threads_decode, choice.n_threads_prefill) == (2, 2)
    assert choice.reason == "2: no core busy elsewhere (other load 0.10 cores)"


def test_one_busy_process_takes_one_core_away():
    choice = choose_turn_threads(2, 1.0)
    assert (choice.n_threads_decode, choice.n_threads_prefill) == (1, 1)
    assert choice.reason == "2 → 1: one core busy elsewhere (other load 1.00 cores)"


def test_overloaded_machine_keeps_one_thread_and_says_all_cores_busy():
    choice = choose_turn_threads(2, 2.7)
    assert choice.n_threads_decode == 1
    assert choice.reason.startswith("2 → 1: both cores busy elsewhere")
    assert choose_turn_threads(8, 3.0).reason.startswith("8 → 5: three cores busy elsewhere")


def test_no_load_sample_means_every_core():
    choice = choose_turn_threads(4, None)
    assert choice.n_threads_decode == 4
    assert "no load sample" in choice.reason


def test_pinned_counts_ignore_the_load():
    choice = choose_turn_threads(2, 2.0, n_threads=2)
    assert (choice.n_threads_decode, choice.n_threads_prefill) == (2, 2)
    assert choice.reason == "2: fixed (--threads)"
    mixed = choose_turn_threads(2, 1.0, n_threads=2, n_threads_batch=1)
    assert (mixed.n_threads_decode, mixed.n_threads_prefill) == (2, 1)


def test_a_pinned_prefill_count_leaves_decode_auto():
    choice = choose_turn_threads(4, 1.0, n_threads_batch=4)
    assert (choice.n_threads_decode, choice.n_threads_prefill) == (3, 4)
    assert choice.reason.endswith("prefill 4 fixed (--threads-batch)")


def test_a_pinned_decode_count_leaves_prefill_auto_only_when_batch_unset_is_pinned_too():
    # llama.cpp's convention: --threads alone sets both
    assert choose_turn_threads(4, 1.0, n_threads=2).n_threads_prefill == 2
    assert choose_turn_threads(4, 1.0, n_threads=2, n_threads_batch=None).n_threads_prefill == 2


def test_choice_fields_name_the_prefill_started_fields():
    from dataclasses import fields

    from chatphase.engine.events import PrefillStarted

    names = {f.name for f in fields(PrefillStarted)}
    assert set(choose_turn_threads(2, 0.0).fields()) <= names


# -- during decode --------------------------------------------------------------------------------


def test_steady_gaps_are_not_preemption():
    assert preempted([7 * MS, 7.2 * MS, 6.9 * MS, 7.1 * MS] * 2, 6.9 * MS) is None


def test_the_odd_slow_gap_is_not_preemption():
    # a UI redraw or a page fault: two gaps of 4x in eight keep the mean under 2x
    assert preempted([7 * MS] * (WINDOW - 2) + [28 * MS] * 2, 7 * MS) is None


def test_bimodal_gaps_with_a_fast_median_are_preemption():
    # beside a busy process most gaps stay near quiet, a few take a whole time slice
    gaps = [7 * MS, 8 * MS, 7 * MS, 160 * MS, 8 * MS, 7 * MS, 9 * MS, 7 * MS]
    why = preempted(gaps, 7 * MS)
    assert why == f"decode preempted (last {WINDOW} gaps 3.8× the fastest, 7.0 ms)"


def test_too_few_gaps_are_not_judged():
    assert preempted([7 * MS] + [900 * MS] * (MIN_GAPS - 2), 7 * MS) is None
    assert preempted([7 * MS] + [900 * MS] * (MIN_GAPS - 1), 7 * MS) is not None


def test_only_the_last_window_counts():
    assert preempted([200 * MS] * 4 + [7 * MS] * WINDOW, 7 * MS) is None


def test_decode_steps_down_one_thread_never_below_one():
    slow = [7 * MS] * 4 + [30 * MS] * 4
    assert decode_step(4, 4, slow, 7 * MS)[0] == 3
    assert decode_step(1, 4, slow, 7 * MS) is None


def test_decode_steps_up_only_with_a_fresh_load_sample_showing_free_cores():
    steady = [11 * MS] * 8
    assert decode_step(1, 2, steady, 11 * MS) is None  # no sample: stay
    assert decode_step(1, 2, steady, 11 * MS, other_load_cores=0.9) is None  # still busy
    n, why = decode_step(1, 2, steady, 11 * MS, other_load_cores=0.1)
    assert n == 2 and why == "both cores free again (other load 0.10 cores)"
    assert decode_step(2, 8, steady, 11 * MS, other_load_cores=0.0)[0] == 3  # one at a time
    assert decode_step(2, 2, steady, 11 * MS, other_load_cores=0.0) is None  # already every core


# -- the governor: scripted token times and load ----------------------------------------------------


class Script:
    """Records ``set_threads`` calls and serves scripted load samples (the last one repeats)."""

    def __init__(self, loads=(0.0,)):
        self.loads = list(loads)
        self.calls: list[tuple[int, int]] = []
        self.samples = 0

    def set_threads(self, n, nb):
        self.calls.append((n, nb))

    def load(self):
        self.samples += 1
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]


def run_gaps(gov: ThreadGovernor, gaps_ms, t0=None):
    """Tokens at the scripted gaps (ms); a first token at 0 unless ``t0`` continues a turn."""
    t = 0 if t0 is None else t0
    if t0 is None:
        gov.on_token(t)
    for g in gaps_ms:
        t += int(g * MS)
        gov.on_token(t)
    return t


def finished(gov: ThreadGovernor):
    m = compute_turn_metrics(
        t_submit_ns=0,
        t_prefill_start_ns=0,
        t_prefill_end_ns=0,
        token_times_ns=[0, 1],
        prompt_tokens=1,
        cached_tokens=0,
        kv_cache_tokens=1,
        kv_bytes_per_token=1,
        kv_capacity_bytes=1,
        stop_reason="stop",
    )
    return gov.finish_turn(m)


def test_quiet_turn_keeps_every_core_and_reports_it():
    s = Script([0.0])
    gov = ThreadGovernor(2, None, None, s.set_threads, s.load)
    assert gov.start_turn().n_threads_decode == 2
    run_gaps(gov, [7] * 200)
    m = finished(gov)
    assert s.calls == [(2, 2)]
    assert (m.n_threads_prefill, m.n_threads_decode, m.decode_thread_changes) == (2, 2, 0)
    assert m.threads_reason == "2: no core busy elsewhere (other load 0.00 cores)"


def test_preemption_mid_decode_drops_a_thread_between_tokens():
    s = Script([0.0, 1.0])  # quiet at the turn's start; then the samples see the new load
    gov = ThreadGovernor(2, None, None, s.set_threads, s.load)
    gov.start_turn()
    run_gaps(gov, [7] * 20 + [25] * 8 + [11] * 50)
    m = finished(gov)
    assert s.calls == [(2, 2), (1, 2)]  # decode drops, prefill's count stays the turn's
    assert (m.n_threads_decode, m.decode_thread_changes) == (1, 1)
    # the window (8 gaps) is 7,7,7,7,25,25,25,25 at token 25: mean 16 ms = 2.3x the fastest
    assert "2 → 1 at token 25: decode preempted (last 8 gaps 2.3× the fastest, 7.0 ms)" in m.threads_reason


def test_load_is_sampled_at_most_once_per_interval_while_on_fewer_threads():
    s = Script([1.0])  # stays busy
    gov = ThreadGovernor(2, None, None, s.set_threads, s.load, up_check_s=1.0)
    gov.start_turn()
    samples_before = s.samples
    run_gaps(gov, [10] * 1000)  # 10 s of decode on one thread
    assert 9 <= s.samples - samples_before <= 10
    assert s.calls == [(1, 1)]


def test_quiet_again_brings_the_thread_back():
    s = Script([1.0, 1.0, 0.0])  # turn start busy; the first check busy; then quiet
    gov = ThreadGovernor(2, None, None, s.set_threads, s.load, up_check_s=1.0)
    assert gov.start_turn().n_threads_decode == 1
    run_gaps(gov, [10] * 300)
    m = finished(gov)
    assert s.calls == [(1, 1), (2, 1)]
    assert m.n_threads_decode == 2 and m.decode_thread_changes == 1
    assert "1 → 2 at token 201: both cores free again" in m.threads_reason


def test_a_step_up_that_does_not_hold_doubles_the_wait():
    s = Script([0.0])  # the load sample always says quiet; the gaps say otherwise
    gov = ThreadGovernor(2, None, None, s.set_threads, s.load, up_check_s=1.0, up_check_max_s=4.0)
    gov.start_turn()
    busy_at_2 = [7, 30, 30, 30, 30]  # preempted whenever on two threads
    t = run_gaps(gov, busy_at_2)
    ups = []
    for _ in range(6):
        n_before = len(s.calls)
        gaps = []
        while len(s.calls) == n_before:  # one thread: steady until the next step up
            t += 11 * MS
            gov.on_token(t)
            gaps.append(11)
        ups.append(len(gaps) * 11)
        for g in busy_at_2[1:]:
            t += g * MS
            gov.on_token(t)
    assert [round(u / 1000) for u in ups] == [1, 2, 4, 4, 4, 4]  # seconds on one thread before each try


def test_pinned_threads_never_change_nor_sample():
    s = Script([2.0])
    gov = ThreadGovernor(2, 2, None, s.set_threads, s.load)
    gov.start_turn()
    run_gaps(gov, [7] * 10 + [300] * 10)
    m = finished(gov)
    assert s.calls == [(2, 2)] and s.samples == 0
    assert (m.n_threads_decode, m.decode_thread_changes, m.threads_reason) == (2, 0, "2: fixed (--threads)")


def test_idle_ticks_reach_the_load_sampler_only_under_auto():
    ticks = []
    auto = ThreadGovernor(2, None, None, lambda n, nb: None, lambda: 0.0, tick=lambda: ticks.append("auto"))
    pinned = ThreadGovernor(2, 1, None, lambda n, nb: None, lambda: 0.0, tick=lambda: ticks.append("pinned"))
    for gov in (auto, pinned):
        gov.idle()
        gov.idle()
    assert ticks == ["auto", "auto"]


def test_many_changes_are_summarised():
    s = Script([0.0])
    gov = ThreadGovernor(2, None, None, s.set_threads, s.load, up_check_s=0.0)
    gov.start_turn()
    t = run_gaps(gov, [7])
    for _ in range(5):
        t = run_gaps(gov, [30, 30, 30, 30], t)  # preempted on two threads ...
        t = run_gaps(gov, [11, 11], t)  # ... and the next load sample brings it back
    m = finished(gov)
    assert m.decode_thread_changes > REASON_CHANGES
    assert f"… {m.decode_thread_changes - 2} more" in m.threads_reason
    assert m.threads_reason.count(" at token ") == 2


# -- other processes' load ------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_other_load_excludes_chatphase_processes():
    clock = Clock()
    busy = {"s": 1000.0}
    own = {11: 50.0, 12: 5.0}
    load = OtherCpuLoad(
        exclude_pids=(11, 12), clock=clock, busy_s=lambda: busy["s"], process_s=lambda pid: own.get(pid)
    )
    assert load.sample() is None  # no window yet
    clock.t += 2.0
    busy["s"] += 3.0  # 1.5 cores busy over 2 s ...
    own[11] += 1.6  # ... of which the engine 0.8 core
    own[12] += 0.4  # ... and the UI 0.2 core
    assert load.sample() == pytest.approx(0.5)


def test_other_load_windows_start_at_a_snapshot_old_enough_and_forget_ended_processes():
    clock = Clock()
    busy = {"s": 0.0}
    own = {11: 0.0}
    load = OtherCpuLoad(
        exclude_pids=(11,), min_window_s=0.25, clock=clock, busy_s=lambda: busy["s"], process_s=lambda pid: own.get(pid)
    )
    clock.t += 0.05
    assert load.sample() is None  # no snapshot old enough, no estimate yet
    clock.t += 0.05
    busy["s"] += 0.1
    assert load.sample() == pytest.approx(1.0)  # the first sample may take a quarter of the window
    clock.t += 0.9
    busy["s"] += 0.9
    assert load.sample() == pytest.approx(1.0)  # from the first snapshot (the second is too recent)
    clock.t += 0.01
    busy["s"] += 0.02
    assert load.sample() == pytest.approx(0.92 / 0.91)  # the last sample is too recent: from the one before
    clock.t += 1.0
    busy["s"] += 0.5
    own[11] += 0.2
    assert load.sample() == pytest.approx(0.3)
    clock.t += 1.0
    busy["s"] += 0.5
    del own[11]  # the process ended: its time is not subtracted
    assert load.sample() == pytest.approx(0.5)


def test_idle_ticks_make_the_sample_cover_the_last_second_not_the_whole_idle_time():
    clock = Clock()
    busy = {"s": 0.0}
    load = OtherCpuLoad(exclude_pids=(), clock=clock, busy_s=lambda: busy["s"], process_s=lambda pid: None)
    for second in range(60):  # a minute between turns: a compile runs for 55 s, then the machine is quiet
        clock.t += 1.0
        busy["s"] += 2.0 if second < 55 else 0.0
        load.tick()
    clock.t += 0.1
    assert load.sample() == pytest.approx(0.0)  # from the last tick at least 0.25 s old: quiet
    untick = OtherCpuLoad(exclude_pids=(), clock=clock, busy_s=lambda: busy["s"], process_s=lambda pid: None)
    clock.t += 60.0
    busy["s"] += 110.0
    assert untick.sample() == pytest.approx(110.0 / 60.0)  # without ticks: the average since the last sample


def test_other_load_reads_this_machine():
    load = OtherCpuLoad(min_window_s=0.0)
    value = load.sample()
    assert value is not None and value >= 0.0


# -- the cores to start from ----------------------------------------------------------------------


def test_cgroup_quota_caps_the_cores(tmp_path):
    from chatphase.system.cpu_features import cgroup_cpu_limit, physical_cores, usable_cores

    f = tmp_path / "cpu.max"
    f.write_text("150000 100000\n")
    assert cgroup_cpu_limit(f) == 2  # 1.5 CPUs of quota: two threads can run, rounded up
    f.write_text("max 100000\n")
    assert cgroup_cpu_limit(f) is None
    assert cgroup_cpu_limit(tmp_path / "missing") is None
    assert 1 <= usable_cores() <= physical_cores()
