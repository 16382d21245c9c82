"""Remote prefix save and restore against a real llama-server, built from the vendored llama.cpp source by
``scripts/llama_build.sh`` (``.ci/run`` builds it before pytest), serving the bundled default model with
``--slot-save-path`` in a temporary folder, one slot, a small context and no RAM prompt cache (``--cache-ram 0``:
what the slot held is gone once erased, as after a restart). Where the tools are not built these tests skip,
unless ``CHATPHASE_REQUIRE_LLAMA_TOOLS=1`` turns the skip into a failure. The scripted-server tests are
tests/engine/test_remote_slots.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import own_cache_dir
from remote_support import free_port, stop_process

from benchmarks import harness
from chatphase.chat.controller import ChatController
from chatphase.chat.dispatch import InlineDispatcher
from chatphase.chat.recording import SessionRecording
from chatphase.engine.events import (
    Message,
    ModelLoaded,
    PrefillStarted,
    SamplingParams,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.remote import slots
from chatphase.engine.remote.engine import RemoteEngine, remote_model_info
from chatphase.engine.remote.slots import NO_SLOT_SAVE_NOTE
from chatphase.sessions.catalog import load_session
from chatphase.settings.schema import Settings

pytestmark = [pytest.mark.model, pytest.mark.timeout(240)]

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, seed=1)
FIRST = "Name three colours."
SECOND = "And one more?"


def _llama_server() -> str:
    """llama-server from the cached build (skips, or fails under CHATPHASE_REQUIRE_LLAMA_TOOLS=1, when not built)."""
    folder = harness.tools_dir()
    exe = folder / "llama-server" if folder is not None else None
    if exe is None or not exe.is_file():
        message = "llama-server is not built: run scripts/llama_build.sh"
        if os.environ.get("CHATPHASE_REQUIRE_LLAMA_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return str(exe)


def _start(model: str, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """llama-server on a free loopback port with chatphase's repacking choice; ``(process, url)`` once healthy."""
    port = free_port()
    args = ["-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", "512", "-np", "1", "-t", "2"]
    args += ["--cache-ram", "0", *extra, *harness.repack_args("llama-server", harness.repack())]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [_llama_server(), *args], stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=harness.tool_env()
        )
    url = f"http://127.0.0.1:{port}"
    if harness.wait_ready(proc, url, 90):
        return proc, url
    stop_process(proc)
    pytest.fail(f"llama-server did not start: {log.read_text(errors='replace')[-2000:]}")


