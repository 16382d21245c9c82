"""Overflow and cache misses without a model: where a KV shift cuts, how a prompt is fitted under each policy,
the miss reason's order and the words the chat uses (the real-model runs are in ``test_overflow_model.py``)."""

from __future__ import annotations

import pytest
from chat_support import make_chat
from fake_engine import fake_model_info

from chatphase.chat.dispatch import InlineDispatcher
from chatphase.chat.overflow import (
    MISS_REASONS,
    OVERFLOW_AHEAD,
    overflow_cost,
    overflow_pairs,
    overflow_text,
    shift_refusal,
    unseen_exchanges,
)
from chatphase.engine.events import LoadedModel, LoadedSettings, Message, PrefillStarted
from chatphase.engine.local.kv_shift import locate_cut, reprefill_tokens, token_offsets
from chatphase.engine.overflow import (
    CACHE_MISS_REASONS,
    OVERFLOW_POLICIES,
    low_water,
    miss_reason,
    reply_room,
)
from chatphase.engine.prompting.prompt import ChatTemplate, PromptTooLong
from chatphase.settings.schema import Settings


def chatml(messages, add_generation_prompt=True, enable_thinking=None):
    text = "".join(f"<{m.role}>{m.content}</>" for m in messages)
    return text + ("<assistant>" if add_generation_prompt else ""), False


def one_per_char(text: str, add_special: bool = False) -> list[int]:
    return [ord(c) for c in text]


def render_char(t: int) -> bytes:
    return chr(t).encode()


SYS = Message("system", "S")


def conv(n: int) -> list[Message]:
    out = [SYS]
    for i in range(n):
        out += [Message("user", f"q{i}"), Message("assistant", f"answer {i}")]
    return out


def test_a_cut_takes_out_the_oldest_messages_and_keeps_the_rest():
    old = chatml(conv(3))[0].encode()[: -len("<assistant>")]  # what the cache spells: the whole conversation
    new = chatml([SYS, *conv(3)[3:], Message("user", "next")])[0].encode()
    offsets = token_offsets(one_per_char(old.decode()), render_char)
    cut = locate_cut(old, offsets, new)
    assert cut is not None
    # the first exchange goes (the cut may begin inside the text it shares with the next one, "<u")
    assert offsets[cut.end] - offsets[cut.start] == len(b"<user>q0</><assistant>answer 0</>")
    assert cut.text == b"<system>S</><user>q1</><assistant>answer 1</><user>q2</><assistant>answer 2</>"
    assert new.startswith(cut.text) and cut.text == old[: offsets[cut.start]] + old[offsets[cut.end] :]


def test_no_cut_where_the_new_prompt_extends_the_cache_or_the_text_is_not_spelled():
    old = b"<system>S</><user>q0</>"
    assert locate_cut(old, token_offsets(one_per_char(old.decode()), render_char), old + b"<assistant>") is None
    assert token_offsets([1, 2], lambda t: b"x", b"xyz") is None


def test_a_cut_that_keeps_nothing_is_no_cut_mid_reply():
    old = b"<system>S</><user>q0</><assistant>a</>"
    new = b"<system>S</><user>something else</><assistant>"
    offsets = token_offsets(one_per_char(old.decode()), render_char)
    assert locate_cut(old, offsets, new, fallback=False) is None
    whole = locate_cut(old, offsets, new)
    assert whole is not None and new.startswith(whole.text)


def test_a_bos_the_text_leaves_out_spells_nothing():
    pieces = {1: b"<bos>", 2: b"a", 3: b"b"}
    assert token_offsets([1, 2, 3], pieces.__getitem__, b"ab") == [0, 0, 1, 2]


def test_reprefill_counts_the_kept_history_evaluated_again():
    text = b"SYSKEPTnew"
    prompt = one_per_char(text.decode())
    assert reprefill_tokens(prompt, render_char, text, cached=3, kept_bytes=7) == 4  # "KEPT"
    assert reprefill_tokens(prompt, render_char, text, cached=7, kept_bytes=7) == 0  # a shift kept it cached
    assert reprefill_tokens(prompt, render_char, text, cached=3, kept_bytes=None) == len(prompt) - 4


