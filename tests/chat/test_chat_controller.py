"""ChatController without Textual: turns, cancel, engine deaths, regenerate and edit, model switch, late
events — driven by FakeEngines through a dispatcher the test steps by hand."""

from __future__ import annotations

import pytest
from chat_support import StepDispatcher, make_chat
from fake_engine import fake_model_info

from chatphase.chat.controller import NotNow
from chatphase.chat.dispatch import InlineDispatcher
from chatphase.engine.events import FirstToken, Message, PrefillProgress, TokensDecoded
from chatphase.settings.schema import Settings


def loaded(**kw):
    chat, engines, calls = make_chat(**kw)
    chat.start_engine()
    chat.dispatcher.drain()
    assert chat.ready
    return chat, engines, calls


def test_a_turn_tells_the_listeners_in_order_and_keeps_the_conversation():
    chat, engines, calls = loaded(replies=["one two three"])
    turn = chat.send("hello")
    assert chat.busy and chat.active_turn == turn.turn_id and not chat.ready
    chat.dispatcher.drain()
    assert calls.names() == [
        "engine_loading",
        "engine_ready",
        "turn_started",
        "prefill_started",
        "prefill_progress",
        "first_token",
        "tokens_decoded",
        "turn_finished",
    ]
    assert chat.conversation == [Message("user", "hello"), Message("assistant", "one two three")]
    assert (turn.number, turn.kind, turn.position, turn.user) == (1, "send", 0, "hello")
    assert turn.reply == "one two three" and turn.decode_tokens == 3
    assert turn.live_decode_rate() == pytest.approx(50.0)  # FakeTiming: 20 ms a token
    assert chat.ready and chat.active_turn is None
    chat.send("more")
    chat.dispatcher.drain()
    assert engines[0].requests[1].messages == tuple(chat.conversation[:3])


def test_the_system_prompt_goes_first_but_is_not_part_of_the_conversation():
    chat, engines, _ = loaded(settings=Settings(system_prompt="Be brief."))
    chat.send("hi")
    chat.dispatcher.drain()
    assert engines[0].requests[0].messages[0] == Message("system", "Be brief.")
    assert [m.role for m in chat.conversation] == ["user", "assistant"]


def test_nothing_is_sent_while_loading_busy_or_stopped():
    chat, _, _ = make_chat()
    chat.start_engine()
    with pytest.raises(NotNow, match="still loading"):
        chat.send("early")
    chat.dispatcher.drain()
    chat.send("first")
    with pytest.raises(NotNow, match="wait for the reply"):
        chat.send("second")
    assert [m.content for m in chat.conversation] == ["first"]


def test_cancel_during_prefill_ends_the_turn_without_tokens():
    chat, _, calls = loaded(settings=Settings().with_overrides(n_batch=2))
    chat.send("a b c d e f")
    while not calls.args_of("prefill_progress"):
        chat.dispatcher.step()
    assert chat.stop()
    chat.dispatcher.drain()
    ((turn, finished),) = calls.args_of("turn_finished")
    assert (finished.metrics.stop_reason, finished.metrics.decode_tokens) == ("cancelled", 0)
    assert turn.prefill is not None and turn.progress.done_tokens < turn.prefill.prefill_tokens
    assert chat.ready and not chat.stop()  # nothing left to stop


def test_engine_death_mid_reply_keeps_the_partial_reply_and_needs_a_restart():
    chat, engines, calls = loaded(crash_at="decode", crash_turn=1, first_only=True)
    chat.send("hello")
    chat.dispatcher.drain()
    ((turn, why),) = calls.args_of("turn_abandoned")
    assert why == "engine stopped: partial reply kept" and turn.reply
    assert chat.conversation[-1] == Message("assistant", turn.reply)
    assert calls.args_of("engine_stopped") and chat.engine is None and not chat.busy
    with pytest.raises(NotNow, match="restart it"):
        chat.send("again")
    chat.restart_engine()
    chat.dispatcher.drain()
    chat.send("again")
    chat.dispatcher.drain()
    assert engines[1].requests[0].messages[-1] == Message("user", "again") and chat.ready


def test_engine_death_before_any_text_gives_the_message_back():
    chat, _, calls = loaded(crash_at="prefill", crash_turn=1)
    turn = chat.send("hello")
    chat.dispatcher.drain()
    assert calls.args_of("turn_failed") == [(turn, "engine process died (signal SIGSEGV)")]
    assert turn.prefill is not None  # it began: a session records it as failed turn 1, so its number stays used
    assert chat.conversation == [] and chat.history.numbered == 1


def test_engine_death_while_idle_is_noticed_by_the_watch():
    chat, engines, calls = loaded()
    assert len(chat.dispatcher.watches) == 1  # started when the model loaded
    engines[0].kill()
    chat.dispatcher.run_watches()
    assert calls.args_of("engine_stopped") == [("engine process died (signal SIGKILL)",)]
    assert chat.engine is None and not chat.ready


