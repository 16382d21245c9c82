"""Side by side (chatphase/bench/compare/, chatphase compare): sides from KEY=VALUE, turns alternating, each side
its own conversation, the ratios, failures and the saved form — on scripted engines (tests/fake_engine.py), whose
metrics are known in advance; one real run on the default model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fake_engine import FakeEngine, FakeTiming, fake_model_info

from chatphase.bench.compare.plan import ComparePlan, parse_side, read_turns
from chatphase.bench.compare.result import CompareResult
from chatphase.bench.compare.run import WARMUP_TOKENS, CompareRun
from chatphase.bench.core.events import RunDone
from chatphase.bench.experiments import EXPERIMENTS, load_result
from chatphase.errors import EngineError, UsageError
from chatphase.settings.schema import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_a_side_is_config_keys_read_as_the_environment_reads_them():
    assert parse_side("type_k=q8_0, n_gpu_layers=auto,model=gemma") == {
        "type_k": "q8_0", "n_gpu_layers": None, "model": "gemma",
    }  # fmt: skip
    assert parse_side("flash-attn=off") == {"flash_attn": "off"}
    for text, words in (
        ("type_k", "KEY=VALUE"),
        ("colour=red", "no setting is called 'colour'"),
        ("temperature=1", "the comparison's own"),
        ("n_ctx=lots", "expected an integer"),
        ("type_k=q9", "type_k must be one of"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_side(text)


def test_turns_are_the_paragraphs_of_a_file(tmp_path):
    f = tmp_path / "chat.txt"
    f.write_text("Name three colours.\n\nWhich one\nis warmest?\n\n\n\nWhy?\n", encoding="utf-8")
    assert read_turns(str(f)) == ("Name three colours.", "Which one is warmest?", "Why?")
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00")
    for name, words in (("empty.txt", "holds no turn"), ("bad.txt", "cannot read"), ("missing.txt", "cannot read")):
        with pytest.raises(ValueError, match=words):
            read_turns(str(tmp_path / name))


def test_the_plan_needs_a_second_side_and_turns():
    with pytest.raises(UsageError, match="side B"):
        ComparePlan(turns=("hi",)).validate(None)
    with pytest.raises(UsageError, match="turns"):
        ComparePlan(turns=("hi", " "), b={"type_k": "q8_0"}).validate(None)
    with pytest.raises(UsageError, match="at most 32"):
        ComparePlan(turns=("hi",) * 33, b={"type_k": "q8_0"}).validate(None)


def fakes(slow_side: str = "B", crash: str | None = None):
    """An engine factory making a FakeEngine per side; side ``slow_side`` prefills and decodes twice as slowly.
    Returns ``(factory, engines by side label)``."""
    engines: dict[str, FakeEngine] = {}

    def factory(info, settings):
        side = "B" if settings.engine.type_k == "q8_0" else "A"
        slow = side == slow_side
        timing = FakeTiming(prefill_ms_per_token=4.0 if slow else 2.0, decode_ms_per_token=40.0 if slow else 20.0)
        replies = [f"{side} says one", f"{side} says two", f"{side} says three"]
        engine = FakeEngine(info, settings.engine, timing=timing, replies=replies,
                            crash_at="decode" if crash == side else None, crash_turn=2)  # fmt: skip
        engines[side] = engine
        return engine

    return factory, engines


def run_all(run) -> tuple[list, RunDone]:
    events = list(run)
    assert isinstance(events[-1], RunDone)
    return events[:-1], events[-1]


def test_turns_alternate_each_side_keeps_its_conversation_and_the_ratios_follow():
    factory, engines = fakes()
    plan = ComparePlan(turns=("one", "two", "three"), b={"type_k": "q8_0"}, gen_tokens=16)
    run = CompareRun(fake_model_info(), Settings(), plan, engine_factory=factory)
    events, done = run_all(run)
    order = [(e.turn.turn, e.turn.side) for e in events if hasattr(e, "turn")]
    assert order == [(0, "A"), (0, "B"), (1, "B"), (1, "A"), (2, "A"), (2, "B")]
    # each side's prompt holds its own replies, never the other side's
    last_b = engines["B"].requests[-1].messages
    assert [m.content for m in last_b if m.role == "assistant"] == ["B says one", "B says two"]
    result: CompareResult = done.result
    assert not result.cancelled and [s.name for s in result.sides] == ["A", "B"]
    for r in result.ratios():
        assert r["decode_tokens_per_s"] == pytest.approx(0.5)
    first = result.ratios()[0]
    assert first["ttft_ms"] > 1 and first["prefill_tokens_per_s"] == pytest.approx(0.5, rel=0.2)
    assert result.differences() == {"type_k": ("f16", "q8_0")}
    # greedy and capped for both (each engine's first request is its warm-up)
    assert {e.requests[1].sampling.temperature for e in engines.values()} == {0.0}
    assert {e.requests[1].sampling.max_tokens for e in engines.values()} == {16}


def test_each_side_warms_up_once_uncounted_so_the_first_side_does_not_pay_the_first_evaluation():
    """A process's first evaluation after a load pays for what later ones find ready (scripted here as 500 ms more
    prefill on the machine's first evaluation, which warms the weights both sides read): without a warm-up, side A,
    first on turn 1, paid it in its TTFT and turn 1's ratio B/A said B was much faster than it is."""
    warm = []
    factory, engines = fakes(slow_side="none")

    class FirstEvaluationSlow(FakeEngine):
        def run_turn(self, request):
            timing = self.timing
            if not warm:
                warm.append(request)
                self.timing = replace(timing, prefill_once_ms=timing.prefill_once_ms + 500)
            try:
                yield from super().run_turn(request)
            finally:
                self.timing = timing

    def slow_first(info, settings):
        engine = factory(info, settings)
        engine.__class__ = FirstEvaluationSlow
        return engine

    plan = ComparePlan(turns=("one", "two"), b={"type_k": "q8_0"}, gen_tokens=16)
    _, done = run_all(CompareRun(fake_model_info(), Settings(), plan, engine_factory=slow_first))
    result: CompareResult = done.result
    assert result.ratios()[0]["ttft_ms"] == pytest.approx(1.0, rel=0.05)  # equal sides look equal on turn 1
    assert [(t.turn, t.side) for t in result.turns] == [(0, "A"), (0, "B"), (1, "B"), (1, "A")]  # none counted
    for engine in engines.values():
        warm_up, first = engine.requests[0], engine.requests[1]
        assert warm_up.sampling.max_tokens == WARMUP_TOKENS and warm_up.sampling.temperature == 0.0
        assert [m.content for m in first.messages if m.role != "system"] == ["one"]  # not in the conversation
    assert "warm-up turn first, not counted" in result.render("table")


