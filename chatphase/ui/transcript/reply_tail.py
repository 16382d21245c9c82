"""The plain-text tail of a streaming reply (:class:`~chatphase.ui.transcript.reply_view.ReplyView`), with the text of
accepted draft tokens (speculative decoding) tinted.

The tail is the last lines of the text not yet committed to the Markdown, wrapped as the Markdown will wrap
it (:func:`wrapped_lines`: at spaces, greedily). Each wrapped line keeps its offset in the source (wrapping
only drops whitespace at line breaks), so the reply view can commit whole wrapped lines to the Markdown and
:func:`tinted_tail` can style the characters inside the drafted spans; a line whose offset is not known (a
tab, expanded by the wrap) stays untinted.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from rich.style import Style
from rich.text import Text

from chatphase.engine.text import inert


def _wrap(line: str, width: int) -> list[tuple[int | None, str]]:
    """One source line (no newline) wrapped at ``width``, each piece with its offset in ``line``: the first
    always (wrapping keeps a line's leading whitespace), the others when they are found in ``line``."""
    expanded = line.expandtabs(4)
    pieces = textwrap.wrap(expanded, width, break_on_hyphens=False) or [""]
    out: list[tuple[int | None, str]] = [(0, pieces[0])]
    cursor: int | None = len(pieces[0]) if expanded == line else None
    for piece in pieces[1:]:
        at = line.find(piece, cursor) if cursor is not None else -1
        cursor = at + len(piece) if at >= 0 else None
        out.append((at if at >= 0 else None, piece))
    return out


def wrapped_lines(text: str, width: int, count: int) -> list[tuple[int | None, str]]:
    """The last ``count`` lines of ``text`` wrapped at ``width`` characters (``width`` ≥ 1): at spaces, as the
    Markdown will wrap it once committed; a word longer than a line is cut. Each line comes with its offset
    in ``text`` (``None`` when not known: a line after a tab, which the wrap expands; the first line of a
    source line always has one, though with tabs its text is not the source's)."""
    lines: list[tuple[int | None, str]] = []
    end = len(text)
    while end >= 0 and len(lines) < count:
        start = text.rfind("\n", 0, end) + 1
        lines[:0] = [(None if at is None else start + at, piece) for at, piece in _wrap(text[start:end], width)]
        end = start - 1
    return lines[-count:]


def tail_lines(text: str, width: int, count: int) -> str:
    """:func:`wrapped_lines` of ``text`` as one string."""
    return "\n".join(piece for _, piece in wrapped_lines(text, width, count))


def tinted_tail(
    text: str, start: int, spans: Sequence[tuple[int, int]], width: int, count: int, style: Style | None
) -> Text:
    """:func:`tail_lines` of ``text[start:]`` made inert (:func:`~chatphase.engine.text.inert`, one character
    for one) as Rich text, the characters inside ``spans`` (``(begin, end)`` offsets into ``text``, in order)
    in ``style``; no tint when ``style`` is ``None`` or there are no spans."""
    tail = inert(text[start:])
    lines = wrapped_lines(tail, width, count)
    out = Text("\n".join(piece for _, piece in lines))
    if style is None or not spans:
        return out
    at = 0  # where the line being placed starts in ``out``
    for offset, piece in lines:
        lo, hi = start + (offset or 0), start + (offset or 0) + len(piece)
        if offset is not None and tail[lo - start : hi - start] == piece:  # not a line whose tabs the wrap expanded
            for a, b in spans:
                if a < hi and b > lo:
                    out.stylize(style, at + max(a, lo) - lo, at + min(b, hi) - lo)
        at += len(piece) + 1  # the newline
    return out
