"""Streaming equals the final render: a property over generated Markdown.

Replies are built from random blocks — paragraphs, headings, lists (with continuation paragraphs and
fences inside items), fences of any length with either character (with shorter or other fences inside),
indented code, quotes, rules — and streamed into a :class:`~chatphase.ui.transcript.reply_view.ReplyView` cut at random
places, with random commits and stalls. After every flush, the segments drawn so far must read exactly as
a one-shot rendering of the text they hold; after the end, as a one-shot rendering of the final text.
Segments are made small (``SEGMENT_CHARS``) so that the texts split into many.
"""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console
from textual.app import App, ComposeResult
from ui_support import streaming_reply

from chatphase.ui.transcript import reply_view
from chatphase.ui.transcript.chat_log import ChatLog
from chatphase.ui.transcript.md_blocks import complete_blocks_end
from chatphase.ui.transcript.reply_markdown import MarkdownSegment, _Markdown
from chatphase.ui.transcript.reply_view import ReplyView

WIDTH = 48
WORDS = st.sampled_from(["prefill", "decode", "token", "cache", "`code`", "**bold**", "KV", "fast", "1.", "x"])


def words(n_min=1, n_max=6):
    return st.lists(WORDS, min_size=n_min, max_size=n_max).map(" ".join)


paragraph = st.lists(words(), min_size=1, max_size=3).map("\n".join)
heading = st.tuples(st.integers(1, 3), words()).map(lambda t: "#" * t[0] + " " + t[1])
quote = st.lists(words(), min_size=1, max_size=2).map(lambda ls: "\n".join("> " + line for line in ls))
rule = st.just("---")
indented_code = st.lists(words(), min_size=1, max_size=3).map(lambda ls: "\n".join("    " + line for line in ls))


@st.composite
def fence(draw, indent=""):
    char = draw(st.sampled_from("`~"))
    n = draw(st.integers(3, 5))
    info = draw(st.sampled_from(["", "python", "md", "text"]))
    body = draw(st.lists(words(), min_size=0, max_size=3))
    if n > 3 and draw(st.booleans()):  # a shorter fence of the same character inside: it cannot close this one
        inner = char * draw(st.integers(3, n - 1))
        body = [*body, inner + "py", *draw(st.lists(words(), min_size=1, max_size=2)), inner]
    elif draw(st.booleans()):  # a fence of the other character inside
        other = "~" if char == "`" else "`"
        body = [*body, other * 3, *draw(st.lists(words(), min_size=1, max_size=2)), other * 3]
    lines = [char * n + info, *body, char * n]
    return "\n".join(indent + line for line in lines)


@st.composite
def bullet_list(draw):
    items = []
    for _ in range(draw(st.integers(1, 3))):
        item = "- " + draw(words())
        kind = draw(st.sampled_from(["plain", "continued", "fenced"]))
        if kind == "continued":
            item += "\n\n  " + draw(words())
        elif kind == "fenced":
            item += "\n\n" + draw(fence(indent="  "))
        items.append(item)
    return draw(st.sampled_from(["\n", "\n\n"])).join(items)


ordered_list = st.lists(words(), min_size=1, max_size=3).map(
    lambda ls: "\n".join(f"{i}. {w}" for i, w in enumerate(ls, start=1))
)
block = st.one_of(paragraph, heading, quote, rule, indented_code, fence(), bullet_list(), ordered_list)


@st.composite
def reply_and_stream(draw):
    blocks = draw(st.lists(block, min_size=1, max_size=7))
    text = ""
    for i, b in enumerate(blocks):
        text += b + ("\n" if i == len(blocks) - 1 else draw(st.sampled_from(["\n\n", "\n\n\n"])))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=8))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if text[a:b]]
    flushes = draw(st.lists(st.sampled_from(["commit", "tail", "stall"]), min_size=len(pieces), max_size=len(pieces)))
    return text, pieces, flushes


def rendered(renderable, console: Console, height: int | None = None) -> list[str]:
    options = console.options.update_width(WIDTH)
    lines = console.render_lines(renderable, options if height is None else options.update(height=height), pad=False)
    return ["".join(seg.text for seg in line).rstrip() for line in lines]


def view_lines(view: ReplyView, console: Console) -> list[str]:
    """The segments' lines as Textual draws them: each measured first, then rendered at that height."""
    lines = []
    for seg in view.query(MarkdownSegment):
        renderable = seg.render()
        lines += rendered(renderable, console, height=len(rendered(renderable, console)))
    return lines


def one_shot(text: str, console: Console) -> list[str]:
    return rendered(_Markdown(text, code_theme="monokai"), console)


class LogApp(App):
    def compose(self) -> ComposeResult:
        yield ChatLog()


async def stream_and_check(text: str, pieces: list[str], flushes: list[str]) -> None:
    console = Console(width=WIDTH, color_system=None, force_terminal=False, legacy_windows=False)
    app = LogApp()
    async with app.run_test(size=(WIDTH + 4, 30)) as pilot:
        view, feed = streaming_reply(app.query_one(ChatLog))
        await pilot.pause()
        for piece, how in zip(pieces, flushes, strict=True):
            feed(piece)
            await view.flush(commit=how != "tail")
            if how == "stall":  # nothing new arrived: the partial block is committed too
                await view.flush(commit=True)
            committed = "".join(s.source for s in view.query(MarkdownSegment))
            assert committed == view.text[: len(committed)]
            assert view_lines(view, console) == one_shot(committed, console), (committed, piece)
        await view.finish(text, None)
        await pilot.pause()
        assert view_lines(view, console) == one_shot(text, console)


#: always among the cases: a four-backtick fence holding a three-backtick block, after more than one segment.
NESTED_FENCE_TEXT = (
    "Some text first, long enough for a segment.\n\nMore text.\n\n````md\n```py\nx = 1\n```\n````\n\nAfter.\n"
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(
    (
        NESTED_FENCE_TEXT,
        [NESTED_FENCE_TEXT[:70], NESTED_FENCE_TEXT[70:95], NESTED_FENCE_TEXT[95:]],
        ["commit", "commit", "commit"],
    )
)
@given(reply_and_stream())
def test_streamed_reply_reads_as_the_one_shot_render(monkeypatch_segments, case):
    text, pieces, flushes = case
    asyncio.run(stream_and_check(text, pieces, flushes))


def test_fences_of_any_length_and_character_hold_their_blank_lines_and_inner_fences():
    nested = "````md\n```py\nx = 1\n\n```\n````\n\nafter\n\n"
    assert complete_blocks_end(nested) == len(nested)
    assert complete_blocks_end("````md\n```py\nx = 1\n\n```\n") == 0  # the outer fence is still open
    assert complete_blocks_end("~~~~\n```\n~~~\n\n") == 0  # a shorter or other fence closes nothing
    assert complete_blocks_end("- item\n\n  more\n\n") == 0  # a list may go on after a blank line
    assert complete_blocks_end("- item\n\n  more\n\nnext\n") == len("- item\n\n  more\n\n")
    assert complete_blocks_end("    code\n\n") == 0 and complete_blocks_end("# Title\n") == len("# Title\n")


import pytest  # noqa: E402 - the fixture below is for the Hypothesis test only


@pytest.fixture(scope="module")
def monkeypatch_segments():
    """Small segments, so that a generated reply of a few hundred characters is split into many."""
    old = reply_view.SEGMENT_CHARS
    reply_view.SEGMENT_CHARS = 40
    yield
    reply_view.SEGMENT_CHARS = old
