"""The count request across the process boundary, on the default model: what ``count_prompt`` says before a
turn is what the turn then evaluates (prompt tokens, cached tokens), and it never disturbs a turn."""

from __future__ import annotations

import pytest

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import (
    CountRequest,
    Message,
    ModelLoaded,
    PrefillStarted,
    SamplingParams,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.process.host import EngineHost

pytestmark = pytest.mark.model

SHORT = SamplingParams(max_tokens=8, temperature=0)


def _prefill(events) -> PrefillStarted:
    return next(e for e in events if isinstance(e, PrefillStarted))


def test_the_count_is_what_the_next_turn_evaluates(default_model_info, tmp_path):
    host = EngineHost(default_model_info, EngineConfig(n_ctx=512), log_path=str(tmp_path / "engine.log"))
    try:
        assert host.count_prompt(CountRequest((Message("user", "hi"),))) is None  # not loaded yet
        assert isinstance(list(host.load())[-1], ModelLoaded)
        first = (Message("user", "Name a colour."),)
        before = host.count_prompt(CountRequest(first, SHORT.max_tokens, texts=("one two three",)))
        assert before is not None and before.cached_tokens == 0 and before.kv_cache_tokens == 0
        assert before.text_tokens[0] >= 3 and before.n_ctx == 512
        events = list(host.run_turn(TurnRequest(1, first, SHORT)))
        assert _prefill(events).prompt_tokens == before.prompt_tokens
        reply = next(e for e in events if isinstance(e, TurnFinished))
        second = (*first, Message("assistant", reply.reply), Message("user", "And another one?"))
        count = host.count_prompt(CountRequest(second, SHORT.max_tokens))
        assert count is not None and count.kv_cache_tokens == reply.metrics.kv_cache_tokens
        # a caller that stops reading at TurnFinished leaves the turn's end marker in the pipe: passed over
        seen = None
        for event in host.run_turn(TurnRequest(2, second, SHORT)):
            if isinstance(event, PrefillStarted):
                seen = (event.prompt_tokens, event.cached_tokens)
                assert host.count_prompt(CountRequest(second)) is None  # a turn is open: no count now
            if isinstance(event, TurnFinished):
                break
        assert seen == (count.prompt_tokens, count.cached_tokens) and count.cached_tokens > 0
        too_long = host.count_prompt(CountRequest((Message("user", "word " * 600),), SHORT.max_tokens))
        assert too_long is not None and too_long.prompt_tokens is None and too_long.new_tokens is None
        assert "tokens with the template; the context leaves room for 504" in (too_long.too_long or "")
    finally:
        host.close()
    assert host.count_prompt(CountRequest((Message("user", "hi"),))) is None  # closed
