"""The offload sweep's pure parts: the layer list, the per-placement roofline, the table and the plot
(the sweep itself runs in the GPU tier, tests/test_gpu_vulkan.py)."""

import pytest

from chatphase.bench.offload import (
    OffloadDone,
    Placement,
    parse_gpu_layers,
    placement_roofline,
    render_offload,
    write_offload_plot,
)
from chatphase.bench.results import BenchResult

MiB = 2**20


def test_layer_lists():
    assert parse_gpu_layers("0,8,16,all") == (0, 8, 16, -1)
    assert parse_gpu_layers(" all , -1, 4,4") == (-1, 4)
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


def test_without_the_device_bandwidth_only_the_host_side_counts_and_it_says_so():
    s = system({"weights": 60 * MiB}, {"weights": 30 * MiB})
    r = placement_roofline(s, 90 * MiB, kv_bytes_per_token=0, context_tokens=0, host_bw=10e9, device_bw=None)
    assert r["decode_bound_tokens_per_s"] == pytest.approx(10e9 / (30 * MiB))
    assert r["bound_by"].startswith("host memory (device bandwidth unknown")
    cpu_only = placement_roofline(system({}, {"weights": 90 * MiB}), 90 * MiB, 0, 0, host_bw=10e9, device_bw=None)
    assert cpu_only["bound_by"] == "host memory" and cpu_only["device_bytes_per_token"] == 0


def _placement(n, offloaded, prefill, decode):
    from chatphase.bench.results import CellResult
    from chatphase.bench.stats import Stats

    def st(v):
        return Stats(mean=v, sd=None, median=v, min=v, max=v, n=1)

    cell = CellResult("prompt", 32, 0, 4, 1, st(100.0), st(prefill), st(decode), st(1000 / decode), 0)
    result = BenchResult(system={"layers_offloaded": offloaded, "layers_total": 31}, results=[cell])
    s = system({"weights": offloaded * MiB}, {"weights": (31 - offloaded) * MiB})
    return Placement(n, result, placement_roofline(s, 31 * MiB, 0, 34, host_bw=10e9, device_bw=None))


def test_table_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    done = OffloadDone([_placement(0, 0, 20.0, 7.0), _placement(-1, 31, 31.9, 11.3)])
    table = render_offload(done).splitlines()
    assert table[0].split()[:2] == ["n_gpu_layers", "offloaded"]
    assert table[1].split()[:4] == ["0", "0/31", "20.0", "7.0"]
    assert table[2].split()[:4] == ["all", "31/31", "31.9", "11.3"]
    out = write_offload_plot(done, tmp_path / "offload.svg")
    assert out.read_text().lstrip().startswith("<?xml")
