"""Speculative decoding in the TUI (FakeEngine): the phase line shows the mode and its live figures."""

from __future__ import annotations

import pytest
from rich.style import Style
from textual.geometry import Region
from textual.widgets import Label, Static
from ui_support import idle, make_app, send, wait_for, wait_thread

from chatphase.engine.events import SpecLive
from chatphase.engine.process.host import EngineHost
from chatphase.settings.schema import Settings
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.dashboard.timeline import TurnTimeline
from chatphase.ui.transcript.reply_tail import tail_lines, tinted_tail


def drawn(widget) -> str:
    """The widget's text as drawn at its size."""
    width, height = widget.outer_size
    return "\n".join("".join(seg.text for seg in strip) for strip in widget.render_lines(Region(0, 0, width, height)))


def stats(app) -> str:
    return str(app.query_one("#phase-stats", Label).render())


async def phase_line_mid_decode(spec: SpecLive | None) -> tuple[str, SpecLive | None]:
    """The phase line's figures and the turn's spec figures after 3 tokens of a reply."""
    app, engines = make_app(hold="decode", hold_after_tokens=3, spec=spec)
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello there")
        await wait_thread(pilot, engines[0].held)
        await wait_for(pilot, lambda: "3 tok" in stats(app))
        shown, live = stats(app), app.chat.turn.spec
        engines[0].release()
        await wait_for(pilot, lambda: idle(app))
    return shown, live


async def test_the_phase_line_shows_the_decode_mode_and_its_figures():
    live = SpecLive("lookup", steps=10, drafted=25, accepted=17, tokens=27, speedup=1.6)
    shown, turn_spec = await phase_line_mid_decode(live)
    assert shown.startswith("lookup · 2.7 tok/step · 68 % accepted · ×1.6 · 3 tok") and turn_spec == live


async def test_plain_decode_shows_no_mode():
    shown, turn_spec = await phase_line_mid_decode(None)
    assert shown.startswith("3 tok") and turn_spec is None


#: a one-paragraph reply (it stays in the streaming tail while it streams): 40 distinct words
WORDS = [f"w{i:02d}" for i in range(40)]
#: tokens 1, 2 of each four come as accepted draft tokens: steps of (draft, draft, sampled) then a plain one
DRAFTED = frozenset(i for i in range(40) if i % 4 in (1, 2))
#: the tint tests' reply: the same words three times over (drafted at the same places), so that it still
#: streams while a slow machine runs their checks
LONG_WORDS = [f"{w}{n}" for n in "abc" for w in WORDS]
LONG_DRAFTED = frozenset(i for i in range(len(LONG_WORDS)) if i % 4 in (1, 2))
LIVE = SpecLive("lookup", steps=10, drafted=25, accepted=17, tokens=27, speedup=1.6)


def tail_words(app) -> tuple[list[str], list[str]]:
    """The words drawn in the streaming reply's tail: (tinted, not tinted)."""
    tail = app.view.chat_log.active_reply.query_one(".reply-tail", Static)
    width, height = tail.outer_size
    tinted, plain = [], []
    for strip in tail.render_lines(Region(0, 0, width, height)):
        for seg in strip:
            (tinted if seg.style is not None and seg.style.underline else plain).extend(seg.text.split())
    return tinted, plain


async def test_accepted_draft_tokens_are_tinted_in_the_streaming_reply_and_the_key_toggles_it():
    app, _ = make_app(replies=[" ".join(LONG_WORDS)], token_delay_s=0.06, spec=LIVE, drafted=LONG_DRAFTED)
    drafted = {LONG_WORDS[i] for i in LONG_DRAFTED}
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: app.view.chat_log.active_reply is not None and len(tail_words(app)[0]) >= 3)
        tinted, plain = tail_words(app)
        assert set(tinted) <= drafted and plain and not set(plain) & drafted  # exactly the drafted words
        await pilot.press("ctrl+f6")
        assert not app.view.chat_log.tint_drafts
        tinted, plain = tail_words(app)  # redrawn at once, with the same text
        assert not tinted and set(plain) & drafted
        await pilot.pause(0.3)
        tinted, plain = tail_words(app)  # and stays off as more text comes
        assert not tinted and set(plain) & drafted
        await pilot.press("ctrl+f6")
        await wait_for(pilot, lambda: len(tail_words(app)[0]) >= 1)
        await pilot.press("escape")
        await wait_for(pilot, lambda: idle(app), timeout_s=10)


async def test_plain_decode_tints_nothing():
    app, _ = make_app(replies=[" ".join(LONG_WORDS)], token_delay_s=0.03)
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: app.view.chat_log.active_reply is not None and len(tail_words(app)[1]) >= 5)
        assert tail_words(app)[0] == []
        await wait_for(pilot, lambda: idle(app), timeout_s=10)


async def test_the_timeline_shows_the_speculative_turns_target_steps():
    app, _ = make_app(replies=[" ".join(WORDS)], spec=LIVE, drafted=DRAFTED)
    async with app.run_test(size=(130, 50)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: idle(app) and app.query_one(TurnTimeline).metrics is not None)
        await pilot.pause()
        m = app.query_one(TurnTimeline).metrics
        # tokens 1..39: 10 verify steps of 3 tokens (2 drafts accepted, 1 rejected), 9 plain steps between them
        assert (m.spec_steps, m.spec_accepted, m.spec_drafted, m.spec_tokens_per_step) == (19, 20, 30, 39 / 19)
        assert (m.spec_verify_step_ms, m.spec_plain_step_ms, m.spec_speedup) == (60.0, 20.0, 1.0)  # 20 ms a token
        lines = drawn(app.query_one(TurnTimeline)).splitlines()
        steps = next(i for i, line in enumerate(lines) if line.startswith("steps"))
        end = next(i for i, line in enumerate(lines) if line.startswith("prompt"))
        assert lines[steps - 1].startswith(" ") and steps > 1  # under the time bar's legend, above the prompt bar
        items = " · ".join(line[8:].strip() for line in lines[steps:end]).split(" · ")
        assert items == ["19 target steps", "2.1 tok/step", "verify 60.0 ms/step", "plain 20.0 ms/step", "×1.0"]


