"""SessionRecording as a listener of the chat controller: what reaches the session file, without Textual."""

from __future__ import annotations

from chat_support import make_chat

from chatphase.chat.listener import ChatListener
from chatphase.chat.recording import SessionRecording
from chatphase.engine.events import SamplingParams
from chatphase.sessions.catalog import list_sessions, load_session
from chatphase.sessions.export import export_session, rows_from_csv
from chatphase.settings.schema import Settings


def recorded_chat(**kw):
    chat, _engines, _calls = make_chat(**kw)
    recording = SessionRecording(chat)
    chat.add_listener(recording)
    chat.start_engine()
    chat.dispatcher.drain()
    return chat, recording


def say(chat, *texts):
    for text in texts:
        chat.send(text)
        chat.dispatcher.drain()


def test_turns_are_recorded_with_their_metrics():
    chat, recording = recorded_chat(replies=["one", "two"])
    say(chat, "what is prefill", "and decode")
    s = load_session(recording.writer.id)
    assert [(t.user, t.reply, t.status) for t in s.turns] == [
        ("what is prefill", "one", "complete"),
        ("and decode", "two", "complete"),
    ]
    assert all(t.metrics is not None for t in s.turns) and s.settings["n_ctx"] == 4096


def test_taken_back_turns_are_marked_replaced():
    chat, recording = recorded_chat()
    say(chat, "one", "two")
    chat.regenerate()
    chat.dispatcher.drain()
    chat.take_back_last()
    say(chat, "two, edited")
    s = load_session(recording.writer.id)
    assert [(t.user, t.replaced) for t in s.turns] == [
        ("one", False),
        ("two", True),
        ("two", True),
        ("two, edited", False),
    ]
    assert [m for m in s.history() if m.role != "system"] == chat.conversation


def test_a_refused_message_is_not_recorded():
    chat, recording = recorded_chat(settings=Settings().with_overrides(n_ctx=40))
    say(chat, "word " * 60)
    assert recording.writer is None and list_sessions() == []
    say(chat, "hi")
    assert [t.user for t in load_session(recording.writer.id).turns] == ["hi"]


def test_a_new_chat_is_a_new_session_and_a_restored_one_continues_its_file():
    chat, recording = recorded_chat()
    say(chat, "first")
    first = recording.writer.id
    chat.new_chat()
    say(chat, "a new topic")
    second = recording.writer.id
    assert first != second and {s.id for s in list_sessions()} == {first, second}
    chat.new_chat()
    chat.restore(load_session(first))
    say(chat, "back again")
    s = load_session(first)
    assert recording.writer.id == first and [t.user for t in s.turns] == ["first", "back again"]
    assert [t.index for t in s.turns] == [1, 2]