def test_two_equal_sides_are_refused_before_anything_loads():
    plan = ComparePlan(turns=("hi",), b={"type_k": "f16"})
    run = CompareRun(fake_model_info(), Settings(), plan, engine_factory=lambda *_: pytest.fail("loaded"))
    with pytest.raises(UsageError, match="the same"):
        run.side_settings()
    with pytest.raises(UsageError, match="the same"):
        list(run)


def test_a_side_that_fails_mid_turn_ends_the_run_with_one_line_and_keeps_what_ran():
    factory, _ = fakes(crash="B")
    plan = ComparePlan(turns=("one", "two"), b={"type_k": "q8_0"})
    run = CompareRun(fake_model_info(), Settings(), plan, engine_factory=factory)
    with pytest.raises(EngineError, match="side B, turn 2"):
        list(run)
    partial = run.partial_done().result
    assert partial.cancelled and [(t.turn, t.side) for t in partial.turns] == [(0, "A"), (0, "B")]


def test_a_result_saves_renders_and_loads_back(tmp_path):
    factory, _ = fakes()
    plan = ComparePlan(turns=("one", "two"), b={"type_k": "q8_0"})
    _, done = run_all(CompareRun(fake_model_info(), Settings(), plan, engine_factory=factory))
    path = tmp_path / "compare.json"
    path.write_text(done.result.to_json(), encoding="utf-8")
    back = load_result(path)
    assert isinstance(back, CompareResult) and back.turns == done.result.turns
    assert EXPERIMENTS["compare"].plan_from_dict(json.loads(path.read_text())["settings"]["plan"]) == plan
    table = back.render("table")
    assert "0.50×" in table and "never at once" in table and "type_k: A 'f16', B 'q8_0'" in table
    md = back.render("md")
    assert md.startswith("### chatphase bench") and "| turn | TTFT B/A |" in md
    assert back.render("csv").splitlines()[0].startswith("turn,side,position,")
    assert EXPERIMENTS["compare"].plot([back], tmp_path / "c.png").stat().st_size > 10_000


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, CHATPHASE_DATA_DIR=os.environ.get("CHATPHASE_DATA_DIR", ""))
    return subprocess.run([sys.executable, "-m", "chatphase", "compare", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)  # fmt: skip


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, words in (
        (("hi",), "--b"),
        (("--b", "colour=red", "hi"), "no setting is called"),
        (("--b", "type_k=f16", "hi"), "the same"),
        (("--b", "type_k=q8_0"), "turns"),
        (("--b", "type_k=q8_0", "--turns", str(tmp_path / "none.txt")), "cannot read"),
        (("--b", "type_k=q8_0", "--format", "xml", "hi"), "--format"),
    ):
        proc = run_cli(*args, timeout=120)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr, (args, proc.stderr)


@pytest.mark.timeout(900)
def test_the_default_model_against_a_q8_0_kv_cache_in_json(tmp_path):
    out = tmp_path / "c.json"
    proc = run_cli("--b", "type_k=q8_0", "--gen", "8", "--format", "json", "-o", str(out), "Hi.", "And then?")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["kind"] == "compare" and len(data["turns"]) == 4
    b = next(t for t in data["turns"] if t["side"] == "B" and t["turn"] == 1)
    assert b["cached_tokens"] > 0  # its own first exchange stayed in its KV cache
    kv = [r["kv_cache_bytes"] for r in data["ratios"]]
    assert all(0.4 < r < 0.8 for r in kv), kv  # q8_0 K beside f16 V: (8.5/8 ÷ 2 + 1) ÷ 2 ≈ 0.77


def test_both_sides_start_without_the_disk_prefix_store_unless_a_side_names_it():
    """A store filled by earlier runs would restore one side's first prompt and not the other's (seen: side A's
    first TTFT 20 ms, restored, beside B's cold 290 ms)."""
    plan = ComparePlan(turns=("hi",), b={"type_k": "q8_0"})
    a, b = CompareRun(fake_model_info(), Settings(), plan).side_settings()
    assert a.engine.prefix_cache == b.engine.prefix_cache == "off"
    on = ComparePlan(turns=("hi",), b={"prefix_cache": "on"})
    a, b = CompareRun(fake_model_info(), Settings(), on).side_settings()
    assert (a.engine.prefix_cache, b.engine.prefix_cache) == ("off", "on")
