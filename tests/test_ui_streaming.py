"""Streaming a reply: Markdown split into a few MarkdownSegment widgets at block boundaries, the prefill
drawn from the app's tick (held back for PREFILL_QUIET_S when no core is spare), and the prompt's cursor
not blinking while a turn runs."""

from __future__ import annotations

import os

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Label
from ui_support import idle, make_app, send, wait_for, wait_thread

from chatphase.engine.events import SamplingParams
from chatphase.settings.schema import Settings
from chatphase.ui.phases import prefill_drawing
from chatphase.ui.redraw_budget import RedrawBudget
from chatphase.ui.transcript.chat_log import SEGMENT_CHARS, ChatLog, ReplyView, complete_blocks_end
from chatphase.ui.transcript.reply_markdown import MarkdownSegment
from chatphase.ui.transcript.reply_tail import tail_lines

LONG_PROMPT = " ".join(f"word{i}" for i in range(60))  # 60 words: 65 prompt tokens in the FakeEngine
#: engine threads that leave this machine no core for the UI (FakeEngine reports what it is given)
NO_SPARE = os.cpu_count() or 1


def _paragraph(i: int) -> str:
    """A block of about 80 characters."""
    return f"Paragraph {i:02d} says that prefill reads the prompt and decode writes one token at a time.\n\n"


CODE_BLOCK = "```python\ndef total(xs):\n    s = 0\n\n    for x in xs:\n        s += x\n    return s\n```\n\n"
LIST_BLOCK = "- first item of the list\n- second item, a bit longer than the first\n- third item\n\n"
#: a long Markdown reply: 40 paragraphs with a code block (with a blank line inside) and a list among them.
LONG_REPLY = (
    "".join(_paragraph(i) for i in range(20))
    + CODE_BLOCK
    + "".join(_paragraph(i) for i in range(20, 30))
    + LIST_BLOCK
    + "".join(_paragraph(i) for i in range(30, 40))
    + "The end.\n"
)


def stats(app) -> str:
    return str(app.query_one("#phase-stats", Label).render())


def segments(view: ReplyView) -> list[MarkdownSegment]:
    return list(view.query(MarkdownSegment))


def assert_split_at_block_boundaries(view: ReplyView) -> None:
    """Every segment after the first starts where whole blocks of the text before it end."""
    before = ""
    for i, segment in enumerate(segments(view)):
        if i:
            assert complete_blocks_end(before) == len(before), f"segment {i} starts inside a block"
            assert segment.source[:1] not in (" ", "\t", "\n"), f"segment {i} starts with {segment.source[:9]!r}"
        before += segment.source


class LogApp(App):
    """A tiny host: a ChatLog alone."""

    def compose(self) -> ComposeResult:
        yield ChatLog()


async def stream(pilot, view: ReplyView, text: str, size: int = 37) -> None:
    """Feed ``text`` in ``size``-character chunks with a committing flush after each (never a stall)."""
    for i in range(0, len(text), size):
        view.feed(text[i : i + size])
        await view.flush(commit=True)
        await pilot.pause()


# -- ReplyView segments, driven directly -------------------------------------------------------------
async def test_long_reply_is_split_into_segments_at_block_boundaries():
    app = LogApp()
    async with app.run_test(size=(100, 40)) as pilot:
        view = app.query_one(ChatLog).start_reply(1)
        await pilot.pause()
        await stream(pilot, view, LONG_REPLY)
        assert len(segments(view)) > 1
        await view.finish(LONG_REPLY, None)
        await pilot.pause()

        parts = segments(view)
        assert len(parts) >= len(LONG_REPLY) // (SEGMENT_CHARS + 200)  # a few widgets, not one per block
        assert 1 < len(parts) < 10
        assert "".join(p.source for p in parts) == LONG_REPLY == view.text
        assert_split_at_block_boundaries(view)
        for p in parts[:-1]:  # a new segment starts only once the previous one is SEGMENT_CHARS long
            assert len(p.source) >= SEGMENT_CHARS
        # the code block (whose blank line is not a block boundary) stays whole in one segment
        assert sum(CODE_BLOCK in p.source for p in parts) == 1
        assert sum(LIST_BLOCK in p.source for p in parts) == 1
        assert not view.pending and view.finished
        for p in parts:  # each segment draws its text (a continued one once drew only blank lines)
            drawn = [p.render_line(y).text.strip() for y in range(p.size.height)]
            assert p.size.height > 0 and sum(map(bool, drawn)) >= p.size.height // 2, (p.source[:60], drawn)