def test_closing_an_engine_is_not_a_death():
    chat, engines, calls = loaded()
    chat.restart_engine()
    chat.dispatcher.run_watches()  # the old engine's watch ends quietly
    chat.dispatcher.drain()
    assert not calls.args_of("engine_stopped") and engines[0].closed and chat.ready


def test_a_message_too_long_is_refused_and_given_back():
    chat, _, calls = loaded(settings=Settings().with_overrides(n_ctx=16))
    turn = chat.send(" ".join(f"w{i}" for i in range(30)))
    chat.dispatcher.drain()
    assert calls.args_of("turn_failed")[0][0] is turn and "too long" in calls.args_of("turn_failed")[0][1]
    assert [n.title for n in calls.notices()] == ["Not sent"]
    assert chat.conversation == [] and chat.ready


def test_regenerate_sends_the_same_prompt_and_reports_the_reuse():
    chat, engines, calls = loaded(replies=["first answer", "second answer"])
    chat.send("hello")
    chat.dispatcher.drain()
    turn = chat.regenerate()
    assert turn.kind == "regenerate" and turn.position == 0
    assert calls.args_of("history_rewound") == [((Message("assistant", "first answer"),),)]
    chat.dispatcher.drain()
    assert engines[0].requests[1].messages == engines[0].requests[0].messages
    assert [m.content for m in chat.conversation] == ["hello", "second answer"]
    (reuse,) = [n for n in calls.notices() if n.kind == "reuse"]
    cached = turn.prefill.cached_tokens
    assert reuse.title == "Regenerate" and reuse.text.startswith(f"{cached:,} of {turn.prefill.prompt_tokens:,}")


def test_regenerate_needs_a_reply():
    chat, _, _ = loaded()
    with pytest.raises(NotNow, match="no reply to regenerate"):
        chat.regenerate()


def test_edit_takes_the_last_message_back_and_resends_it():
    chat, _, calls = loaded()
    for text in ("one", "two"):
        chat.send(text)
        chat.dispatcher.drain()
    assert chat.take_back_last() == "two"
    assert next(m.content for m in chat.conversation) == "one" and len(chat.conversation) == 2
    turn = chat.send("two three")
    chat.dispatcher.drain()
    assert (turn.kind, turn.position, turn.number) == ("resend", 1, 3)
    assert [n.title for n in calls.notices() if n.kind == "reuse"] == ["Edit and resend"]
    assert turn.prefill.cached_tokens > 0


def test_model_switch_mid_turn_keeps_what_streamed_and_drops_the_old_engines_late_events():
    chat, engines, calls = loaded()
    chat.send("hello")
    while not calls.args_of("tokens_decoded"):
        chat.dispatcher.step()
    streamed = chat.turn.reply
    other = fake_model_info(name="Other 1B")
    chat.switch_model(other)
    assert calls.args_of("turn_abandoned")[0][1] == "cancelled (engine replaced)"
    assert calls.args_of("turn_abandoned")[0][0].metrics_so_far().stop_reason == "cancelled"  # asked for: no error
    assert chat.conversation[-1] == Message("assistant", streamed) and engines[0].closed
    before = len(calls.calls)
    chat.dispatcher.drain()  # the old turn's rest, then the new engine's load
    late = [name for name, _ in calls.calls[before:]]
    assert "tokens_decoded" not in late and "turn_finished" not in late
    assert late[-1] == "engine_ready" and chat.loaded.info is other and chat.ready
    chat.send("still here")
    chat.dispatcher.drain()
    assert engines[1].requests[0].messages[0].content == "hello"


def test_model_switch_before_any_text_gives_the_message_back():
    chat, _, calls = loaded(hold="prefill")
    turn = chat.send("hello")
    chat.dispatcher.step(2)  # prefill started, first progress
    chat.switch_model(fake_model_info(name="Other 1B"))
    assert calls.args_of("turn_failed")[0][0] is turn and chat.conversation == []


def test_late_events_of_a_restarted_engine_change_nothing():
    chat, _engines, calls = loaded(replies=["a b c d e f g"])
    chat.send("hello")
    chat.dispatcher.step(3)
    chat.restart_engine()
    conversation = list(chat.conversation)
    before = len(calls.calls)
    old_job, events = chat.dispatcher.jobs[0]
    for event in events:  # everything the replaced engine still sends
        assert isinstance(event, (PrefillProgress, FirstToken, TokensDecoded)) or event.turn_id == 1
        old_job.deliver(event)
    old_job.end()
    assert calls.calls[before:] == [] and chat.conversation == conversation


def test_new_chat_forgets_the_conversation_and_numbers_turns_from_one():
    chat, _, calls = loaded()
    for text in ("one", "two"):
        chat.send(text)
        chat.dispatcher.drain()
    chat.new_chat()
    assert chat.conversation == [] and calls.args_of("chat_cleared") == [()]
    assert chat.send("fresh").number == 1


