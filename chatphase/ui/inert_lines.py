"""The TUI's last line of defence against text that would drive the terminal.

Every widget that shows text from outside the program (the reply, the thinking, notices, model and file
names, session titles, the engine log) makes it inert itself (:func:`chatphase.engine.text.inert`),
so that it is measured and wrapped as it is drawn (a raw ESC counts zero cells, its picture one).
:class:`InertLines`, a Textual line filter the app applies to every line it draws, catches what a
widget missed: no control character reaches the terminal inside a line's text, whatever the widget.
"""

from __future__ import annotations

from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter

from chatphase.engine.text import inert


class InertLines(LineFilter):
    """Each text segment of a drawn line made inert; a line without a control character is returned as is
    (one regex scan per segment). Textual's own control segments (cursor moves) are left alone."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        out: list[Segment] | None = None
        for i, segment in enumerate(segments):
            if segment.control:
                continue
            text = inert(segment.text)
            if text is not segment.text:
                if out is None:
                    out = list(segments)
                out[i] = Segment(text, segment.style, segment.control)
        return segments if out is None else out
