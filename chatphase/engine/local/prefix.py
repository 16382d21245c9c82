"""Which text the KV cache's tokens spell, so that a new prompt can reuse them by text.

Why: the engine reuses the KV cache across turns by keeping the cached tokens that the new prompt
starts with. The previous reply comes back in the new prompt as *text*, and re-tokenising a reply often
gives other ids than the ones the model sampled (BPE merges across the sampled pieces), so a comparison
of token ids stops early in the reply and the rest of it is evaluated again. :class:`CacheText`
records, at token boundaries of the cache, the exact UTF-8 text the tokens up to there stand for;
:func:`encode_prompt` then builds a prompt's tokens as *the cached tokens of the longest recorded text
the new prompt starts with* + *the tokenisation of only the text after it*.

Which boundaries are recorded (each one is a place where a tokenisation may start again):

* the end of an evaluated prompt (the whole templated text, with the tokens it was tokenised to);
* after every generated token that was evaluated into the cache (its piece, control tokens rendered
  as their text, e.g. ``<|im_end|>``, because the template text holds them literally).

Boundaries *inside* a tokenised prompt are not recorded: a tokenisation restarted mid-prompt could
give different (non-canonical) tokens at the seam. When a new prompt departs from the cache inside a
prompt region, the text is tokenised again from the start of that region, which gives the same ids as
before up to the change, so the engine's longest common token prefix still keeps the cache up to the
change (as in ``Llama.generate``). Generated tokens are what the model saw, so any of their
boundaries is a fine place to continue.

Units: boundaries are ``(tokens, bytes)`` pairs — a count of cache tokens and a count of UTF-8 bytes
of text. A boundary inside a multi-byte character (a character split across generated tokens) is
never used to split a prompt. Pure Python, no model: tokenisation and token rendering are passed in.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise

Tokenize = Callable[[str, bool], list[int]]
"""``(text, add_special) -> token ids``, parsing special tokens in ``text`` (e.g. ``<|im_start|>``)."""
Render = Callable[[int], bytes]
"""``token -> bytes`` it spells, control tokens as their text (llama.cpp's piece with ``special=True``)."""


def common_prefix_len(a: bytes, b: bytes) -> int:
    """Length in bytes of the longest common prefix of ``a`` and ``b`` (compares 4 KiB blocks in C)."""
    n = min(len(a), len(b))
    i, block = 0, 4096
    while i < n and a[i : i + block] == b[i : i + block]:
        i += block
    i = min(i, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


class CacheText:
    """The text of prefixes of the KV cache's tokens, at recorded token boundaries.

    The engine keeps the tokens (a ``list[int]`` mirroring the cache); this object keeps
    ``text`` (bytes) and boundaries ``(n_tokens, n_bytes)`` meaning "the first ``n_tokens`` cached
    tokens stand for ``text[:n_bytes]``". Both counts never decrease along the list. The engine calls
    :meth:`truncate` whenever the cache drops tokens, :meth:`add_prompt` once a prompt is wholly
    evaluated and :meth:`add_pieces` for generated tokens evaluated into the cache.
    """

    def __init__(self) -> None:
        self._text = b""
        self._ntok: list[int] = []
        self._nbytes: list[int] = []

    @property
    def n_tokens(self) -> int:
        """Cache tokens covered by the last boundary (0 when nothing is recorded)."""
        return self._ntok[-1] if self._ntok else 0

    @property
    def text(self) -> bytes:
        """UTF-8 text of the first :attr:`n_tokens` cache tokens."""
        return self._text

    @classmethod
    def of(cls, text: bytes, ntok: Sequence[int], nbytes: Sequence[int]) -> CacheText:
        """A record with these boundaries (as :attr:`boundaries` gave them) over ``text``.

        Raises:
            ValueError: the boundaries are not non-decreasing pairs within ``text``.
        """
        ordered = all(a <= b for a, b in pairwise(ntok)) and all(a <= b for a, b in pairwise(nbytes))
        ends = nbytes[0] >= 0 and nbytes[-1] == len(text) if nbytes else not text
        if len(ntok) != len(nbytes) or not ordered or not ends:
            raise ValueError("boundaries must be non-decreasing and end at the text's end")
        out = cls()
        out._text, out._ntok, out._nbytes = bytes(text), list(ntok), list(nbytes)
        return out

    @property
    def boundaries(self) -> tuple[list[int], list[int]]:
        """``(token counts, byte counts)`` of the recorded boundaries (copies)."""
        return list(self._ntok), list(self._nbytes)

    def copy(self) -> CacheText:
        """An independent copy."""
        return CacheText.of(self._text, self._ntok, self._nbytes)

    def clear(self) -> None:
        """Forget everything (the cache was cleared, or holds tokens of unknown text from the start)."""
        self._text, self._ntok, self._nbytes = b"", [], []

    def truncate(self, n_tokens: int, text: bytes | None = None) -> None:
        """Keep only boundaries within the first ``n_tokens`` tokens (the cache was cut to that length)
        and, if ``text`` is given, only those whose text is a prefix of ``text``."""
        keep = bisect_right(self._ntok, n_tokens)
        if text is not None:
            keep = min(keep, bisect_right(self._nbytes, common_prefix_len(self._text, text)))
        del self._ntok[keep:], self._nbytes[keep:]
        self._text = self._text[: self._nbytes[-1]] if self._nbytes else b""

    def add_prompt(self, n_tokens: int, text: bytes) -> None:
        """The cache's first ``n_tokens`` tokens are the tokenisation of all of ``text``.

        Raises:
            ValueError: ``text`` does not start with the recorded text, or ``n_tokens`` is not past
                the last boundary (call :meth:`truncate` with the prompt's text first).
        """
        if not text.startswith(self._text) or (self._ntok and n_tokens <= self._ntok[-1]):
            raise ValueError("a prompt must extend the recorded text and tokens")
        self._text = text
        self._ntok.append(n_tokens)
        self._nbytes.append(len(text))

    def add_pieces(self, pieces: Iterable[bytes]) -> None:
        """One token per piece was appended to the cache after :attr:`n_tokens`; each piece is the
        token's bytes (control tokens as their text). Records a boundary after each."""
        n, size, parts = self.n_tokens, len(self._text), [self._text]
        for piece in pieces:
            n += 1
            size += len(piece)
            parts.append(piece)
            self._ntok.append(n)
            self._nbytes.append(size)
        self._text = b"".join(parts)

    def split(self, text: bytes) -> tuple[int, int]:
        """``(n_tokens, n_bytes)``: the recorded boundary with the longest text that ``text`` starts
        with and that ends on a character boundary of ``text``; ``(0, 0)`` when there is none.
        Among boundaries at the same text length the one with fewer tokens wins (a token that spells
        nothing is not kept on its own)."""
        limit = common_prefix_len(self._text, text)
        i = bisect_right(self._nbytes, limit) - 1
        while i >= 0:
            i = bisect_left(self._nbytes, self._nbytes[i])  # the first boundary at this text length
            off = self._nbytes[i]
            if off == len(text) or (text[off] & 0xC0) != 0x80:  # not inside a UTF-8 character
                return self._ntok[i], off
            i -= 1
        return 0, 0


def encode_prompt(
    text: str, add_special: bool, cache: Sequence[int], known: CacheText, tokenize: Tokenize, render: Render
) -> list[int]:
    """Token ids for the prompt ``text``, reusing the cached tokens whose text it starts with.

    Args:
        text: the whole templated prompt.
        add_special: whether a whole-prompt tokenisation adds BOS/EOS (as the template asks).
        cache: the tokens in the KV cache; ``known`` must describe a prefix of them.
        known: the text record of ``cache``.
        tokenize / render: the model's tokeniser and token renderer (see :data:`Tokenize`, :data:`Render`).

    Returns:
        ``cache[:n] + tokenize(rest, False)`` where ``cache[:n]`` stands for the longest recorded
        prefix of ``text`` and ``rest`` is the text after it; the whole prompt tokenised as before
        (``tokenize(text, add_special)``) when no recorded prefix matches, or when the tokens of
        ``rest`` do not spell ``rest`` exactly (tokenisers that add a leading space, for example).
    """
    data = text.encode("utf-8")
    n, off = known.split(data)
    if n == 0 or n > len(cache):
        return tokenize(text, add_special)
    rest = data[off:]
    tail = tokenize(rest.decode("utf-8"), False) if rest else []
    if b"".join(render(t) for t in tail) != rest:
        return tokenize(text, add_special)
    return list(cache[:n]) + tail