def test_no_new_chat_while_a_reply_runs():
    """The running reply is not thrown away unasked: stop it first (its partial reply is kept)."""
    chat, _, calls = loaded()
    chat.send("one")
    with pytest.raises(NotNow, match="wait for the reply or stop it") as err:
        chat.new_chat()
    assert err.value.action == "chat.stop" and calls.args_of("chat_cleared") == []
    chat.dispatcher.drain()
    assert chat.turn is None and len(chat.conversation) == 2


def test_a_non_fatal_error_after_text_keeps_the_partial_reply():
    """A remote stream cut mid-reply: EngineFailed (not fatal) then TurnFinished(stop_reason="error")."""
    from chatphase.engine.events import EngineFailed, TurnFinished
    from chatphase.engine.metrics import compute_turn_metrics

    chat, _, calls = loaded()
    turn = chat.send("hello")
    job, _events = chat.dispatcher.jobs.pop(0)
    metrics = compute_turn_metrics(
        t_submit_ns=0,
        t_prefill_start_ns=1,
        t_prefill_end_ns=2,
        token_times_ns=[3, 4],
        prompt_tokens=5,
        cached_tokens=0,
        kv_cache_tokens=7,
        kv_bytes_per_token=1,
        kv_capacity_bytes=64,
        stop_reason="error",
    )
    from chatphase.engine.events import PrefillStarted

    job.deliver(PrefillStarted(turn.turn_id, 5, 0, 5, 0, 1))
    job.deliver(FirstToken(turn.turn_id, "par", 1.0, 3))
    job.deliver(EngineFailed("the stream was cut", turn.turn_id))
    job.deliver(TurnFinished(turn.turn_id, "par", metrics))
    job.end()
    assert chat.conversation[-1] == Message("assistant", "par") and turn.error == "the stream was cut"
    assert [n.title for n in calls.notices()] == ["Turn error"] and chat.ready


def test_a_factory_failure_stops_the_engine_visibly():
    def broken(info, settings):
        raise RuntimeError("no engine today")

    from chat_support import Calls

    from chatphase.chat.controller import ChatController

    calls = Calls()
    chat = ChatController(Settings(), fake_model_info(), broken, StepDispatcher(), [calls])
    chat.start_engine()
    assert calls.args_of("engine_stopped") == [("cannot start the engine: no engine today",)]


def test_inline_dispatcher_runs_a_whole_chat_in_the_callers_thread():
    chat, _, calls = make_chat(dispatcher=InlineDispatcher(), replies=["sure"])
    chat.start_engine()
    assert chat.ready
    chat.send("hi")
    assert chat.conversation[-1] == Message("assistant", "sure") and chat.ready
    assert "turn_finished" in calls.names()


def test_a_turn_whose_drafts_did_not_pay_says_so():
    from chatphase.engine.events import SpecLive

    note = "the draft model did not pay: this turn decoded at ×0.41 of plain steps (2 threads); --spec off or lookup is faster"
    chat, _, calls = loaded(spec=SpecLive("draft", 0, 0, 0, 0), drafted=(2, 3), spec_note=note)
    chat.send("hello")
    chat.dispatcher.drain()
    (notice,) = [n for n in calls.notices() if n.kind == "spec"]
    assert (notice.text, notice.severity) == (note, "warning")


def test_a_turn_that_met_a_saved_prefix_says_what_was_restored():
    note = "prefix restore: 1,113 tok · 24.5 MiB in 14.2 ms (restore ≈ 7.0 ms < prefill ≈ 2,796 ms)"
    chat, _, calls = loaded(restore_note=note)
    chat.send("hello")
    chat.dispatcher.drain()
    (notice,) = [n for n in calls.notices() if n.kind == "prefix"]
    assert (notice.text, notice.severity) == (note, "information")


def test_after_a_new_chat_the_budget_counts_the_new_conversation_not_the_cache_left_from_the_last():
    """Seen: after Ctrl+N the line said "context 23 % → 73 %" (and "+8 tok · context 2 % → 1 %") while the
    panel said 0 tok: "now" was all the KV cache held, the last chat's."""
    from chatphase.chat.budget import budget_of

    chat, _, _ = loaded(replies=["a reply of many words " * 20])
    chat.send("a first message of the old chat " * 10)
    chat.dispatcher.drain()
    request = chat.draft_request("more")
    assert request is not None
    going_on = chat.count(request)
    assert going_on is not None and going_on.kv_cache_tokens > 100  # a chat that goes on: its own cache
    chat.new_chat()
    request = chat.draft_request("hi")
    assert request is not None
    fresh = chat.count(request)
    assert fresh is not None and fresh.prompt_tokens is not None
    assert fresh.kv_cache_tokens == fresh.cached_tokens < fresh.prompt_tokens
    now, after = budget_of(fresh, chat.ttft).line().split(" · ")[1].removeprefix("context ").split(" → ")
    assert int(now.rstrip(" %")) <= int(after.rstrip(" %"))
