"""What an old turn costs the UI: a finished reply is folded into one widget once a newer one starts
(``ReplyView.fold``), which draws the user message above it too (``folded_turn``), the widgets it
streamed into are freed, and it reads as it did. Counts, not timings
or RSS (``benchmarks/ui_memory.py`` measures the memory)."""

from __future__ import annotations

import gc

from fake_engine import FakeEngine, fake_model_info
from rich.markdown import Markdown
from textual.geometry import Region
from textual.widget import Widget
from thinking_support import CASES, THINK
from ui_support import idle, make_app, send, wait_for, wait_thread

from chatphase.engine.events import Message
from chatphase.sessions.catalog import load_session
from chatphase.settings.schema import Settings
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.transcript.chat_log import ChatLog
from chatphase.ui.transcript.folded_reply import FoldedReply
from chatphase.ui.transcript.reply_markdown import ContinuedMarkdown, MarkdownSegment
from chatphase.ui.transcript.reply_view import ReplyView
from chatphase.ui.transcript.thinking_block import ThinkingBlock
from chatphase.ui.transcript.user_message import UserMessage


def lines(widget: Widget) -> list[str]:
    """The widget's lines as drawn (padding included), trailing spaces stripped."""
    width, height = widget.outer_size
    return [strip.text.rstrip() for strip in widget.render_lines(Region(0, 0, width, height))]


def reply_lines(view: ReplyView) -> list[str]:
    """A reply's lines as drawn: its own once folded, else those of its shown children, top to bottom."""
    if not view.children:
        return lines(view)
    return [line for child in view.children if child.display for line in lines(child)]


async def turns(pilot, count: int, start: int = 0) -> None:
    app = pilot.app
    for i in range(start + 1, start + count + 1):
        await send(pilot, f"question {i}")
        await wait_for(pilot, lambda i=i: len(app.chat.conversation) == 2 * i and idle(app))
    await pilot.pause(0.1)


def stray(cls: type) -> list:
    """Objects of ``cls`` still alive but no longer in the DOM (a widget kept after its removal)."""
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, cls) and not o.is_attached]


async def test_finished_turns_cost_one_widget_each_and_their_streaming_widgets_are_freed():
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await turns(pilot, 12)
        log = app.query_one(ChatLog)
        views = list(log.query_children(ReplyView))
        assert len(views) == 12 and len(log.query_children(UserMessage)) == 1  # the newest turn's
        assert all(v.folded and not v.children and v.user == f"question {i}" for i, v in enumerate(views[:-1], 1))
        assert log.user_texts() == [f"question {i}" for i in range(1, 13)]
        assert not views[-1].folded and views[-1].query(MarkdownSegment)  # the newest reply keeps its widgets
        # every old turn: its reply (which draws its message); the newest: its message, its reply and the
        # reply's segment, tail and footer
        assert len(list(log.walk_children())) == 11 + 2 + 3
        # the user messages the old turns took in are freed (the newest of them may be held by a one-entry
        # cache of Textual's, the chat log's last list of its children, until that is asked again)
        assert [u.text for u in stray(UserMessage)] in ([], ["question 11"])
        # none of the widgets the folded replies streamed into is still alive (a theme watch, a cached
        # arrangement or child list of the reply kept each of them until now)
        assert not stray(MarkdownSegment) and not [w for w in stray(Widget) if "reply-meta" in w.classes]


async def test_a_folded_reply_reads_as_it_did_and_keeps_its_footer():
    app, _ = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await turns(pilot, 1)
        first = app.query_one(ReplyView)
        message = app.query_one(UserMessage)
        before = reply_lines(first)
        assert first.meta.startswith("TTFT ") and before[-1].strip() == first.meta
        # the message as its widget drew it, in its left margin; then the reply's top margin
        asked = [(" " * message.styles.margin.left + line).rstrip() for line in lines(message)] + [""]
        await turns(pilot, 1, start=1)
        assert first.folded and not first.children and first.user == "question 1"
        assert lines(first) == asked + before
        first.set_meta("cancelled turn")  # a footer set after the fold is drawn
        await pilot.pause()
        assert lines(first)[-1].strip() == "cancelled turn" and lines(first)[:-1] == asked + before[:-1]
        await pilot.resize_terminal(70, 40)  # drawn again from its text at the new width
        await pilot.pause(0.2)
        assert first.size.width < 100 and "Reply 1: you said" in "\n".join(lines(first))
        assert all(len(line) <= first.outer_size.width for line in lines(first))


