"""Lever grids (``bench`` with comma lists): parsing, combination, the roofline's prediction per cell on
scripted inputs, the interleaved order of a run on scripted engines, and the CLI's checks."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
from bench_support import CharTokenizer, ScriptedTokenEngine
from fake_engine import fake_model_info
from test_bench_results import make_cell

from chatphase.bench.core.peaks import MachinePeaks
from chatphase.bench.core.prompts import PromptBuilder
from chatphase.bench.grid.levers import GridPoint, LeverGrid, parse_lever, predict, ratio
from chatphase.bench.grid.run import GridDone, GridRun
from chatphase.bench.sweep.loop import SweepPlan, SweepProgress
from chatphase.cli import main
from chatphase.commands.bench import split_levers
from chatphase.engine.config import EngineConfig
from chatphase.errors import UsageError

PEAKS = MachinePeaks(10e9, "read", 1e11, "matmul", threads=2)


def test_lists_parse_like_llama_bench():
    assert parse_lever("type_k", "F16, q8_0,q4_0") == ("f16", "q8_0", "q4_0")
    assert parse_lever("n_ubatch", "64,256,512") == (64, 256, 512)
    assert parse_lever("n_threads", "1,auto") == (1, "auto")
    assert parse_lever("model", "a.gguf,b.gguf,a.gguf") == ("a.gguf", "b.gguf")  # duplicates dropped
    with pytest.raises(UsageError, match="expected whole numbers"):
        parse_lever("n_ubatch", "64,big")
    with pytest.raises(UsageError, match="empty item"):
        parse_lever("type_v", "f16,,q8_0")


def test_grid_is_the_product_model_slowest():
    grid = LeverGrid({"model": ("a", "b"), "n_threads": (1, 2), "n_ubatch": (64,)})
    points, notes = grid.points()
    assert [p.values for p in points] == [
        {"model": "a", "n_ubatch": 64, "n_threads": 1},
        {"model": "a", "n_ubatch": 64, "n_threads": 2},
        {"model": "b", "n_ubatch": 64, "n_threads": 1},
        {"model": "b", "n_ubatch": 64, "n_threads": 2},
    ]
    assert notes == [] and grid.varying == ("model", "n_threads")
    assert points[1].label() == "model=a t=2"  # only the varying levers
    assert points[1].engine_overrides() == {"n_ubatch": 64, "n_threads": 2, "n_threads_batch": 2}
    assert GridPoint({"n_threads": "auto"}).engine_overrides() == {"n_threads": None, "n_threads_batch": None}
    assert GridPoint({"flash_attn": "auto"}).engine_overrides() == {"flash_attn": "auto"}  # a valid setting
    assert not LeverGrid({"type_k": ("q8_0",)}).is_sweep


def test_quantised_v_without_flash_attention_is_left_out_with_a_note():
    points, notes = LeverGrid({"type_v": ("f16", "q8_0"), "flash_attn": ("on", "off")}).points()
    assert [(p.values["type_v"], p.values["flash_attn"]) for p in points] == [
        ("f16", "on"),
        ("f16", "off"),
        ("q8_0", "on"),
    ]
    assert notes == ["left out ctv=q8_0 fa=off: llama.cpp needs flash attention for a quantised V cache"]
    with pytest.raises(UsageError, match="no valid combination"):
        LeverGrid({"type_v": ("q8_0", "q4_0"), "flash_attn": ("off",)}).points()
    with pytest.raises(UsageError, match="at most"):
        LeverGrid({"n_ubatch": tuple(range(1, 26))}).points()


def test_prediction_on_scripted_inputs():
    # depth cell: 1000 cached + 4 evaluated, 8 generated -> decodes at 1004 + 4 = 1008 tokens of context
    cell = make_cell("depth", 1004, 1000, gen=8, ttft=[10.0], prefill=[100.0], decode=[40.0])
    p = predict(PEAKS, weight_bytes=100_000_000, n_params=50_000_000, kv_bytes_per_token=1000, cell=cell,
                prefill_bounded=True)  # fmt: skip
    assert p.step_bytes == 100_000_000 + 1000 * 1008
    assert p.decode_tokens_per_s == pytest.approx(10e9 / (100_000_000 + 1_008_000))
    assert p.prefill_tokens_per_s == pytest.approx(1e11 / 1e8) == 1000
    assert p.ttft_ms == pytest.approx(4.0)  # 4 evaluated tokens at 1000 tok/s
    assert ratio(40.0, p.decode_tokens_per_s) == pytest.approx(40.0 / p.decode_tokens_per_s)
    assert ratio(None, 3.0) is None and ratio(3.0, 0.0) is None
    # a quantised cache reads fewer KV bytes, so its bound is higher at the same depth
    q8 = predict(PEAKS, weight_bytes=100_000_000, n_params=50_000_000, kv_bytes_per_token=531, cell=cell,
                 prefill_bounded=True)  # fmt: skip
    assert q8.decode_tokens_per_s > p.decode_tokens_per_s


def test_a_run_interleaves_points_round_by_round():
    info = fake_model_info()
    engines: list[ScriptedTokenEngine] = []

    def factory(i, cfg):
        engines.append(ScriptedTokenEngine())
        engines[-1].cfg = cfg
        return engines[-1]

    grid = LeverGrid({"n_ubatch": (64, 128), "type_k": ("f16", "q8_0")})
    points, _ = grid.points()
    plan = SweepPlan(prompt_lengths=(10,), depths=(0,), gen_tokens=3, reps=2, warmup=1)
    run = GridRun(
        points, {None: info}, EngineConfig(n_ctx=256, n_threads=2), plan, engine_factory=factory, peaks={2: PEAKS},
        builder=PromptBuilder(CharTokenizer()),
    )  # fmt: skip
    events = list(run)
    progress = [e for e in events if isinstance(e, SweepProgress)]
    assert len(progress) == 4 * 2 * 3 and progress[-1].total_runs == 24
    # round by round: each engine ran its two cells once before any ran a second time
    order = [e for e in events if isinstance(e, SweepProgress)]
    assert [s.sample.rep for s in order[:8]] == [0] * 8 and all(s.sample.warmup for s in order[:8])
    # levers vary in LEVERS order, the cache type slower than the ubatch
    assert [(e.cfg.type_k, e.cfg.n_ubatch) for e in engines] == [("f16", 64), ("f16", 128), ("q8_0", 64), ("q8_0", 128)]
    assert all(e.closed for e in engines) and all(len(e.requests) == 6 for e in engines)
    result = events[-1].result
    assert isinstance(events[-1], GridDone) and len(result.cells) == 8
    assert {c.point for c in result.cells} == {p.label() for p in points}
    assert all(c.prediction is not None and c.ratios()["decode_tokens_per_s"] for c in result.cells)
    text = result.render("table")
    assert "ctk=q8_0 ub=64" in text and "measured / predicted" in text
    assert result.render("csv").splitlines()[0].startswith("point,kind,prompt_tokens")


def _args(**kw):
    base = dict(model=None, type_k=None, type_v=None, flash_attn=None, n_ubatch=None, n_threads=None)
    return argparse.Namespace(**{**base, **kw})


def test_split_levers_puts_single_values_back_for_the_plain_bench(tmp_path):
    args = _args(n_ubatch="128", n_threads="2", type_k="Q8_0")
    grid = split_levers(args)
    assert not grid.is_sweep and (args.n_ubatch, args.n_threads, args.type_k) == (128, 2, "q8_0")
    args = _args(n_threads="1,2", flash_attn="on")
    grid = split_levers(args)
    assert grid.is_sweep and args.n_threads is None and args.flash_attn == "on"
    with pytest.raises(UsageError, match="choose from"):
        split_levers(_args(type_v="f16,q9_9"))
    odd = tmp_path / "a,b.gguf"
    odd.write_bytes(b"GGUF")
    args = _args(model=str(odd))
    assert not split_levers(args).is_sweep and args.model == str(odd)
    with pytest.raises(UsageError, match="at least 1"):
        split_levers(_args(n_threads="0,1"))


def test_cli_refuses_a_grid_with_parallel_in_one_line(capsys):
    assert main(["bench", "--threads", "1,2", "--parallel", "1,2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "chatphase: --parallel does not apply to a lever grid (comma lists in the levers)"
    )
    assert main(["bench", "--cache-type-k", "f16,nope"]) == 2
    assert "choose from" in capsys.readouterr().err


@pytest.mark.model
def test_a_grid_runs_from_the_cli_on_a_tiny_synthetic_model(tmp_path, capsys):
    import json

    from chatphase.models.synth import plan, write_synthetic
    from chatphase.models.synth_shapes import SHAPES

    model = write_synthetic(plan(SHAPES["tiny-llama"], "Q4_0"), tmp_path / "tiny.gguf")
    argv = ["bench", "--model", str(model), "--cache-type-k", "f16,q8_0", "--cache-type-v", "f16,q8_0",
            "--flash-attn", "on", "--threads", "1", "--prompt-lengths", "32", "--depths", "64", "--gen", "4",
            "--reps", "1", "--warmup", "0", "--n-ctx", "256", "--no-roofline", "--format", "json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    cells = data["grid"]
    assert len(cells) == 4 * 2  # 4 cache-type combinations × (one prompt cell + one depth cell)
    assert {c["point"] for c in cells} == {f"ctk={k} ctv={v}" for k in ("f16", "q8_0") for v in ("f16", "q8_0")}
    for c in cells:
        assert c["synthetic"] and c["decode_tokens_per_s"]["mean"] > 0 and c["prediction"] is None
        # what llama.cpp printed (MiB, 2 decimals) agrees with the formula for each cache type
        assert abs(c["llama_kv_cache_bytes"] - c["kv_capacity_bytes"]) <= 0.005 * 2**20
    by_point = {c["point"]: c["kv_bytes_per_token"] for c in cells}
    assert by_point["ctk=f16 ctv=f16"] == 1024 and by_point["ctk=q8_0 ctv=q8_0"] == 544


def test_a_kv_cache_lever_that_loses_says_why_in_the_bench_output():
    """`bench --cache-type-k/-v f16,q8_0` on scripted engines: q8_0 reads fewer KV bytes (the roofline predicts
    it faster at depth) but its attention costs more per token of context (measured slower), as on a CPU."""

    class KvTyped(ScriptedTokenEngine):
        """Reports the cache types it was configured with, as the real engine's loaded settings do."""

        def __init__(self, cfg):
            q8 = cfg.type_k == "q8_0"
            super().__init__(kv_bytes_per_token=60_000 if q8 else 114_000, decode_ms_per_depth=0.02 if q8 else 0.01)
            self.cfg = cfg

        def load(self):
            for event in super().load():
                settings = replace(event.model.settings, type_k=self.cfg.type_k, type_v=self.cfg.type_v)
                yield replace(event, model=replace(event.model, settings=settings))

    def factory(i, cfg):
        return KvTyped(cfg)

    points, _ = LeverGrid({"type_k": ("f16", "q8_0"), "type_v": ("f16", "q8_0")}).points()
    points = [p for p in points if p.values["type_k"] == p.values["type_v"]]
    plan = SweepPlan(prompt_lengths=(), depths=(0, 1000), gen_tokens=3, reps=1, warmup=0)
    run = GridRun(
        points, {None: fake_model_info()}, EngineConfig(n_ctx=2048, n_threads=2, flash_attn="on"), plan,
        engine_factory=factory, peaks={2: PEAKS}, builder=PromptBuilder(CharTokenizer()),
    )  # fmt: skip
    text = list(run)[-1].result.render("table")
    assert "lever lost: ctk=q8_0 ctv=q8_0 decodes at 0." in text and "of ctk=f16 ctv=f16 at depth 1000" in text
    assert "attention dequantises the q8_0 cache" in text and "ms over its shallowest depth" in text


