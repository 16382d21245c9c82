"""The chat log: user messages, streamed Markdown replies, and inline notices.

Replies stream through Textual's :class:`~textual.widgets.markdown.MarkdownStream` (``Markdown.get_stream``),
which appends to the document and re-parses only its last block, so a long reply does not get slower
to draw as it grows. Decoded text is never drawn per token: :meth:`ReplyView.feed` only appends to a
buffer, and the app calls :meth:`ChatLog.flush` at a bounded rate (``FLUSH_HZ``) to hand the buffered
text to the stream in one piece. The log stays scrolled to the bottom (``anchor``) until the user
scrolls up.
"""

from __future__ import annotations

from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from chatphase.engine.metrics import TurnMetrics
from chatphase.ui.format import fmt_int, fmt_ms, fmt_rate

#: how often buffered reply text is handed to the Markdown stream (times per second). Each hand-over
#: costs Textual a Markdown parse of the last block and a screen layout; measured at 150×45 with a
#: 50 tok/s FakeEngine, the UI process used 21 % of a core for prose at 10 Hz against 28 % at 20 Hz.
FLUSH_HZ = 10


class UserMessage(Static):
    """One user message, shown verbatim (no markup)."""

    def __init__(self, text: str) -> None:
        super().__init__(text, markup=False, classes="user")
        self.text = text


class Notice(Static):
    """An inline line in the log (``kind``: ``info``, ``warning`` or ``error``)."""

    def __init__(self, text: str, kind: str = "info") -> None:
        super().__init__(text, markup=False, classes=f"notice -{kind}")


class ReplyView(Vertical):
    """One assistant reply: streamed Markdown plus a one-line metrics footer."""

    def __init__(self, turn_id: int, text: str = "") -> None:
        super().__init__(classes="assistant")
        self.turn_id = turn_id
        self.text = text
        self._pending: list[str] = []
        self._stream: MarkdownStream | None = None
        self.finished = bool(text)

    def compose(self):
        self._md = Markdown(self.text, classes="reply-md")
        self._meta = Static("prefill…" if not self.finished else "", classes="reply-meta")
        yield self._md
        yield self._meta

    def feed(self, text: str) -> None:
        """Buffer decoded text (drawn at the next :meth:`flush`)."""
        if text:
            self._pending.append(text)
            self.text += text

    @property
    def pending(self) -> bool:
        """Whether buffered text waits for the next :meth:`flush`."""
        return bool(self._pending) and not self.finished

    async def flush(self) -> bool:
        """Hand the buffered text to the Markdown stream in one write; returns whether there was any."""
        if not self.pending:
            return False
        chunk = "".join(self._pending)
        self._pending.clear()
        if self._stream is None:
            self._stream = Markdown.get_stream(self._md)
        await self._stream.write(chunk)
        return True

    def set_meta(self, text: str) -> None:
        """Set the footer line under the reply."""
        self._meta.update(text)

    async def finish(self, reply: str, metrics: TurnMetrics | None) -> None:
        """End the stream; if the engine's final ``reply`` differs from what streamed, show ``reply``."""
        await self.flush()
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.finished = True
        if reply != self.text:
            self.text = reply
            await self._md.update(reply)
        if metrics is not None:
            self.set_meta(metrics_line(metrics))


def metrics_line(m: TurnMetrics) -> str:
    """``TTFT 412 ms · 57 tok · 48.2 tok/s · stop`` (plus cached/dropped when non-zero)."""
    parts = [f"TTFT {fmt_ms(m.ttft_ms)}", f"prefill {fmt_int(m.prefill_tokens)} tok",
             f"{fmt_int(m.decode_tokens)} tok", fmt_rate(m.decode_tokens_per_s), m.stop_reason]
    if m.cached_tokens:
        parts.insert(2, f"{fmt_int(m.cached_tokens)} cached")
    return " · ".join(parts)


class ChatLog(VerticalScroll):
    """The scrolling conversation (see the module docstring)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._latest_reply: ReplyView | None = None  # kept so per-token calls never query the DOM

    def on_mount(self) -> None:
        self.anchor()

    def add_user(self, text: str) -> UserMessage:
        """Append a user message."""
        widget = UserMessage(text)
        self.mount(widget)
        self.anchor()
        return widget

    def start_reply(self, turn_id: int) -> ReplyView:
        """Append an empty reply that the turn's text will stream into."""
        view = ReplyView(turn_id)
        self.mount(view)
        self.anchor()
        self._latest_reply = view
        return view

    def add_reply(self, turn_id: int, text: str) -> ReplyView:
        """Append a finished reply (e.g. restoring a conversation)."""
        view = ReplyView(turn_id, text)
        self.mount(view)
        return view

    def add_notice(self, text: str, kind: str = "info") -> Notice:
        """Append an inline notice."""
        notice = Notice(text, kind)
        self.mount(notice)
        self.anchor()
        return notice

    @property
    def active_reply(self) -> ReplyView | None:
        """The newest reply while it streams (unfinished and still in the log), else ``None``."""
        view = self._latest_reply
        return view if view is not None and not view.finished and view.parent is self else None

    async def flush(self) -> bool:
        """Flush the active reply's buffered text (called by the app at up to ``FLUSH_HZ``); returns
        whether any text was written."""
        reply = self.active_reply
        return reply is not None and await reply.flush()

    async def remove_last(self, cls: type) -> str | None:
        """Remove the newest entry of type ``cls`` (``UserMessage`` or ``ReplyView``); returns its text."""
        entries = self.query(cls)
        if not entries:
            return None
        last = entries.last()
        await last.remove()
        return getattr(last, "text", None)

    async def clear_log(self) -> None:
        """Remove every entry."""
        await self.remove_children()
