"""The offload sweep's pure parts: the layer list, the per-placement roofline, the table and the plot
(the sweep itself runs in the GPU tier, tests/engine/test_gpu_vulkan.py)."""

import pytest

from chatphase.bench.core.results import SweepResult
from chatphase.bench.offload.run import (
    OffloadDone,
    Placement,
    parse_gpu_layers,
    placement_roofline,
    render_offload,
    write_offload_plot,
)

MiB = 2**20


def test_layer_lists():
    assert parse_gpu_layers("0,8,16,all") == (0, 8, 16, -1)
    assert parse_gpu_layers(" all , -1, 4,4") == (-1, 4)
    assert parse_gpu_layers("0,auto,AUTO,all") == (0, None, -1)  # auto: EngineConfig's None
    for bad in ("", "x", "8,-2", "1.5"):
        with pytest.raises(ValueError):
            parse_gpu_layers(bad)


def system(device: dict, host: dict, devices=()) -> dict:
    return {"memory": {"device": device, "host": host}, "devices": list(devices)}


def test_the_bound_adds_the_two_sides_and_names_the_larger():
    # 60 of 90 MiB of weights + 3/4 of the KV on the device, the rest on the host; 1,000 tokens of context.
    # The host's mapped buffer spans the whole file (llama.cpp maps a range): not what the host reads
    s = system({"weights": 60 * MiB, "kv_cache": 3 * MiB}, {"weights": 88 * MiB, "kv_cache": 1 * MiB})
    r = placement_roofline(s, 90 * MiB, kv_bytes_per_token=1000, context_tokens=1000, host_bw=10e9, device_bw=100e9)
    assert r["device_bytes_per_token"] == pytest.approx(60 * MiB + 750_000)
    assert r["host_bytes_per_token"] == pytest.approx(30 * MiB + 250_000)
    t = r["device_bytes_per_token"] / 100e9 + r["host_bytes_per_token"] / 10e9
    assert r["decode_bound_tokens_per_s"] == pytest.approx(1 / t)
    assert r["bound_by"] == "host memory"  # 30 MiB at 10 GB/s takes longer than 60 MiB at 100 GB/s


def test_without_the_device_bandwidth_the_bound_is_unknown_and_it_says_so():
    # every layer on a device of unknown bandwidth: the host side alone once read 20,580 tok/s beside 2.8
    s = system({"weights": 88 * MiB, "kv_cache": 4 * MiB}, {"weights": 2 * MiB})
    r = placement_roofline(s, 90 * MiB, kv_bytes_per_token=1000, context_tokens=100, host_bw=10e9, device_bw=None)
    assert r["decode_bound_tokens_per_s"] is None
    assert r["bound_by"] == "unknown: device bandwidth unknown, give --device-bandwidth GB/s"
    cpu_only = placement_roofline(system({}, {"weights": 90 * MiB}), 90 * MiB, 0, 0, host_bw=10e9, device_bw=None)
    assert cpu_only["bound_by"] == "host memory" and cpu_only["device_bytes_per_token"] == 0
    assert cpu_only["decode_bound_tokens_per_s"] == pytest.approx(10e9 / (90 * MiB))
    all_on_device = placement_roofline(system({"weights": 90 * MiB}, {}), 90 * MiB, 0, 0, host_bw=None, device_bw=1e11)
    assert all_on_device["decode_bound_tokens_per_s"] == pytest.approx(1e11 / (90 * MiB))
    no_peaks = placement_roofline(system({}, {"weights": 90 * MiB}), 90 * MiB, 0, 0, host_bw=None, device_bw=None)
    assert no_peaks["decode_bound_tokens_per_s"] is None and no_peaks["bound_by"].startswith("unknown")
    table = render_offload(OffloadDone([Placement(-1, SweepResult(system={}), r)]))
    row = table.splitlines()[1]
    assert "20,580" not in row and "–  unknown: device bandwidth unknown, give --device-bandwidth" in row


def st(v):
    from chatphase.timing.stats import Stats

    return Stats(mean=v, sd=None, median=v, min=v, max=v, n=1)


def cell(kind, prompt, depth, ttft_ms, prefill, decode):
    from chatphase.bench.core.results import CellResult

    return CellResult(kind, prompt, depth, 4, 1, st(ttft_ms), st(prefill), st(decode), st(1000 / decode), 0)


