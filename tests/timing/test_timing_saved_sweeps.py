"""The one reader of saved sweeps' prefills (chatphase.timing.saved_sweeps): a sweep's samples as the TTFT model's
points, and the newest saved sweep of a model file in a folder, as ``chatphase bench -o FILE.json`` writes it."""

from __future__ import annotations

import json
import os

from chatphase.bench.core.results import Sample, SweepResult, save_result
from chatphase.bench.parallel.result import ParallelResult
from chatphase.timing.saved_sweeps import points_from_sweep, saved_points, sweep_points
from chatphase.timing.ttft_model import PrefillPoint


def test_the_points_of_a_sweeps_samples():
    samples = [
        {"prompt_tokens": 64, "depth": 0, "warmup": True, "ttft_ms": 999.0, "prefill_tokens_per_s": 1.0},
        {"prompt_tokens": 64, "depth": 0, "warmup": False, "ttft_ms": 50.0 + 64 * 2, "prefill_tokens_per_s": 500.0},
        {"prompt_tokens": 32, "depth": 512, "warmup": False, "ttft_ms": None, "prefill_tokens_per_s": 500.0},
        {"prompt_tokens": 40, "depth": 512, "prefill_tokens": 8, "cached_tokens": 32, "ttft_ms": 70.0,
         "prefill_tokens_per_s": 400.0},
    ]  # fmt: skip
    assert points_from_sweep(samples, "bench results s.json") == [
        PrefillPoint(64, 0, 128.0, 178.0, origin="bench results s.json"),
        PrefillPoint(8, 32, 20.0, 70.0, origin="bench results s.json"),
    ]


def sample(prompt_tokens: int, depth: int, ttft_ms: float, warmup: bool = False) -> Sample:
    """A measured repetition as the bench records it: ``prompt_tokens - depth`` evaluated at 500 tokens/s."""
    kind = "depth" if depth else "prompt"
    evaluated = prompt_tokens - depth
    return Sample(kind, prompt_tokens, depth, 0, warmup, ttft_ms, 500.0, 40.0, 25.0, evaluated, depth, 8, 0, "length")


def test_what_the_bench_saves_is_what_the_prior_reads(tmp_path):
    """A sweep saved by the bench's own records: its measured samples are the points, each prefill the evaluated
    tokens at the measured rate on top of the cached ones; a warm-up is none."""
    model = {"path": "/models/smol.gguf", "name": "smol"}
    result = SweepResult(model=model, samples=[sample(64, 0, 200.0, warmup=True), sample(64, 0, 150.0),
                                               sample(1064, 1000, 180.0)])  # fmt: skip
    save_result(result, tmp_path / "smol.json")
    assert saved_points("/elsewhere/smol.gguf", tmp_path) == [
        PrefillPoint(64, 0, 128.0, 150.0, origin="bench results smol.json"),
        PrefillPoint(64, 1000, 128.0, 180.0, origin="bench results smol.json"),
    ]
    assert saved_points("/models/other.gguf", tmp_path) == []


def test_only_the_newest_sweep_of_the_model_is_read_and_anything_else_is_passed_over(tmp_path):
    old = SweepResult(model={"path": "/m/a.gguf"}, samples=[sample(32, 0, 90.0)])
    new = SweepResult(model={"path": "/m/a.gguf"}, samples=[sample(16, 0, 60.0)])
    os.utime(save_result(old, tmp_path / "old.json"), (1, 1))
    save_result(new, tmp_path / "new.json")
    save_result(ParallelResult(model={"path": "/m/a.gguf"}), tmp_path / "parallel.json")
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "list.json").write_text(json.dumps([1, 2]))
    assert saved_points("/m/a.gguf", tmp_path) == [PrefillPoint(16, 0, 32.0, 60.0, origin="bench results new.json")]
    assert sweep_points({"samples": [s.to_dict() for s in old.samples], "model": {"path": "a.gguf"}}, "/m/a.gguf", "x")
    assert sweep_points({"kind": "parallel", "samples": []}, "/m/a.gguf", "x") == []
    assert saved_points("/m/a.gguf", tmp_path / "missing") == []
