"""The thread policy on the real model: threads change in the middle of decode and the turn completes.

The load is scripted (a real machine's load is whatever it is), the thread counts are llama.cpp's own
(``llama_n_threads``); nothing here is timed.
"""

from __future__ import annotations

import pytest

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import (
    Message,
    ModelLoaded,
    PrefillStarted,
    SamplingParams,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.local.llama import LlamaEngine
from chatphase.engine.threads.governor import ThreadGovernor


@pytest.fixture
def engine(default_model_info, tmp_path):
    engine = LlamaEngine(default_model_info, EngineConfig(n_ctx=512), log_path=tmp_path / "engine.log")
    assert isinstance(list(engine.load())[-1], ModelLoaded)
    yield engine
    engine.close()


def scripted_governor(engine, loads, **kwargs):
    """A governor for a 2-core machine whose load samples are ``loads`` (the last repeats), recording
    the thread counts llama.cpp holds after each change."""
    seen = []

    def set_threads(n, nb):
        engine.set_threads(n, nb)
        seen.append(engine.threads_now())

    queue = list(loads)
    gov = ThreadGovernor(2, None, None, set_threads, lambda: queue.pop(0) if len(queue) > 1 else queue[0], **kwargs)
    engine.threads = gov
    return seen


def run(engine, turn_id, max_tokens=48):
    req = TurnRequest(
        turn_id,
        (Message("user", "Count from one to fifty in words."),),
        SamplingParams(max_tokens=max_tokens, temperature=0),
        ignore_eos=True,
    )
    return list(engine.run_turn(req))


def test_threads_go_up_mid_decode_and_the_turn_completes(engine):
    seen = scripted_governor(engine, [1.0, 0.0], up_check_s=0.0)  # busy at the turn's start, then free
    events = run(engine, 1)
    started = next(e for e in events if isinstance(e, PrefillStarted))
    assert (started.n_threads_prefill, started.n_threads_decode) == (1, 1)
    assert started.threads_reason.startswith("2 → 1: one core busy elsewhere")
    finished = events[-1]
    assert isinstance(finished, TurnFinished)
    m = finished.metrics
    assert m.stop_reason == "length" and m.decode_tokens == 48
    assert sum(e.n_tokens for e in events if isinstance(e, TokensDecoded)) == 47
    assert seen[0] == (1, 1) and seen[1] == (2, 1)  # llama.cpp holds the new decode count, prefill's stays
    # on a busy machine the gaps may take the thread away again: at least the one change happened
    assert m.n_threads_prefill == 1 and m.decode_thread_changes == len(seen) - 1 >= 1
    assert "1 → 2 at token" in m.threads_reason and "both cores free again" in m.threads_reason
    assert engine.threads_now()[0] == m.n_threads_decode == seen[-1][0]


def test_the_next_turn_chooses_again_and_reuses_the_cache(engine):
    # load samples: turn 1's start (quiet), its end, turn 2's start (busy); no sample in between
    seen = scripted_governor(engine, [0.0, 0.0, 1.0], up_check_s=1e6)
    first = run(engine, 1, max_tokens=8)[-1].metrics
    second = run(engine, 2, max_tokens=8)[-1].metrics
    assert (first.n_threads_prefill, second.n_threads_prefill, second.n_threads_decode) == (2, 1, 1)
    assert seen[0] == (2, 2) and seen[-1] == (1, 1)
    assert second.cached_tokens > 0 and second.decode_tokens == 8


def test_pinned_threads_are_what_llama_cpp_runs(default_model_info, tmp_path):
    engine = LlamaEngine(default_model_info, EngineConfig(n_ctx=512, n_threads=1), log_path=tmp_path / "e.log")
    loaded = list(engine.load())[-1].model
    try:
        assert loaded.settings.threads_policy == "fixed"
        m = run(engine, 1, max_tokens=4)[-1].metrics
        assert (m.n_threads_prefill, m.n_threads_decode, m.decode_thread_changes) == (1, 1, 0)
        assert m.threads_reason == "1: fixed (--threads)"
        assert engine.threads_now() == (1, 1)
    finally:
        engine.close()
