"""Speculative decoding (``--spec``) on the real default model: the reply is plain decode's, byte for byte at
temperature 0 and token for token with a fixed seed above it, across prompt kinds; stop strings and the
thinking budget land where plain decode puts them; the figures add up. Plus the pure parts (the lookup, the
auto policy, the metrics formulas, the mode's parsing)."""

from __future__ import annotations

import itertools

import pytest

from chatphase.bench.spec.arms import verify_cost
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import (
    EngineFailed,
    FirstToken,
    Message,
    ModelLoaded,
    SamplingParams,
    ThinkingEnded,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.local.drafters import LookupDrafter
from chatphase.engine.local.llama import LlamaEngine
from chatphase.engine.metrics import spec_figures
from chatphase.engine.spec_modes import SpecMode, parse_spec
from chatphase.errors import UsageError

CODE = """def parse_line(line):
    name, _, value = line.partition("=")
    return name.strip(), value.strip()


def read_config(path):
    settings = {}
    with open(path) as handle:
        for line in handle:
            if line.strip() and not line.startswith("#"):
                name, value = parse_line(line)
                settings[name] = value
    return settings
"""
TEXT = (
    "The lighthouse at Cape Wren was built in 1871 from granite quarried on the island. Its lamp burned "
    "whale oil until 1902, then kerosene, and since 1958 it has been electric. The keeper's cottage is now a "
    "museum that keeps the logbooks of eleven keepers."
)
#: input-grounded prompts (the reply copies from the prompt: drafts get accepted) and open-ended ones.
PROMPTS = (
    f"Rewrite this code with the function read_config renamed to load_config:\n\n{CODE}",
    f"Summarise this text, quoting its first sentence:\n\n{TEXT}",
    "Write a short story about a fox.",
    "What is the capital of France?",
)
MODES = ("lookup", "draft:default", "auto")


def make(info, tmp_path, spec, **config):
    engine = LlamaEngine(
        info, EngineConfig(**{"n_ctx": 1024, "spec": spec, **config}), log_path=tmp_path / f"{spec}.log"
    )
    events = list(engine.load())
    assert isinstance(events[-1], ModelLoaded), events
    return engine


@pytest.fixture(scope="module")
def engines(default_model_info, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spec")
    made = {spec: make(default_model_info, tmp, spec) for spec in ("off", *MODES)}
    yield made
    for engine in made.values():
        engine.close()


def turn(engine, prompt, **sampling):
    sp = SamplingParams(**{"max_tokens": 40, "temperature": 0, **sampling})
    events = list(engine.run_turn(TurnRequest(1, (Message("user", prompt),), sp, reset_cache=True)))
    assert not [e for e in events if isinstance(e, EngineFailed)], events
    finished = events[-1]
    assert isinstance(finished, TurnFinished)
    return events, finished


def streamed(events) -> str:
    return "".join(e.text for e in events if isinstance(e, (FirstToken, TokensDecoded)))


@pytest.mark.parametrize("spec", MODES)
def test_a_greedy_reply_is_byte_identical_to_plain_decode(engines, spec):
    drafted = accepted = 0
    for prompt in PROMPTS:
        _plain_events, plain = turn(engines["off"], prompt)
        events, fin = turn(engines[spec], prompt)
        assert fin.reply == plain.reply and streamed(events) == fin.reply, prompt
        m, p = fin.metrics, plain.metrics
        assert (m.decode_tokens, m.stop_reason, m.kv_cache_tokens) == (
            p.decode_tokens,
            p.stop_reason,
            p.kv_cache_tokens,
        )
        assert engines[spec].cached_tokens == engines["off"].cached_tokens  # rejected drafts left the KV cache
        assert p.spec_mode is None and m.spec_mode == spec.split(":")[0]
        drafted, accepted = drafted + m.spec_drafted, accepted + m.spec_accepted
    assert accepted > 0  # drafting happened: the identity is not plain decode's with itself
    if spec == "draft:default":  # the model drafting for itself: its greedy drafts are the target's choices
        # but where two logits nearly tie: a batch and a one-token evaluation differ in the last bits
        assert accepted / drafted >= 0.85


def test_the_grounded_prompt_is_drafted_well_by_lookup(engines):
    _events, fin = turn(engines["lookup"], PROMPTS[0], max_tokens=60)
    m = fin.metrics
    assert m.spec_acceptance > 0.3 and m.spec_tokens_per_step > 1.5
    assert m.spec_steps < m.decode_tokens - 1  # fewer target steps than tokens
    assert m.spec_plain_step_ms > 0 and m.spec_verify_step_ms > 0 and m.spec_speedup > 0


@pytest.mark.parametrize("seed", [1, 7, 42])
def test_with_a_seed_a_sampled_reply_is_plain_decodes_token_for_token(engines, seed):
    """Each sampled token takes one draw of the sampler's random stream, in reply order, in both modes, so
    the same seed gives the same reply (where batched and one-token logits agree, as they do here)."""
    kw = {"temperature": 0.9, "seed": seed, "max_tokens": 40}
    for prompt in PROMPTS[:2]:
        _e, plain = turn(engines["off"], prompt, **kw)
        _e, spec = turn(engines["lookup"], prompt, **kw)
        assert spec.reply == plain.reply
        assert spec.metrics.decode_tokens == plain.metrics.decode_tokens


def test_live_figures_and_drafted_spans(engines):
    events, fin = turn(engines["lookup"], PROMPTS[0], max_tokens=60)
    tokens = [e for e in events if isinstance(e, TokensDecoded)]
    lives = [e.spec for e in tokens if e.spec is not None]
    assert lives and lives[-1].steps <= fin.metrics.spec_steps
    assert all(a.steps <= b.steps and a.accepted <= b.accepted for a, b in itertools.pairwise(lives))
    spans = [e for e in tokens if e.drafted_spans]
    assert spans and all(e.drafted_spans == ((0, len(e.text)),) for e in spans)
    assert len(spans) <= fin.metrics.spec_accepted


def test_verify_steps_are_timed_and_leave_the_cache_empty(engines):
    """The verify-cost sweep's steps (``bench --spec``): k tokens after a context, timed, gone from the KV cache
    after; the next turn, reusing nothing, writes the reply it wrote before."""
    engine = engines["off"]
    _events, before = turn(engine, PROMPTS[3])
    tokens = engine.tokenize(CODE)
    ms = engine.time_verify_steps(tokens[:64], [tokens[64:65], tokens[64:68], tokens[64:65]])
    assert len(ms) == 3 and all(t > 0 for t in ms) and engine.cached_tokens == []
    sp = SamplingParams(max_tokens=40, temperature=0)
    after = list(engine.run_turn(TurnRequest(2, (Message("user", PROMPTS[3]),), sp)))[-1]
    assert isinstance(after, TurnFinished) and after.reply == before.reply and after.metrics.cached_tokens == 0


def test_verify_cost_medians_per_k(default_model_info):
    costs = verify_cost(default_model_info, EngineConfig(n_ctx=512), depth=32, ks=(1, 4), reps=2)
    assert list(costs) == [1, 4] and all(ms > 0 for ms in costs.values())


def test_a_stop_string_inside_a_verified_batch(default_model_info, tmp_path):
    """The completion format stops at the next ``\\nUser:`` line, written as text: the lookup drafts it from
    the prompt's own dialogue, so the marker lands inside a batch; the reply ends before it, as plain."""
    prompt = "\n".join(f"User: what is {a} plus {a}?\nAssistant: {a} plus {a} is {2 * a}." for a in range(2, 9))
    prompt += "\nUser: what is 9 plus 9?"
    replies = {}
    for spec in ("off", "lookup"):
        engine = make(default_model_info, tmp_path, spec, chat_template="completion")
        try:
            _events, fin = turn(engine, prompt, max_tokens=60)
        finally:
            engine.close()
        replies[spec] = fin
    assert replies["lookup"].reply == replies["off"].reply
    assert replies["off"].metrics.stop_reason == replies["lookup"].metrics.stop_reason
    assert "User:" not in replies["lookup"].reply


def test_a_thinking_budget_closes_where_plain_decode_closes(thinking_model_info, tmp_path):
    question = Message("user", "Repeat after me: one two three four five six seven eight.")
    results = {}
    for spec in ("off", "lookup"):
        engine = make(thinking_model_info, tmp_path, spec)
        try:
            sp = SamplingParams(max_tokens=32, temperature=0, think_budget=6)
            events = list(engine.run_turn(TurnRequest(1, (question,), sp, reset_cache=True)))
        finally:
            engine.close()
        (ended,) = [e for e in events if isinstance(e, ThinkingEnded)]
        results[spec] = (ended.forced, ended.thinking_tokens, events[-1].reply, events[-1].thinking)
    assert results["lookup"] == results["off"]
    assert results["off"][:2] == (True, 6)


def test_the_default_model_drafting_for_itself_is_said_at_load(default_model_info, tmp_path):
    from chatphase.engine.spec_modes import SPEC_WARNING

    engine = make(default_model_info, tmp_path, "draft:default", n_ctx=256)
    try:
        (note,) = [n for n in engine.loaded.notes if n.startswith(SPEC_WARNING)]
        assert "is the target model itself" in note
    finally:
        engine.close()


def test_a_draft_model_of_another_vocabulary_is_refused(default_model_info, gemma_model_info, tmp_path):
    engine = LlamaEngine(
        default_model_info, EngineConfig(n_ctx=256, spec=f"draft:{gemma_model_info.path}"), log_path=tmp_path / "e.log"
    )
    try:
        (event,) = list(engine.load())
    finally:
        engine.close()
    assert isinstance(event, EngineFailed) and event.fatal
    assert "cannot draft for this model" in event.message and "tokens" in event.message


def test_a_recurrent_model_bypasses_speculation_with_a_note(default_model_info, tmp_path, monkeypatch):
    import chatphase.engine.local.drafters as drafters

    monkeypatch.setattr(drafters.lc, "llama_model_is_recurrent", lambda model: True)
    engine = make(default_model_info, tmp_path, "lookup", n_ctx=256)
    try:
        assert engine.loaded.spec_mode == "off"
        assert any("speculative decoding off" in n and "recurrent" in n for n in engine.loaded.notes)
        _events, fin = turn(engine, "Hi", max_tokens=4)
        assert fin.metrics.spec_mode is None
    finally:
        engine.close()


# -- the pure parts ---------------------------------------------------------------------------------


def test_lookup_proposes_what_followed_the_latest_earlier_occurrence():
    d = LookupDrafter(n=2)
    hist = [1, 2, 3, 4, 9, 1, 2, 5, 6, 7, 1, 2]
    assert d.propose(hist, 3) == [5, 6, 7]  # the later of the two earlier "1 2"
    assert d.propose([*hist, 5], 2) == [6, 7]  # "2 5" seen once, the index grew by one token
    assert d.propose([*hist, 5, 8], 4) == []  # "5 8" never seen
    assert d.propose([1, 2], 0) == []


def test_lookup_does_not_propose_the_current_ngram_itself():
    d = LookupDrafter(n=2)
    assert d.propose([1, 2], 4) == []
    assert d.propose([1, 2, 1, 2], 4) == [1, 2]


def test_spec_figures_formulas():
    ms = 1_000_000
    # steps: plain 10 ms (1 token), verify 20 ms (4 drafted, 3 accepted: 4 tokens), verify 15 ms (2 drafted, 0: 1)
    f = spec_figures("lookup", 0, [10 * ms, 30 * ms, 45 * ms], [1, 4, 1], [0, 4, 2], [0, 3, 0], [True, False, False])
    assert (f["spec_drafted"], f["spec_accepted"], f["spec_steps"]) == (6, 3, 3)
    assert f["spec_acceptance"] == pytest.approx(0.5)
    assert f["spec_accepted_per_step"] == pytest.approx(1.5)
    assert f["spec_tokens_per_step"] == pytest.approx(2.0)
    assert f["spec_verify_step_ms"] == pytest.approx(17.5) and f["spec_plain_step_ms"] == pytest.approx(10.0)
    assert f["spec_speedup"] == pytest.approx(10.0 * 6 / 45)
    assert f["step_ms_p50"] == pytest.approx(15.0)
    none = spec_figures("auto", 0, [5 * ms], [1], [3], [0], [False])
    assert none["spec_plain_step_ms"] is None and none["spec_speedup"] is None and none["spec_acceptance"] == 0
    with pytest.raises(ValueError):
        spec_figures("lookup", 0, [ms], [1], [1], [2], [False])
    with pytest.raises(ValueError):
        spec_figures("lookup", 5 * ms, [ms], [1], [0], [0], [True])


def test_parse_spec():
    assert parse_spec(None) == SpecMode("off") and parse_spec("LOOKUP") == SpecMode("lookup")
    assert parse_spec("draft:models/small.gguf") == SpecMode("draft", "models/small.gguf")
    for bad in ("draft:", "fast", "draft"):
        with pytest.raises(UsageError):
            parse_spec(bad)
    with pytest.raises(UsageError):
        EngineConfig(spec="nope").validate()


# -- on screen --------------------------------------------------------------------------------------


def _spec_metrics(**kw):
    from chatphase.engine.metrics import compute_turn_metrics

    ms = 1_000_000
    figures = spec_figures("lookup", 10 * ms, [20 * ms, 30 * ms], [1, 4], [0, 4], [0, 3], [True, False])
    return compute_turn_metrics(
        t_submit_ns=0,
        t_prefill_start_ns=ms,
        t_prefill_end_ns=5 * ms,
        token_times_ns=[10 * ms, 20 * ms, 27 * ms, 28 * ms, 29 * ms, 30 * ms],
        prompt_tokens=10,
        cached_tokens=0,
        kv_cache_tokens=15,
        kv_bytes_per_token=1,
        kv_capacity_bytes=100,
        stop_reason="stop",
        spec=figures,
        **kw,
    )


def test_the_phase_line_and_the_history_show_the_figures():
    from chatphase.engine.events import SpecLive
    from chatphase.engine.spec_modes import spec_figures_text
    from chatphase.ui.dashboard.history_table import format_row
    from chatphase.ui.dashboard.turn_detail import metric_pairs
    from chatphase.ui.phases.indicator import spec_done, spec_live

    assert spec_figures_text("lookup", 2.7, 0.68, 1.6) == "lookup · 2.7 tok/step · 68 % accepted · ×1.6"
    assert spec_live(SpecLive("auto", 0, 0, 0, 0)) == "auto"  # nothing known yet
    m = _spec_metrics()
    assert (m.spec_tokens_per_step, m.spec_speedup) == (2.5, pytest.approx(10 * 5 / 20))
    assert spec_done(m) == " · lookup · 2.5 tok/step · 75 % accepted · ×2.5"
    assert format_row(3, m)[-1] == "stop\n2.5×2.5"
    pairs = dict(metric_pairs(m))
    assert pairs["decode mode"] == "lookup" and pairs["drafted / accepted"] == "4 / 3 (75%)"
    assert pairs["speed-up"] == "×2.50" and pairs["target steps"] == "2"
