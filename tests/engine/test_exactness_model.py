"""The same reply, on the real default model (greedy): an exact restore (``prefix_cache = exact``) computes the cold
run's first-token logits and KV cells bit for bit with flash attention as chatphase resolves it; a resumed chat's
restored turn computes the in-memory chat's; with flash attention off a restored reply is the cold one every
time and a ``--spec lookup`` reply is plain decode's; each turn states which it is (``logits_exact``)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace

import llama_cpp as lc
import numpy as np
import pytest
from conftest import own_cache_dir

from chatphase.engine import exactness as ex
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, Message, PrefillStarted, SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.local.llama import LlamaEngine

pytestmark = pytest.mark.model

DOC = " ".join(f"Item {i}: the {w} lamp is on shelf {i % 7}." for i, w in enumerate(["red", "blue", "green"] * 9))
CHAT = (Message("user", f"Read this list.\n{DOC}\nWhich shelf holds item 4?"),)
#: small chunks, so a prompt of about 300 tokens is several of them: an exact restore cuts inside it
CONFIG = EngineConfig(n_ctx=1024, n_threads=2, n_batch=128, prefix_cache="exact")


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    own_cache_dir(monkeypatch, tmp_path / "cache")


@dataclass
class Ran:
    """A turn's events and what the context held after it: the last evaluated position's logits (the first
    reply token's, for a turn of ``max_tokens=1``) and sequence 0's state bytes (its KV cells)."""

    started: PrefillStarted
    finished: TurnFinished
    logits: np.ndarray
    state: bytes
    flash_attn_enabled: bool | None


def _engine(info, config: EngineConfig) -> LlamaEngine:
    engine = LlamaEngine(info, config)
    for ev in engine.load():
        if isinstance(ev, EngineFailed):
            pytest.fail(ev.message)
    return engine


def _turn(engine: LlamaEngine, messages=CHAT, max_tokens: int = 1, turn_id: int = 1, store: bool = True) -> Ran:
    started = finished = None
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    request = TurnRequest(turn_id, messages, sampling, prefix_store=store)
    for ev in engine.run_turn(request):
        if isinstance(ev, EngineFailed):
            pytest.fail(ev.message)
        started = ev if isinstance(ev, PrefillStarted) else started
        finished = ev if isinstance(ev, TurnFinished) else finished
    assert started is not None and finished is not None and engine.loaded is not None
    ctx = engine._loaded_kv().ptr
    n_vocab = lc.llama_vocab_n_tokens(engine.vocab.ptr)
    logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
    size = lc.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    assert lc.llama_state_seq_get_data(ctx, buf, size, 0) == size
    return Ran(started, finished, logits, bytes(buf), engine.loaded.settings.flash_attn_enabled)


def _run(info, config: EngineConfig, messages=CHAT, max_tokens: int = 1) -> Ran:
    """One turn in a fresh engine, which saves its cache as it closes."""
    engine = _engine(info, config)
    try:
        return _turn(engine, messages, max_tokens)
    finally:
        engine.close()


def _said(ran: Ran, when_on: str) -> None:
    """The turn's statement: ``when_on`` with flash attention on, exact by ``flash_attn_off`` where it resolved off."""
    m = ran.finished.metrics
    expected = (True, when_on) if ran.flash_attn_enabled is not False else (True, ex.FLASH_ATTN_OFF)
    assert (m.logits_exact, m.logits_exact_reason) == expected


def test_an_exact_restore_computes_the_cold_runs_logits_and_kv_cells(default_model_info):
    cold = _run(default_model_info, CONFIG)
    n = cold.finished.metrics.prompt_tokens
    assert n is not None and n > 2 * CONFIG.n_batch and cold.started.cached_tokens == 0
    _said(cold, ex.COLD_PREFILL)
    last_chunk = (n - 1) // CONFIG.n_batch * CONFIG.n_batch
    for _ in range(2):
        exact = _run(default_model_info, CONFIG)
        # restored up to the cold run's last chunk, which is evaluated again as one batch
        assert exact.started.restored_tokens == last_chunk, exact.started.restore_note
        assert exact.finished.metrics.prefill_tokens == n - last_chunk
        assert np.array_equal(exact.logits, cold.logits), float(np.abs(exact.logits - cold.logits).max())
        assert exact.state == cold.state  # every KV cell, bit for bit
        _said(exact, ex.EXACT_RESTORE)
    fast = _run(default_model_info, replace(CONFIG, prefix_cache="on"))
    assert fast.started.restored_tokens == n - 1  # the last prompt token evaluated alone
    m = fast.finished.metrics
    if fast.flash_attn_enabled is not False:
        assert (m.logits_exact, m.logits_exact_reason) == (False, ex.RESTORED_LAST_TOKEN)


def test_the_same_prompt_again_in_memory_is_computed_as_before_under_exact(default_model_info):
    """A regenerated reply (the same prompt, the cache in memory): ``exact`` evaluates the last chunk again rather
    than the last token alone, so its logits are the first turn's; ``on`` keeps all but the last token."""
    for mode, reason in (("exact", ex.SAME_BATCHES), ("on", ex.CACHE_REUSE)):
        engine = _engine(default_model_info, replace(CONFIG, prefix_cache=mode))
        try:
            first = _turn(engine)
            again = _turn(engine, turn_id=2)
        finally:
            engine._keeper = None  # nothing to save
            engine.close()
        n = first.finished.metrics.prompt_tokens
        m = again.finished.metrics
        if mode == "exact":
            assert n is not None and m.cached_tokens == (n - 1) // CONFIG.n_batch * CONFIG.n_batch
            assert np.array_equal(again.logits, first.logits) and again.state == first.state
            _said(again, reason)
        elif again.flash_attn_enabled is not False:
            assert (m.cached_tokens, m.logits_exact, m.logits_exact_reason) == (n - 1 if n else None, False, reason)


def test_a_resumed_chats_restored_turn_computes_what_the_chat_in_memory_did(default_model_info):
    """With flash attention on, a resumed chat's turn is not a cold prefill of the whole conversation (its earlier
    turns were cut into other batches), but the restored cells are the saving chat's bit for bit: the turn after
    the restore computes the logits the chat computed when it went on in memory."""
    config = replace(CONFIG, prefix_cache="on")  # the whole saved cache is restored: on and exact alike
    saved = _run(default_model_info, config, max_tokens=12)  # closes: its prompt and reply are saved
    follow = (*CHAT, Message("assistant", saved.finished.reply), Message("user", "And item 5?"))
    engine = _engine(default_model_info, config)
    try:  # without the store: the chat computes all of it itself
        _turn(engine, CHAT, max_tokens=12, store=False)
        in_memory = _turn(engine, follow, turn_id=2, store=False)
    finally:
        engine._keeper = None
        engine.close()
    restored = _run(default_model_info, config, follow)
    assert restored.started.restored_tokens == in_memory.started.cached_tokens
    assert np.array_equal(restored.logits, in_memory.logits) and restored.state == in_memory.state
    for ran in (restored, in_memory):
        if ran.flash_attn_enabled is not False:
            m = ran.finished.metrics
            assert (m.logits_exact, m.logits_exact_reason) == (False, ex.CACHE_REUSE)


def test_with_flash_attention_off_a_restored_reply_is_the_cold_one_every_time(default_model_info):
    config = replace(CONFIG, flash_attn="off", prefix_cache="on")
    cold = _run(default_model_info, config, max_tokens=16)
    assert cold.flash_attn_enabled is False and cold.started.cached_tokens == 0
    n = cold.finished.metrics.prompt_tokens
    for _ in range(3):
        restored = _run(default_model_info, config, max_tokens=16)
        assert restored.started.restored_tokens == (n or 0) - 1
        assert restored.finished.reply == cold.finished.reply
        m = restored.finished.metrics
        assert (m.logits_exact, m.logits_exact_reason) == (True, ex.FLASH_ATTN_OFF)


GROUNDED = "Copy this list exactly, line by line:\n" + "\n".join(
    f"{i}. the {w} lamp is on shelf {i % 7}" for i, w in enumerate(["red", "blue", "green"] * 4)
)


def _reply(info, config: EngineConfig) -> TurnFinished:
    engine = _engine(info, replace(config, prefix_cache="off"))
    try:
        return _turn(engine, (Message("user", GROUNDED),), max_tokens=32).finished
    finally:
        engine.close()


def test_with_flash_attention_off_a_lookup_reply_is_plain_decodes_and_says_so(default_model_info):
    off = replace(CONFIG, flash_attn="off")
    plain, spec = _reply(default_model_info, off), _reply(default_model_info, replace(off, spec="lookup"))
    assert spec.metrics.spec_drafted and spec.metrics.spec_accepted  # drafts were verified in batches
    assert spec.reply == plain.reply
    for fin in (plain, spec):
        assert (fin.metrics.logits_exact, fin.metrics.logits_exact_reason) == (True, ex.FLASH_ATTN_OFF)
    auto = _reply(default_model_info, replace(CONFIG, spec="lookup"))
    engine_fa = auto.metrics.logits_exact_reason != ex.FLASH_ATTN_OFF
    if engine_fa and auto.metrics.spec_drafted:
        assert (auto.metrics.logits_exact, auto.metrics.logits_exact_reason) == (False, ex.SPECULATIVE)
