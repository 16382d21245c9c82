"""Where a streamed Markdown text can be cut into segments without changing how it reads.

A streamed reply is drawn as several :class:`~chatphase.ui.transcript.reply_markdown.MarkdownSegment` widgets, each
parsed on its own, so a segment may only start where the whole text's parse starts a top-level block
that no later text can change. The block structure comes from the parser Rich's Markdown itself uses
(markdown-it-py, CommonMark, with Rich's extensions), not from a hand-made scanner, so fences of any
length and either character, fences inside fences, fences and continuation paragraphs in list items and
indented code are all read as the renderer reads them. No Textual here: pure functions of text.

A block is *whole* when the text after it can no longer change it:

- every top-level block before the last one (a new block has begun after it);
- the last one when it is a closed fence (its closing line has arrived), a heading or a thematic break
  (one line each), or a paragraph, block quote or table followed by a blank line;
- never a list, indented code or HTML block while it is the last one: text after a blank line may still
  continue it (a loose list's next item, the next line of code).
"""

from __future__ import annotations

from functools import lru_cache

#: closed by a blank line after them (when last); closed by their own line.
_ENDED_BY_BLANK = ("paragraph_open", "blockquote_open", "table_open")
_ONE_LINE = ("heading_open", "hr")


def _newline_as_written(state, silent: bool) -> bool:
    """markdown-it's inline ``newline`` rule, but every line break is a hard break and the next line keeps
    its leading spaces: a reply's line breaks read as the model wrote them (CommonMark joins the lines of a
    paragraph, so a code reply without fences became one line). Spaces before the break are dropped, as
    CommonMark drops them. Only the text inside a block changes: the blocks (fences, lists, tables) are found
    by the block rules, before this runs."""
    if state.src[state.pos] != "\n":
        return False
    if not silent:
        state.pending = state.pending.rstrip(" ")
        state.push("hardbreak", "br", 0)
    state.pos += 1
    return True


@lru_cache(maxsize=1)
def markdown_parser():
    """The parser of replies, shared by the block finder and the renderer: Rich's (CommonMark, tables,
    strikethrough) with raw HTML off, so that ``<word ...>`` in a reply is text, not a tag Rich drops, and
    line breaks kept as written (:func:`_newline_as_written`)."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("strikethrough").enable("table")
    md.inline.ruler.at("newline", _newline_as_written)
    return md


def top_level_blocks(text: str) -> list:
    """The opening (or single) token of each top-level block of ``text``, with its ``map`` of lines."""
    return [t for t in markdown_parser().parse(text) if t.level == 0 and t.nesting >= 0 and t.map]


def _offsets(lines: list[str]) -> list[int]:
    out, pos = [0], 0
    for line in lines:
        pos += len(line)
        out.append(pos)
    return out


def _closed_fence(token, lines: list[str]) -> bool:
    start, end = token.map
    if end - start < 2 or end > len(lines):
        return False
    last = lines[end - 1].strip()
    mark = token.markup
    return len(last) >= len(mark) and set(last) == {mark[0]}


def complete_blocks_end(text: str) -> int:
    """Length of the longest prefix of ``text`` made of whole Markdown blocks (see the module docstring),
    with the blank lines after them; 0 when no block is whole yet. Only whole lines count (the last
    line may still be being written)."""
    body = text[: text.rfind("\n") + 1]
    if not body:
        return 0
    lines = body.splitlines(keepends=True)
    offsets = _offsets(lines)
    blocks = top_level_blocks(body)
    if not blocks:
        return len(body) if not body.strip() else 0
    last = blocks[-1]
    start, end = last.map
    whole = False
    if last.type == "fence":
        whole = _closed_fence(last, lines)
    elif last.type in _ONE_LINE:
        whole = True
    elif last.type in _ENDED_BY_BLANK:
        whole = end < len(lines) and not lines[end].strip()
    if not whole:
        return offsets[start] if len(blocks) > 1 else 0
    rest = body[offsets[end] :]
    return len(body) if not rest.strip() else offsets[end]


def last_block_start(text: str) -> int:
    """Offset in ``text`` of its last top-level block (0 when it has none or one)."""
    blocks = top_level_blocks(text)
    if not blocks:
        return 0
    lines = text.splitlines(keepends=True)
    return _offsets(lines)[blocks[-1].map[0]]
