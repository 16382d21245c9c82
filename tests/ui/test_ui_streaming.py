"""Streaming a reply: Markdown split into a few MarkdownSegment widgets at block boundaries, the prefill
drawn from the app's tick (held back for PREFILL_QUIET_S when no core is spare), and the prompt's cursor
not blinking while a turn runs."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Label
from ui_support import idle, make_app, send, streaming_reply, wait_for, wait_thread

from chatphase.engine.events import SamplingParams
from chatphase.settings.schema import Settings
from chatphase.ui.chat_view import (
    NO_SPARE_CORE_PANEL_S,
    NO_SPARE_CORE_TICK_S,
    PANEL_S,
    STALL_S,
    TICK_S,
)
from chatphase.ui.phases import prefill_drawing
from chatphase.ui.redraw_budget import RedrawBudget
from chatphase.ui.transcript import chat_log
from chatphase.ui.transcript.chat_log import ChatLog
from chatphase.ui.transcript.md_blocks import complete_blocks_end
from chatphase.ui.transcript.reply_markdown import MarkdownSegment
from chatphase.ui.transcript.reply_tail import tail_lines, wrapped_lines
from chatphase.ui.transcript.reply_view import SEGMENT_CHARS, TAIL_LINES, ReplyView

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
    """A tiny host: a ChatLog alone, with the app's styles (the tail's height and padding)."""

    CSS_PATH = str(Path(chat_log.__file__).resolve().parents[1] / "app.tcss")

    def compose(self) -> ComposeResult:
        yield ChatLog()


async def stream(pilot, view: ReplyView, feed, text: str, size: int = 37) -> None:
    """Feed ``text`` in ``size``-character chunks with a committing flush after each (never a stall)."""
    for i in range(0, len(text), size):
        feed(text[i : i + size])
        await view.flush(commit=True)
        await pilot.pause()


# -- ReplyView segments, driven directly -------------------------------------------------------------
async def test_long_reply_is_split_into_segments_at_block_boundaries():
    app = LogApp()
    async with app.run_test(size=(100, 40)) as pilot:
        view, feed = streaming_reply(app.query_one(ChatLog))
        await pilot.pause()
        await stream(pilot, view, feed, LONG_REPLY)
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
        view, feed = streaming_reply(app.query_one(ChatLog))
        await pilot.pause()
        paragraphs = "".join(_paragraph(i) for i in range(SEGMENT_CHARS // 80 + 2))
        head = paragraphs + "- a list item\n\n"
        assert len(paragraphs) > SEGMENT_CHARS
        feed(head)
        assert await view.flush(commit=True)
        await pilot.pause()
        assert [p.source for p in segments(view)] == [paragraphs]  # the list may still go on

        feed("   continued list item\n\n")
        await view.flush(commit=True)
        feed("\tanother continuation\n\n")
        await view.flush(commit=True)
        await pilot.pause()
        assert all(p.source[:1] not in (" ", "\t") for p in segments(view))  # never split from its item

        # an unindented paragraph cannot continue the list: the list goes in whole, with its continuations
        feed("A new paragraph.\n\n")
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
        view, feed = streaming_reply(app.query_one(ChatLog))
        await pilot.pause()
        await stream(pilot, view, feed, LONG_REPLY[:3000])
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
        view, feed = streaming_reply(app.query_one(ChatLog))
        await pilot.pause()
        head = ""
        while len(head) + 2 * len(_paragraph(0)) < SEGMENT_CHARS:
            head += _paragraph(len(head))
        head += "x" * (SEGMENT_CHARS - 20 - len(head)) + "\n\n"
        assert SEGMENT_CHARS - 40 < len(head) < SEGMENT_CHARS
        feed(head)
        await view.flush(commit=True)
        feed("```python\nx = 1\nx += 1\nx += 2\n")
        await view.flush(commit=True)
        await view.flush(commit=True)  # nothing new arrived: the stream stalled, the partial fence is committed
        feed("y = 2\n```\n\nAfter the code.\n\n")
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


# -- what a tick draws ---------------------------------------------------------------------------------
async def test_a_streaming_reply_redraws_neither_the_prompt_nor_the_footer_at_each_tick(monkeypatch):
    """Textual draws every widget whose container overlaps a frame's changes: in boxes of their own
    (app.tcss), the prompt and the footer are not drawn again by the ticks that stream a reply's tail."""
    from textual.widgets import Footer

    from chatphase.ui.prompt_input import PromptInput

    drawn = {PromptInput: 0, Footer: 0}
    for cls in drawn:
        original = cls.render_lines

        def counted(self, crop, original=original, cls=cls):
            drawn[cls] += 1
            return original(self, crop)

        monkeypatch.setattr(cls, "render_lines", counted)
    reply = " ".join(f"word{i}" for i in range(400))
    settings = Settings(sampling=SamplingParams(max_tokens=2000)).with_overrides(n_threads=NO_SPARE)
    app, _ = make_app(settings, replies=[reply], token_delay_s=0.01)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        ticks = 0
        tick = app.view.tick

        async def counted_tick():
            nonlocal ticks
            ticks += 1
            await tick()

        app.view._timer.stop()
        app.view._timer = app.set_interval(app.view.tick_s, counted_tick, pause=True)
        await send(pilot, "write")
        await wait_for(pilot, lambda: app.chat.turn is not None and app.chat.turn.decoding)
        before = dict(drawn)
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app), timeout_s=30)
        assert ticks >= 8
        assert drawn[PromptInput] - before[PromptInput] <= ticks // 4, (drawn, before, ticks)
        assert drawn[Footer] - before[Footer] <= ticks // 4, (drawn, before, ticks)