def _placement(n, offloaded, prefill, decode, cells=None):
    cells = cells or [cell("prompt", 32, 0, 32 / prefill * 1000 + 5, prefill, decode)]
    result = SweepResult(system={"layers_offloaded": offloaded, "layers_total": 31}, results=cells)
    s = system({"weights": offloaded * MiB}, {"weights": (31 - offloaded) * MiB})
    return Placement(n, result, placement_roofline(s, 31 * MiB, 0, 34, host_bw=10e9, device_bw=None))


def test_table_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    done = OffloadDone([_placement(0, 0, 20.0, 7.0), _placement(-1, 31, 31.9, 11.3)])
    table = render_offload(done).splitlines()
    assert table[0].split()[:5] == ["n_gpu_layers", "offloaded", "prompt", "tok", "TTFT"]
    assert table[1].split()[:6] == ["0", "0/31", "32", "1,605.0", "20.0", "7.0"]
    assert table[2].split()[:6] == ["all", "31/31", "32", "1,008.1", "31.9", "11.3"]
    out = write_offload_plot(done, tmp_path / "offload.svg")
    assert out.read_text().lstrip().startswith("<?xml")


def test_the_count_auto_chose_and_one_past_it_are_marked(tmp_path):
    """``--gpu-layers 0,auto,13,all``: auto offloaded 12; its row, and the row at 13, are marked in the table
    and the JSON (which keeps ``n_gpu_layers`` null for auto, and reads back), the plot draws a line at 12."""
    pytest.importorskip("matplotlib")
    from chatphase.bench.offload.run import auto_count, offload_from_dict, offload_json, offload_rows

    auto = _placement(None, 12, 25.0, 9.0)
    auto.result.system["n_gpu_layers_why"] = "auto: 12 (11/30 layers + output) fit: Vulkan0 …"
    done = OffloadDone(
        [_placement(0, 0, 20.0, 7.0), auto, _placement(13, 13, 26.0, 9.5), _placement(-1, 31, 31.9, 11.3)]
    )
    table = render_offload(done).splitlines()
    assert [row.split()[0] for row in table[1:5]] == ["0", "auto", "13", "all"]
    assert [row.endswith("◀ auto") for row in table[1:5]] == [False, True, False, False]
    assert table[3].endswith("◀ auto+1") and "◀" not in table[4]
    assert table[5] == "n_gpu_layers auto: 12 (11/30 layers + output) fit: Vulkan0 …"
    data = offload_json(done)
    assert data["auto"] == 12 and [p["mark"] for p in data["offload"]] == ["", "auto", "auto+1", ""]
    assert data["offload"][1]["n_gpu_layers"] is None
    again = offload_from_dict(data)
    assert again.placements[1].n_gpu_layers is None and auto_count(again.placements) == 12
    assert [r["n_gpu_layers"] for r in offload_rows(done)] == [0.0, 12.0, 13.0, -1.0]
    svg = write_offload_plot(done, tmp_path / "offload.svg").read_text()
    assert "auto (12)" in svg
    no_auto = OffloadDone([_placement(0, 0, 20.0, 7.0), _placement(13, 13, 26.0, 9.5)])
    assert "◀" not in render_offload(no_auto) and offload_json(no_auto)["auto"] is None


def test_prefill_rate_and_ttft_describe_the_same_turns():
    # 0 layers on a Vulkan build: prompts of 64+ tokens go to the (software) device, slow; the depth cells'
    # 4-token extensions stay on the CPU, fast. A mean of the cells' rates read 164 tok/s beside 7,086 ms
    cells = [
        cell("prompt", 64, 0, 7086.0, 64 / 7.0, 2.8),
        cell("prompt", 256, 0, 26_100.0, 256 / 26.0, 2.8),
        cell("depth", 4, 0, 30.0, 320.0, 2.8),
        cell("depth", 1028, 1024, 40.0, 320.0, 2.5),
    ]
    p = _placement(0, 0, 1.0, 2.8, cells)
    prompt_tokens, ttft_ms, rate = p.prefill()
    assert prompt_tokens == 256
    assert rate * ttft_ms / 1000 == pytest.approx(prompt_tokens, rel=0.01)  # the rate's tokens fit its TTFT
    row = render_offload(OffloadDone([p])).splitlines()[1].split()
    assert row[2:5] == ["256", "26,100.0", "9.8"]
    assert p.to_dict()["prefill_tokens_per_s"] == pytest.approx(256 / 26.0) and p.to_dict()["ttft_ms"] == 26_100.0


