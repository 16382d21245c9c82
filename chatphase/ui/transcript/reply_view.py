"""ReplyView: one assistant reply in the chat log, streamed as Markdown.

Streaming a reply must not slow the model: on a machine whose cores all run the engine's threads, every
millisecond of UI CPU is taken from decode. Committing text to the Markdown costs a parse, a render and
a layout of the screen (10–40 ms of CPU at 150×45), so it is done rarely; the text still streams
visibly at ``FLUSH_HZ``:

- the reply's text accumulates in the chat's :class:`~chatphase.chat.turn.Turn`, which the view reads (it
  keeps offsets into the text, never a copy of it, and does no work per token);
- :meth:`ReplyView.flush` (called by the app's redraw tick, at most ``FLUSH_HZ`` times a second) draws
  the block being written as plain text in a fixed-height tail (``TAIL_LINES`` lines, redrawn without a
  layout), and, when the app's CPU budget allows (``commit``), appends the whole blocks written so far to
  the Markdown. Whatever the budget, the wrapped lines of a block longer than the tail go to the Markdown
  as the tail fills (all but its last line), as they would otherwise be out of sight until the block
  ends. When no text arrived for a while (the stream paused), the partial block is committed too.
- A reply's Markdown is a column of :class:`~chatphase.ui.transcript.reply_markdown.MarkdownSegment` widgets of
  about ``SEGMENT_CHARS`` characters each, split only where the whole text's parse starts a block that
  later text cannot change (:func:`~chatphase.ui.transcript.md_blocks.complete_blocks_end`), each one widget drawn
  by Rich, and each drawn as it reads after the last block of the segment above (the blank line Rich puts
  between two blocks depends on the first), so the segments read exactly as one rendering of the whole
  text: a commit re-renders only the last segment, and the screen's widget count (which every Textual
  layout pass walks) grows by one per segment, not by the ten or so widgets per block of Textual's
  Markdown. ``tests/ui/test_md_streaming.py`` checks this as a property over generated Markdown.

Once a newer reply starts, a finished one is *folded* (:meth:`ReplyView.fold`): its segment, tail and
footer widgets go, and it draws its whole text and footer itself, as one renderable rebuilt at each
resize or theme change, with the user message above it (:mod:`~chatphase.ui.transcript.folded_turn`),
so an old turn costs the UI one widget however long the chat (``benchmarks/ui_memory.py`` measures it).

The tail tints the text of accepted draft tokens (speculative decoding;
:mod:`chatphase.ui.transcript.reply_tail`); the Markdown does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.style import Style
from textual.widget import AwaitMount, Widget
from textual.widgets import Static

from chatphase.chat.overflow import overflow_cost
from chatphase.chat.turn import Turn
from chatphase.engine.metrics import TurnMetrics
from chatphase.engine.text import inert
from chatphase.models.gguf_meta import SYNTHETIC_LABEL
from chatphase.ui.compat.textual_private import clear_arrangement_cache
from chatphase.ui.transcript.folded_reply import FoldedReply
from chatphase.ui.transcript.folded_turn import USER_BORDER, USER_BORDER_LEFT_OUT, FoldedTurn
from chatphase.ui.transcript.md_blocks import complete_blocks_end, last_block_start
from chatphase.ui.transcript.reply_markdown import CODE_THEMES, FinishedReply, MarkdownSegment
from chatphase.ui.transcript.reply_tail import tinted_tail, wrapped_lines
from chatphase.ui.transcript.user_message import UserMessage
from chatphase.units import fmt_int, fmt_ms, fmt_rate, fmt_stop_reason

#: how often new reply text is drawn (times per second): the tail at this rate, Markdown commits as
#: often as the app's CPU budget allows.
FLUSH_HZ = 10
#: height of the plain-text tail that shows the block being written (lines).
TAIL_LINES = 4
#: a streamed reply's Markdown starts a new segment at the first block boundary past this many characters.
SEGMENT_CHARS = 1200


class ReplyView(Widget):
    """One assistant reply: Markdown of the whole blocks streamed so far, the block being written as
    plain text in a fixed-height tail, and a one-line metrics footer (see the module docstring).

    A finished reply that is no longer the newest is *folded* (:meth:`fold`): its segments, tail and
    footer widgets go, and it draws its text and footer itself, as one widget (a turn with thinking keeps
    its block, above one :class:`FoldedReply`). Every widget costs the UI process some 20–40 KiB (its
    styles, message queue and task, its place in the compositor's map, its rendered lines), so it draws
    the user's message above it too (``fold(user)``): a chat's old turns cost one widget each instead of
    five (a turn with thinking or a synthetic model's label: its message, this one and the block).
    """

    DEFAULT_CSS = """
    ReplyView {
        height: auto;
        margin: 1 0 0 0;
    }
    ReplyView MarkdownSegment {
        margin: 0;
        padding: 0 1;
    }
    /* the block being written, as plain text (TAIL_LINES lines; fixed so updates need no layout) */
    ReplyView .reply-tail {
        height: 4;
        padding: 0 1;
        text-wrap: nowrap;
        text-overflow: clip;
    }
    /* a synthetic model (random weights): its text is noise, shown dimmed under a label */
    ReplyView .synthetic-label { color: $warning; text-style: bold; padding: 0 1; }
    ReplyView.synthetic MarkdownSegment { text-opacity: 50%; text-style: italic; }
    ReplyView.synthetic .reply-tail { text-opacity: 50%; text-style: italic; }
    ReplyView.synthetic .reply-folded { text-opacity: 50%; text-style: italic; }
    ReplyView .reply-meta {
        color: $text-muted;
        padding: 0 1;
        text-style: italic;
    }
    /* a folded reply (fold) draws its Markdown and footer itself, as the widgets above did */
    ReplyView.-folded { height: auto; padding: 0 1; }
    /* a folded reply that draws its user message too (folded_turn): its padding is drawn with its text */
    ReplyView.-turn { height: auto; padding: 0; }
    """

    def __init__(
        self,
        text: str = "",
        turn: Turn | None = None,
        on_shown: Callable[[], object] | None = None,
        synthetic: bool = False,
    ) -> None:
        """``text``: a finished reply's; ``turn``: the turn whose reply streams into this view (its text
        is read from it until :meth:`finish`)."""
        # a synthetic model's text (random weights) is not a reply: shown dimmed under its label
        super().__init__(classes="assistant synthetic" if synthetic else "assistant")
        self.synthetic = synthetic
        self._on_shown = on_shown
        self._turn = turn
        self._text = text
        self._committed = len(text)  # characters of ``text`` handed to the Markdown
        self._shown = len(text)  # characters of ``text`` drawn (Markdown or tail)
        self._idle_flushes = 0  # flushes in a row that found no new text
        self._segment_chars = len(text)  # characters in the last Markdown segment
        self._boundary = len(text)  # end of the last whole Markdown block of ``text`` (a block boundary)
        self.finished = turn is None
        self.folded = False
        self.user: str | None = None  # the user message this folded reply draws above it (fold), if any
        self.meta = "prefill…" if not self.finished else ""  # the footer's text
        self._above: list[Widget] = []  # mounted by :meth:`add_above` (a thinking block)
        self.drafted: list[tuple[int, int]] = []  # spans of ``text`` from accepted draft tokens, not committed
        self.tint = True  # whether the tail tints them
        self.stall_flushes = 1  # flushes without new text after which the stream counts as paused

    @property
    def text(self) -> str:
        """The reply's text: its turn's while it streams, then the finished reply's."""
        return self._turn.reply if self._turn is not None else self._text

    def _length(self) -> int:
        """``len(self.text)``, without joining a streaming turn's text."""
        return self._turn.reply_chars if self._turn is not None else len(self._text)

    def compose(self):
        if self.folded:  # folded before it was mounted (a resumed chat's turns): nothing to stream into
            return
        self._segments = [MarkdownSegment(lambda: self.text, end=self._committed, classes="reply-md")]
        self._tail = Static("", markup=False, classes="reply-tail")
        self._tail.display = not self.finished  # shown from the start: showing it at the first token is a layout
        self._meta = Static(self.meta, markup=False, classes="reply-meta")
        if self.synthetic:  # stays above the text when the reply is folded (as a thinking block does)
            self._above.append(
                Static(f"{SYNTHETIC_LABEL} — random weights: noise, not a reply", classes="synthetic-label")
            )
            yield self._above[-1]
        yield self._segments[0]
        yield self._tail
        yield self._meta

    def render(self):
        if self.folded and not self.children:
            if self.user is not None:
                return self.turn_drawing(self.user)
            return self.drawing()
        return super().render()

    def drawing(self) -> FinishedReply:
        """The folded reply as it is drawn (by this view, or by the :class:`FoldedReply` under a thinking block)."""
        theme = CODE_THEMES[self.app.current_theme.dark]
        return FinishedReply(self.text, self.meta, theme, self._log_style("reply--meta"))

    def turn_drawing(self, user: str) -> FoldedTurn:
        """The folded reply under the user message ``user``, as this view draws them (:meth:`fold`)."""
        log = self.parent
        assert isinstance(log, Widget)  # drawn only while in the chat log
        left_out = self.has_class("left-out")  # the model no longer sees this turn (an overflow)
        text = "user--left-out" if left_out else "user--message"
        inner = Style(bgcolor=log.get_component_rich_style(text).bgcolor)
        border = Style(
            color=log.get_component_rich_style(text if left_out else "user--border").color, bgcolor=inner.bgcolor
        )
        message = log.get_visual_style(text)
        bar = USER_BORDER_LEFT_OUT if left_out else USER_BORDER
        return FoldedTurn(self, user, message, inner, border, self.drawing(), bar)

    def _log_style(self, component: str) -> Style:
        """A component style of the chat log this reply is in (``ChatLog.COMPONENT_CLASSES``; there, not on
        each reply: Textual keeps a styles node per component class and widget, which a long chat would pay
        for at every turn)."""
        log = self.parent
        if isinstance(log, Widget) and component in log.COMPONENT_CLASSES:
            return log.get_component_rich_style(component)
        return Style.null()

    def fold(self, user: UserMessage | None = None) -> bool:
        """Draw a finished reply as one widget (see the class docstring): it reads the same, and is
        rebuilt from :attr:`text` and :attr:`meta` at each resize or theme change. Nothing when it is
        not finished or already folded; the streaming widgets go at the next message cycle.

        ``user``: the message above the reply, which it then draws too and removes (an old turn as one
        widget, :mod:`~chatphase.ui.transcript.folded_turn`) — only for a mounted reply without a block
        above its text (a thinking block, a synthetic label). Returns whether it took ``user`` (the caller
        counts it as removed)."""
        if not self.finished or self.folded:
            return False
        self.folded = True
        streamed = [w for w in self.children if w not in self._above]
        self._segments, self._tail, self._meta = [], None, None  # freed with the widgets
        if user is not None and (self._above or not streamed):
            user = None
        if streamed:
            self.user = None if user is None else user.text
            self.call_later(self._drop, streamed, user)
        else:  # not mounted yet (compose yields nothing), or nothing left
            self.set_class(not self._above, "-folded")
        return user is not None

    def forget_user(self) -> None:
        """Stop drawing the user message above the folded reply (it was removed from the chat)."""
        if self.user is not None:
            self.user = None
            self.set_class(False, "-turn")
            self.set_class(self.folded and not self._above, "-folded")
            self.refresh(layout=True)

    async def _drop(self, streamed: list[Widget], user: UserMessage | None = None) -> None:
        with self.app.batch_update():  # no frame between the widgets and their drawing
            if self._above:
                await self.mount(FoldedReply(self), after=self._above[-1])
            await self.remove_children(streamed)
            if user is not None:
                await user.remove()
            # What Textual cached of the removed children would keep them alive, as a leaf never asks again:
            clear_arrangement_cache(self)  # their placements (no public way in Textual 8)
            _ = self.displayed_children  # their list (kept by the child list until next asked)
            self.set_class(not self._above and self.user is None, "-folded")
            self.set_class(self.user is not None, "-turn")
            self.refresh(layout=True)

    def redraw(self) -> None:
        """Draw a folded reply again (its footer changed, or the theme: the code blocks' colours)."""
        if self.folded:
            drawn = self.query_children(FoldedReply).first() if self._above else self
            drawn.refresh(layout=True)

    def on_mount(self) -> None:
        if self._on_shown is not None:
            # Call back once the view is laid out and painted. That takes two screen refreshes: the first
            # places the view; its new parts, sized by it, ask for a second layout pass.
            callback, self._on_shown = self._on_shown, None
            self.app.call_after_refresh(self.app.call_after_refresh, callback)

    def add_drafted(self, spans: Sequence[tuple[int, int]], start: int) -> None:
        """Accepted drafts' ``spans`` in the text just streamed, which begins at offset ``start`` of the reply."""
        if not self.finished:
            self.drafted.extend((start + a, start + b) for a, b in spans)

    @property
    def pending(self) -> bool:
        """Whether streamed text is not yet rendered as Markdown."""
        return self._committed < self._length() and not self.finished

    async def flush(self, commit: bool = True) -> bool:
        """Draw the text fed since the last call; returns whether Markdown was written (a layout).

        The unfinished block goes to the tail (a fixed-size redraw, no layout). With ``commit``, whole
        blocks are handed to the Markdown. All of the text is, when none arrived in the last
        :attr:`stall_flushes` calls (the stream paused, so the partial block is drawn as Markdown too). And
        whatever ``commit`` says, the wrapped lines the tail has no room for go to the Markdown, all but the
        last (a long paragraph, a list, a code block): they would be out of sight until the next commit.
        """
        if not self.pending:
            return False
        text = self.text
        self._idle_flushes = self._idle_flushes + 1 if self._shown == len(text) else 0
        stalled = self._idle_flushes >= self.stall_flushes
        self._shown = len(text)
        wrote = False
        if stalled:
            await self._commit(text, len(text))
            wrote = True
        elif commit:
            # Blocks are found from the last known block boundary, not from what was committed: after a
            # stall the committed text may end inside a block (a code fence), whose rest is not a new block.
            found = self._boundary + complete_blocks_end(text[self._boundary :])
            if found > self._committed:
                await self._commit(text, found, boundary=found)
                wrote = True
        room = self._tail_height()
        lines = wrapped_lines(inert(text[self._committed :]), self._tail_width(), room + 1)  # as the tail draws it
        if len(lines) > room:  # a source line's first piece always has its offset
            end = self._committed + next(at for at, _ in reversed(lines) if at is not None)
            if end > self._committed:
                await self._commit(text, end)
                wrote = True
        self.drafted = [s for s in self.drafted if s[1] > self._committed]
        self.draw_tail(hide_when_empty=stalled)
        return wrote

    async def _commit(self, text: str, end: int, boundary: int | None = None) -> None:
        """Hand ``text[committed:end]`` (the chunk) to the last segment, or start a new segment with it once
        the last is ``SEGMENT_CHARS`` long and ends at a block boundary — unless the chunk starts indented
        (it may continue a list item above, which a new segment would show as code). ``text``: the reply's
        text now; ``boundary``: where the committed text's last whole block ends, when the caller's parse
        found it (else parsed here)."""
        at_boundary = self._committed == self._boundary
        start, self._committed = self._committed, end
        if boundary is None:
            boundary = self._boundary + complete_blocks_end(text[self._boundary : end])
        self._boundary = boundary
        if at_boundary and self._segment_chars >= SEGMENT_CHARS and text[start : start + 1] not in (" ", "\t"):
            above = self._segments[-1]
            lead_start = above.start + last_block_start(text[above.start : start])
            segment = MarkdownSegment(lambda: self.text, start, end, lead_start, classes="reply-md")
            self._segments.append(segment)
            self._segment_chars = end - start
            await self.mount(segment, before=self._tail)
        else:
            self._segment_chars += end - start
            self._segments[-1].extend(end)

    def _tail_width(self) -> int:
        """The tail's width in characters, which the Markdown's is too (before the tail is laid out: the view's)."""
        return max(1, self._tail.content_size.width or self.content_size.width - 2)

    def _tail_height(self) -> int:
        """The lines the tail shows (``TAIL_LINES`` before it is laid out)."""
        return self._tail.content_size.height or TAIL_LINES

    def draw_tail(self, hide_when_empty: bool = False) -> None:
        """Show the uncommitted text in the tail (again when :attr:`tint` changed). Showing or hiding the
        tail is a layout, so it stays shown (empty) between blocks and is hidden only with a commit of all."""
        tail = self._tail
        if self._committed == self._length() and (hide_when_empty or not tail.display):
            tail.display = False
            return
        width, lines = self._tail_width(), self._tail_height()
        style = self._log_style("reply--drafted") if self.tint and self.drafted else None
        tail.update(tinted_tail(self.text, self._committed, self.drafted, width, lines, style), layout=False)
        if not tail.display:
            tail.display = True

    def add_above(self, widget: Widget) -> AwaitMount:
        """Mount ``widget`` above the reply's text (a reasoning model's thinking block, which streams
        first). The answer's tail, empty until then, is hidden: it shows again with the first answer text."""
        self._above.append(widget)
        if self.folded:  # a resumed turn's thinking block: the folded text goes below it
            mounted = self.mount(widget, before=0) if self.children else self.mount(widget)
            if len(self._above) == 1:
                self.remove_class("-folded")
                self.mount(FoldedReply(self))
            return mounted
        if not self._committed and not self._length():
            self._tail.display = False
        return self.mount(widget, before=0)

    def set_meta(self, text: str, layout: bool = True) -> None:
        """Set the footer line under the reply; ``layout=False`` when ``text`` surely fits one line."""
        self.meta = text = inert(text)
        if self._meta is not None:
            self._meta.update(text, layout=layout)
        self.redraw()

    async def finish(self, reply: str, metrics: TurnMetrics | None) -> None:
        """End the stream: the view shows ``reply`` from now on (the conversation's text, not the turn's);
        if it differs from what streamed (the engine's final text), it is drawn anew."""
        streamed = self.text
        if self._committed < len(streamed):
            await self._commit(streamed, len(streamed))
        self.finished = True
        self._tail.display = False
        self._turn, self._text = None, reply
        if reply != streamed:
            extra, self._segments = self._segments[1:], self._segments[:1]
            if extra:
                await self.remove_children(extra)
            self._segments[0].show_all()
        self._committed = self._shown = len(reply)
        if metrics is not None:
            self.set_meta(metrics_line(metrics))


def metrics_line(m: TurnMetrics) -> str:
    """``TTFT 412 ms · 57 tok · 48.2 tok/s`` (plus cached/dropped when non-zero, an overflow's cost, and how the
    reply ended unless the model ended it: ``length``, ``cancelled``)."""
    parts = [
        f"TTFT {fmt_ms(m.ttft_ms)}",
        f"prefill {fmt_int(m.prefill_tokens)} tok",
        f"{fmt_int(m.decode_tokens)} tok",
        fmt_rate(m.decode_tokens_per_s),
    ]
    if m.stop_reason != "stop":
        parts.append(fmt_stop_reason(m.stop_reason))
    if m.cached_tokens:
        parts.insert(2, f"{fmt_int(m.cached_tokens)} cached")
    if m.overflow is not None:  # the turn's overflow and its cost
        parts.append(f"{m.overflow}: {overflow_cost(m.overflow, m.overflow_reprefill_tokens, m.overflow_reprefill_ms)}")
    return " · ".join(parts)