# -- the prefill drawn from the tick -----------------------------------------------------------------
async def test_prefill_is_not_drawn_while_quiet_without_a_spare_core(monkeypatch):
    monkeypatch.setattr(prefill_drawing, "PREFILL_QUIET_S", 60.0)
    app, engines = make_app(Settings().with_overrides(n_batch=16, n_threads=NO_SPARE), hold="prefill")
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        assert app.view.tick_s == NO_SPARE_CORE_TICK_S  # the engine's threads take every core
        assert app.chat_log.stall_flushes == round(STALL_S / NO_SPARE_CORE_TICK_S) >= 2
        assert app.view.panel_s == NO_SPARE_CORE_PANEL_S
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
        assert app.view.tick_s == NO_SPARE_CORE_TICK_S
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
        assert app.view.tick_s == TICK_S and app.view.prefill.quiet_s == 0
        assert app.chat_log.stall_flushes == round(STALL_S / TICK_S) and app.view.panel_s == PANEL_S
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
        view, feed = streaming_reply(app.query_one(ChatLog))
        await pilot.pause()
        items = "".join(f"- item {i}\n" for i in range(10))
        feed(items + "- item 1")
        assert await view.flush(commit=True)
        assert "".join(s.source for s in segments(view)) == items
        feed("0 is last\n\nAfter.\n\n")
        await view.flush(commit=True)
        await view.finish(view.text, None)
        assert "".join(s.source for s in segments(view)) == view.text
        assert_split_at_block_boundaries(view)


def drawn_lines(widget) -> list[str]:
    """The lines a laid-out widget draws, right-stripped."""
    return [widget.render_line(y).text.rstrip() for y in range(widget.size.height)]