async def test_a_folded_reply_keeps_its_thinking_block_expandable():
    pieces, fmt, preopened, _ = CASES["both tags"]
    app, _ = make_app(replies=[pieces], thinking=fmt, thinking_preopened=preopened)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await turns(pilot, 1)
        first = app.query_one(ReplyView)
        answer = [line for line in reply_lines(first)[-3:] if line.strip()]
        await turns(pilot, 1, start=1)
        assert first.folded
        block, body = first.children
        assert isinstance(block, ThinkingBlock) and isinstance(body, FoldedReply)
        assert [line for line in lines(body) if line.strip()] == answer  # "It is 4." and its footer
        title = block.query_one("CollapsibleTitle")
        title.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert block.expanded and "I add them." in "\n".join(lines(block.query_one(".thinking-text")))


async def test_a_resumed_chat_is_folded_with_its_thinking_blocks_and_a_regenerate_folds_the_one_before():
    pieces, fmt, preopened, _ = CASES["both tags"]
    app, _ = make_app(replies=[pieces], thinking=fmt, thinking_preopened=preopened)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await turns(pilot, 3)
        session_id = app.recording.writer.id
    resumed = ChatPhaseApp(
        Settings(),
        fake_model_info(),
        lambda info, s: FakeEngine(info, s.engine, replies=["Fine."]),
        resume=load_session(session_id),
    )
    async with resumed.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: idle(resumed) and len(resumed.query(ThinkingBlock)) == 3)
        await pilot.pause(0.2)
        views = list(resumed.query(ReplyView))
        assert [v.folded for v in views] == [True, True, False]
        for view in views[:2]:  # each: its block, then its answer and footer below it
            block, body = view.children
            assert isinstance(block, ThinkingBlock) and isinstance(body, FoldedReply)
            assert next(line.strip() for line in lines(body) if line.strip()) == "It is 4."
        assert "It is 4." in "\n".join(reply_lines(views[2]))
        # a regenerate removes the newest reply; the one before it is still folded, the new one streams
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: idle(resumed) and resumed.chat.conversation[-1].content == "Fine.")
        await pilot.pause(0.2)
        views = list(resumed.query(ReplyView))
        assert len(views) == 3 and [v.folded for v in views] == [True, True, False]
        await send(pilot, "next")
        await wait_for(pilot, lambda: idle(resumed) and len(resumed.chat.conversation) == 8)
        await pilot.pause(0.2)
        assert [v.folded for v in resumed.query(ReplyView)] == [True, True, True, False]


#: marks the text of the reply below (its answer and its thinking): no other text in the app has them.
ANSWER_MARK, THINKING_MARK = "ŋ", "ŧ"


def marks_held(mark: str) -> int:
    """How many ``mark`` characters the chatphase objects alive hold: in the strings their attributes
    refer to (directly, or in a list, tuple or dict there), each string counted once. A text held once is
    counted once, however many objects refer to it; a copy of it counts again. Left out: the engine's
    objects but the conversation's messages (the FakeEngine runs in this process: the reply it streams
    from, the pieces it is splitting, the events on their way, each with its piece), and the renderables
    Textual caches for a widget until its next change (what it draws: Textual's). The app freezes its start-up
    objects (``gc.freeze()``), which ``gc.get_objects()`` no longer lists: they are unfrozen first."""
    gc.unfreeze()
    gc.collect()
    strings: dict[int, str] = {}
    for obj in gc.get_objects():
        module = vars(type(obj)).get("__module__")  # a class's own (some C types have a descriptor there)
        if not isinstance(module, str):
            continue
        engine = module.startswith("chatphase.engine.") and not isinstance(obj, Message)
        if not module.startswith("chatphase.") or engine:
            continue
        if isinstance(obj, (Markdown, ContinuedMarkdown)):
            continue
        try:
            values = list(vars(obj).values())
        except TypeError:  # no __dict__ (slots)
            values = [getattr(obj, name, None) for name in getattr(type(obj), "__slots__", ())]
        for value in values:
            if isinstance(value, dict):
                value = list(value.values())
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(item, str) and mark in item:
                    strings[id(item)] = item
    return sum(s.count(mark) for s in strings.values())


async def test_a_streaming_reply_and_its_thinking_are_held_once():
    """The turn accumulates a reply's text; the reply view, its Markdown segments, the thinking block and
    the session recording read it there. Mid-reply (after many commits) and once finished, the UI
    process holds each mark of the answer and of the thinking once."""
    thinking = [f" {THINKING_MARK}{i}" for i in range(150)]
    answer = [f"Paragraph {ANSWER_MARK}{i} about prefill and decode.\n\n" for i in range(300)]
    pieces = ["<think>", *thinking, "</think>", "\n\n", *answer]
    app, engines = make_app(
        replies=[pieces], thinking=THINK, hold="decode", hold_after_tokens=len(pieces) - 20, token_delay_s=0.01
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "tell me")
        await wait_thread(pilot, engines[0].held)
        view = app.query_one(ChatLog).active_reply
        await wait_for(pilot, lambda: app.chat.turn.reply and not view.pending, timeout_s=10)
        assert len(view.query(MarkdownSegment)) >= 2  # committed in more than one segment
        shown = app.chat.turn.reply.count(ANSWER_MARK)
        assert shown > 200 and app.chat.turn.thinking.count(THINKING_MARK) == 150
        assert marks_held(ANSWER_MARK) == shown
        assert marks_held(THINKING_MARK) == 150
        engines[0].release()
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        await pilot.pause(0.2)
        assert app.chat.conversation[-1].content.count(ANSWER_MARK) == 300
        assert marks_held(ANSWER_MARK) == 300 and marks_held(THINKING_MARK) == 150


