"""Reasoning models through the chat controller (FakeEngine scripts): the split, the phase's metrics,
the history sent back, the saved session and ``ask``'s output, for every marker case."""

from __future__ import annotations

import json

import pytest
from chat_support import make_chat
from thinking_support import CASES, GPT_OSS, THINK

from chatphase.chat.dispatch import InlineDispatcher
from chatphase.chat.recording import SessionRecording
from chatphase.engine.events import Message, SamplingParams
from chatphase.sessions.catalog import load_session
from chatphase.settings.schema import Settings


def chat_with(pieces, fmt, preopened, settings=None, recording=False, listener=None):
    chat, engines, calls = make_chat(
        settings=settings, dispatcher=InlineDispatcher(), replies=[pieces], thinking=fmt, thinking_preopened=preopened
    )
    rec = None
    if recording:
        rec = SessionRecording(chat)
        chat.add_listener(rec)
    if listener is not None:
        chat.add_listener(listener)
    chat.start_engine()
    return chat, engines, calls, rec


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_split_and_its_metrics(case):
    pieces, fmt, preopened, _ = CASES[case]
    chat, _, calls, _ = chat_with(pieces, fmt, preopened)
    turn = chat.send("What is 2+2?")
    ((_, finished),) = calls.args_of("turn_finished")
    assert (finished.thinking, finished.reply) == ("I add them.", "It is 4.")
    assert chat.conversation[-1] == Message("assistant", "It is 4.", "I add them.")
    m = finished.metrics
    closing = next(i for i, p in enumerate(pieces) if p.endswith(("</think>", "nk>\n\n", "<|end|>")))
    if fmt is GPT_OSS:
        closing = pieces.index("<|channel|>final<|message|>")  # the block ends with the final channel's header
    assert m.thinking_tokens == closing + 1 and m.answer_tokens == len(pieces) - closing - 1
    assert m.thinking_ms == pytest.approx(20.0 * closing) and not m.thinking_cut_short  # 20 ms a token
    assert m.ttfa_ms == pytest.approx(m.ttft_ms + 20.0 * (closing + 1))
    ((_, ended),) = calls.args_of("thinking_ended")
    assert ended.thinking_tokens == m.thinking_tokens and not ended.forced
    assert turn.thinking == "I add them." and turn.thinking_ended is ended
    streamed_answer = "".join(a[1].text for name, a in calls.calls if name in ("first_token", "tokens_decoded"))
    assert streamed_answer == "It is 4." and "<" not in streamed_answer  # markers are never text


def test_a_reply_cut_short_while_thinking():
    pieces = ["<think>", "Let", " me", " count", " the", " ways"]
    chat, _, calls, _ = chat_with(pieces, THINK, False, settings=Settings(sampling=SamplingParams(max_tokens=4)))
    chat.send("Think hard.")
    ((_, finished),) = calls.args_of("turn_finished")
    m = finished.metrics
    assert (finished.thinking, finished.reply, m.stop_reason) == ("Let me count", "", "length")
    assert (m.thinking_tokens, m.answer_tokens, m.thinking_cut_short, m.ttfa_ms) == (4, 0, True, None)
    assert not calls.args_of("thinking_ended")


def test_a_thinking_only_reply():
    chat, _, calls, _ = chat_with(["<think>", "Hmm", ".", "</think>"], THINK, False)
    chat.send("?")
    ((_, finished),) = calls.args_of("turn_finished")
    assert (finished.thinking, finished.reply) == ("Hmm.", "")
    assert (finished.metrics.thinking_tokens, finished.metrics.answer_tokens) == (4, 0)


def test_a_model_without_markers_behaves_as_before():
    pieces = ["Plain", " <think>", " text", "."]
    chat, _, calls, _ = chat_with(pieces, None, False)
    chat.send("hi")
    ((_, finished),) = calls.args_of("turn_finished")
    assert finished.reply == "".join(pieces) and finished.thinking == ""
    m = finished.metrics
    assert (m.thinking_tokens, m.answer_tokens, m.ttfa_ms, m.answer_tokens_per_s) == (None, None, None, None)


