"""Remote prefix save and restore (chatphase/engine/remote/slots.py) against scripted loopback servers, and the
restore rule (chatphase/engine/restore_policy.py). The real llama-server tier is
tests/engine/test_remote_slots_server.py."""

from __future__ import annotations

import json
import re

import pytest
from remote_support import ScriptedServer, content_chunk, sse

from chatphase.engine.events import (
    Message,
    ModelLoaded,
    PrefillStarted,
    SamplingParams,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.remote.engine import RemoteEngine
from chatphase.engine.remote.slots import (
    NO_SLOT_SAVE_NOTE,
    PROBE_ACTION,
    SlotIndex,
    prefix_hash,
    slot_file_name,
)
from chatphase.engine.restore_policy import decide_restore

pytestmark = pytest.mark.timeout(60)

MODELS = {"object": "list", "data": [{"id": "/srv/models/tiny.Q4_0.gguf", "object": "model", "meta": {"size": 1}}]}
PROPS = {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1, "model_path": "/srv/tiny.gguf"}
SAVED = {"id_slot": 0, "filename": "x", "n_saved": 40, "n_written": 4_000_000, "timings": {"save_ms": 4.0}}
RESTORED = {"id_slot": 0, "filename": "x", "n_restored": 40, "n_read": 4_000_000, "timings": {"restore_ms": 2.0}}
GREEDY = SamplingParams(max_tokens=8, temperature=0)


def _stream(cached: int, prompt_n: int = 30, prompt_per_second: float = 100.0, **more: int) -> list:
    timings = {"prompt_n": prompt_n, "prompt_ms": 10.0, "prompt_per_second": prompt_per_second, "cache_n": cached}
    timings.update(more)
    usage = {
        "prompt_tokens": prompt_n + cached,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage, "timings": timings}
    return sse(content_chunk("Hel"), content_chunk("lo"), end, "[DONE]")


def _routes(probe=(400, {"error": {"code": 400, "message": "Invalid action"}}), save=(200, SAVED), cached=0, **more):
    routes = {
        "GET /v1/models": (200, MODELS),
        "GET /props": (200, PROPS),
        f"POST /slots/0?action={PROBE_ACTION}": probe,
        "POST /slots/0?action=save": save,
        "POST /slots/0?action=restore": (200, RESTORED),
        "POST /v1/chat/completions": (200, _stream(cached)),
    }
    routes.update(more)
    return routes


def _engine(url: str) -> RemoteEngine:
    engine = RemoteEngine(url)
    assert isinstance(list(engine.load())[-1], ModelLoaded)
    return engine


def _turn(engine: RemoteEngine, *texts: str) -> tuple[PrefillStarted, TurnFinished]:
    """The turn's ``PrefillStarted`` (which says the prefix store's line) and its ``TurnFinished``."""
    roles = ["user", "assistant"] * len(texts)
    request = TurnRequest(1, tuple(Message(r, t) for r, t in zip(roles, texts, strict=False)), GREEDY)
    events = list(engine.run_turn(request))
    assert isinstance(events[0], PrefillStarted) and isinstance(events[-1], TurnFinished), events
    return events[0], events[-1]


def _paths(srv: ScriptedServer) -> list[str]:
    return [f"{m} {p}" for m, p, _h, _b in srv.requests]


# --- the rule ----------------------------------------------------------------------------------------------


def test_restore_only_when_reading_the_bytes_beats_prefilling_the_tokens():
    """The remote path decides by the one rule (:func:`decide_restore`), with the server's measured rates."""
    d = decide_restore(90 * 2**20, 4096, 1e9, 400.0)  # 0.09 s against 10 s
    assert d.restore and "beats prefill" in d.why
    d = decide_restore(90 * 2**20, 100, 50e6, 400.0)  # 1.9 s against 0.25 s
    assert not d.restore and "beats restore" in d.why
    assert decide_restore(10, 0, 1e9, 400.0).restore is False
    d = decide_restore(10, 100, None, 400.0)
    assert d.restore and d.why == "no read rate measured yet: restoring measures it"
    assert decide_restore(2000, 100, 1000.0, None).restore is True  # no prefill rate yet: restoring is how it is learnt


def test_slot_file_names_are_safe_and_keyed_on_the_model_and_the_opening():
    opening = (Message("system", "Be brief."), Message("user", "Hi"))
    name = slot_file_name("key", "C:\\models\\..\\we ird:*name..gguf", (*opening, Message("assistant", "Hello")))
    assert re.fullmatch(r"chatphase-[A-Za-z0-9._-]+\.slot", name) and ".." not in name
    assert name == slot_file_name("key", "C:\\models\\..\\we ird:*name..gguf", opening)  # one file per chat
    assert name != slot_file_name("other key", "C:\\models\\..\\we ird:*name..gguf", opening)
    assert prefix_hash("key", opening) != prefix_hash("key", opening[:1])


# --- against a scripted llama-server ------------------------------------------------------------------------


def test_a_finished_turn_is_saved_in_the_background_to_its_conversations_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    with ScriptedServer(_routes()) as srv:
        first = _engine(srv.url)
        started, done = _turn(first, "Hi")
        store = first.slots
        assert store is not None
        first.close()  # waits (bounded) for the save
        assert started.restore_note is None and done.metrics.restored_tokens is None
        body = next(b for m, p, _h, b in srv.requests if p == "/v1/chat/completions")
        assert body["id_slot"] == 0  # the chat is pinned to the slot that is saved
        save = next(b for m, p, _h, b in srv.requests if p == "/slots/0?action=save")
        assert save == {"filename": slot_file_name(store.model_key, MODELS["data"][0]["id"], (Message("user", "Hi"),))}
        index = json.loads((tmp_path / "remote-slots.json").read_text())
        assert [(e["tokens"], e["bytes"]) for e in index["files"].values()] == [(40, 4_000_000)]
        assert store.last_save_error is None


def test_resume_on_the_same_server_restores_and_fills_the_restore_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    with ScriptedServer(_routes()) as srv:
        first = _engine(srv.url)
        _turn(first, "Hi")
        first.close()
        srv.routes["POST /v1/chat/completions"] = (200, _stream(cached=38))
        srv.requests.clear()
        resumed = _engine(srv.url)
        started, done = _turn(resumed, "Hi", "Hello", "And then?")
        resumed.close()
        paths = _paths(srv)
        assert paths.index("POST /slots/0?action=restore") < paths.index("POST /v1/chat/completions")
        m = done.metrics
        assert m.restored_tokens == 38  # what the server reused of the 40 restored
        assert m.restore_bytes == 4_000_000 and m.restore_ms is not None and m.restore_ms > 0
        assert m.ttft_ms is not None and m.ttft_ms >= m.restore_ms  # TTFT includes the restore
        assert started.restore_note is not None and started.restore_note.startswith(
            "prefix restore: 40 tok · 3.8 MiB in"
        )
        # that turn's save replaced the file's state with the longer history: resumed again, that is what is
        # restored, and the turn after it finds its prefix in the slot already
        srv.requests.clear()
        again = _engine(srv.url)
        _, one = _turn(again, "Hi", "Hello", "And then?", "Hello", "More?")
        second, two = _turn(again, "Hi", "Hello", "And then?", "Hello", "More?", "Hello", "Again?")
        again.close()
        assert _paths(srv).count("POST /slots/0?action=restore") == 1
        assert one.metrics.restored_tokens == 38 and second.restore_note is None and two.metrics.restored_tokens is None


def test_a_prefix_faster_to_prefill_again_than_a_second_is_not_saved(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    fast = _stream(0, prompt_n=30, prompt_per_second=1000.0, predicted_n=4)  # 34 tok: 34 ms to prefill again
    slow = _stream(0, prompt_n=30, prompt_per_second=20.0, predicted_n=4)  # 1.7 s
    with ScriptedServer(_routes(**{"POST /v1/chat/completions": (200, fast)})) as srv:
        engine = _engine(srv.url)
        _turn(engine, "Hi")
        engine.close()
        assert "POST /slots/0?action=save" not in _paths(srv)
        srv.routes["POST /v1/chat/completions"] = (200, slow)
        engine = _engine(srv.url)
        _turn(engine, "Hi")
        engine.close()
        assert _paths(srv).count("POST /slots/0?action=save") == 1


def test_a_save_cut_short_is_never_restored(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    with ScriptedServer(_routes(save=(500, {"error": {"message": "Unable to save slot"}}))) as srv:
        first = _engine(srv.url)
        _turn(first, "Hi")
        store = first.slots
        first.close()
        assert store is not None and "Unable to save slot" in (store.last_save_error or "")
        srv.requests.clear()
        resumed = _engine(srv.url)
        started, _ = _turn(resumed, "Hi", "Hello", "And then?")
        resumed.close()
        assert "POST /slots/0?action=restore" not in _paths(srv) and started.restore_note is None


def _resume_with_restore_answer(srv: ScriptedServer, answer: tuple) -> tuple[PrefillStarted, TurnFinished, str]:
    """A first chat saves its prefix; a resumed one ("Hi", "Hello", then a new message) gets ``answer`` (status,
    body) to its restore. Returns the resumed turn's ``PrefillStarted`` and ``TurnFinished``, and the engine's
    model key."""
    first = _engine(srv.url)
    _turn(first, "Hi")
    first.close()
    srv.routes["POST /slots/0?action=restore"] = answer
    # a quick turn, not worth saving: what the index holds afterwards is the restore's doing alone
    srv.routes["POST /v1/chat/completions"] = (200, _stream(0, prompt_per_second=1000.0, predicted_n=4))
    resumed = _engine(srv.url)
    started, done = _turn(resumed, "Hi", "Hello", "And then?")
    key = resumed.slots.model_key if resumed.slots else ""
    resumed.close()
    return started, done, key


def test_a_refused_file_is_recomputed_in_one_line_and_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    refused = {
        "error": {
            "code": 400,
            "message": "Unable to restore slot: No available space in KV cache or invalid slot save file",
        }
    }
    with ScriptedServer(_routes()) as srv:
        started, done, key = _resume_with_restore_answer(srv, (400, refused))
        assert done.reply == "Hello" and done.metrics.restored_tokens is None
        note = started.restore_note or ""
        assert "\n" not in note and "was not restored" in note and "the prompt is recomputed" in note
        index = SlotIndex(tmp_path / "remote-slots.json")
        assert index.find(srv.url, prefix_hash(key, (Message("user", "Hi"), Message("assistant", "Hello")))) is None


def test_a_restore_the_server_never_answers_is_not_asked_for_again(tmp_path, monkeypatch):
    """llama-server aborts on a truncated slot file: the file must not be restored on its next start."""
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    with ScriptedServer(_routes()) as srv:
        started, done, key = _resume_with_restore_answer(srv, (200, None))
        assert "the prompt is recomputed" in (started.restore_note or "") and done.reply == "Hello"
        history = (Message("user", "Hi"), Message("assistant", "Hello"))
        assert SlotIndex(tmp_path / "remote-slots.json").find(srv.url, prefix_hash(key, history)) is None


def test_recompute_when_the_measured_rates_say_restoring_is_slower(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    slow = {**RESTORED, "timings": {"restore_ms": 4000.0}}  # 1 MB/s: 4 s, against 40 tokens at 100 tok/s
    with ScriptedServer(_routes(**{"POST /slots/0?action=restore": (200, slow)})) as srv:
        first = _engine(srv.url)
        _turn(first, "Hi")
        first.close()
        second = _engine(srv.url)
        _turn(second, "Hi", "Hello", "And then?")  # restores, and measures the slow read rate
        second.close()
        srv.requests.clear()
        later = _engine(srv.url)
        started, done = _turn(later, "Hi", "Hello", "And then?", "Hello", "More?")
        later.close()
        assert "POST /slots/0?action=restore" not in _paths(srv)
        assert started.restore_note is not None and "not restored" in started.restore_note
        assert "beats restore" in started.restore_note and done.metrics.restored_tokens is None


def test_a_server_without_slot_saving_says_so_once_and_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    off = (501, {"error": {"code": 501, "message": "This server does not support slots action."}})
    with ScriptedServer(_routes(probe=off)) as srv:
        engine = _engine(srv.url)
        (started, one), (second, _) = _turn(engine, "Hi"), _turn(engine, "Hi", "Hello", "More?")
        engine.close()
        assert one.reply == "Hello" and started.restore_note == NO_SLOT_SAVE_NOTE and second.restore_note is None
        bodies = [b for m, p, _h, b in srv.requests if p == "/v1/chat/completions"]
        assert all("id_slot" not in b for b in bodies)
        assert not any("action=save" in p for p in _paths(srv))


def test_bench_prompts_never_touch_the_slots(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    routes = _routes(**{"POST /v1/completions": (200, _stream(0))})
    with ScriptedServer(routes) as srv:
        engine = _engine(srv.url)
        request = TurnRequest(1, (), GREEDY, prompt_token_ids=(1, 2, 3), reset_cache=True)
        assert isinstance(list(engine.run_turn(request))[-1], TurnFinished)
        engine.close()
        assert [p for p in _paths(srv) if "/slots" in p] == []
        assert "id_slot" not in next(b for m, p, _h, b in srv.requests if p == "/v1/completions")


def test_an_answer_that_is_not_llama_servers_slot_api_leaves_the_slots_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))
    router = (400, {"error": {"code": 400, "message": "model name is missing from the request"}})
    with ScriptedServer(_routes(probe=router)) as srv:
        engine = _engine(srv.url)
        started, done = _turn(engine, "Hi")
        engine.close()
        assert done.reply == "Hello" and started.restore_note is None and engine.slots is None
        assert [p for p in _paths(srv) if "/slots" in p] == [f"POST /slots/0?action={PROBE_ACTION}"]


async def test_the_restore_line_is_said_in_the_chat_when_the_prefill_starts():
    from ui_support import idle, make_app, send, wait_for

    from chatphase.ui.transcript.notice import Notice as ChatNotice

    note = "prefix restore: 1,113 tok · 24.5 MiB in 14.2 ms (restore ≈ 7.0 ms < prefill ≈ 2,796 ms)"
    app, _ = make_app(restore_note=note)
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: idle(app) and any(note in str(n.render()) for n in app.query(ChatNotice)))


def test_the_prefix_cache_switch_turns_the_remote_slot_store_off_too():
    """`--prefix-cache off` (or the setting) is one switch for both stores: the factory passes it on."""
    from chatphase.engine.config import EngineConfig
    from chatphase.engine.factory import make_engine

    on = make_engine(None, EngineConfig(), server="http://127.0.0.1:9")
    off = make_engine(None, EngineConfig(prefix_cache="off"), server="http://127.0.0.1:9")
    assert on.prefix_restore is True and off.prefix_restore is False