async def test_indented_chunk_continues_the_previous_segment():
    """A list may go on after a blank line (an indented continuation, a tab): it is held back until a
    block that cannot belong to it begins, and never split from its continuations."""
    app = LogApp()
    async with app.run_test(size=(100, 40)) as pilot:
        view = app.query_one(ChatLog).start_reply(1)
        await pilot.pause()
        paragraphs = "".join(_paragraph(i) for i in range(SEGMENT_CHARS // 80 + 2))
        head = paragraphs + "- a list item\n\n"
        assert len(paragraphs) > SEGMENT_CHARS
        view.feed(head)
        assert await view.flush(commit=True)
        await pilot.pause()
        assert [p.source for p in segments(view)] == [paragraphs]  # the list may still go on

        view.feed("   continued list item\n\n")
        await view.flush(commit=True)
        view.feed("\tanother continuation\n\n")
        await view.flush(commit=True)
        await pilot.pause()
        assert all(p.source[:1] not in (" ", "\t") for p in segments(view))  # never split from its item

        # an unindented paragraph cannot continue the list: the list goes in whole, with its continuations
        view.feed("A new paragraph.\n\n")
        assert await view.flush(commit=True)
        await pilot.pause()
        parts = segments(view)
        assert [p.source for p in parts] == [
            paragraphs,
            "- a list item\n\n   continued list item\n\n\tanother continuation\n\nA new paragraph.\n\n",
        ]
        assert "".join(p.source for p in parts) == view.text
        assert parts[1].lead == _paragraph(SEGMENT_CHARS // 80 + 1)  # drawn as it reads after the block above


async def test_finish_with_another_text_leaves_one_segment():
    app = LogApp()
    async with app.run_test(size=(100, 40)) as pilot:
        view = app.query_one(ChatLog).start_reply(1)
        await pilot.pause()
        await stream(pilot, view, LONG_REPLY[:3000])
        assert len(segments(view)) > 1
        other = "The engine's final text.\n\n- differs from what streamed\n"
        await view.finish(other, None)
        await pilot.pause()
        parts = segments(view)
        assert len(parts) == 1 and parts[0].source == other
        assert view.text == other and view.finished and not view.pending
        assert not view.query_one(".reply-tail").display


async def test_stall_inside_a_block_does_not_split_it_across_segments():
    """When the stream pauses, the partial block is committed; if that fills the segment, the rest of the
    block must not open a new segment (a fence split so re-opens as a fence at its closing line)."""
    app = LogApp()
    async with app.run_test(size=(100, 40)) as pilot:
        view = app.query_one(ChatLog).start_reply(1)
        await pilot.pause()
        head = ""
        while len(head) + 2 * len(_paragraph(0)) < SEGMENT_CHARS:
            head += _paragraph(len(head))
        head += "x" * (SEGMENT_CHARS - 20 - len(head)) + "\n\n"
        assert SEGMENT_CHARS - 40 < len(head) < SEGMENT_CHARS
        view.feed(head)
        await view.flush(commit=True)
        view.feed("```python\nx = 1\nx += 1\nx += 2\n")
        await view.flush(commit=True)
        await view.flush(commit=True)  # nothing new arrived: the stream stalled, the partial fence is committed
        view.feed("y = 2\n```\n\nAfter the code.\n\n")
        await view.flush(commit=True)
        await view.finish(view.text, None)
        await pilot.pause()
        assert_split_at_block_boundaries(view)


# -- ReplyView segments in the app, streamed by the FakeEngine ---------------------------------------
async def test_streamed_reply_in_the_app_is_segmented():
    settings = Settings(sampling=SamplingParams(max_tokens=2000))  # the reply is 677 tokens
    app, _ = make_app(settings, replies=[LONG_REPLY], token_delay_s=0.004)
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        app.view.flush_budget = RedrawBudget(1.0, max_interval_s=0.0)  # commit at every tick
        await send(pilot, "write a long answer")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app), timeout_s=30)
        assert app.chat.conversation[1].content == LONG_REPLY
        view = app.query_one(ReplyView)
        parts = segments(view)
        assert len(parts) > 1
        assert "".join(p.source for p in parts) == LONG_REPLY
        for p in parts[:-1]:
            assert len(p.source) >= SEGMENT_CHARS
        assert not view.query_one(".reply-tail").display


# -- the prefill drawn from the tick -----------------------------------------------------------------
async def test_prefill_is_not_drawn_while_quiet_without_a_spare_core(monkeypatch):
    monkeypatch.setattr(prefill_drawing, "PREFILL_QUIET_S", 60.0)
    app, engines = make_app(Settings().with_overrides(n_batch=16, n_threads=NO_SPARE), hold="prefill")
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        assert app.view.tick_stride == 2  # the engine's threads take every core
        await send(pilot, LONG_PROMPT)
        await wait_thread(pilot, engines[0].held)
        await pilot.pause(0.5)  # several ticks
        assert app.view.prefill.waiting and app.view.prefill.progress is not None  # the progress arrived…
        assert "16/65" not in stats(app)  # …but is not drawn
        assert "0/65" not in stats(app)  # nor the prefill's start
        assert "templating" in stats(app)

        app.view.prefill.quiet_s = 0.0
        await wait_for(pilot, lambda: "16/65" in stats(app), timeout_s=1.0)

        engines[0].release()
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        assert app.chat.conversation[1].content.startswith("Reply 1: you said")
        assert str(app.query_one("#phase-badge", Label).render()).strip() == "DONE"
        assert not app.view.prefill.waiting and app.view.prefill.progress is None


async def test_quiet_prefill_is_drawn_at_the_first_token(monkeypatch):
    """Without a spare core and a prefill shorter than PREFILL_QUIET_S, the first token draws it."""
    monkeypatch.setattr(prefill_drawing, "PREFILL_QUIET_S", 60.0)
    app, engines = make_app(
        Settings().with_overrides(n_batch=16, n_threads=NO_SPARE), hold="decode", hold_after_tokens=2
    )
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        assert app.view.tick_stride == 2
        await send(pilot, LONG_PROMPT)
        await wait_thread(pilot, engines[0].held)
        await wait_for(pilot, lambda: app.chat.turn is not None and app.chat.turn.decoding)
        assert app.panel.figures["prompt"] == "65 tok (0 cached)"  # the prefill's start reached the panel
        assert app.panel.figures["prefill"].startswith("65/65 tok")
        bar = app.query_one("#prefill-bar")
        assert bar.total == 65 and bar.progress == 65  # the full prefill bar is kept at the first token
        engines[0].release()
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a core to spare needs 2 CPUs")
async def test_prefill_progress_is_drawn_at_once_with_a_spare_core():
    app, engines = make_app(Settings().with_overrides(n_batch=16, n_threads=NO_SPARE - 1), hold="prefill")
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        assert app.view.tick_stride == 1 and app.view.prefill.quiet_s == 0
        assert prefill_drawing.PREFILL_QUIET_S > 0.1
        await send(pilot, LONG_PROMPT)
        await wait_thread(pilot, engines[0].held)
        await wait_for(pilot, lambda: "16/65" in stats(app), timeout_s=1.0)
        engines[0].release()
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))


