"""The prefix store with real models: a restored prefix answers as a full prefill does (temperature 0),
and a bad file is refused in one line and recomputed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, Message, PrefillStarted, SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.local.llama import LlamaEngine
from chatphase.engine.local.prefix_store import list_files, read_entry, read_state, store_dir, write_entry

pytestmark = pytest.mark.model

DOC = " ".join(f"Item {i}: the {w} lamp is on shelf {i % 7}." for i, w in enumerate(["red", "blue", "green"] * 40))
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
CONFIG = EngineConfig(n_ctx=2048, n_threads=2, n_batch=256)


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    """Each test its own prefix store."""
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path / "cache"))


def _turn(engine: LlamaEngine, messages: tuple[Message, ...], turn_id: int = 1, store: bool = True):
    started = finished = None
    for ev in engine.run_turn(TurnRequest(turn_id, messages, GREEDY, prefix_store=store)):
        if isinstance(ev, EngineFailed):
            pytest.fail(ev.message)
        if isinstance(ev, PrefillStarted):
            started = ev
        if isinstance(ev, TurnFinished):
            finished = ev
    assert started is not None and finished is not None
    return started, finished


def _engine(info, config: EngineConfig = CONFIG) -> LlamaEngine:
    engine = LlamaEngine(info, config)
    for ev in engine.load():
        if isinstance(ev, EngineFailed):
            pytest.fail(ev.message)
    return engine


def _first_chat(info, config: EngineConfig = CONFIG) -> tuple[Message, ...]:
    """One turn over a long document, then the engine closes (saving its prefix): the conversation so far."""
    first = (Message("user", f"Read this list.\n{DOC}\nWhich shelf holds item 4?"),)
    engine = _engine(info, config)
    try:
        _, done = _turn(engine, first)
    finally:
        engine.close()
    return (*first, Message("assistant", done.reply), Message("user", "And item 5?"))


def _cold_reply(info, messages, config: EngineConfig = CONFIG) -> str:
    engine = _engine(info, replace(config, prefix_cache="off"))
    try:
        return _turn(engine, messages, store=False)[1].reply
    finally:
        engine.close()


@pytest.mark.parametrize("which", ["default", "gemma"])
def test_a_restored_prefix_answers_as_a_full_prefill(which, request):
    info = request.getfixturevalue("default_model_info" if which == "default" else "gemma_model_info")
    messages = _first_chat(info)
    assert [p for p, *_ in list_files(store_dir())], "closing the engine saved its prefix"

    engine = _engine(info)
    try:
        started, done = _turn(engine, messages)
        m = done.metrics
    finally:
        engine.close()
    assert started.restored_tokens and started.restored_tokens > 300, started.restore_note
    assert m.restored_tokens == started.restored_tokens and m.restore_bytes and m.restore_ms is not None
    assert m.cached_tokens == m.restored_tokens and m.prefill_tokens == m.prompt_tokens - m.cached_tokens
    assert m.ttft_ms is not None and m.ttft_ms >= m.restore_ms
    assert done.reply == _cold_reply(info, messages)


def test_a_state_restored_for_other_tokens_answers_otherwise(default_model_info):
    """The equality above has power: the saved state of one document, filed under the tokens of another,
    is restored (the store trusts its files' tokens) and gives another reply than that prompt's prefill —
    so restored tokens or positions that are wrong fail the test above."""
    info = default_model_info
    _first_chat(info)
    (path,) = [p for p, *_ in list_files(store_dir())]
    entry = read_entry(path)
    state = read_state(entry)
    other = (
        Message("user", "Read this list.\n" + DOC.replace("lamp", "cup").replace("shelf", "table") + "\nWhich table?"),
    )
    engine = _engine(info)
    try:
        tokens = engine.template.fit(other, 2048, lambda t, a: engine.tokenize(t, a), None).tokens
    finally:
        engine.close()
    assert len(tokens) > entry.n_tokens
    path.unlink()
    write_entry(path.parent, entry.key, "swapped", tokens[: entry.n_tokens], [], [], b"", state)
    engine = _engine(info)
    try:
        started, done = _turn(engine, other)
    finally:
        engine.close()
    assert started.restored_tokens == entry.n_tokens
    assert done.reply != _cold_reply(info, other)


def test_a_damaged_truncated_or_foreign_file_is_refused_and_the_prompt_recomputed(default_model_info, tmp_path):
    info = default_model_info
    messages = _first_chat(info)
    cold = _cold_reply(info, messages)
    (path,) = [p for p, *_ in list_files(store_dir())]
    original = path.read_bytes()
    damaged = bytearray(original)
    damaged[-1000] ^= 0xFF
    for bad in (bytes(damaged), original[: len(original) // 2]):
        path.write_bytes(bad)
        engine = _engine(info)
        try:
            started, done = _turn(engine, messages)
        finally:
            engine.close()
        assert not started.restored_tokens and started.cached_tokens == 0
        assert started.restore_note is None or "\n" not in started.restore_note
        assert done.reply == cold
        assert not path.exists() or path.read_bytes() != bad, "a refused file is removed"
        path.write_bytes(original)
    # another KV type: another key, the file is not even looked at; with the key forced equal, llama.cpp refuses
    q8 = replace(CONFIG, type_k="q8_0")
    engine = _engine(info, q8)
    try:
        started, done = _turn(engine, messages)
    finally:
        engine.close()
    assert not started.restored_tokens