def test_partial_while_running_holds_the_runs_so_far_as_a_cancelled_result():
    """What a second Ctrl+C prints (``chatphase bench`` with a grid, as every experiment): the points' runs
    measured so far, warm-ups left out, marked cancelled; nothing before an engine loaded."""
    points, _ = LeverGrid({"n_ubatch": (64, 128)}).points()
    plan = SweepPlan(prompt_lengths=(10,), depths=(0,), gen_tokens=3, reps=2, warmup=0)
    run = GridRun(
        points, {None: fake_model_info()}, EngineConfig(n_ctx=256, n_threads=2), plan,
        engine_factory=lambda i, cfg: ScriptedTokenEngine(), peaks={2: PEAKS}, builder=PromptBuilder(CharTokenizer()),
    )  # fmt: skip
    assert run.partial() is None
    events = iter(run)
    for event in events:
        if isinstance(event, SweepProgress) and event.done_runs == 5:  # round 1's four runs, then one more
            break
    done = run.partial()
    assert isinstance(done, GridDone) and done.result.cancelled
    reps = {(c.point, c.cell.kind): c.cell.reps for c in done.result.cells}
    assert reps == {("ub=64", "prompt"): 2, ("ub=64", "depth"): 1, ("ub=128", "prompt"): 1, ("ub=128", "depth"): 1}
    assert "CANCELLED" in done.result.render("table")
    events.close()
