"""A bracketed paste arrives whole, ESC and all: Textual's terminal input parser, with the paste taken out of its hands.

Where Textual 8 loses it: ``XTermParser.parse`` (``textual/_xterm_parser.py``) adds a bracketed paste's characters
to its paste buffer in its outer loop only. An ESC inside the paste sends it into its escape-sequence loop, whose
characters are never added: at the next ESC (or after 32 characters, or ESCDELAY) it hands them on as key presses
(the ESC as ``^``), which reach the app before the :class:`~textual.events.Paste`, and the Paste holds only the text
before the first ESC. So a pasted ``hello \\x1b[31mred\\x1b[0m`` came in as the keys ``^[31mred^[0m`` and then
``hello``; a line break after an ESC was a press of Enter (half the paste was sent), and a paste cut by ESCDELAY lost
characters to Alt keys.

:class:`PasteParser` wraps that parser: between the paste's start and end sequences it keeps the characters itself
and emits one Paste of them, control characters included (the prompt box shows them as their pictures and says so);
every other input is Textual's parser's, timeouts included. :class:`PasteKeepingDriver` is Textual's own terminal
driver reading with it (the app's on Linux and macOS). Without bracketed paste a terminal's paste is typing, which this cannot tell apart.
The parser's names are Textual's private API, taken from :mod:`chatphase.ui.compat.textual_private` (the app keeps
Textual's own driver where they are gone).
"""

from __future__ import annotations

from collections.abc import Generator

from textual import events
from textual.drivers.linux_driver import LinuxDriver
from textual.message import Message

from chatphase.ui.compat.textual_private import (
    BRACKETED_PASTE_END,
    BRACKETED_PASTE_START,
    ParseEOF,
    ParseError,
    Peek1,
    Read1,
    TokenCallback,
    XTermParser,
    linux_driver_parser,
)


class PasteParser(XTermParser):
    """Textual's input parser, but a bracketed paste is one :class:`~textual.events.Paste` of all its text (the
    module docstring says why)."""

    def parse(self, token_callback: TokenCallback) -> Generator[Read1 | Peek1, str, None]:
        swallow = False  # the wrapped parser's own paste, empty, at the end sequence handed to it

        def inner_token(token: Message) -> None:
            nonlocal swallow
            if swallow and isinstance(token, events.Paste):
                swallow = False
                return
            token_callback(token)

        inner = super().parse(inner_token)
        awaiting = next(inner)
        recent = ""  # the last characters handed on, to see the paste's start
        pasted: list[str] | None = None  # the paste's characters, while one comes in
        while True:
            try:
                character = yield (self.read1() if pasted is not None else awaiting)
            except ParseError as error:  # a timeout or the end of input: the wrapped parser's to handle
                if pasted is not None and isinstance(error, ParseEOF):
                    token_callback(events.Paste("".join(pasted).replace("\x00", "")))  # cut short: what came
                    pasted = None
                try:
                    awaiting = inner.throw(error)
                except StopIteration:
                    return
                continue
            if pasted is not None:
                pasted.append(character)
                if character == BRACKETED_PASTE_END[-1] and "".join(pasted[-len(BRACKETED_PASTE_END) :]) == (
                    BRACKETED_PASTE_END
                ):
                    text = "".join(pasted[: -len(BRACKETED_PASTE_END)])
                    pasted = None
                    token_callback(events.Paste(text.replace("\x00", "")))  # NULs dropped, as Textual does
                    swallow = True  # the wrapped parser, told the paste ended, leaves its paste mode
                    for c in BRACKETED_PASTE_END:
                        awaiting = inner.send(c)
                continue
            try:
                awaiting = inner.send(character)
            except StopIteration:
                return
            recent = (recent + character)[-len(BRACKETED_PASTE_START) :]
            if recent == BRACKETED_PASTE_START:  # the wrapped parser is in its paste mode now: the text is ours
                pasted, recent = [], ""


class PasteKeepingDriver(LinuxDriver):
    """Textual's terminal driver (Linux and macOS), reading its input with :class:`PasteParser`."""

    PARSER = PasteParser

    def run_input_thread(self) -> None:
        # The input thread runs for the app's whole life, and the one app of this process is this one.
        with linux_driver_parser(self.PARSER):
            super().run_input_thread()
