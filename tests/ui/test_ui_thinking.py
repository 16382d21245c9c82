"""A reasoning model's thinking in the TUI (FakeEngine scripts, Pilot): the block streams above the answer
with its running count, collapses to one line when the answer starts, expands to the whole thinking, and
the phase line, the side panel and the dashboard measure it — for every marker case, checked on screen."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine, fake_model_info
from textual.geometry import Region
from textual.widgets import Collapsible, Label
from thinking_support import CASES, THINK
from ui_support import idle, make_app, notifications, send, wait_for, wait_thread

from chatphase.engine.events import SamplingParams
from chatphase.sessions.catalog import load_session
from chatphase.settings.schema import Settings
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.dashboard.history_table import THINKING_COLUMNS, TurnHistoryTable
from chatphase.ui.dashboard.timeline import TurnTimeline
from chatphase.ui.phases.panel import PhasePanel
from chatphase.ui.transcript.reply_view import ReplyView
from chatphase.ui.transcript.thinking_block import ThinkingBlock, thought_title
from chatphase.units import fmt_ms, fmt_seconds

MARKERS = ("<think>", "</think>", "think>", "<|channel|>", "<|message|>", "<|end|>", "<|start|>")


def drawn(widget) -> str:
    """The widget's own text as drawn at its size (padding included)."""
    width, height = widget.outer_size
    return "\n".join("".join(seg.text for seg in strip) for strip in widget.render_lines(Region(0, 0, width, height)))


def badge(app) -> str:
    return str(app.query_one("#phase-badge", Label).render()).strip()


def stats(app) -> str:
    return str(app.query_one("#phase-stats", Label).render())


def shown(widget) -> bool:
    """Whether ``widget`` and every ancestor up to the screen is displayed and has a size."""
    node = widget
    while node is not None and node is not widget.screen:
        if not node.display:
            return False
        node = node.parent
    return bool(widget.size.area)


def body_text(block: ThinkingBlock) -> str:
    """The expanded block's text as drawn, without its left rule."""
    lines = drawn(block.query_one(".thinking-text")).splitlines()
    return "\n".join(line.lstrip("▌ ").rstrip() for line in lines).strip()


def answer_text(view: ReplyView) -> str:
    return "\n".join(drawn(segment) for segment in view.query("MarkdownSegment"))


def thinking_app(pieces, fmt, preopened=False, settings=None, **kwargs):
    return make_app(settings, replies=[pieces], thinking=fmt, thinking_preopened=preopened, **kwargs)


async def finish_turn(pilot, text: str = "What is 2+2?") -> None:
    app = pilot.app
    n = len(app.chat.conversation)
    await send(pilot, text)
    await wait_for(pilot, lambda: len(app.chat.conversation) == n + 2 and idle(app))
    await pilot.pause(0.2)


@pytest.mark.parametrize("case", sorted(CASES))
async def test_the_thinking_streams_in_its_block_then_collapses_above_the_answer(case):
    pieces, fmt, preopened, thinking_tokens = CASES[case]
    app, engines = thinking_app(pieces, fmt, preopened, hold="decode", hold_after_tokens=3)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "What is 2+2?")
        await wait_thread(pilot, engines[0].held)
        await wait_for(
            pilot, lambda: app.query(ThinkingBlock) and "Thinking… " in drawn(app.query_one(".thinking-live"))
        )
        block = app.query_one(ThinkingBlock)
        await wait_for(pilot, lambda: "I add" in drawn(block.query_one(".thinking-tail")))
        live = drawn(block.query_one(".thinking-live"))
        assert live.strip().startswith("Thinking… ") and " tok · " in live and live.strip().endswith(" s")
        assert badge(app) == "THINKING" and "TTFT" in stats(app) and " tok · " in stats(app)
        reply = app.query_one(ReplyView)
        assert list(reply.children).index(block) == 0  # above the answer
        assert not block.query(Collapsible) and not answer_text(reply).strip()
        engines[0].release()
        await wait_for(pilot, lambda: idle(app))
        await pilot.pause(0.2)

        m = app.dashboard.turns[1]
        title = block.query_one("CollapsibleTitle")
        assert shown(title) and not shown(block.query_one(".thinking-tail"))
        assert drawn(title).strip() == f"▶ Thought for {fmt_seconds(m.thinking_ms / 1000)} · {thinking_tokens} tok"
        assert m.thinking_tokens == thinking_tokens and not block.expanded
        assert not shown(block.query_one(".thinking-text"))  # collapsed: one line
        assert answer_text(reply).strip() == "It is 4."
        on_screen = answer_text(reply) + drawn(title)
        assert not any(marker in on_screen for marker in MARKERS)
        assert badge(app) == "DONE" and f"TTFA {fmt_ms(m.ttfa_ms)} · " in stats(app)

        await pilot.click(title)  # expands to the whole thinking text
        await wait_for(pilot, lambda: shown(block.query_one(".thinking-text")))
        assert body_text(block) == "I add them."
        assert drawn(title).strip().startswith("▼ Thought for")