def fit(messages, budget, **kw):
    return ChatTemplate(chatml, one_per_char).fit(messages, budget, **kw)


def test_drop_oldest_goes_down_to_the_low_water_mark_and_stays_there():
    messages = [*conv(6), Message("user", "next")]
    whole = len(chatml(messages)[0])
    fitted = fit(messages, whole - 1, low_water=whole // 2)
    assert fitted.full_tokens == whole and len(fitted.tokens) <= whole // 2
    assert fitted.dropped_messages % 2 == 0 and fitted.text.startswith("<system>S</><user>")
    again = fit([*messages, Message("assistant", "a"), Message("user", "b")], 10_000, skip=fitted.dropped_messages)
    assert again.dropped_messages == fitted.dropped_messages and again.full_tokens is None  # sticky, no new drop
    assert again.text.startswith(fitted.text[: -len("<assistant>")])


def test_stop_refuses_with_the_numbers():
    messages = [*conv(6), Message("user", "next")]
    with pytest.raises(PromptTooLong, match=r"conversation is \d+ tokens .* room for 50 .*--overflow"):
        fit(messages, 50, drop=False)


def test_the_margins():
    assert reply_room(512, 4096) == 512 and reply_room(512, 1024) == 256
    assert low_water(768, 1024) == 512 and low_water(100, 1024) == 50


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"overflow": "shift", "trim_failed": "swa", "change": "edited"}, "overflow_shift"),
        ({"overflow": "drop-oldest"}, "overflow_drop"),
        ({"trim_failed": "swa", "change": "edited"}, "swa"),
        ({"change": "regenerated"}, "regenerated"),
        ({}, "template"),
    ],
)
def test_a_miss_reason_in_order(kw, reason):
    args = {"overflow": None, "trim_failed": None, "change": None} | kw
    assert miss_reason(cache_before=100, reused=40, history=True, **args) == reason


def test_no_miss_no_reason_and_an_empty_cache_takes_the_controllers_word():
    none = {"overflow": None, "trim_failed": None}
    assert miss_reason(cache_before=100, reused=100, history=True, change="edited", **none) is None
    assert miss_reason(cache_before=0, reused=0, history=False, change="restarted", **none) is None
    assert miss_reason(cache_before=0, reused=0, history=True, change="restored", **none) == "restored"
    # a new chat's first turn on a cache that holds the last chat: nothing of this conversation was lost
    assert miss_reason(cache_before=300, reused=20, history=False, change=None, **none) is None


def test_the_words_of_an_overflow():
    ev = PrefillStarted(1, 300, 20, 280, 4, 0, overflow="drop-oldest", overflow_dropped_messages=4,
                        overflow_dropped_tokens=612, overflow_reprefill_tokens=2310)  # fmt: skip
    assert "oldest 4 messages (612 tok) dropped" in overflow_text(ev) and "re-prefill 2,310 tok" in overflow_text(ev)
    assert overflow_cost("shift", 0) == "KV shift · 0 tok re-prefilled"
    assert overflow_cost("drop-oldest", 2310, 5100.0) == "re-prefill 2,310 tok · 5.1 s"


def test_every_policy_and_every_miss_reason_the_engine_names_has_words():
    assert set(OVERFLOW_AHEAD) == set(OVERFLOW_POLICIES)
    assert set(MISS_REASONS) == set(CACHE_MISS_REASONS)