async def test_a_long_paragraph_goes_to_the_markdown_line_by_line_as_the_tail_fills():
    """With no commit allowed (the CPU budget says no), the wrapped lines of a paragraph longer than the
    tail still go to the Markdown, all but the last: no line is ever out of sight, and what is drawn (the
    Markdown, then the tail) reads line for line as the paragraph wrapped whole."""
    app = LogApp()
    async with app.run_test(size=(60, 40)) as pilot:
        view, feed = streaming_reply(app.query_one(ChatLog))
        await pilot.pause()
        paragraph = " ".join(f"word{i}" for i in range(150))
        tail = view.query_one(".reply-tail")
        assert tail.content_size.height == TAIL_LINES
        wrote = 0
        for i in range(0, len(paragraph), 23):
            feed(paragraph[i : i + 23])
            wrote += await view.flush(commit=False)
            await pilot.pause()
            markdown = [line for s in segments(view) for line in drawn_lines(s) if line]
            shown = markdown + [line.strip() for line in drawn_lines(tail) if line]
            assert shown == textwrap.wrap(view.text, tail.content_size.width), i
        assert wrote >= len(textwrap.wrap(paragraph, tail.content_size.width)) // 4 - 1  # a commit per tail's worth


async def test_a_pause_is_drawn_only_after_stall_flushes_without_new_text():
    """The partial block goes to the Markdown once ``stall_flushes`` flushes in a row found no new text: a
    tick that falls between two of the engine's batches is not a pause."""
    app = LogApp()
    async with app.run_test(size=(100, 40)) as pilot:
        view, feed = streaming_reply(app.query_one(ChatLog))
        view.stall_flushes = 2
        await pilot.pause()
        feed("A paragraph that is still being written")
        assert not await view.flush(commit=True)  # text arrived: the paragraph is not whole
        assert not await view.flush(commit=True)  # one flush without new text: not yet a pause
        assert "".join(s.source for s in segments(view)) == ""
        assert await view.flush(commit=True)  # the second: the stream paused, the partial block is drawn
        assert "".join(s.source for s in segments(view)) == view.text


def test_the_tail_wraps_at_spaces_and_keeps_the_last_lines():
    text = "of cats and the different types of animals that lived\n\n    code  stays   indented"
    assert tail_lines(text, 20, 4) == "animals that lived\n\n    code  stays\nindented"  # no word cut in two
    assert tail_lines("x" * 45, 20, 2) == "x" * 20 + "\n" + "x" * 5  # a word longer than the line is cut


def test_wrapped_lines_know_where_each_line_starts():
    text = "hello world, this is a test\n\n\tone tab and then words"
    lines = wrapped_lines(text, 10, 20)
    assert [piece for _, piece in lines] == [
        "hello",
        "world,",
        "this is a",
        "test",
        "",
        "    one",
        "tab and",
        "then words",
    ]
    starts = [at for at, _ in lines]
    assert starts[:5] == [0, 6, 13, 23, 28]  # each piece is the source's text there
    assert starts[5] == 29 and starts[6:] == [None, None]  # after a tab: the line's start only
    assert wrapped_lines(text, 10, 2) == lines[-2:]  # the last lines only


async def test_a_code_reply_without_fences_keeps_its_lines_on_screen_folded_and_in_the_copy(monkeypatch):
    """Markdown joins a paragraph's lines: a code reply without fences read as one line. Its line breaks
    and indentation stay as the model wrote them while it streams, once finished, once folded under a newer
    reply, and in the copy (F2)."""
    code = "def area(r):\n    pi = 3.14159\n    return pi * r * r\n\nprint(area(2))"
    app, _ = make_app(replies=[code, "ok"], token_delay_s=0.01)
    copied: list[str] = []
    monkeypatch.setattr(app, "copy_to_clipboard", copied.append)
    expected = ["def area(r):", "    pi = 3.14159", "    return pi * r * r", "", "print(area(2))"]
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "write area() in python")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        await pilot.pause()
        view = app.query_one(ReplyView)
        drawn = [line for p in segments(view) for line in drawn_lines(p)]
        assert drawn[: len(expected)] == expected
        await pilot.press("f2")
        assert copied == [code]
        await send(pilot, "thanks")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 4 and idle(app))
        await pilot.pause()
        assert view.folded
        asked, blank, *answer = drawn_lines(view)  # an old turn draws its message above its reply
        assert asked.strip() == "▎ write area() in python" and not blank.strip()
        assert [line[1:] for line in answer[: len(expected)]] == expected  # inside the reply's padding (1 cell)
