"""llama.cpp's KV shift for the ``shift`` overflow policy: take whole messages out of the KV cache, keep the rest.

The cache holds the tokens of the templated conversation ``S + D + K`` (system prompt, the messages to drop,
the messages kept); the next prompt is ``S + K + new``. :func:`locate_cut` finds the cache tokens ``[start, end)``
that spell ``D`` — by text, so that it does not depend on how a template writes its turns — and :func:`shift_out`
removes them (``llama_memory_seq_rm``) and moves the kept cells down by ``end - start`` positions
(``llama_memory_seq_add``; llama.cpp applies the RoPE shift to the keys at the next ``llama_decode``). The tokens
after the cut keep the KV entries computed when ``D`` was still in view, as llama.cpp's own context shift does
(llama-server's ``--context-shift``); nothing is evaluated again.

A cut is found only where the cache's tokens spell its text exactly (their pieces, control tokens as text) and
both ends fall on token boundaries; otherwise the caller re-prefills and says so.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llama_cpp as lc

from chatphase.engine.local.prefix import common_prefix_len

Render = Callable[[int], bytes]


def token_offsets(tokens: Sequence[int], render: Render, text: bytes | None = None) -> list[int] | None:
    """Byte offsets of each token's start in the text the tokens spell, then the text's length (``len + 1``).

    With ``text``: the offsets into ``text``, ``None`` unless the tokens spell it exactly — a first token that
    ``text`` leaves out (a BOS the tokeniser added, e.g. Gemma's ``<bos>``) spells nothing there."""
    pieces = [render(t) for t in tokens]
    if text is not None and b"".join(pieces) != text:
        if not pieces or pieces[0] + text != b"".join(pieces):
            return None
        pieces[0] = b""
    out, at = [0], 0
    for piece in pieces:
        at += len(piece)
        out.append(at)
    return out


@dataclass(frozen=True)
class Cut:
    """Cache tokens ``[start, end)`` to remove; ``text`` what the cache spells after the cut."""

    start: int
    end: int
    text: bytes


def locate_cut(
    old_text: bytes, offsets: Sequence[int], new_text: bytes, tries: int = 16, fallback: bool = True
) -> Cut | None:
    """The token range of the cache (whose tokens spell ``old_text`` at ``offsets``, :func:`token_offsets`) whose
    removal leaves a text that ``new_text`` starts with; ``None`` when there is none (or the texts disagree).

    The cut starts at a token boundary no later than where the texts part (trying up to ``tries`` boundaries
    back); its end is the first token boundary from which the rest of the cache's text reappears in
    ``new_text`` there, so what is kept is as long as it can be. When the rest never reappears (the template
    renders the kept turns differently) everything after the first boundary goes (``fallback=False``: ``None``)."""
    if not offsets or offsets[-1] != len(old_text):
        return None
    split = common_prefix_len(old_text, new_text)
    if split == len(old_text):
        return None  # nothing to cut: the new prompt extends the cache
    bounds = {off: k for k, off in enumerate(offsets)}
    first = bisect_right(offsets, split) - 1
    for i in range(first, max(-1, first - tries), -1):
        a = offsets[i]
        needle = new_text[a : a + 64]
        pos = old_text.find(needle, a + 1) if needle else -1
        while pos != -1:
            if pos in bounds and new_text.startswith(old_text[pos:], a):
                return Cut(i, bounds[pos], old_text[:a] + old_text[pos:])
            pos = old_text.find(needle, pos + 1)
    return Cut(first, len(offsets) - 1, old_text[: offsets[first]]) if fallback else None


def shift_refusal(model: lc.llama_model_p | None, mem: lc.llama_memory_t) -> str | None:
    """Why llama.cpp cannot shift this model's cache (one line), or ``None`` when it can."""
    if model is None:
        return "no model is loaded"
    if lc.llama_model_is_recurrent(model) or lc.llama_model_is_hybrid(model):
        return "its memory is recurrent or hybrid: a state, not positions that can move"
    if not lc.llama_memory_can_shift(mem):
        if lc.llama_model_n_swa(model) > 0:  # llama.cpp shifts an iSWA cache only when its SWA part is full-size
            return "its sliding-window KV cache is smaller than n_ctx (llama_memory_can_shift is false)"
        return "llama.cpp cannot shift this model's KV cache (llama_memory_can_shift is false)"
    return None


def shift_out(mem: lc.llama_memory_t | None, cache: list[int], start: int, end: int) -> bool:
    """Remove cache tokens ``[start, end)`` from sequence 0 and move the later ones down; ``cache`` (the token
    list mirroring it) is cut the same way. Returns ``False`` (nothing changed) when llama.cpp refuses.
    ``mem=None``: only ``cache`` is cut (a count of what the shift would leave, on a copy)."""
    if end <= start:
        return True
    if mem is not None and not lc.llama_memory_seq_rm(mem, 0, start, end):
        return False
    if mem is not None and end < len(cache):
        lc.llama_memory_seq_add(mem, 0, end, -1, start - end)
    del cache[start:end]
    return True


def plan_cut(cache: Sequence[int], cache_text: bytes, render: Render, new_text: bytes) -> Cut | None:
    """:func:`locate_cut` for the engine's cache: ``None`` unless ``cache_text`` (the text record of the cache,
    :class:`~chatphase.engine.local.prefix.CacheText`) is what all of ``cache``'s tokens spell."""
    offsets = token_offsets(cache, render, cache_text)
    return locate_cut(cache_text, offsets, new_text) if offsets is not None else None


def reprefill_tokens(prompt: Sequence[int], render: Render, text: bytes, cached: int, kept_bytes: int | None) -> int:
    """Tokens of ``prompt`` (spelling ``text``) evaluated again although the cache held their text before the
    overflow: those from ``cached`` up to byte ``kept_bytes`` (where the kept history ends in ``text``).
    ``kept_bytes=None`` or tokens that do not spell ``text``: every evaluated token but the last, an upper bound."""
    offsets = token_offsets(prompt, render, text) if kept_bytes is not None else None
    if offsets is None or kept_bytes is None:
        return max(0, len(prompt) - cached - 1)
    return max(0, bisect_right(offsets, kept_bytes) - 1 - cached)
