"""The prefix store with real models: a restored prefix answers as a full prefill does (temperature 0, flash
attention off: with it on, only an exact restore of the same prompt is bit-identical to a cold run,
tests/engine/test_exactness_model.py), and a bad file is refused in one line and recomputed."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import own_cache_dir

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, Message, PrefillStarted, SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.local.llama import LlamaEngine
from chatphase.engine.local.prefix_store import list_files, read_entry, read_state, store_dir, write_entry

pytestmark = pytest.mark.model

DOC = " ".join(f"Item {i}: the {w} lamp is on shelf {i % 7}." for i, w in enumerate(["red", "blue", "green"] * 14))
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
CONFIG = EngineConfig(n_ctx=2048, n_threads=2, n_batch=256)


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    """Each test its own prefix store."""
    own_cache_dir(monkeypatch, tmp_path / "cache")


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
    assert engine._keeper is None  # the switch turns the store off
    try:
        return _turn(engine, messages, store=False)[1].reply
    finally:
        engine.close()


@pytest.mark.parametrize("which", ["default", "gemma"])
def test_a_restored_prefix_answers_as_a_full_prefill(which, request):
    """A resumed chat restores its whole conversation and prefills the new message: bit for bit a cold prefill of
    the whole conversation where flash attention is off (with it on, llama.cpp's CPU kernel sums a batch by its
    shape, and the conversation's turns were cut into other batches than one cold prefill cuts: the turn says
    so, ``logits_exact`` false)."""
    info = request.getfixturevalue("default_model_info" if which == "default" else "gemma_model_info")
    config = replace(CONFIG, flash_attn="off")
    messages = _first_chat(info, config)
    (saved,) = [e for _, _, _, e, _ in list_files(store_dir())]
    assert saved is not None, "closing the engine saved its prefix"

    engine = _engine(info, config)
    try:
        started, done = _turn(engine, messages)
        m = done.metrics
    finally:
        engine.close()
    # all of it: the first prompt and the reply's sampled tokens, matched by their text (a resumed chat)
    assert started.restored_tokens == saved.n_tokens > 200, started.restore_note
    assert m.restored_tokens == started.restored_tokens and m.restore_bytes and m.restore_ms is not None
    assert m.cached_tokens == m.restored_tokens and m.prefill_tokens == m.prompt_tokens - m.cached_tokens
    assert m.ttft_ms is not None and m.ttft_ms >= m.restore_ms
    assert done.reply == _cold_reply(info, messages, config)
    assert (m.logits_exact, m.logits_exact_reason) == (True, "flash_attn_off")


def test_a_state_restored_for_other_tokens_answers_otherwise(default_model_info):
    """The equality above has power: the saved state of one document, filed under the tokens of another,
    is restored (the store trusts its files' tokens) and gives another reply than that prompt's prefill —
    so restored tokens or positions that are wrong fail the test above."""
    info = default_model_info
    _first_chat(info)
    (path,) = [p for p, *_ in list_files(store_dir())]
    entry = read_entry(path)
    state = read_state(entry)
    other_doc = DOC.replace("lamp", "cup").replace("shelf", "table") + " Each cup is clean." * 20
    other = (Message("user", f"Read this list.\n{other_doc}\nWhich table holds item 4? And item 5? And item 6?"),)
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
    for bad, why in ((bytes(damaged), "damaged"), (original[: len(original) // 2], "truncated")):
        for other in store_dir().glob("*.kvs"):
            other.unlink()  # what the last close saved
        path.write_bytes(bad)
        engine = _engine(info)
        try:
            started, done = _turn(engine, messages)
        finally:
            engine.close()
        assert not started.restored_tokens and started.cached_tokens == 0
        assert started.restore_note is not None and why in started.restore_note and "\n" not in started.restore_note
        assert done.reply == cold
        assert not path.exists() or path.read_bytes() != bad, "a refused file is removed"
        path.write_bytes(original)
    # another KV type: another key, so the file is not looked at; filed under that key all the same,
    # llama.cpp's own check refuses it (its K type) and the prompt is recomputed
    for other in store_dir().glob("*.kvs"):
        other.unlink()
    path.write_bytes(original)
    entry = read_entry(path)
    state = read_state(entry)
    q8 = _engine(info, replace(CONFIG, type_k="q8_0"))
    try:
        assert q8._keeper is not None and q8._keeper.key != entry.key
        q8_key = q8._keeper.key
        assert not _turn(q8, messages)[0].restored_tokens
    finally:
        q8.close()
    for other in store_dir().glob("*.kvs"):
        other.unlink()
    write_entry(path.parent, q8_key, "f16 state", entry.tokens, entry.ntok, entry.nbytes, entry.text, state)
    q8 = _engine(info, replace(CONFIG, type_k="q8_0"))
    try:
        started, done = _turn(q8, messages)
    finally:
        q8.close()
    assert not started.restored_tokens and "llama.cpp refused its state" in (started.restore_note or "")


def test_a_bench_turn_is_never_saved(default_model_info):
    """A turn that does not ask for the store (a bench sweep's cold prefill) leaves nothing to save at close."""
    engine = _engine(default_model_info)
    try:
        _turn(engine, (Message("user", DOC),), store=False)
    finally:
        engine.close()
    assert list_files(store_dir()) == []


def test_an_idle_engine_saves_and_a_turn_during_the_save_wins(default_model_info, monkeypatch):
    from chatphase.engine.local import prefix_keeper, prefix_store

    monkeypatch.setattr(prefix_keeper, "SAVE_IDLE_S", 0.0)
    monkeypatch.setattr(prefix_store, "WRITE_CHUNK", 64 << 10)
    engine = _engine(default_model_info)
    try:
        _turn(engine, (Message("user", DOC),))
        engine.idle()  # the policy's moment: a save starts, written by a thread
        writer = engine._keeper._writer
        assert writer is not None
        writer.join(30)
        assert [e.n_tokens for _, _, _, e, _ in list_files(store_dir())] == [len(engine.cached_tokens)]

        real = prefix_keeper.write_entry

        def slow(*args, **kwargs):
            abort = args[-1]
            return real(*args[:-1], lambda: time.sleep(0.05) or abort())

        monkeypatch.setattr(prefix_keeper, "write_entry", slow)
        before = {p for p, *_ in list_files(store_dir())}
        _turn(engine, (Message("user", DOC), Message("assistant", "Yes."), Message("user", DOC)), turn_id=2)
        engine.idle()
        writer = engine._keeper._writer
        assert writer is not None and writer.is_alive()
        _turn(engine, (Message("user", "Hi"),), turn_id=3)  # the send wins: the save gives way
        writer.join(30)
        assert {p for p, *_ in list_files(store_dir())} == before
        assert not list(store_dir().glob(".*.part"))
    finally:
        engine._keeper = None  # no save at close: the test looked at what the idle saves did
        engine.close()


def test_ask_runs_sharing_a_prefix_restore_it(monkeypatch):
    """Two `ask` processes with the same long system prompt: the second restores it (`ask --json` shows it)."""
    import json
    import subprocess
    import sys

    monkeypatch.setenv("CHATPHASE_PREFIX_CACHE", "on")
    args = ["ask", "--json", "--temperature", "0", "--max-tokens", "8", "--n-ctx", "2048", "--system", DOC]

    def ask(prompt: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "chatphase", *args, prompt], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["turns"][0]["metrics"]

    first = ask("Which shelf holds item 4?")
    assert first["restored_tokens"] is None
    second = ask("Which shelf holds item 9?")
    assert second["restored_tokens"] and second["restored_tokens"] > 200
    assert second["restore_bytes"] > 0 and second["ttft_ms"] >= second["restore_ms"] > 0
    assert second["cached_tokens"] == second["restored_tokens"]


def test_a_state_of_another_model_filed_under_this_ones_key_is_refused(default_model_info, gemma_model_info):
    """Another model's file has another key and is not looked at; forced under this model's key, llama.cpp's own
    check (its layer count) refuses it: one line, the prompt recomputed, the reply as a cold prefill's."""
    messages = _first_chat(gemma_model_info)
    (path,) = [p for p, *_ in list_files(store_dir())]
    entry = read_entry(path)
    state = read_state(entry)
    engine = _engine(default_model_info)
    try:
        assert engine._keeper is not None and engine._keeper.key != entry.key
        key = engine._keeper.key
        tokens = engine.template.fit(messages, 2048, lambda t, a: engine.tokenize(t, a), None).tokens
    finally:
        engine._keeper = None
        engine.close()
    path.unlink()
    n = min(entry.n_tokens, len(tokens) - 1)
    write_entry(path.parent, key, "gemma state", tokens[:n], [], [], b"", state)
    engine = _engine(default_model_info)
    try:
        started, done = _turn(engine, messages)
    finally:
        engine._keeper = None
        engine.close()
    assert not started.restored_tokens and started.cached_tokens == 0
    assert "llama.cpp refused its state" in (started.restore_note or "")
    assert done.reply == _cold_reply(default_model_info, messages)


def test_a_resumed_turn_misses_only_what_the_restore_did_not_hold(default_model_info):
    """``cache_miss_reason`` after a resume: none when the restored prefix holds the whole conversation before
    the new message; ``restored`` when the store held less of it (here: an exchange it never saw).

    The store is seeded by a turn whose conversation already holds the assistant's message, so the store has that
    text as the template tokenizes it. (A generated reply need not: its tokens can differ from the same text
    tokenized again, " 5" "." against " 5.", and where they do, the restore rightly stops inside it; which
    replies do depends on the machine's greedy output.)"""
    seen = (
        Message("user", f"Read this list.\n{DOC}\nWhich shelf holds item 4?"),
        Message("assistant", "Shelf 4."),
        Message("user", "And item 5?"),
    )
    engine = _engine(default_model_info)
    try:
        _turn(engine, seen)
    finally:
        engine.close()  # saves the prefix
    edited = (*seen[:2], Message("user", "And item 6?"))  # the store holds everything before the newest message
    longer = (*seen, Message("assistant", "Not on any shelf."), Message("user", "And item 6?"))  # never seen
    reasons = []
    for conversation in (edited, longer):
        engine = _engine(default_model_info)
        try:
            started = None
            for ev in engine.run_turn(
                TurnRequest(1, conversation, GREEDY, prefix_store=True, history_change="resumed")
            ):
                if isinstance(ev, EngineFailed):
                    pytest.fail(ev.message)
                started = ev if isinstance(ev, PrefillStarted) else started
        finally:
            engine.close()
        assert started is not None and started.restored_tokens, started and started.restore_note
        reasons.append(started.cache_miss_reason)
    assert reasons == [None, "restored"]


def test_restore_miss_reads_whether_the_restore_reached_the_message_before_the_newest():
    from chatphase.engine.overflow import restore_miss

    text = b"<s>user: a long document<e>\n<s>assistant: shelf 1<e>\n<s>user: And item 5?<e>"
    end = text.find(b"shelf 1") + len(b"shelf 1")
    assert restore_miss(text, end, "shelf 1", "And item 5?") is None  # the template's glue is left: no miss
    assert restore_miss(text, len(text), "shelf 1", "And item 5?") is None
    assert restore_miss(text, end - 3, "shelf 1", "And item 5?") == "restored"  # ended inside the reply
    assert restore_miss(None, 100, "shelf 1", "x") == "restored"  # a token-id prompt: cannot tell


def test_the_count_before_sending_says_what_the_store_would_restore(default_model_info):
    """The budget line's count (``count_prompt``) sees the prefix store as a turn would: a resumed chat's
    saved conversation is counted as restored, not as tokens to prefill."""
    from chatphase.engine.events import CountRequest

    messages = _first_chat(default_model_info)
    engine = _engine(default_model_info)
    try:
        count = engine.count_prompt(CountRequest(messages, GREEDY.max_tokens, None))
        started, _ = _turn(engine, messages)
    finally:
        engine.close()
    # no restore measured yet in this store: its time is not predicted (the first restore measures it)
    assert count is not None and count.cached_tokens == 0 and count.restore_ms is None
    assert count.restore_tokens == started.restored_tokens > 200
    assert count.new_tokens == started.prefill_tokens


def test_a_resumed_overflowed_chat_restores_its_prefix_and_reprefills_nothing(default_model_info):
    # the bug report: after an overflow and a quit, the resumed chat's first turn met the same drop again on a
    # prefix restored from disk and called the new message's tokens a re-prefill (prompt − cached − 1)
    config = replace(CONFIG, n_ctx=512)
    old = tuple(Message(r, f"Note {i}: {DOC[:300]}") for i in range(4) for r in ("user", "assistant"))
    first = (*old, Message("user", "Which shelf holds item 4?"))
    engine = _engine(default_model_info, config)
    try:
        before, done = _turn(engine, first)
    finally:
        engine.close()  # saves the prefix
    assert before.overflow == "drop-oldest" and before.overflow_dropped_messages > 0
    engine = _engine(default_model_info, config)
    try:
        started, finished = _turn(engine, (*first, Message("assistant", done.reply), Message("user", "And 5?")))
    finally:
        engine.close()
    assert (
        started.overflow == "drop-oldest"
        and started.restored_tokens
        and started.cached_tokens == started.restored_tokens
    )
    assert started.overflow_reprefill_tokens == 0 and finished.metrics.overflow_reprefill_tokens == 0


def test_a_store_folder_that_cannot_be_written_is_said_once_at_the_first_turn(default_model_info, monkeypatch):
    """A read-only store folder (faked: root writes through a chmod): the first turn's notice says so, once —
    only the engine log did, and the next run prefilled cold without a word."""
    import errno

    from chatphase.engine.local import prefix_store

    real_open = open
    folder = store_dir()

    def read_only(path, mode="r", *args, **kwargs):
        if "w" in mode and Path(path).parent == folder:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(prefix_store, "open", read_only, raising=False)  # the store's writes: probe and saves
    engine = _engine(default_model_info)
    try:
        started, _ = _turn(engine, (Message("user", "Hi"),))
        assert started.restore_note == (
            f"prefix store: cannot save in {folder} (Read-only file system); a later run or restart prefills this"
            " prompt cold"
        )
        again, _ = _turn(engine, (Message("user", "Hello"),), 2)
        assert again.restore_note is None
    finally:
        engine.close()
    assert list_files(folder) == []


def test_a_save_that_fails_later_is_said_at_the_next_turn(default_model_info, monkeypatch):
    """The disk fills after the store opened: the idle save fails (ENOSPC, faked) and the next turn says so, once."""
    import errno

    from chatphase.engine.local import prefix_keeper

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prefix_keeper, "SAVE_IDLE_S", 0.0)
    monkeypatch.setattr(prefix_keeper, "SAVE_MIN_TOKENS", 1)  # short turns: quick, and saved all the same
    monkeypatch.setattr(prefix_keeper, "SAVE_GROWTH_TOKENS", 1)
    monkeypatch.setattr(prefix_keeper, "write_entry", full)
    engine = _engine(default_model_info)
    try:
        first, _ = _turn(engine, (Message("user", "Hi"),))
        assert first.restore_note is None  # the store could save when it opened
        engine.idle()
        engine._keeper._writer.join(30)
        second, _ = _turn(engine, (Message("user", "Hello"),), 2)
        assert second.restore_note is not None and "(No space left on device)" in second.restore_note
        engine.idle()  # fails again: in the engine log, not said again
        engine._keeper._writer.join(30)
        third, _ = _turn(engine, (Message("user", "Hi there"),), 3)
        assert third.restore_note is None
    finally:
        engine._keeper = None  # no save at close
        engine.close()


def test_ask_says_when_the_store_cannot_save(tmp_path, monkeypatch):
    """`ask` saves only at close, too late to be heard: its turn says that the store cannot save (here a plain
    file where the store's folder should be, which stops root as well)."""
    import subprocess
    import sys

    monkeypatch.setenv("CHATPHASE_PREFIX_CACHE", "on")
    store_dir().parent.mkdir(parents=True, exist_ok=True)
    store_dir().write_text("not a folder\n")
    done = subprocess.run(
        [sys.executable, "-m", "chatphase", "ask", "--no-save", "--max-tokens", "4", "Hi"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    line = f"chatphase: prefix store: cannot save in {store_dir()} ({store_dir()} is not a folder)"
    assert [x for x in done.stderr.splitlines() if x.startswith("chatphase: prefix store")] == [
        f"{line}; a later run or restart prefills this prompt cold"
    ]
