"""The what-if predictor on scripted inputs: efficiency from a bench result, device predictions, the
assumptions said, and the command on a saved result."""

from __future__ import annotations

import json

import pytest
from test_bench_results import make_cell

from chatphase.bench.core.results import SweepResult
from chatphase.bench.whatif import (
    DEVICES,
    Efficiency,
    ModelFacts,
    device_rows,
    efficiency_from,
    find_device,
    predict_decode,
    predict_ttft_ms,
)
from chatphase.cli import main
from chatphase.errors import UsageError

MODEL = ModelFacts("m", weight_bytes=1_000_000_000, n_params=2_000_000_000, kv_bytes_per_token=100_000)


def _result():
    cells = [
        make_cell("prompt", 256, 0, gen=16, ttft=[1000.0], prefill=[256.0], decode=[9.0]),
        make_cell("depth", 4, 0, gen=16, ttft=[20.0], prefill=[200.0], decode=[8.0]),
        make_cell("depth", 516, 512, gen=16, ttft=[30.0], prefill=[150.0], decode=[7.0]),
    ]
    roofline = {"bandwidth_bytes_per_s": 20e9, "flops_per_s": 2e12, "weight_bytes": MODEL.weight_bytes,
                "n_params": MODEL.n_params, "kv_bytes_per_token": MODEL.kv_bytes_per_token}  # fmt: skip
    model = {"name": "m", "synthetic": True, "quantization": "F32"}
    return SweepResult(model=model, results=cells, roofline=roofline, system={"cpu": "X"})


def test_efficiency_from_a_result_by_hand():
    eff, model, measured = efficiency_from(_result())
    assert model == MODEL
    # depth 0 decodes at 4 + 8 = 12 tokens of context: bound 20e9 / (1e9 + 1.2e6)
    assert eff.decode == pytest.approx(8.0 / (20e9 / (1e9 + 12 * 100_000)))
    # prefill bound 2e12 / 4e9 = 500 tok/s; measured 256 -> 51.2 %
    assert eff.prefill == pytest.approx(256 / 500) and eff.prefill_tokens == 256 and eff.decode_depth == 0
    assert measured["decode"][512][0] == 7.0 and measured["ttft_ms"] == {256: 1000.0}


def test_device_predictions_scale_the_spec_sheet_peaks_by_the_efficiency():
    eff = Efficiency(decode=0.5, prefill=0.25, bandwidth_bytes_per_s=20e9, flops_per_s=2e12, decode_depth=0,
                     prefill_tokens=256)  # fmt: skip
    h100 = find_device("H100")
    assert predict_decode(h100.bandwidth_bytes_per_s, 0.5, MODEL, 0) == pytest.approx(0.5 * 3.35e12 / 1e9)
    assert predict_decode(h100.bandwidth_bytes_per_s, 0.5, MODEL, 10_000) == pytest.approx(0.5 * 3.35e12 / 2e9)
    # TTFT of 1000 tokens: 1000 × 4e9 FLOPs / (0.25 × 989e12) s
    assert predict_ttft_ms(h100.flops_per_s, 0.25, MODEL, 1000) == pytest.approx(1000 * 1000 * 4e9 / (0.25 * 989e12))
    rows = device_rows([h100], eff, MODEL, [1000], [0, 10_000])
    assert rows[0]["decode_tokens_per_s"][0] > rows[0]["decode_tokens_per_s"][10_000]
    assert rows[0]["source"] == h100.source


def test_every_device_cites_its_source_and_unknown_names_are_one_line():
    assert all(d.source and d.bandwidth_bytes_per_s > 0 and d.flops_per_s > 0 for d in DEVICES)
    assert len({d.key for d in DEVICES}) == len(DEVICES)
    with pytest.raises(UsageError, match="unknown device 'tpu'"):
        find_device("tpu")


def test_whatif_from_a_saved_result_prints_predictions_and_assumptions(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(_result().to_json())
    assert main(["whatif", "--from", str(path), "--device", "rtx-4090,rpi5", "--depths", "0,512"]) == 0
    out = capsys.readouterr().out
    assert "m (synthetic: timings only)" in out and "NVIDIA GeForce RTX 4090" in out and "Raspberry Pi 5" in out
    assert "this machine (X)" in out and "upper bounds on speed" in out
    assert "decode at depth 0: predicted 8.0, measured 8.0 — calibration" in out
    assert "decode at depth 512" in out and "measured / predicted" in out
    assert main(["whatif", "--from", str(path), "--device", "h100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["device"] for d in data["devices"]] == ["h100", "this-machine"] and data["assumptions"]


def test_whatif_needs_a_roofline(tmp_path, capsys):
    r = _result()
    r.roofline = {}
    (tmp_path / "r.json").write_text(r.to_json())
    assert main(["whatif", "--from", str(tmp_path / "r.json")]) == 2
    assert "no roofline" in capsys.readouterr().err


def test_the_readmes_form_takes_the_model_as_its_positional_argument(monkeypatch, capsys):
    """``chatphase whatif MODEL --device ...`` (docs/levers.md): MODEL is the model to measure here, not --spec's value
    (the positional's dest was "spec", which settings_from_args read as the speculative mode)."""
    import chatphase.bench.sweep.run as sweep_run
    import chatphase.models.gguf_meta as gguf_meta
    import chatphase.models.resolve as resolve
    from chatphase.bench.core.events import RunDone

    asked: list[str] = []
    monkeypatch.setattr(resolve, "resolve_model", lambda spec, models_dir=None: asked.append(spec) or spec)
    monkeypatch.setattr(gguf_meta, "read_model_info", lambda path: type("Info", (), {"synthetic": True})())
    monkeypatch.setattr(sweep_run, "SweepRun", lambda info, engine, plan: iter([RunDone(_result())]))
    argv = "whatif synthetic-llama-3.1-8b-Q4_0.gguf --device rtx-4090,m2,rpi5 --depths 0,4096,16384".split()
    assert main(argv) == 0
    assert asked == ["synthetic-llama-3.1-8b-Q4_0.gguf"]
    assert "NVIDIA GeForce RTX 4090" in capsys.readouterr().out
