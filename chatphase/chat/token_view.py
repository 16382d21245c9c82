"""What the token view shows of a turn's tokens (:class:`~chatphase.engine.tokens.TurnTokens`), for every view of it:
``ask --tokens`` (text and ``--json``) and the TUI's token screen.

One palette, one legend and one counts line, so the views agree. The palette is Okabe & Ito's colour-blind-safe one
("Color Universal Design", 2008), each source a hue apart from the others; a piece is shown inert
(:func:`~chatphase.engine.text.inert`), its newline and tab as visible marks.
"""

from __future__ import annotations

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
#: the accepted draft tokens of a speculative reply (bluish green)
ACCEPTED_COLOUR = "#009E73"

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
    if t.spec_steps:
        reply += f" (drafted {t.spec_drafted:,}, accepted {t.spec_accepted:,})"
    return f"prompt {len(t.prompt_ids):,} tok: {' · '.join(parts)} · {reply}"


def sources_present(t: TurnTokens) -> list[Source]:
    """The sources this turn has tokens of, in legend order."""
    c = t.counts()
    return [s for s in SOURCES if c[s]]


def gap_bar(gap_ms: float | None, longest_ms: float, width: int = 20) -> str:
    """A bar of up to ``width`` cells for a gap, against the turn's longest; at least one cell for any gap."""
    if gap_ms is None or longest_ms <= 0:
        return ""
    return "▇" * max(1, round(width * gap_ms / longest_ms))


def longest_gap_ms(t: TurnTokens) -> float:
    gaps = [t.itl_ms(i) or 0.0 for i in range(1, len(t.reply_ids))]
    return max(gaps, default=0.0)


def as_json(t: TurnTokens) -> dict[str, Any]:
    """``{"counts", "prompt": [{"id", "text", "source", "special"}], "left_out": [...], "reply": [{"id", "text",
    "t_ms", "itl_ms", "accepted_draft"}], "spec_steps": [{"first", "drafted", "accepted"}]}``: the text raw (the
    caller makes the document inert)."""
    prompt = []
    for start, end, src in t.spans():
        for i in range(start, end):
            tok = t.prompt_ids[i]
            prompt.append({"id": tok, "text": t.text(tok), "source": src, "special": t.special(tok)})
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