def test_turn_detail_rows_only_for_an_overflow_or_a_miss():
    from dataclasses import replace

    from chatphase.engine.metrics import compute_turn_metrics

    m = compute_turn_metrics(
        t_submit_ns=0, t_prefill_start_ns=0, t_prefill_end_ns=10, token_times_ns=[20], prompt_tokens=10,
        cached_tokens=0, kv_cache_tokens=11, kv_bytes_per_token=1, kv_capacity_bytes=100, stop_reason="stop",
    )  # fmt: skip
    assert overflow_pairs(m) == []
    shifted = replace(m, overflow="shift", overflow_dropped_messages=2, overflow_dropped_tokens=90,
                      overflow_reprefill_tokens=0, cache_miss_reason="overflow_shift")  # fmt: skip
    assert overflow_pairs(shifted) == [
        ("overflow", "shift: 2 messages, 90 tok"),
        ("overflow cost", "KV shift · 0 tok re-prefilled"),
        ("cache miss", "overflow_shift"),
    ]


def test_unseen_turns_count_user_messages():
    messages = conv(3)[1:]
    assert (
        unseen_exchanges(messages, 0) == 0 and unseen_exchanges(messages, 2) == 1 and unseen_exchanges(messages, 4) == 2
    )


def loaded(remote=False, refusal=None):
    settings = LoadedSettings(backend="remote") if remote else LoadedSettings()
    return LoadedModel(fake_model_info(), settings, 1.0, None, None, kv_shift_refusal=refusal)


def test_shift_is_refused_with_the_reason_on_a_remote_server_and_a_model_that_cannot():
    assert "--context-shift" in shift_refusal("shift", loaded(remote=True))
    assert "recurrent" in shift_refusal("shift", loaded(refusal="its memory is recurrent or hybrid"))
    assert shift_refusal("shift", loaded()) is None and shift_refusal("drop-oldest", loaded(remote=True)) is None


def test_the_controller_sends_the_policy_what_is_left_out_and_what_changed():
    settings = Settings().with_overrides(overflow="shift")
    chat, engines, _calls = make_chat(settings, dispatcher=InlineDispatcher())
    chat.start_engine()
    chat.send("one")
    req = engines[-1].requests[-1]
    assert (req.overflow, req.first_message, req.history_change) == ("shift", 0, None)
    chat.regenerate()
    assert engines[-1].requests[-1].history_change == "regenerated"
    chat.take_back_last()
    chat.send("one again")
    assert engines[-1].requests[-1].history_change == "edited"
    chat.restart_engine()
    chat.send("two")
    assert engines[-1].requests[-1].history_change == "restarted"
    chat.switch_model(fake_model_info())
    chat.send("three")
    assert engines[-1].requests[-1].history_change == "model_switch"
    chat.send("four")
    assert engines[-1].requests[-1].history_change is None


def test_an_overflow_mid_reply_is_noticed_at_the_turns_end_and_marks_the_turns():
    from dataclasses import replace

    from fake_engine import FakeEngine

    from chatphase.engine.events import TurnFinished

    class MidReplyShift(FakeEngine):
        """The second turn's reply outgrew n_ctx: the engine shifted the first exchange out mid-reply."""

        def run_turn(self, request):
            for ev in super().run_turn(request):
                if isinstance(ev, TurnFinished) and request.turn_id == 2:
                    m = replace(ev.metrics, dropped_messages=2, overflow="shift", overflow_dropped_messages=2,
                                overflow_dropped_tokens=220, overflow_reprefill_tokens=0)  # fmt: skip
                    ev = replace(ev, metrics=m)
                yield ev

    from chat_support import Calls

    from chatphase.chat.controller import ChatController

    calls = Calls()
    chat = ChatController(
        Settings().with_overrides(overflow="shift"),
        fake_model_info(),
        lambda info, s: MidReplyShift(info, s.engine),
        InlineDispatcher(),
        [calls],
    )
    chat.start_engine()
    chat.send("one")
    chat.send("two")
    notices = [n for n in calls.notices() if n.kind == "dropped"]
    assert len(notices) == 1 and "oldest 2 messages (220 tok) shifted out" in notices[0].text
    assert calls.args_of("history_left_out") == [(1,)] and chat.history.left_out == 2
    chat.send("three")
    assert chat.engine.requests[-1].first_message == 2  # the next prompt leaves them out too


