"""The plain-text tail of a streaming reply (:class:`~chatphase.ui.transcript.chat_log.ReplyView`), with the text of
accepted draft tokens (speculative decoding) tinted.

The tail is the last lines of the text not yet committed to the Markdown, wrapped as the Markdown will wrap
it (:func:`tail_lines`). :func:`tinted_tail` finds each wrapped line back in the source (wrapping only drops
whitespace at line breaks) and styles the characters inside the drafted spans; a line it cannot find (a tab,
expanded by the wrap) and the lines above it stay untinted.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from rich.style import Style
from rich.text import Text


def tail_lines(text: str, width: int, count: int) -> str:
    """The last ``count`` lines of ``text`` wrapped at ``width`` characters (``width`` ≥ 1): at spaces, as
    the Markdown will wrap it once committed; a word longer than a line is cut."""
    lines: list[str] = []
    for line in text.split("\n")[-count:]:
        lines.extend(textwrap.wrap(line.expandtabs(4), width, break_on_hyphens=False) or [""])
    return "\n".join(lines[-count:])


def tinted_tail(
    text: str, start: int, spans: Sequence[tuple[int, int]], width: int, count: int, style: Style | None
) -> Text:
    """:func:`tail_lines` of ``text[start:]`` as Rich text, the characters inside ``spans`` (``(begin, end)``
    offsets into ``text``, in order) in ``style``; no tint when ``style`` is ``None`` or there are no spans."""
    rest = text[start:]
    lines = tail_lines(rest, width, count).split("\n")
    out = Text("\n".join(lines))
    if style is None or not spans:
        return out
    at = len(out.plain)  # where the line being placed ends in ``out``
    cursor = len(rest)  # lines are found from the end: the tail shows the end of ``rest``
    for line in reversed(lines):
        at -= len(line)
        pos = rest.rfind(line, 0, cursor)
        if pos < 0:
            break
        cursor = pos
        lo, hi = start + pos, start + pos + len(line)
        for a, b in spans:
            if a < hi and b > lo:
                out.stylize(style, at + max(a, lo) - lo, at + min(b, hi) - lo)
        at -= 1  # the newline
    return out
