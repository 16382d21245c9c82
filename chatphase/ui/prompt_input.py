"""The prompt box: a multi-line :class:`~textual.widgets.TextArea` where Enter sends.

Enter posts :class:`PromptInput.Submitted` with the text (and clears the box); Ctrl+J, Shift+Enter or
Alt+Enter insert a new line. Ctrl+J works everywhere; Shift+Enter and Alt+Enter only where the terminal
reports them as keys of their own (the kitty keyboard protocol): xterm-style terminals and tmux send
Shift+Enter as CR and Alt+Enter as ESC CR, which Textual 8 reads as a plain ``enter`` (Textual issue
#6663), so there they send.
Ctrl+U clears the box (said by the placeholder while it is empty and by the box's border while it holds
text, where the footer has no room at 80 columns; Ctrl+Z brings the text back). Pastes arrive as one
bracketed-paste event (whole even when they hold an ESC: :mod:`chatphase.ui.paste_input`), so large multi-line
pastes go in whole and are not sent line by line; text in
them that is not valid Unicode (a lone surrogate) is replaced with U+FFFD, a control character (ESC,
BEL) by its visible symbol, and a notice says so once per paste. The box grows with its text up to a height cap set in its ``DEFAULT_CSS``. Typing that reaches the app
because another widget of the chat screen has focus (after a click on a dashboard tab) comes here too
(:meth:`PromptInput.catch`), so that it is never lost.
Tab completes a file path typed after ``/file `` or ``@`` (:func:`~chatphase.chat.attachments.completion_context`;
several matches: their common start, and a notice lists them; a name's control characters in their pictures, which
``/file`` and ``@path`` find the file by: :func:`~chatphase.chat.attachments.real_path`); elsewhere Tab moves the
focus as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

from chatphase.chat.attachments import complete_path, completed, completion_context
from chatphase.engine.text import clean_text, inert, replaced_note


class PromptInput(TextArea):
    """Multi-line prompt input; see the module docstring for the keys."""

    DEFAULT_CSS = """
    PromptInput {
        height: auto;
        /* one cell of text inside the round border and TextArea's padding (0 1), however narrow the terminal:
           Textual's TextArea wraps its placeholder at the content width, and at width 0 that raises inside
           Rich (chop_cells: range() arg 3 must not be zero), a Textual bug worked around here */
        min-width: 5;
        min-height: 3;
        max-height: 10;
        border: round $accent 50%;
    }
    PromptInput:focus { border: round $accent; }
    """

    #: keys that insert a line break instead of sending.
    NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")
    BINDINGS = [
        Binding("enter", "submit", "Send", id="prompt.send"),
        Binding(",".join(NEWLINE_KEYS), "newline", "New line", key_display="^J", id="prompt.newline"),
        Binding(
            "ctrl+u",
            "clear_prompt",
            "Clear box",
            show=False,  # the footer is full at 80 columns: the box's border says it while it holds text
            id="prompt.clear",
            tooltip="Empty the prompt box (Ctrl+Z undoes)",
        ),
    ]

    @dataclass
    class Submitted(Message):
        """The user pressed Enter on non-blank ``text`` (the box is cleared)."""

        prompt_input: PromptInput
        text: str

        @property
        def control(self) -> PromptInput:
            return self.prompt_input

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.placeholder = "Message the model…  (Enter send · Ctrl+J new line · Ctrl+U clear)"

    async def _on_key(self, event: events.Key) -> None:
        """Enter sends and the newline keys break the line, handled here in key order.

        (Priority bindings would run in the app before earlier keys of the same burst, e.g. a fast
        type-ahead ``hi⏎``, reach the text, and send an empty box; the bindings above document the
        keys for the footer, the help and the keymap.)
        """
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.action_submit()
        elif event.key == "tab" and self._complete_path():
            event.stop()
            event.prevent_default()
        elif event.key in self.NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.action_newline()
        else:
            await super()._on_key(event)

    #: most matches a Tab lists in its notice.
    MAX_LISTED = 12

    def _complete_path(self) -> bool:
        """Complete the path before the cursor (module docstring); whether Tab was taken for it."""
        row, col = self.cursor_location
        context = completion_context(self.document.get_line(row)[:col])
        if context is None:
            return False
        prefix, quote = context
        matches = complete_path(prefix)
        replacement = completed(prefix, quote, matches)
        if replacement is not None:  # a name's control characters in pictures: shown, not obeyed, and found again
            self.replace(replacement, (row, col - len(prefix) - len(quote)), (row, col))
        if len(matches) != 1:
            names = [os.path.basename(m.rstrip("/")) + ("/" if m.endswith("/") else "") for m in matches]
            listed = ", ".join(names[: self.MAX_LISTED])
            more = f" and {len(matches) - self.MAX_LISTED} more" if len(matches) > self.MAX_LISTED else ""
            self.notify(inert(listed + more) if matches else "No file matches", title="Files", timeout=4)
        return True

    def action_submit(self) -> None:
        """Send the text unless it is blank."""
        text = self.text
        if not text.strip():
            return
        self.clear()
        self.border_title = ""  # an edit of the last message is sent
        self.post_message(self.Submitted(self, text))

    #: the border's title while the box holds the last message taken back for editing (a toast there
    #: would cover the very text being edited on a small terminal).
    EDITING_TITLE = "Editing your last message · Enter resends it"

    def edit_message(self, text: str) -> None:
        """Put ``text`` (the last message, taken back) in the box to edit, focused, and say so on its
        border until it is sent or emptied."""
        self.set_text(text)
        self.border_title = self.EDITING_TITLE
        self.focus()

    #: the border's hint while the box holds text.
    CLEAR_HINT = "Ctrl+U clear"

    def on_text_area_changed(self, _event: TextArea.Changed) -> None:
        hint = self.CLEAR_HINT if self.text else ""
        if self.border_subtitle != hint:
            self.border_subtitle = hint
        if not self.text and self.border_title:
            self.border_title = ""  # the edit was given up

    def action_clear_prompt(self) -> None:
        """Empty the box as one edit (so Ctrl+Z restores the text)."""
        if self.text:
            self.replace("", self.document.start, self.document.end)

    async def _on_paste(self, event: events.Paste) -> None:
        """A paste with lone surrogates (they cannot be encoded for the model) goes in with U+FFFD
        instead, and one with control characters (an ESC sequence copied from a terminal) with their
        visible symbols (:func:`~chatphase.engine.text.inert`: the box would write them to the terminal raw),
        each said once; any other paste is left to ``TextArea``'s own handler (Textual calls each class's
        handler in turn unless one prevents the default). The paste stops here: it was taken."""
        event.stop()
        text, first = clean_text(event.text)
        lines = text.replace("\r\n", "\n").replace("\r", "\n")
        visible = inert(lines)
        if first is None and visible == lines:
            return
        event.prevent_default()
        if first is not None:
            self.notify(replaced_note("The pasted text", first), title="Paste", severity="warning")
        if visible != lines:
            self.notify("Control characters in the pasted text are shown as symbols (␛).", title="Paste")
        await super()._on_paste(events.Paste(visible))

    def catch(self, event: events.Key | events.Paste) -> None:
        """A printable key or a paste that no widget took (the focus was on a dashboard tab, the turns
        table, a thinking block) goes into this box, which takes the focus back; only while the box's
        screen is the one shown (a dialog's stray keys stay there)."""
        if self.screen is not self.app.screen or self.has_focus:
            return
        if isinstance(event, events.Key) and not (event.is_printable and event.character):
            return
        event.stop()
        self.focus()
        if isinstance(event, events.Paste):
            self.post_message(events.Paste(event.text))  # as if pasted here: the same checks, one undo step
        else:
            self.insert(event.character or "")

    def action_newline(self) -> None:
        """Insert a line break at the cursor."""
        self.insert("\n")

    def set_text(self, text: str) -> None:
        """Replace the content and put the cursor at its end (used to edit a previous message)."""
        self.load_text(text)
        self.move_cursor(self.document.end)
