"""What the token view shows of a turn's tokens (:class:`~chatphase.engine.tokens.TurnTokens`), for every view of it:
``ask --tokens`` (text and ``--json``) and the TUI's token screen.

One palette, one legend and one counts line, so the views agree. The palette is Okabe & Ito's colour-blind-safe one
("Color Universal Design", 2008), each source a hue apart from the others; a piece is shown inert
(:func:`~chatphase.engine.text.inert`), its newline and tab as visible marks.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Any

from chatphase.engine.text import inert
from chatphase.engine.tokens import SOURCES, Source, TurnTokens

#: each source's colour (Okabe–Ito: blue, sky blue, orange, grey, vermillion, reddish purple) and its words
PALETTE: dict[Source, str] = {
    "restored": "#0072B2",
    "cached": "#56B4E9",
    "prefilled": "#E69F00",
    "unevaluated": "#999999",
    "dropped": "#D55E00",
    "shifted": "#CC79A7",
}
LEGEND: dict[Source, str] = {
    "restored": "restored from the disk prefix store",
    "cached": "reused from the KV cache",
    "prefilled": "prefilled this turn",
    "unevaluated": "not evaluated (stopped during the prefill)",
    "dropped": "dropped by the overflow (not in the prompt)",
    "shifted": "shifted out of the cache by the overflow (not in the prompt)",
}
#: the accepted draft tokens of a speculative reply (bluish green), a reasoning model's thinking (yellow)
ACCEPTED_COLOUR = "#009E73"
THINKING_COLOUR = "#F0E442"

#: what a newline and a tab in a piece are shown as
NEWLINE_MARK, TAB_MARK = "↵", "⇥"


def shown(piece: str) -> str:
    """``piece`` inert, on one line: newline and tab as :data:`NEWLINE_MARK` / :data:`TAB_MARK`."""
    return inert(piece).replace("\n", NEWLINE_MARK).replace("\t", TAB_MARK)


def counts_line(t: TurnTokens) -> str:
    """``prompt 1,234 tok: restored 0 · cached 1,100 · prefilled 134 · reply 56 tok`` (dropped / shifted and the
    drafts only where there were any)."""
    c = t.counts()
    parts = [f"{src} {c[src]:,}" for src in ("restored", "cached", "prefilled") if c[src] or src == "prefilled"]
    parts += [f"{src} {c[src]:,}" for src in ("unevaluated", "dropped", "shifted") if c[src]]
    reply = f"reply {len(t.reply_ids):,} tok"
    if t.thinking_tokens:
        reply += f" (thinking {t.thinking_tokens:,})"
    if t.spec_steps:
        reply += f" (drafted {t.spec_drafted:,}, accepted {t.spec_accepted:,})"
    return f"prompt {len(t.prompt_ids):,} tok: {' · '.join(parts)} · {reply}"


def sources_present(t: TurnTokens) -> list[Source]:
    """The sources this turn has tokens of, in legend order."""
    c = t.counts()
    return [s for s in SOURCES if c[s]]


def file_runs(t: TurnTokens) -> list[tuple[int, int, str]]:
    """The prompt tokens that hold a file's text, ``(start, end, name)`` per file block (the block a user message
    carries a file in: :mod:`chatphase.sessions.message_files`), found by its head and its end in the prompt's
    pieces (a token that holds both the head's last character and the file's first is the file's). A file that itself
    holds the end marker is marked up to there."""
    from chatphase.sessions.message_files import FILE_END, FILE_HEAD, file_name

    texts = {tok: t.text(tok) for tok in set(t.prompt_ids)}  # once per vocabulary entry, the rest in C
    pieces = list(map(texts.__getitem__, t.prompt_ids))
    starts = array("q", accumulate(map(len, pieces), initial=0))  # each token's first character (and the end)
    text = "".join(pieces)
    runs = []
    for m in FILE_HEAD.finditer(text):
        end = text.find(FILE_END, m.end())
        if end < 0:
            continue
        first = bisect_right(starts, m.end()) - 1  # the token holding the file's first character
        last = bisect_left(starts, end)  # the first token that starts at or after the end marker
        if last > first:
            runs.append((first, last, file_name(m.group(1))))
    return runs


def file_at(runs: list[tuple[int, int, str]], position: int) -> str | None:
    """The file whose text prompt token ``position`` holds (``None``: none)."""
    for start, end, name in runs:
        if start <= position < end:
            return name
    return None


def gap_bar(gap_ms: float | None, longest_ms: float, width: int = 20) -> str:
    """A bar of up to ``width`` cells for a gap, against the turn's longest; at least one cell for any gap."""
    if gap_ms is None or longest_ms <= 0:
        return ""
    return "▇" * max(1, round(width * gap_ms / longest_ms))


def longest_gap_ms(t: TurnTokens) -> float:
    gaps = [t.itl_ms(i) or 0.0 for i in range(1, len(t.reply_ids))]
    return max(gaps, default=0.0)


def as_json(t: TurnTokens) -> dict[str, Any]:
    """``{"counts", "prompt": [{"id", "text", "source", "special", "file"}], "left_out": [...], "reply": [{"id",
    "text", "t_ms", "itl_ms", "accepted_draft", "thinking"}], "spec_steps": [{"first", "drafted", "accepted"}]}`` (``file``: the
    name of the attached file whose text the token holds, :func:`file_runs`, else ``null``): the text raw (the
    caller makes the document inert)."""
    prompt = []
    files = file_runs(t)
    for start, end, src in t.spans():
        for i in range(start, end):
            tok = t.prompt_ids[i]
            prompt.append({"id": tok, "text": t.text(tok), "source": src, "special": t.special(tok),
                           "file": file_at(files, i)})  # fmt: skip
    left = [
        {"id": tok, "text": t.text(tok), "source": t.left_out_how, "special": t.special(tok)} for tok in t.left_out_ids
    ]
    accepted = set(t.reply_accepted)
    reply = [
        {
            "id": tok,
            "text": t.text(tok),
            "t_ms": round(t.t_ms(i), 3),
            "itl_ms": None if (gap := t.itl_ms(i)) is None else round(gap, 3),
            "accepted_draft": i in accepted if t.spec_steps else None,
            "thinking": t.thinking(i),
        }
        for i, tok in enumerate(t.reply_ids)
    ]
    return {
        "counts": dict(t.counts()) | {"prompt": len(t.prompt_ids), "reply": len(t.reply_ids)},
        "prompt": prompt,
        "left_out": left,
        "reply": reply,
        "spec_steps": [{"first": f, "drafted": d, "accepted": a} for f, d, a in t.spec_steps],
    }