def test_the_replys_meta_line_carries_an_overflows_cost():
    from dataclasses import replace

    from chatphase.engine.metrics import compute_turn_metrics
    from chatphase.ui.transcript.reply_view import metrics_line

    m = compute_turn_metrics(
        t_submit_ns=0, t_prefill_start_ns=0, t_prefill_end_ns=10, token_times_ns=[20], prompt_tokens=10,
        cached_tokens=0, kv_cache_tokens=11, kv_bytes_per_token=1, kv_capacity_bytes=100, stop_reason="stop",
    )  # fmt: skip
    assert "re-prefill" not in metrics_line(m)
    m = replace(m, overflow="drop-oldest", overflow_reprefill_tokens=2310, overflow_reprefill_ms=5100.0)
    assert metrics_line(m).endswith("drop-oldest: re-prefill 2,310 tok · 5.1 s")


def test_a_change_outlives_a_turn_refused_before_its_prefill():
    chat, engines, _calls = make_chat(Settings().with_overrides(n_ctx=32), dispatcher=InlineDispatcher())
    chat.start_engine()
    chat.send("one")
    chat.restart_engine()
    chat.send(" ".join(["w"] * 30))  # too long: refused before its prefill
    chat.send("two")
    assert [r.history_change for r in engines[-1].requests] == ["restarted", "restarted"]


def overflowed_chat():
    """A chat on fake engines whose long first message no longer fits n_ctx (100), with room left for "ok" (the
    fake drops no more than it must): (chat, engines, calls, the messages left out)."""
    chat, engines, calls = make_chat(
        Settings().with_overrides(n_ctx=100), dispatcher=InlineDispatcher(), replies=["a short reply"]
    )
    chat.start_engine()
    chat.send("a long first message " * 10)
    while not chat.history.left_out:
        chat.send("a short message")
    count = chat.count(chat.draft_request("ok"))  # type: ignore[arg-type]
    assert count is not None and count.dropped_messages == 0  # the old engine would leave out nothing new
    assert any(n.kind == "dropped" for n in calls.notices())
    return chat, engines, calls, chat.history.left_out


@pytest.mark.parametrize("how", ["restart", "switch"])
def test_a_fresh_engine_refits_the_conversation_without_saying_its_old_overflow_again(how):
    """Seen: after an engine restart or a model switch the first turn's fit left out the same messages again and
    the chat said so as a new overflow ("Context full", counted again). A fresh engine fits from message 0 (it
    may fit more) but only what it leaves out beyond the conversation's own count is new."""
    chat, engines, calls, left_out = overflowed_chat()
    said = len(calls.notices())
    marks = calls.args_of("history_left_out")
    chat.restart_engine() if how == "restart" else chat.switch_model(fake_model_info())
    request = chat.draft_request("ok")
    count = chat.count(request)  # type: ignore[arg-type]
    assert count is not None and count.dropped_messages == 0  # the budget line: nothing newly left out
    chat.send("ok")
    assert [n for n in calls.notices()[said:] if n.kind == "dropped"] == []
    assert chat.history.left_out == left_out and calls.args_of("history_left_out") == marks  # the marks stand
    assert request is not None and (request.first_message, request.overflow_from) == (0, left_out)
    request = engines[-1].requests[-1]
    assert (request.first_message, request.left_out_before) == (0, left_out)  # the fit starts at the first message
    chat.send("ok again")  # the fresh engine has fitted: the next turn starts where it left off
    assert engines[-1].requests[-1].first_message == chat.history.left_out


def test_a_fresh_engine_with_a_larger_n_ctx_brings_messages_back_and_the_marks_follow():
    chat, _engines, calls, left_out = overflowed_chat()
    said = len(calls.notices())
    chat.settings = chat.settings.with_overrides(n_ctx=4096)
    chat.restart_engine()
    chat.send("ok")
    assert chat.history.left_out == 0 and calls.args_of("history_left_out")[-1] == (0,)
    (back,) = [n for n in calls.notices()[said:] if n.kind == "dropped"]
    assert back.severity == "information" and back.text.startswith(f"{left_out} earlier message")
    assert "back in the context" in back.text
