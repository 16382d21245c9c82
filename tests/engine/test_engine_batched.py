"""The batched engine on the real default model: N sequences prefilled together, then one ``llama_decode`` of N
tokens per step; the same prompt at temperature 0 writes the same text in every sequence."""

from __future__ import annotations

import llama_cpp as lc
import pytest

from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder
from chatphase.engine.batching import BatchRequest
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import ModelLoaded, SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.local import batched
from chatphase.engine.local.amx_probe import amx_verdict
from chatphase.engine.local.batched import BatchedEngine


@pytest.fixture
def engine(default_model_info, tmp_path):
    eng = BatchedEngine(
        default_model_info, EngineConfig(n_ctx=1024, n_seq_max=4, n_threads=1), log_path=tmp_path / "engine.log"
    )
    events = list(eng.load())
    assert isinstance(events[-1], ModelLoaded), events
    yield eng
    eng.close()


def _record_decodes(monkeypatch) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """Wrap llama.cpp's ``llama_decode`` as the engine calls it: (n_tokens, seq ids, positions) per call."""
    calls = []
    real = lc.llama_decode

    def spy(ctx, batch):
        n = batch.n_tokens
        calls.append((n, tuple(batch.seq_id[i][0] for i in range(n)), tuple(batch.pos[i] for i in range(n))))
        return real(ctx, batch)

    monkeypatch.setattr(batched.lc, "llama_decode", spy)
    return calls


def test_four_sequences_decode_in_one_batch_and_write_the_same_text(engine, monkeypatch):
    prompt = PromptBuilder(EngineTokenizer(engine)).tokens(40)
    calls = _record_decodes(monkeypatch)
    out = engine.run_batch(BatchRequest((prompt,) * 4, gen_steps=8))

    assert out.stop_reason == "length", out.error
    prefill, steps = calls[:-8], calls[-8:]
    assert sum(n for n, _, _ in prefill) == 4 * 40 and len(prefill) == 1  # 160 tokens fit one n_batch chunk
    for i, (n, seqs, positions) in enumerate(steps):  # each step: one llama_decode of 4 tokens, one per sequence
        assert n == 4 and seqs == (0, 1, 2, 3) and positions == (40 + i,) * 4
    assert out.decode_batch_tokens == (4,) * 8 and len(out.step_end_ns) == 8
    assert all(len(t) == 9 for t in out.tokens)  # the first token from the prefill, then one per step
    assert len(set(out.texts)) == 1 and out.texts[0].strip()
    # llama.cpp's own view of the cache: every sequence holds its prompt and 8 decoded tokens
    assert engine.sequence_lengths() == [48] * 4
    assert out.kv_cache_tokens == 4 * 48 and out.kv_cache_bytes == 4 * 48 * engine.loaded.kv_bytes_per_token
    times = [out.t_prefill_start_ns, out.t_prefill_end_ns, out.t_decode_start_ns, *out.step_end_ns]
    assert times == sorted(times) and all(
        out.t_prefill_start_ns < t <= out.t_prefill_end_ns for t in out.first_token_ns
    )


def test_prompts_across_chunks_each_get_their_first_token(engine, monkeypatch):
    builder = PromptBuilder(EngineTokenizer(engine))
    prompts = (builder.tokens(150), builder.tokens(150), builder.tokens(20))  # 320 tokens: chunks of 256 + 64
    calls = _record_decodes(monkeypatch)
    out = engine.run_batch(BatchRequest(prompts, gen_steps=3))
    assert [n for n, _, _ in calls] == [256, 64, 3, 3, 3]
    assert out.texts[0] == out.texts[1] and all(len(t) == 4 for t in out.tokens)
    assert out.first_token_ns[0] < out.first_token_ns[1] == out.first_token_ns[2]  # seq 0 ends in chunk 1


def test_cache_cleared_per_run_and_chat_turns_still_work(engine):
    prompt = PromptBuilder(EngineTokenizer(engine)).tokens(16)
    first = engine.run_batch(BatchRequest((prompt, prompt), 4))
    again = engine.run_batch(BatchRequest((prompt, prompt), 4))
    assert first.texts == again.texts and again.kv_cache_tokens == 2 * 20
    events = list(
        engine.run_turn(TurnRequest(1, prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=4, temperature=0)))
    )
    finished = events[-1]
    assert isinstance(finished, TurnFinished) and finished.metrics.cached_tokens == 0
    assert finished.reply == first.texts[0][: len(finished.reply)]  # the single-sequence path agrees


def test_cancel_and_bad_requests(engine):
    prompt = PromptBuilder(EngineTokenizer(engine)).tokens(16)
    engine.cancel()
    out = engine.run_batch(BatchRequest((prompt,) * 2, 4))
    assert out.stop_reason == "cancelled" and out.step_end_ns == ()
    with pytest.raises(ValueError, match="1 to 4"):
        engine.run_batch(BatchRequest((prompt,) * 5, 4))
    with pytest.raises(ValueError, match="256 cells"):  # n_ctx 1024 / 4 sequences
        engine.run_batch(BatchRequest((prompt,), 250))


def test_amx_safety_applies_to_the_batched_path(engine):
    s = engine.loaded.settings
    assert s.n_seq_max == 4 and engine.n_ctx_seq == 256
    # extra buffer types off exactly on AMX CPUs whose llama.cpp build failed the AMX probe
    assert s.use_extra_bufts is (not s.amx_detected or amx_verdict().safe)