async def test_an_old_turn_keeps_no_markdown_parse_and_no_style_nodes_of_its_own():
    """What a folded reply keeps: its text, not Rich's Markdown of it (markdown-it's tokens, some 12 KiB a
    turn, kept by Textual with the widget's renderable until its next refresh), and no component-style
    nodes (Textual keeps a styled node per component class and widget: the styles are the chat log's)."""
    from rich.markdown import Markdown as RichMarkdown
    from textual.dom import DOMNode

    def alive(cls: type, exact: bool = False) -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if (type(o) is cls if exact else isinstance(o, cls)))

    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await turns(pilot, 2)
        nodes = alive(DOMNode, exact=True)
        await turns(pilot, 4, start=2)
        assert alive(DOMNode, exact=True) == nodes  # none per turn
        assert alive(RichMarkdown) == 0  # drawn, then let go
        assert all(v.folded for v in list(app.query_one(ChatLog).query_children(ReplyView))[:-1])


async def test_old_turns_out_of_view_keep_no_drawn_lines_and_redraw_when_scrolled_back():
    """Textual keeps each widget's last rendered lines (``Strip`` objects, seven small caches each) until it
    is drawn again, which an entry scrolled out of view never is: as a reply starts, the chat log lets go
    of those of every entry out of view (``ChatLog.let_go_of_hidden_lines``). Scrolled back, an old turn
    is drawn anew and reads as before."""
    app, _ = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await turns(pilot, 2)
        first = app.query_one(ReplyView)
        before = lines(first)  # folded, with its message
        await turns(pilot, 9, start=2)
        log = app.query_one(ChatLog)
        hidden = [e for e in log.children if not e.region.overlaps(log.region)]
        assert len(hidden) >= 6 and first in hidden  # an old turn is one entry
        # those the newest turn pushed out of view keep theirs until the next turn starts
        held = [
            w
            for e in hidden[:-4]
            for w in (e, *e.walk_children())
            if w._render_cache.lines or w._styles_cache._cache  # Textual's own caches: no public view of them
        ]
        assert held == []
        log.scroll_home(animate=False)
        await pilot.pause(0.2)
        assert first.region.overlaps(log.region) and lines(first) == before


async def test_removed_widgets_drawn_lines_are_let_go_of():
    """Textual 8's ``StylesCache.get_inner_outer`` (an ``lru_cache`` on a method) keeps every widget's styles
    cache, with its drawn lines, after the widget is gone: the chat log empties it once a turn
    (``chatphase.ui.compat.textual_private``), so no styles cache of a removed widget keeps lines."""
    from textual._styles_cache import StylesCache  # Textual's: no public view of it

    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await turns(pilot, 6)
        gc.collect()
        owned = {id(o._styles_cache) for o in gc.get_objects() if isinstance(o, Widget)}
        orphans = [o for o in gc.get_objects() if isinstance(o, StylesCache) and id(o) not in owned]
        # those of the widgets removed since the newest turn started (its user message's fold) may be left
        assert sum(1 for o in orphans if o._cache) <= 4


async def test_an_old_turns_message_is_styled_as_a_message_widget_in_each_theme():
    """The message an old turn draws has the looks of a ``UserMessage`` (its border, background and text
    styles, cell for cell), in the dark theme and after a switch to a light one."""

    def first_line(widget: Widget) -> list:
        return [(s.text, s.style) for s in widget.render_lines(Region(0, 0, *widget.outer_size))[0]]

    app, _ = make_app(replies=["ok"])
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "same words")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        await send(pilot, "same words")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 4 and idle(app))
        await pilot.pause(0.2)
        old, live = app.query_one(ReplyView), app.query_one(UserMessage)
        assert old.user == "same words"
        for theme in ("textual-dark", "textual-light"):
            app.theme = theme
            await pilot.pause(0.3)
            drawn = first_line(old)  # its left margin, then the message as the widget draws it
            assert drawn[0][0] == " " * live.styles.margin.left and drawn[1:] == first_line(live)
