"""ChatLog: the scrolling conversation: user messages (:mod:`~chatphase.ui.transcript.user_message`),
streamed replies (:mod:`~chatphase.ui.transcript.reply_view`, which says how a reply streams without slowing
the model) and inline notices (:mod:`~chatphase.ui.transcript.notice`).

The log stays scrolled to the bottom (``anchor``) until the user scrolls up. A finished reply is folded
when a newer one starts (:meth:`~chatphase.ui.transcript.reply_view.ReplyView.fold`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import ClassVar

from textual.await_remove import AwaitRemove
from textual.containers import VerticalScroll
from textual.widget import Widget

from chatphase.chat.turn import Turn
from chatphase.ui.compat.textual_private import free_drawn_lines, release_removed_styles_caches
from chatphase.ui.transcript.folded_turn import USER_BACKGROUND, USER_BORDER_COLOR
from chatphase.ui.transcript.notice import Notice
from chatphase.ui.transcript.reply_markdown import MarkdownSegment
from chatphase.ui.transcript.reply_view import ReplyView
from chatphase.ui.transcript.user_message import UserMessage


class ChatLog(VerticalScroll):
    """The scrolling conversation (see the module docstring)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "reply--meta",
        "reply--drafted",
        "user--message",
        "user--border",
        "user--left-out",
    }
    """``reply--meta``: the metrics footer of a folded reply (as ``.reply-meta``); ``reply--drafted``: the
    tint of accepted draft tokens in a reply's tail (speculative decoding, while :attr:`ReplyView.tint`);
    ``user--message``, ``user--border``: a user message's text and border as an old turn draws them
    (:mod:`~chatphase.ui.transcript.folded_turn`, as ``UserMessage``); ``user--left-out``: its text (and dashed
    bar) once the model no longer sees the turn (an overflow).
    Here, not on each reply: Textual keeps a node with its own styles per component class and widget,
    which a long chat would pay for at every turn."""

    DEFAULT_CSS = f"""
    ChatLog > .reply--meta {{ color: $text-muted; text-style: italic; }}
    /* the text of accepted draft tokens in a reply's tail (speculative decoding; the tint key toggles) */
    ChatLog > .reply--drafted {{ color: $success; text-style: underline; }}
    ChatLog > .user--message {{ background: {USER_BACKGROUND}; }}
    ChatLog > .user--border {{ background: {USER_BACKGROUND}; color: {USER_BORDER_COLOR}; }}
    /* turns the model no longer sees (an overflow dropped or shifted them): dimmed, a dashed bar */
    ChatLog > UserMessage.left-out {{ border-left: dashed $foreground 50%; color: $text-muted; }}
    ChatLog > ReplyView.left-out {{ color: $text-muted; }}
    ChatLog > .user--left-out {{ background: {USER_BACKGROUND}; color: $text-muted; }}
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._latest_reply: ReplyView | None = None  # kept so per-token calls never query the DOM
        self._removing: weakref.WeakSet = weakref.WeakSet()  # entries whose removal has started
        self.tint_drafts = True  # new replies' :attr:`ReplyView.tint`
        self.stall_flushes = 1  # new replies' :attr:`ReplyView.stall_flushes` (the app sets it from its tick rate)
        #: tokens of the files counted while they were attached, by (name, size in bytes): shown in their line
        self.file_tokens: dict[tuple[str, int], int] = {}

    def on_mount(self) -> None:
        self.anchor()
        # One watch for every reply's code theme: a watch per widget would keep each removed one alive
        # until the theme changes (Textual drops the watches of removed widgets only then).
        self.watch(self.app, "theme", self._theme_changed, init=False)

    def _theme_changed(self) -> None:
        for segment in self.query(MarkdownSegment):
            segment.refresh(layout=True)
        for view in self.query_children(ReplyView):
            view.redraw()

    def add_user(self, text: str) -> UserMessage:
        """Append a user message (its files' token counts from :attr:`file_tokens`)."""
        widget = UserMessage(text, self.file_tokens)
        self.mount(widget)
        self.anchor()
        return widget

    def start_reply(
        self, turn: Turn, on_shown: Callable[[], object] | None = None, synthetic: bool = False
    ) -> ReplyView:
        """Append the reply that ``turn``'s text streams into; ``on_shown`` is called once it is mounted
        and painted; ``synthetic``: the model's weights are random (the text is labelled, dimmed)."""
        view = ReplyView(turn=turn, on_shown=on_shown, synthetic=synthetic)
        view.tint, view.stall_flushes = self.tint_drafts, self.stall_flushes
        self._fold_latest()
        self.let_go_of_hidden_lines()
        self.mount(view)
        self.anchor()
        self._latest_reply = view
        return view

    def add_reply(self, text: str) -> ReplyView:
        """Append a finished reply (e.g. restoring a conversation)."""
        view = ReplyView(text)
        self._fold_latest()
        self.mount(view)
        self._latest_reply = view
        return view

    def _fold_latest(self) -> None:
        """Fold the newest reply (once finished) as a newer one comes (:meth:`ReplyView.fold`): the newest
        not being removed (a regenerate or an edit removes the newest before its new reply starts). The
        user message right above it goes into it (an old turn as one widget), when it can take it."""
        views = [v for v in self.query_children(ReplyView) if v not in self._removing]
        if not views:
            return
        view = views[-1]
        index = self.children.index(view)
        above = self.children[index - 1] if index else None
        # a message with files stays a widget: its files' lines open and fold (a click, Enter)
        user = above if isinstance(above, UserMessage) and not above.files and above not in self._removing else None
        if view.fold(user) and user is not None:
            self._removing.add(user)

    def let_go_of_hidden_lines(self) -> None:
        """Free the drawn lines of every entry out of view (once a turn, as a reply starts), so an old turn
        keeps its text but not its drawing: Textual keeps each widget's last rendered lines, ``Strip`` objects
        with seven small caches each (some 20 KiB a turn), until the widget is drawn again, which an entry
        scrolled out of view never is. The entries in view keep theirs; one scrolled back into view is drawn
        anew (its lines, and the padded ones of its styles cache, are made again) and let go at the next turn.

        ``Widget.refresh`` frees the styles cache's lines and marks the widget dirty, so it renders again
        when next drawn; the rendered content lines it keeps until then (no public way to free them in
        Textual 8: :func:`~chatphase.ui.compat.textual_private.free_drawn_lines`). The drawn lines of the
        widgets removed since the last turn are let go of too
        (:func:`~chatphase.ui.compat.textual_private.release_removed_styles_caches`)."""
        release_removed_styles_caches()
        window = self.region
        for entry in self.children:
            if entry.region.overlaps(window):
                continue
            for widget in (entry, *entry.walk_children(Widget)):
                if free_drawn_lines(widget):
                    widget.refresh()

    def mark_left_out(self, n_turns: int) -> None:
        """Mark the ``n_turns`` oldest turns (a user message and the entries up to the next one) as no longer
        seen by the model, and unmark the rest."""
        seen_users = 0
        for child in self.children:
            if isinstance(child, UserMessage) or (isinstance(child, ReplyView) and child.user is not None):
                seen_users += 1  # a turn starts at its message, or at the old turn that draws it
            if isinstance(child, UserMessage | ReplyView):
                out = 0 < seen_users <= n_turns
                if child.has_class("left-out") != out:
                    child.set_class(out, "left-out")
                    child.tooltip = "The model no longer sees this turn (the context overflowed)" if out else None
                    if isinstance(child, ReplyView):
                        child.redraw()  # an old turn draws its message itself: dimmed, a dashed bar

    def user_texts(self) -> list[str]:
        """The user messages shown, oldest first: each a :class:`UserMessage`'s, or drawn by an old turn's reply."""
        texts = []
        for entry in self.children:
            if entry in self._removing:
                continue
            if isinstance(entry, UserMessage):
                texts.append(entry.text)
            elif isinstance(entry, ReplyView) and entry.user is not None:
                texts.append(entry.user)
        return texts

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

    async def flush(self, commit: bool = True) -> bool:
        """Draw the active reply's new text (called by the app at ``FLUSH_HZ``); ``commit``: whether
        whole blocks may go to its Markdown now. Returns whether Markdown was written."""
        reply = self.active_reply
        return reply is not None and await reply.flush(commit)

    def remove_last(self, cls: type[Widget]) -> AwaitRemove | None:
        """Start removing the newest entry of type ``cls`` (``UserMessage`` or ``ReplyView``) that is not
        already being removed; returns the awaitable removal (``None`` when there is none). The entry is
        chosen now, so entries mounted afterwards are never taken instead.

        An old turn is one widget (a folded reply that draws its user message): removing its reply puts
        the message back as a widget of its own above it (the next removal, an edit's, takes that); a
        message alone is taken from it (it stops drawing it)."""
        entries: list[Widget] = [w for w in self.query_children(cls) if w not in self._removing]
        if cls is UserMessage:  # the newest message may be drawn by an old turn's reply
            drawn = [v for v in self.query_children(ReplyView) if v.user is not None and v not in self._removing]
            if drawn and (not entries or self.children.index(drawn[-1]) > self.children.index(entries[-1])):
                drawn[-1].forget_user()
                return None
        if not entries:
            return None
        last = entries[-1]
        if isinstance(last, ReplyView) and last.user is not None:
            self.mount(UserMessage(last.user), before=last)
        self._removing.add(last)
        return last.remove()

    def clear_log(self) -> AwaitRemove:
        """Start removing every entry there is now (entries mounted afterwards stay); returns the
        awaitable removal."""
        return self.remove_children()