async def test_a_reply_cut_short_while_thinking_says_so():
    pieces = ["<think>", "Let", " me", " count", " the", " ways"]
    app, _ = thinking_app(pieces, THINK, settings=Settings(sampling=SamplingParams(max_tokens=4)))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await finish_turn(pilot, "Think hard.")
        block = app.query_one(ThinkingBlock)
        m = app.dashboard.turns[1]
        assert m.thinking_cut_short and m.stop_reason == "length"
        assert drawn(block.query_one("CollapsibleTitle")).strip() == "▶ Thinking cut short after 0.1 s · 4 tok"
        assert block.text == "Let me count" and not answer_text(app.query_one(ReplyView)).strip()
        assert "cut short" in app.panel.figures["thinking"]


async def test_a_thinking_only_reply_shows_its_block_and_an_empty_answer():
    app, _ = thinking_app(["<think>", "Hmm", ".", "</think>"], THINK)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await finish_turn(pilot, "?")
        block = app.query_one(ThinkingBlock)
        assert drawn(block.query_one("CollapsibleTitle")).strip() == "▶ Thought for 0.1 s · 4 tok"
        reply = app.query_one(ReplyView)
        assert block.text == "Hmm." and not answer_text(reply).strip()
        assert not shown(reply.query_one(".reply-tail"))
        await pilot.press("f2")  # no answer to copy: the notice names the key that copies the thinking
        await pilot.pause()
        assert "has only thinking: Ctrl+F2 copies it" in notifications(app)[-1]
        await pilot.press("ctrl+f2")
        await pilot.pause()
        assert app.clipboard == "<think>\nHmm.\n</think>"


async def test_a_model_without_markers_looks_as_before():
    pieces = ["Plain", " <think>", " text", "."]
    app, _ = thinking_app(pieces, None)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await finish_turn(pilot, "hi")
        assert not app.query(ThinkingBlock)
        assert app.query_one(ReplyView).text == "Plain <think> text."
        assert "thinking" not in app.panel.figures and not app.query_one(TurnHistoryTable).thinking
        assert "TTFA" not in stats(app)


async def test_the_budget_and_the_open_setting():
    pieces = ["<think>", "a", " b", " c", " d", " e", "</think>", "Done", "."]
    settings = Settings(sampling=SamplingParams(think_budget=3), thinking_open=True)
    app, _ = thinking_app(pieces, THINK, settings=settings)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await finish_turn(pilot)
        block = app.query_one(ThinkingBlock)
        assert drawn(block.query_one("CollapsibleTitle")).strip() == "▼ Thought for 0.0 s · 3 tok · budget reached"
        assert block.expanded and body_text(block) == "a b"


