"""DraftBudget: under the prompt box, the files attached with ``/file`` and the budget of the draft, live.

As the user types or attaches, the draft is counted by the model's own tokenizer (the engine's count request,
:meth:`~chatphase.chat.controller.ChatController.count`) in a thread worker, :data:`DEBOUNCE_S` after the last
change (a newer draft cancels an older count), and shown as one line (:mod:`chatphase.chat.budget`):
``+3,412 tok · context 41 % → 63 % · TTFT ≈ 8.4 s (this chat, 3 turns)``. A file that cannot go in, or a
message that would not fit, is said there instead, and :meth:`DraftBudget.refusal` lets the app refuse to
send it. The files' text never goes through the UI thread's hands but for the final send.

A ``/file`` file is said to be attached once its first count says it fits (with its tokens): one that is more
tokens than the whole context is not attached, and the notice says why and how to make room (the budget's
words); where the engine cannot count now, it is attached, said without its tokens, and taken off (said too)
once a later count finds it too large.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from textual import work
from textual.timer import Timer
from textual.widgets import Static
from textual.worker import get_current_worker
from typing_extensions import override

from chatphase.chat.attachments import (
    Attachment,
    AttachmentError,
    at_paths,
    message_text,
    read_attachment,
    too_many_tokens,
)
from chatphase.chat.budget import Budget, budget_of, does_not_fit
from chatphase.chat.controller import ChatController
from chatphase.chat.listener import ChatListener
from chatphase.chat.turn import Turn
from chatphase.engine.events import LoadedModel, Message, TurnFinished
from chatphase.engine.fit_hints import for_tui
from chatphase.engine.text import inert
from chatphase.sessions.store import Session

#: seconds after the last keystroke before the draft is counted.
DEBOUNCE_S = 0.3


@dataclass(frozen=True)
class Counted:
    """A draft (``text`` as typed, with the ``/file`` files named in ``names``) and what counting it found:
    its ``budget`` (``None``: the engine could not count now), the files with their tokens, and ``refusal``
    (a file that cannot go in, or the message does not fit: one line)."""

    text: str
    names: tuple[str, ...]
    budget: Budget | None
    files: tuple[Attachment, ...] = ()
    refusal: str | None = None


class DraftBudget(Static):
    """The budget line (see the module docstring); ``files`` are those attached with ``/file``."""

    DEFAULT_CSS = """
    DraftBudget { height: auto; padding: 0 1; color: $text-muted; }
    DraftBudget.-refused { color: $error; }
    """

    def __init__(self, chat: ChatController, settings_key: str = "F9", **kwargs) -> None:
        """``settings_key``: the key of the settings screen, named in the hint of a draft that does not fit."""
        super().__init__("", markup=False, **kwargs)
        self.chat = chat
        self.settings_key = settings_key
        self.files: list[Attachment] = []
        self._unsaid: set[str] = set()  # names of files attached but not yet said to be (waiting for a count)
        self.latest: Counted | None = None
        self._text = ""
        self._timer: Timer | None = None
        self.display = False  # until there is a draft to count

    def n_ctx(self) -> int:
        """The context's size in tokens (the loaded engine's, else the setting's)."""
        loaded = self.chat.loaded
        n_ctx = loaded.settings.n_ctx if loaded is not None else None
        return n_ctx or self.chat.settings.engine.n_ctx_before_load

    # -- what changes the draft --------------------------------------------------------------------------
    def draft_changed(self, text: str) -> None:
        """The prompt box now holds ``text``: count it :data:`DEBOUNCE_S` from now."""
        self._text = text
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(DEBOUNCE_S, self.recount)

    def attach(self, att: Attachment) -> None:
        """Add a ``/file`` file to the next message (one of the same name is replaced); a notice says it was
        attached, or why not, once it is counted (module docstring)."""
        self.files = [f for f in self.files if f.name != att.name] + [att]
        self._unsaid.add(att.name)
        self.recount()

    def put_back(self, files: Sequence[Attachment]) -> None:
        """Attach ``files`` again, as they were (a message taken back to edit, or refused): before any attached
        since, said by the caller."""
        names = {f.name for f in files}
        self.files = [*files, *(f for f in self.files if f.name not in names)]
        self._unsaid -= names
        self.recount()

    def take_files(self) -> list[Attachment]:
        """The ``/file`` files, taken off (the message went, or the user dropped them)."""
        files, self.files = self.files, []
        self._unsaid.clear()
        self.recount()
        return files

    def recount(self) -> None:
        """Count the draft now (after a turn, the context changed); a ``/file`` line being typed is no message."""
        text, files = self._text, tuple(self.files)
        if text.lstrip().startswith("/file"):
            text = ""
        if not text.strip() and not files:
            self.latest = None
            self._show("", refused=False)
            return
        self._count(text, files)

    def files_for(self, text: str, attached: Sequence[Attachment] | None = None) -> list[Attachment]:
        """The files that go with ``text``: ``attached`` (default: the ``/file`` ones), then each ``@path``
        of ``text`` not among them, read now (an edited message's files are not read again).

        Raises:
            AttachmentError: an ``@path`` file cannot go in.
        """
        attached = list(self.files if attached is None else attached)
        names = {f.name for f in attached}
        return [*attached, *(read_attachment(a.path, self.n_ctx()) for a in at_paths(text) if a.path not in names)]

    def counted_tokens(self) -> dict[tuple[str, int], int]:
        """The latest count's tokens per file, by (name, size in bytes): for the transcript's file lines."""
        files = self.latest.files if self.latest is not None else ()
        return {(f.name, f.size_bytes): f.tokens for f in files if f.tokens is not None}

    def refusal(self, text: str) -> str | None:
        """Why ``text`` with the current files must not be sent, if its count (when it is the latest) says so."""
        latest = self.latest
        if latest is None or latest.text != text or latest.names != tuple(f.name for f in self.files):
            return None
        return latest.refusal

    # -- the count, off the UI thread ----------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="draft-budget", exit_on_error=False)
    def _count(self, text: str, attached: tuple[Attachment, ...]) -> None:
        """Count in a thread worker; a failure here only leaves the line as it was (the send checks again),
        never ends the app."""
        try:
            self._count_now(text, attached)
        except Exception:  # the app is closing, or the engine went away mid-count: nothing to show
            logging.getLogger(__name__).debug("draft budget", exc_info=True)
            with contextlib.suppress(Exception):  # the files are said to be attached, uncounted
                self.app.call_from_thread(self._say_files, attached, None)

    def _count_now(self, text: str, attached: tuple[Attachment, ...]) -> None:
        worker = get_current_worker()
        names = tuple(f.name for f in attached)
        try:
            files = self.files_for(text, attached)
        except AttachmentError as exc:
            self.app.call_from_thread(self._done, Counted(text, names, None, refusal=f"Cannot send: {exc}"))
            return
        message = message_text(text, files)
        request = self.app.call_from_thread(self.chat.draft_request, message, tuple(f.text for f in files))
        if worker.is_cancelled:
            return
        if request is None:  # the engine cannot count (none loaded, a server): the files go uncounted
            self.app.call_from_thread(self._say_files, attached, None)
            return
        count = self.chat.count(request)
        if worker.is_cancelled:
            return
        if count is None:
            self.app.call_from_thread(self._done, Counted(text, names, None, tuple(files)))
            return
        files = [replace(f, tokens=n) for f, n in zip(files, count.text_tokens, strict=True)]
        budget = budget_of(count, self.chat.ttft)
        refusal = next((does_not_fit(r) for f in files if (r := too_many_tokens(f, count.n_ctx)) is not None), None)
        if refusal is None and not budget.fits:
            refusal = budget.line()
        if refusal is not None:  # the TUI's way to make room: its settings screen, not the command line's flags
            refusal = for_tui(refusal, self.settings_key)
        self.app.call_from_thread(self._done, Counted(text, names, budget, tuple(files), refusal))

    def _done(self, counted: Counted) -> None:
        n_ctx = counted.budget.count.n_ctx if counted.budget is not None else None
        if not self._say_files(counted.files or self._attached(counted), n_ctx):
            return  # a file was taken off: the draft is counted again without it
        self.latest = counted
        parts = [f"📎 {f.line()}" for f in counted.files]
        if counted.refusal is not None:
            self._show(" · ".join([*parts, counted.refusal]), refused=True)  # a warning: nothing was sent yet
        elif counted.budget is not None:
            self._show(" · ".join([*parts, counted.budget.line()]), refused=False)
        else:
            self._show(
                " · ".join([*parts, "budget: counted when the engine is free (loading, or a reply running)"]),
                refused=False,
            )

    def _attached(self, counted: Counted) -> tuple[Attachment, ...]:
        """The ``/file`` files ``counted`` was about (uncounted: its count did not get to them)."""
        return tuple(f for f in self.files if f.name in counted.names)

    def _say_files(self, counted: Sequence[Attachment], n_ctx: int | None) -> bool:
        """Say the ``/file`` files among ``counted`` (with their tokens, or none when ``n_ctx`` is ``None``):
        each one not said yet as attached, and each one larger than the context taken off with why (then the
        draft is counted again: ``False``)."""
        fits = True
        for f in counted:
            if all(f.name != g.name for g in self.files):
                continue  # not a /file one (an @path), or taken off since
            too_large = too_many_tokens(f, n_ctx) if n_ctx is not None else None
            if too_large is not None:
                said = f.name not in self._unsaid
                self.files = [g for g in self.files if g.name != f.name]
                self._unsaid.discard(f.name)
                why = for_tui(too_large, self.settings_key)
                title = "Files" if said else "Not attached"
                self.app.notify(f"Took it off: {why}" if said else why, title=title, severity="error", timeout=10)
                fits = False
            elif f.name in self._unsaid:
                self._unsaid.discard(f.name)
                self.app.notify(f"Attached {f.line()}; it goes with your next message", title="Files")
        if not fits:
            self.recount()
        return fits

    def _show(self, line: str, refused: bool) -> None:
        self.set_class(refused, "-refused")
        self.update(inert(line))
        self.display = bool(line)


class RecountAfterTurns(ChatListener):
    """Counts the draft again when the context changed or the engine can count again (a turn ended, the
    engine loaded, the chat was cleared, rewound or restored)."""

    def __init__(self, draft: DraftBudget) -> None:
        self.draft = draft

    @override
    def engine_ready(self, loaded: LoadedModel) -> None:
        self.draft.recount()

    @override
    def turn_finished(self, turn: Turn, event: TurnFinished) -> None:
        self.draft.recount()

    @override
    def turn_failed(self, turn: Turn, message: str) -> None:
        self.draft.recount()

    @override
    def turn_abandoned(self, turn: Turn, why: str) -> None:
        self.draft.recount()

    @override
    def history_rewound(self, removed: tuple[Message, ...]) -> None:
        self.draft.recount()

    @override
    def chat_cleared(self) -> None:
        self.draft.recount()

    @override
    def history_restored(self, session: Session) -> None:
        self.draft.recount()