async def test_plain_turns_timeline_has_no_steps_line():
    app, _ = make_app(replies=[" ".join(WORDS)])
    async with app.run_test(size=(130, 50)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: idle(app) and app.query_one(TurnTimeline).metrics is not None)
        await pilot.pause()
        assert not any(line.startswith("steps") for line in drawn(app.query_one(TurnTimeline)).splitlines())


def tinted(text) -> list[str]:
    """The tinted runs of a Rich text."""
    return [text.plain[s.start : s.end] for s in sorted(text.spans, key=lambda s: s.start)]


def test_the_tail_tints_spans_across_wrapped_lines_and_only_its_own_text():
    red = Style(color="red")
    text = "hello world, this is a test of the tail"
    t = tinted_tail(text, 6, [(0, 5), (13, 17), (26, 33)], 10, 4, red)
    assert t.plain == tail_lines(text[6:], 10, 4) == "world,\nthis is a\ntest of\nthe tail"
    # (0, 5) lies before the tail; (26, 33) = "t of th" crosses a line break, whose space is not drawn
    assert tinted(t) == ["this", "t of", "th"] and all(s.style == red for s in t.spans)
    assert tinted(tinted_tail(text, 6, [(13, 17)], 10, 4, None)) == []  # tint off


def test_the_tail_finds_repeated_lines_from_the_end_and_leaves_a_tab_expanded_line_untinted():
    red = Style(color="red")
    t = tinted_tail("ab\nab\nab", 0, [(6, 8)], 10, 2, red)  # the last "ab" only
    assert t.plain == "ab\nab" and [(s.start, s.end) for s in t.spans] == [(3, 5)]
    t = tinted_tail("a\tb\ncd", 0, [(0, 3), (4, 6)], 10, 4, red)  # the tab is drawn as spaces: not found
    assert t.plain == "a   b\ncd" and tinted(t) == ["cd"]


async def test_the_real_engine_drafts_tint_the_tail(default_model_info, monkeypatch):
    """lookup on the default model, asked to repeat its prompt: accepted drafts reach the tail, tinted. Every tail
    the view draws is recorded (a spy on its ``tinted_tail``), so a quick reply whose tinted frames fall between
    two of the test's polls still counts."""
    from chatphase.ui.transcript import reply_view

    drawn = [0]
    real_tail = reply_view.tinted_tail

    in_tail = [0]  # tails drawn with a drafted span past the committed text

    def spy(text_, committed, drafted, *args, **kwargs):
        text = real_tail(text_, committed, drafted, *args, **kwargs)
        drawn[0] = max(drawn[0], len(text.spans))
        in_tail[0] += any(end > committed for _, end in drafted)
        return text

    monkeypatch.setattr(reply_view, "tinted_tail", spy)
    from chatphase.chat.controller import ChatController

    finished: list = []
    real_finished = ChatController._finished

    def record(self, turn, event):
        finished.append(event)
        return real_finished(self, turn, event)

    monkeypatch.setattr(ChatController, "_finished", record)
    settings = Settings().with_overrides(n_ctx=1024, temperature=0.0, seed=0, spec="lookup", max_tokens=120)
    app = ChatPhaseApp(settings, default_model_info, lambda info, cur: EngineHost(info, cur.engine))
    most = 0
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app), timeout_s=60)
        # at temperature 0 the default model answers with a long run of digits: lookup drafts most of it
        words = "one two three four five six seven eight nine ten eleven twelve"
        await send(pilot, f"Repeat this text exactly: {words} {words}")
        await wait_for(pilot, lambda: app.chat.active_turn is not None)
        while app.chat.active_turn is not None:
            if app.view.chat_log.active_reply is not None:
                most = max(most, len(tail_words(app)[0]))
            await pilot.pause(0.02)
        await wait_for(pilot, lambda: idle(app), timeout_s=60)
        assert app.chat.conversation[-1].content
    accepted = finished[-1].metrics.spec_accepted if finished else None
    if not accepted:  # the reply's greedy text depends on the CPU's kernels; on some it repeats nothing drafted
        pytest.skip(
            f"lookup accepted no drafts in this machine's reply ({len(finished)} turn, spec_accepted {accepted})"
        )
    if not in_tail[0]:  # a quick reply can end within one frame: no tail was drawn while it held a draft
        pytest.skip("no tail was drawn while drafted tokens were in it (the reply ended within a frame)")
    assert max(most, drawn[0]) >= 1  # accepted drafts were drawn tinted


async def test_a_draft_model_that_cannot_pay_is_said_in_the_chat_at_load_and_after_a_turn():
    from chatphase.engine.spec_modes import SPEC_WARNING
    from chatphase.ui.transcript.notice import Notice as ChatNotice

    before = f"{SPEC_WARNING} the draft model small.gguf is the target model itself: each drafted token costs …"
    after = "the draft model did not pay: this turn decoded at ×0.41 of plain steps (2 threads); --spec off …"
    app, _ = make_app(notes=(before,), spec=LIVE, drafted=(2, 3), spec_note=after)
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        shown = lambda: [str(n.render()) for n in app.query(ChatNotice)]  # noqa: E731
        assert any(before in text for text in shown())
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: idle(app) and any(after in text for text in shown()))
