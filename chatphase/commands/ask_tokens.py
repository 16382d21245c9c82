"""``ask --tokens``: a turn's token view in the terminal (:mod:`chatphase.chat.token_view`).

The counts and the legend first (with the prompt positions of each attached file's text), then the prompt's tokens by source (a header per run of one source, the pieces
inert, separated by a dim ``│``; a newline piece as ``↵`` and a line break; special tokens bold), the tokens an
overflow left out, then the reply's tokens one a line with their time, their gap (ITL) as a bar and whether they
were an accepted draft or a reasoning model's thinking. Colour (24-bit, the view's palette) only where the stream is a terminal and ``NO_COLOR`` is
unset; without it the run headers say the source.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TextIO

from chatphase.chat.token_view import (
    ACCEPTED_COLOUR,
    LEGEND,
    NEWLINE_MARK,
    PALETTE,
    THINKING_COLOUR,
    counts_line,
    file_runs,
    gap_bar,
    longest_gap_ms,
    shown,
    sources_present,
)
from chatphase.engine.tokens import Source, TurnTokens
from chatphase.units import fmt_ms


def colour_wanted(stream: TextIO) -> bool:
    """Colour where ``stream`` is a terminal and ``NO_COLOR`` (no-color.org) is unset or empty."""
    return not os.environ.get("NO_COLOR") and hasattr(stream, "isatty") and stream.isatty()


class _Style:
    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def fg(self, hex_colour: str, text: str, bold: bool = False) -> str:
        if not self.colour:
            return text
        r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        return f"\x1b[{'1;' if bold else ''}38;2;{r};{g};{b}m{text}\x1b[0m"

    def dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.colour else text


def token_lines(t: TurnTokens, number: int, colour: bool) -> list[str]:
    """The view of turn ``number`` as lines (escape sequences only with ``colour``)."""
    st = _Style(colour)
    out = [f"── turn {number} tokens ── {counts_line(t)}"]
    out += [f"  {st.fg(PALETTE[s], '■')} {s}: {LEGEND[s]}" for s in sources_present(t)]
    out.append(
        "  special (chat template) tokens are bold" if colour else "  <…> special tokens as the template has them"
    )
    for start, end, name in file_runs(t):
        out.append(f"  file {shown(name)}: prompt {start:,}–{end - 1:,} ({end - start:,} tok)")
    if t.left_out_ids:
        out += _run(st, t, t.left_out_ids, t.left_out_how, "left out")
    for start, end, src in t.spans():
        out += _run(st, t, t.prompt_ids[start:end], src, f"prompt {start:,}–{end - 1:,}")
    out += _reply(st, t)
    return out


def _run(st: _Style, t: TurnTokens, ids: Sequence[int], src: Source, where: str) -> list[str]:
    """One run of tokens of one source: its header, then its pieces wrapped at their newlines."""
    colour = PALETTE[src]
    lines, line = [st.fg(colour, f"▌{src} · {where} ({len(ids):,} tok)", bold=True)], []
    sep = st.dim("│")
    for tok in ids:
        text = shown(t.text(tok))
        line.append(st.fg(colour, text, bold=t.special(tok)))
        if text.endswith(NEWLINE_MARK):
            lines.append(sep.join(line))
            line = []
    if line:
        lines.append(sep.join(line))
    return lines


def _reply(st: _Style, t: TurnTokens) -> list[str]:
    """The reply's tokens, one a line: index, time since submit, gap and its bar, the piece."""
    if not t.reply_ids:
        return ["▌reply: no tokens"]
    longest = longest_gap_ms(t)
    accepted = set(t.reply_accepted)
    out = [st.fg(PALETTE["prefilled"], f"▌reply ({len(t.reply_ids):,} tok; time since sent · gap)", bold=True)]
    for i, tok in enumerate(t.reply_ids):
        gap = t.itl_ms(i)
        when = f"{fmt_ms(t.t_ms(i)):>10} · {'TTFT' if gap is None else fmt_ms(gap):>9}"
        bar = gap_bar(gap, longest)
        draft = " accepted draft" if i in accepted else ""
        thinking = " thinking" if t.thinking(i) else ""
        if draft:
            bar_shown = st.fg(ACCEPTED_COLOUR, bar.ljust(20))
        else:
            bar_shown = st.fg(THINKING_COLOUR, bar.ljust(20)) if thinking else st.dim(bar.ljust(20))
        out.append(f"  #{i:<5} {when} {bar_shown} {shown(t.text(tok))}{thinking}{draft}")
    return out