@pytest.fixture(scope="module")
def saving(default_model_path, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """``(url, slot folder)`` of a llama-server started with ``--slot-save-path``."""
    base = tmp_path_factory.mktemp("slots")
    (base / "save").mkdir()
    proc, url = _start(str(default_model_path), base / "server.log", "--slot-save-path", str(base / "save"))
    yield url, base / "save"
    stop_process(proc)


@pytest.fixture(autouse=True)
def _own_index(tmp_path, monkeypatch):
    own_cache_dir(monkeypatch, tmp_path)  # the client's index of saves, this test's own
    # these chats are short: on a quiet machine they prefill again faster than a save is worth
    monkeypatch.setattr(slots, "MIN_SAVE_RECOMPUTE_S", 0.0)


def _engine(url: str, **kw) -> RemoteEngine:
    engine = RemoteEngine(url, read_timeout_s=120, **kw)
    assert isinstance(list(engine.load())[-1], ModelLoaded)
    return engine


def _turn(engine: RemoteEngine, *texts: str) -> tuple[PrefillStarted, TurnFinished]:
    """The turn's ``PrefillStarted`` (which says the prefix store's line) and its ``TurnFinished``."""
    roles = ["user", "assistant"] * len(texts)
    messages = tuple(Message(r, t) for r, t in zip(roles, texts, strict=False))
    events = list(engine.run_turn(TurnRequest(1, messages, GREEDY)))
    assert isinstance(events[0], PrefillStarted) and isinstance(events[-1], TurnFinished), events
    return events[0], events[-1]


def _erase(url: str) -> None:
    """Empty slot 0, as a restarted server's is."""
    assert httpx.post(f"{url}/slots/0?action=erase", timeout=30, trust_env=False).status_code == 200


def _full_prefill(url: str, *texts: str) -> TurnFinished:
    """The turn from an empty slot, with prefix restore off."""
    _erase(url)
    engine = _engine(url, prefix_restore=False)
    try:
        _, done = _turn(engine, *texts)
    finally:
        engine.close()
    assert done.metrics.cached_tokens == 0 and done.metrics.restored_tokens is None
    return done


def _first_chat(url: str) -> str:
    """One finished turn, saved when its engine closes; its reply."""
    engine = _engine(url)
    try:
        reply = _turn(engine, FIRST)[1].reply
    finally:
        engine.close()  # waits (bounded) for the save
    assert reply
    return reply


def test_a_resumed_chat_restores_its_saved_prefix_and_replies_as_a_full_prefill(saving):
    url, folder = saving
    reply = _first_chat(url)
    assert [p.suffix for p in folder.iterdir()] == [".slot"]
    _erase(url)  # the server forgets the slot, as after a restart
    resumed = _engine(url)
    try:
        started, done = _turn(resumed, FIRST, reply, SECOND)
    finally:
        resumed.close()
    m = done.metrics
    assert m.restored_tokens is not None and m.restored_tokens > 0, started.restore_note
    assert m.restored_tokens == m.cached_tokens  # every token reused came from the file
    assert m.restore_bytes is not None and m.restore_bytes > 0 and m.restore_ms is not None
    assert m.ttft_ms is not None and m.ttft_ms >= m.restore_ms
    assert (started.restore_note or "").startswith("prefix restore: ")
    assert done.reply == _full_prefill(url, FIRST, reply, SECOND).reply  # temperature 0: the same reply


def test_a_resumed_session_restores_through_the_chat_and_records_the_restore(saving):
    """``chat --resume ID --server URL``: the controller sends the session's history; the session keeps the
    restore's figures with the turn's metrics."""
    url, _folder = saving
    settings = Settings(sampling=GREEDY)

    def chat_on(url: str) -> tuple[ChatController, SessionRecording]:
        chat = ChatController(
            settings, remote_model_info(url, None), lambda info, s: RemoteEngine(url), InlineDispatcher(), []
        )
        recording = SessionRecording(chat)
        chat.add_listener(recording)
        chat.start_engine()
        return chat, recording

    chat, recording = chat_on(url)
    chat.send(FIRST)
    chat.close()  # quit: waits (bounded) for the save
    first = recording.writer.id if recording.writer else ""
    _erase(url)
    resumed, _ = chat_on(url)
    resumed.restore(load_session(first))
    resumed.send(SECOND)
    resumed.close()
    last = load_session(first).turns[-1]
    assert last.metrics is not None and last.metrics.restored_tokens, last
    assert last.metrics.restore_bytes and last.metrics.restore_ms is not None


def test_a_damaged_file_is_refused_in_one_line_and_the_prompt_recomputed(saving):
    url, folder = saving
    reply = _first_chat(url)
    for f in folder.iterdir():  # a damaged header; a truncated file would abort llama-server (slots.py says why)
        data = bytearray(f.read_bytes())
        data[:8] = b"\xff" * 8
        f.write_bytes(bytes(data))
    _erase(url)
    resumed = _engine(url)
    try:
        started, done = _turn(resumed, FIRST, reply, SECOND)
    finally:
        resumed.close()
    note = started.restore_note or ""
    assert "was not restored" in note and "recomputed" in note and "\n" not in note
    assert done.metrics.restored_tokens is None and done.metrics.cached_tokens == 0
    assert done.reply == _full_prefill(url, FIRST, reply, SECOND).reply


def test_a_server_without_slot_save_path_says_so_in_one_line_and_answers(default_model_path, tmp_path):
    proc, url = _start(str(default_model_path), tmp_path / "server.log")
    try:
        engine = _engine(url)
        try:
            started, done = _turn(engine, FIRST)
        finally:
            engine.close()
    finally:
        stop_process(proc)
    assert done.reply and started.restore_note == NO_SLOT_SAVE_NOTE