async def test_the_panel_history_timeline_and_explanation_measure_the_thinking():
    pieces, fmt, preopened, _ = CASES["both tags"]
    app, _ = thinking_app(pieces, fmt, preopened)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await finish_turn(pilot)
        m = app.dashboard.turns[1]
        panel = drawn(app.query_one(PhasePanel).query_one("#turn-figures"))
        assert "thinking    5 tok · 80.0 ms" in panel
        assert f"answer      4 tok · TTFA {fmt_ms(m.ttfa_ms)} · 50.0 tok/s" in panel
        table = app.query_one(TurnHistoryTable)
        assert table.thinking and table.columns_shown == THINKING_COLUMNS
        assert [str(c).split("\n") for c in table.get_row_at(0)][4] == ["9", "5"]  # decode over thinking tokens
        timeline = drawn(app.query_one(TurnTimeline))
        assert "┅ thinking 80.0 ms" in timeline and "━ answer 80.0 ms" in timeline
        assert "┅ thinking 5 tok" in timeline and "━ answer 4 tok" in timeline
        explain = str(app.query_one("#detail-explain").render())
        assert "thinking: 5 of 9 generated tokens (56%), 80 ms before the first answer token" in explain
        app.action_new_chat()
        await pilot.pause(0.1)
        assert not table.thinking and table.row_count == 0


async def test_copy_answer_only_or_with_thinking():
    pieces, fmt, preopened, _ = CASES["pre-opened"]
    app, _ = thinking_app(pieces, fmt, preopened)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await finish_turn(pilot)
        await pilot.press("f2")
        assert app.clipboard == "It is 4."
        await pilot.press("ctrl+f2")  # "Chat: Copy with thinking"
        assert app.clipboard == "<think>\nI add them.\n</think>\n\nIt is 4."
        assert any("with its thinking" in n for n in notifications(app))


async def test_the_thinking_switch_cycles_for_the_next_turn():
    pieces, fmt, preopened, _ = CASES["both tags"]
    app, engines = thinking_app(pieces, fmt, preopened)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        sent = []
        for mode, enable in (("on", True), ("off", False), ("auto", None)):
            await pilot.press("ctrl+f9")
            assert app.chat.settings.thinking == mode
            await finish_turn(pilot, f"thinking {mode}")
            sent.append(engines[0].requests[-1].enable_thinking)
            assert sent[-1] is enable
        assert any("no thinking switch" in n for n in notifications(app))  # the fake template has none


async def test_a_resumed_session_shows_its_thinking_collapsed():
    pieces, fmt, preopened, _ = CASES["both tags"]
    app, _ = thinking_app(pieces, fmt, preopened)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await finish_turn(pilot)
        session_id = app.recording.writer.id
    session = load_session(session_id)
    resumed = ChatPhaseApp(Settings(), fake_model_info(), lambda info, s: FakeEngine(info, s.engine), resume=session)
    async with resumed.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(resumed) and resumed.query(ThinkingBlock))
        await pilot.pause(0.2)
        block = resumed.query_one(ThinkingBlock)
        title = drawn(block.query_one("CollapsibleTitle")).strip()
        assert title == "▶ " + thought_title(5, session.turns[0].metrics.thinking_ms)
        assert block.text == "I add them." and not block.expanded
        assert answer_text(resumed.query_one(ReplyView)).strip() == "It is 4."


async def test_a_resumed_session_keeps_budget_reached():
    """The session stores that the budget closed the block, so the resumed block says so as the live one did."""
    pieces = ["<think>", "a", " b", " c", " d", "</think>", "Done", "."]
    app, _ = thinking_app(pieces, THINK, settings=Settings(sampling=SamplingParams(think_budget=3)))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await finish_turn(pilot)
        live = drawn(app.query_one(ThinkingBlock).query_one("CollapsibleTitle")).strip()
        session_id = app.recording.writer.id
    assert live.endswith("· budget reached")
    resumed = ChatPhaseApp(
        Settings(), fake_model_info(), lambda info, s: FakeEngine(info, s.engine), resume=load_session(session_id)
    )
    async with resumed.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(resumed) and resumed.query(ThinkingBlock))
        await pilot.pause(0.2)
        assert drawn(resumed.query_one(ThinkingBlock).query_one("CollapsibleTitle")).strip() == live