def test_a_thinking_budget_closes_the_block_and_the_answer_follows():
    pieces = ["<think>", "a", " b", " c", " d", " e", "</think>", "Done", "."]
    settings = Settings(sampling=SamplingParams(think_budget=3))
    chat, _, calls, _ = chat_with(pieces, THINK, False, settings=settings)
    chat.send("?")
    ((_, finished),) = calls.args_of("turn_finished")
    assert (finished.thinking, finished.reply) == ("a b", "Done.")
    ((_, ended),) = calls.args_of("thinking_ended")
    assert ended.forced and ended.thinking_tokens == 3 == finished.metrics.thinking_tokens


def test_the_next_turn_sends_the_thinking_as_reasoning_and_reports_the_reuse():
    pieces, fmt, preopened, _ = CASES["both tags"]
    chat, engines, calls, _ = chat_with(pieces, fmt, preopened)
    chat.send("What is 2+2?")
    chat.send("And 3+3?")
    sent = engines[0].requests[1].messages
    assert sent[1] == Message("assistant", "It is 4.", "I add them.")
    (reuse,) = [n for n in calls.notices() if n.kind == "reuse"]
    second = engines[0].requests[1]
    turn2 = calls.args_of("prefill_started")[1][1]
    assert reuse.title == "After thinking" and f"{turn2.cached_tokens:,} of {turn2.prompt_tokens:,}" in reuse.text
    assert 0 < turn2.cached_tokens < turn2.prompt_tokens - 1  # reused up to the stripped thinking
    assert second.messages[-1].content == "And 3+3?"


def test_the_saved_session_keeps_the_thinking_apart():
    pieces, fmt, preopened, _ = CASES["split markers"]
    chat, _, _, rec = chat_with(pieces, fmt, preopened, recording=True)
    chat.send("What is 2+2?")
    (turn,) = load_session(rec.writer.id).turns
    assert (turn.reply, turn.thinking, turn.metrics.thinking_tokens) == ("It is 4.", "I add them.", 6)
    assert load_session(rec.writer.id).history()[-1] == Message("assistant", "It is 4.", "I add them.")


def test_ask_json_gives_the_thinking_apart_and_plain_ask_prints_it_only_when_asked(capsys):
    from chatphase.commands.ask import _Printer

    pieces, fmt, preopened, _ = CASES["pre-opened"]
    for as_json, show in ((True, False), (False, False), (False, True)):
        printer = _Printer(as_json, show)
        chat, _, _, _ = chat_with(pieces, fmt, preopened, listener=printer)
        chat.send("What is 2+2?")
        if as_json:
            printer.emit_json()
        out, err = capsys.readouterr()
        if as_json:
            (turn,) = json.loads(out)["turns"]
            assert (turn["reply"], turn["thinking"], turn["metrics"]["thinking_tokens"]) == (
                "It is 4.",
                "I add them.",
                4,
            )
        else:
            assert out == "It is 4.\n"
            assert ("I add them." in err) == show and "thinking 4 tok" in err


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (Settings(thinking="on"), "thinking has no effect"),
        (Settings(thinking="off", sampling=SamplingParams(think_budget=8)), "thinking and think_budget have no effect"),
    ],
)
def test_thinking_settings_a_model_cannot_take_are_pointed_out(settings, named):
    chat, _, calls, _ = chat_with(["Hi."], None, False, settings=settings)
    (notice,) = calls.notices()
    assert notice.kind == "model" and notice.severity == "warning" and named in notice.text
    chat.send("hello")  # the chat goes on as without them
    assert chat.conversation[-1].content == "Hi."


def test_no_notice_where_the_thinking_settings_apply():
    for settings, fmt in ((Settings(thinking="on"), THINK), (Settings(), None)):
        _, _, calls, _ = chat_with(["<think>a</think>b"] if fmt else ["b"], fmt, False, settings=settings)
        assert calls.notices() == []


def test_a_remote_server_gets_no_such_notice():
    from types import SimpleNamespace

    from chatphase.chat.listener import thinking_ignored
    from chatphase.engine.events import LoadedSettings

    remote = SimpleNamespace(
        thinking_format=None, settings=LoadedSettings(backend="remote"), info=SimpleNamespace(name="m")
    )
    local = SimpleNamespace(thinking_format=None, settings=LoadedSettings(), info=SimpleNamespace(name="m"))
    assert thinking_ignored(Settings(thinking="on"), remote) is None  # its thinking shows only in replies
    assert thinking_ignored(Settings(thinking="on"), local) is not None