# -- the prompt's cursor ---------------------------------------------------------------------------
async def test_prompt_cursor_does_not_blink_while_a_turn_runs():
    app, engines = make_app(hold="decode")
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        assert app.prompt.cursor_blink is True
        await send(pilot, "hello there")
        await wait_thread(pilot, engines[0].held)
        assert app.chat.busy and app.prompt.cursor_blink is False
        await pilot.pause(0.3)
        assert app.prompt.cursor_blink is False
        engines[0].release()
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        await wait_for(pilot, lambda: app.prompt.cursor_blink is True, timeout_s=1.0)


async def test_a_block_longer_than_the_tail_is_committed_in_whole_lines():
    """A list with no blank line is one block: its whole lines go to the Markdown, the tail keeps the rest."""
    app = LogApp()
    async with app.run_test(size=(100, 40)) as pilot:
        view = app.query_one(ChatLog).start_reply(1)
        await pilot.pause()
        items = "".join(f"- item {i}\n" for i in range(10))
        view.feed(items + "- item 1")
        assert await view.flush(commit=True)
        assert "".join(s.source for s in segments(view)) == items
        view.feed("0 is last\n\nAfter.\n\n")
        await view.flush(commit=True)
        await view.finish(view.text, None)
        assert "".join(s.source for s in segments(view)) == view.text
        assert_split_at_block_boundaries(view)


def test_the_tail_wraps_at_spaces_and_keeps_the_last_lines():
    text = "of cats and the different types of animals that lived\n\n    code  stays   indented"
    assert tail_lines(text, 20, 4) == "animals that lived\n\n    code  stays\nindented"  # no word cut in two
    assert tail_lines("x" * 45, 20, 2) == "x" * 20 + "\n" + "x" * 5  # a word longer than the line is cut