def test_a_write_error_is_reported_once_and_the_chat_goes_on(monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("CHATPHASE_DATA_DIR", str(blocker))
    errors = []
    chat, _engines, _ = make_chat()
    chat.add_listener(SessionRecording(chat, on_error=errors.append))
    chat.start_engine()
    chat.dispatcher.drain()
    say(chat, "one", "two")
    assert len(errors) == 1 and "cannot save the session" in errors[0]
    assert len(chat.conversation) == 4


def test_each_turn_keeps_the_sampling_it_was_generated_with_across_a_resume():
    """A chat at temperature 0 resumed without the flag: the old turns still export at 0.0, the new one
    at the new temperature, and the Markdown says each turn's where they differ."""
    chat, recording = recorded_chat(settings=Settings(sampling=SamplingParams(temperature=0.0)))
    say(chat, "one", "two")
    first = recording.writer.id
    chat2, _ = recorded_chat()  # a TUI started without --temperature
    chat2.restore(load_session(first))
    say(chat2, "three")
    s = load_session(first)
    assert [t.sampling["temperature"] for t in s.turns] == [0.0, 0.0, 0.7]
    rows = rows_from_csv(export_session(s, "csv"))
    assert [r["sampling"]["temperature"] for r in rows] == [0.0, 0.0, 0.7]
    md = export_session(s, "md")
    assert "sampling per turn" in md and "temperature=0.7" not in md.split("## Transcript")[0]
    turn_lines = [line for line in md.splitlines() if line.startswith("_sampling:")]
    assert [line.split(",")[0] for line in turn_lines] == ["_sampling: temperature=0.0"] * 2 + [
        "_sampling: temperature=0.7"
    ]
    chat3, recording3 = recorded_chat()
    say(chat3, "four", "five")
    same = export_session(load_session(recording3.writer.id), "md")  # every turn alike: said once, above
    assert "sampling per turn" not in same and "temperature=0.7" in same.split("## Transcript")[0]


def test_an_engine_death_mid_reply_keeps_the_partial_turn_with_the_figures_it_had():
    """The one outcome of an engine that dies mid-reply, as the controller decides it (``turn_abandoned``):
    the session keeps the text so far as a partial turn (no error) in the conversation, as the chat does."""
    chat, recording = recorded_chat(crash_at="decode")
    say(chat, "hello")
    (turn,) = load_session(recording.writer.id).turns
    m = turn.metrics
    assert turn.status == "partial" and turn.reply and turn.in_conversation and m is not None
    assert (
        turn.error is None and load_session(recording.writer.id).history()[-1].content == chat.conversation[-1].content
    )
    assert m.stop_reason == "error" and m.prompt_tokens and m.prefill_tokens == m.prompt_tokens - m.cached_tokens
    assert m.ttft_ms > 0 and m.prefill_ms > 0 and m.decode_tokens >= 1
    assert m.itl_ms_p95 is None and m.kv_cache_tokens is None  # only the engine's end of the turn says these


def test_quitting_mid_reply_keeps_the_partial_turn_with_its_figures_cancelled():
    """Seen: Ctrl+Q during a reply saved "partial turn (no metrics)" though TTFT and the prefill were measured."""
    chat, recording = recorded_chat(replies=["a reply of several words to stream"])
    calls = []
    chat.add_listener(type("Seen", (ChatListener,), {"tokens_decoded": lambda self, t, e: calls.append(e)})())
    chat.send("hello")
    while not calls:
        chat.dispatcher.step()
    sid = recording.writer.id
    chat.close()
    recording.close()  # as the app's unmount does
    (turn,) = load_session(sid).turns
    m = turn.metrics
    assert turn.status == "partial" and turn.error is None and turn.reply and m is not None
    assert m.stop_reason == "cancelled" and m.ttft_ms > 0 and m.decode_tokens >= 1


def test_the_sessions_turn_indices_are_the_chats_turn_numbers_after_a_failed_turn():
    """One numbering: a turn that failed after its prefill began is in the session as failed under its
    number, and the next turn is numbered after it in the chat and in the session alike (the chat gave the
    number back while the session went on: turn 2 of the chat was recorded as turn 3)."""
    chat, recording = recorded_chat(crash_at="prefill", crash_turn=2)
    numbers = []
    chat.add_listener(type("Numbers", (ChatListener,), {"turn_started": lambda self, t: numbers.append(t.number)})())
    say(chat, "one", "two")
    chat.restart_engine()
    chat.dispatcher.drain()
    say(chat, "three")
    s = load_session(recording.writer.id)
    assert [(t.index, t.user, t.status) for t in s.turns] == [
        (1, "one", "complete"),
        (2, "two", "failed"),
        (3, "three", "complete"),
    ]
    assert numbers == [t.index for t in s.turns]


def test_a_resumed_chat_that_had_overflowed_leaves_the_same_messages_out():
    """Seen: a chat resumed after drop-oldest had dropped 2 messages reported, on its first turn, a new
    overflow of those same messages and a "re-prefill" that was the new message. The session's drop stands:
    the next request starts where the saved chat's did, and no overflow of its own is reported."""
    small = Settings().with_overrides(n_ctx=60)
    chat, recording = recorded_chat(settings=small, replies=["a short reply of six words"])
    say(chat, *[f"message number {i} with a few more words" for i in range(6)])
    saved = load_session(recording.writer.id)
    dropped = saved.turns[-1].metrics.dropped_messages
    assert dropped > 0 and chat.history.left_out == dropped

    resumed, engines, calls = make_chat(settings=small, replies=["ok"])
    resumed.start_engine()
    resumed.dispatcher.drain()
    resumed.restore(saved)
    assert resumed.history.left_out == dropped
    resumed.send("ok")
    resumed.dispatcher.drain()
    request = engines[-1].requests[-1]
    assert request.first_message == dropped
    # only a drop beyond the session's is this turn's own (the fake fits from the whole list, as the engine
    # would without first_message: before the fix its whole drop was said again as new)
    again = [n for n in calls.notices() if n.kind == "dropped"]
    assert all(f"the oldest {dropped} messages" not in n.text for n in again)

    # at a larger n_ctx the fit starts from the first message again: what fits now comes back, and is said
    larger, engines, calls = make_chat(settings=Settings().with_overrides(n_ctx=4096), replies=["ok"])
    larger.start_engine()
    larger.dispatcher.drain()
    larger.restore(saved)
    assert larger.history.left_out == dropped  # the marks stand until the first turn says otherwise
    larger.send("ok")
    larger.dispatcher.drain()
    request = engines[-1].requests[-1]
    assert (request.first_message, request.left_out_before) == (0, dropped)
    assert larger.history.left_out == 0 and calls.args_of("history_left_out")[-1] == (0,)
    notices = [n for n in calls.notices() if n.kind == "dropped"]
    assert [n.severity for n in notices] == ["information"] and "back in the context" in notices[0].text