async def test_the_settings_screen_sets_thinking_its_budget_and_the_open_block():
    from textual.widgets import Checkbox, Input, Select

    from chatphase.ui.screens.settings import SettingsScreen

    pieces = ["<think>", "a", " b", " c", " d", "</think>", "Done", "."]
    app, engines = thinking_app(pieces, THINK)
    async with app.run_test(size=(130, 45)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await pilot.press("f9")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen) and app.screen.query("#set-thinking"))
        screen = app.screen
        assert screen.query_one("#set-thinking", Select).value == "auto"
        screen.query_one("#set-think_budget", Input).value = "-1"
        await pilot.pause()
        assert "think_budget must be >= 0" in str(screen.query_one("#settings-error").render())
        screen.query_one("#set-think_budget", Input).value = "2"
        screen.query_one("#set-thinking", Select).value = "off"
        screen.query_one("#set-thinking_open", Checkbox).value = True
        await pilot.pause()
        assert not str(screen.query_one("#settings-reload").render()).strip()  # no reload for these
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        s = app.chat.settings
        assert (s.thinking, s.sampling.think_budget, s.thinking_open, len(engines)) == ("off", 2, True, 1)
        await finish_turn(pilot)
        request = engines[0].requests[-1]
        assert request.enable_thinking is False and request.sampling.think_budget == 2
        block = app.query_one(ThinkingBlock)
        assert block.expanded and body_text(block) == "a"  # two thinking tokens: "<think>", "a"
        assert "budget reached" in drawn(block.query_one("CollapsibleTitle"))


@pytest.mark.parametrize("key", ["escape", "ctrl+l"])
async def test_esc_while_thinking_cuts_it_short_and_a_cleared_screen_does_not_break_the_stream(key):
    pieces = ["<think>", "Let", " me", " see", ".", "</think>", "Four", "."]
    app, engines = thinking_app(pieces, THINK, hold="decode", hold_after_tokens=3)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "?")
        await wait_thread(pilot, engines[0].held)
        await wait_for(pilot, lambda: badge(app) == "THINKING")
        await pilot.press(key)
        engines[0].release()
        await wait_for(pilot, lambda: idle(app))
        await pilot.pause(0.2)
        m = app.dashboard.turns[1]
        if key == "escape":
            assert (m.stop_reason, m.thinking_cut_short, badge(app)) == ("cancelled", True, "STOPPED")
            title = drawn(app.query_one(ThinkingBlock).query_one("CollapsibleTitle")).strip()
            assert title == "▶ Thinking cut short after 0.0 s · 3 tok"
        else:  # the screen was cleared mid-turn: the reply ends off screen, its figures still count
            assert not app.query(ThinkingBlock) and m.thinking_tokens == 6 and badge(app) == "DONE"


async def test_an_open_block_does_not_take_the_log_off_the_streaming_answer():
    pieces = ["<think>", *[f"step {i}\n" for i in range(60)], "</think>", *[f"word{i} " for i in range(120)]]
    app, _ = thinking_app(pieces, THINK, settings=Settings(thinking_open=True), token_delay_s=0.001)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await finish_turn(pilot, "go")
        log = app.chat_log
        assert app.query_one(ThinkingBlock).expanded and log.max_scroll_y > 40
        assert log.scroll_y == log.max_scroll_y  # still anchored at the bottom


async def test_a_finished_blocks_title_keeps_its_muted_looks_when_focused_or_hovered():
    """The block carries its looks (DEFAULT_CSS, below any app CSS): its title's colour and style must still
    win over Textual's own ``CollapsibleTitle:focus`` and ``:hover``, as they did from the app's stylesheet."""
    from textual.app import App
    from textual.widgets import Input

    class Host(App):
        def compose(self):
            yield Input()
            yield ThinkingBlock("some thinking", title="Thought for 1.0 s · 3 tok")

    app = Host()
    async with app.run_test(size=(60, 10)) as pilot:
        await pilot.pause()
        title = app.query_one("CollapsibleTitle")
        looks = (title.styles.color, title.styles.text_style)
        assert title.styles.text_style.italic
        await pilot.hover("CollapsibleTitle")
        assert (title.styles.color, title.styles.text_style) == looks
        title.focus()
        await pilot.pause()
        assert title.has_focus and (title.styles.color, title.styles.text_style) == looks