# -- the sweep's run: numbered progress, partial results, Ctrl+C ------------------------------------------


def sample(prompt, rep=0):
    from chatphase.bench.core.results import Sample

    return Sample("prompt", prompt, 0, rep, False, 7086.0, 9.0, 2.8, 357.0, prompt, 0, 4, 0, "length")


class FakeBenchRun:
    """One placement's bench run: ``runs`` finished runs, then (``stuck``) a turn that ignores cancel until
    ``release`` is set, as llama.cpp's batch on a software GPU did for minutes."""

    def __init__(self, n, runs, stuck=None):
        self.n, self.runs, self.stuck = n, runs, stuck
        self.cancelled = False
        self.measured: list = []

    def cancel(self):
        self.cancelled = True  # the turn in flight goes on regardless

    def _result(self, cancelled):
        cells = [cell("prompt", s.prompt_tokens, 0, s.ttft_ms, s.prefill_tokens_per_s, 2.8) for s in self.measured]
        return SweepResult(system={"layers_offloaded": self.n, "layers_total": 31}, results=cells, cancelled=cancelled)

    def partial(self):
        return self._result(True) if self.measured else None

    def __iter__(self):
        from chatphase.bench.core.events import RunDone
        from chatphase.bench.sweep.loop import SweepProgress

        for i in range(self.runs):
            self.measured.append(sample(64 * (i + 1)))
            yield SweepProgress(i + 1, 4, self.measured[-1])
        if self.stuck is not None:
            self.stuck.wait(30)
        yield RunDone(self._result(self.cancelled))


def offload_run(runs_by_layers, stuck=None):
    from fake_engine import fake_model_info

    from chatphase.bench.offload.run import OffloadRun
    from chatphase.bench.sweep.loop import SweepPlan
    from chatphase.engine.config import EngineConfig

    plan = SweepPlan(prompt_lengths=(64, 128, 192, 256), depths=(), reps=1, warmup=0)
    sweep = OffloadRun(fake_model_info(), EngineConfig(), plan, tuple(runs_by_layers), roofline=False)
    sweep.make_run = lambda n, peaks: FakeBenchRun(
        n, runs_by_layers[n], stuck if n == list(runs_by_layers)[-1] else None
    )
    return sweep


def test_progress_is_numbered_across_placements_and_partial_keeps_what_ran():
    from chatphase.bench.sweep.loop import SweepProgress

    sweep = offload_run({0: 4, 8: 2})
    events = iter(sweep)
    seen = []
    for event in events:
        if isinstance(event, SweepProgress):
            seen.append((event.done_runs, event.total_runs))
            if len(seen) == 5:
                break
    assert seen == [(1, 8), (2, 8), (3, 8), (4, 8), (5, 8)]
    partial = sweep.partial()  # mid-run: the first placement whole, the second's one run so far
    assert partial.cancelled and [p.n_gpu_layers for p in partial.placements] == [0, 8]
    assert [len(p.result.results) for p in partial.placements] == [4, 1]


def test_ctrl_c_twice_prints_the_partial_results_and_long_runs_show_progress(capsys):
    import argparse
    import os
    import signal
    import threading

    from chatphase.bench.offload.run import OffloadDone
    from chatphase.commands.bench import execute

    stuck = threading.Event()
    sweep = offload_run({0: 4, 8: 2}, stuck)
    for delay in (0.6, 1.0):  # the first cancels (the turn in flight ignores it), the second stops now
        threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()
    args = argparse.Namespace(output=None, plot=None)
    try:
        rc = execute(
            args, sweep, 8, OffloadDone, render_offload, None, lambda d: d.cancelled, sweep.partial, heartbeat_s=0.2
        )
    finally:
        stuck.set()
    out, err = capsys.readouterr()
    assert rc == 130
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [r[:3] for r in rows[:2]] == [["0", "0/31", "256"], ["8", "8/31", "128"]]
    assert "(cancelled: the placements above are the ones that ran)" in out
    assert "still running: prompt 128 rep 1" in err  # the stuck turn: progress lines while it runs
    assert "cancelled; the results above are partial" in err and "Traceback" not in err
