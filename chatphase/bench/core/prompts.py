"""Prompts of exactly N tokens, cut on token boundaries (never by cutting bytes or characters).

A benchmark prompt must have an exact token count, and its text must still be valid UTF-8: cutting a
byte string and re-tokenising gives a different count, and a cut inside a multi-byte character gives
invalid text. :class:`PromptBuilder` therefore works on the model's own token ids:

1. ``prefix`` = the tokens the model puts before any text (BOS, when its vocabulary asks for one);
2. the source text is tokenised once and repeated as a stream of tokens;
3. the stream is cut at the last token boundary ``k <= need`` where the pieces decoded so far form
   complete UTF-8 (a byte-fallback token can hold a third of a character), and the remaining
   ``need - k`` tokens (at most a few) are a single-token ASCII filler such as ``" the"``.

So ``len(builder.tokens(n)) == n`` for every ``n >= 1`` and the detokenised bytes always decode as
UTF-8. ``tokens(n, variant=j)`` starts the stream ``j`` token boundaries later (boundaries that end on a
complete character), so the sequences of a parallel run each get their own prompt of the same length. The tokenizer is the engine's own (:class:`EngineTokenizer`), so the ids are exactly those the
engine evaluates; any object with llama-cpp-python's ``tokenize``/``detokenize`` works too.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from chatphase.errors import EngineError

#: the default source text: plain prose about what is being measured, repeated as needed.
DEFAULT_SOURCE_TEXT = (
    "A language model answers in two phases. First it reads the whole prompt in one parallel pass, "
    "the prefill, and the user waits for the first token. Then it writes the answer one token at a "
    "time, the decode, and each step reads every weight of the model from memory once more. Longer "
    "prompts make the first phase longer; a deeper context makes every later step a little slower, "
    "because attention reads the keys and values of all earlier tokens from the cache. "
)

#: single-token ASCII fillers tried in order to top a prompt up to its exact length.
_FILLER_CANDIDATES = (b" the", b" a", b" and", b".", b" ", b"a")


class Tokenizer(Protocol):
    """The two calls :class:`PromptBuilder` needs (``llama_cpp.Llama`` and :class:`EngineTokenizer` provide both)."""

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]: ...

    def detokenize(self, tokens: list[int], prev_tokens=None, special: bool = False) -> bytes: ...


class EngineTokenizer:
    """A loaded :class:`~chatphase.engine.local.llama.LlamaEngine`'s own vocabulary as a :class:`Tokenizer`
    (or a vocabulary-only load's :class:`~chatphase.engine.prompting.vocab.Vocab`, which has the same
    ``tokenize``/``piece``: ``bench --server``).

    ``bench`` uses this rather than a second vocabulary-only load: the tokens are by construction those
    the engine evaluates. The engine parses special-token text (``<|im_start|>``) as special tokens;
    the default source text has none.
    """

    def __init__(self, engine) -> None:
        self._engine = engine

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of UTF-8 ``text``, with BOS first when ``add_bos`` and the model wants one."""
        return list(self._engine.tokenize(text.decode("utf-8"), add_special=add_bos))

    def detokenize(self, tokens: list[int], prev_tokens=None, special: bool = False) -> bytes:
        """The bytes of ``tokens`` (concatenated pieces)."""
        return b"".join(self._engine.piece(t) for t in tokens)


class PromptBuilder:
    """Builds token prompts of exact lengths from a source text (see the module docstring).

    Args:
        tokenizer: the model's tokenizer.
        source_text: non-empty text to repeat; any Unicode (non-ASCII included).

    Raises:
        ValueError: when ``source_text`` tokenises to nothing.
    """

    def __init__(self, tokenizer: Tokenizer, source_text: str = DEFAULT_SOURCE_TEXT) -> None:
        self._tok = tokenizer
        self.prefix: tuple[int, ...] = tuple(tokenizer.tokenize(b"", add_bos=True, special=False))
        body = tokenizer.tokenize(source_text.encode("utf-8"), add_bos=False, special=False)
        if not body:
            raise ValueError("the prompt source text has no tokens")
        self._body: tuple[int, ...] = tuple(body)
        self._pieces: dict[int, bytes] = {}
        self._starts: list[int] | None = None
        self.filler: int = self._pick_filler()

    def piece(self, token: int) -> bytes:
        """The bytes of one token (cached)."""
        got = self._pieces.get(token)
        if got is None:
            got = self._pieces[token] = self._tok.detokenize([token], special=False)
        return got

    def _pick_filler(self) -> int:
        for text in _FILLER_CANDIDATES:
            ids = self._tok.tokenize(text, add_bos=False, special=False)
            if len(ids) == 1 and self.piece(ids[0]) == text:
                return ids[0]
        for tok in self._body:  # any complete ASCII token of the source will do
            if self.piece(tok) and self.piece(tok).isascii():
                return tok
        raise ValueError("no single-token ASCII filler found in this vocabulary")

    def _stream(self, need: int, variant: int) -> list[int]:
        if variant:
            if self._starts is None:  # body offsets whose preceding pieces end on a complete character
                self._starts = _complete_utf8_boundaries([self.piece(t) for t in self._body])
            start = self._starts[variant % len(self._starts)]
        else:
            start = 0
        reps = -(-(need + start) // len(self._body))
        return list((self._body * reps)[start : start + need])

    def tokens(self, n_tokens: int, variant: int = 0) -> tuple[int, ...]:
        """A prompt of exactly ``n_tokens`` token ids (the BOS prefix included when the model has one);
        ``variant`` ``j > 0`` starts the source ``j`` complete-character token boundaries later.

        Raises:
            ValueError: when ``n_tokens < 1``.
        """
        if n_tokens < 1:
            raise ValueError(f"a prompt needs at least 1 token (got {n_tokens})")
        if n_tokens <= len(self.prefix):
            return self.prefix[:n_tokens]
        need = n_tokens - len(self.prefix)
        stream = self._stream(need, variant)
        cut = _last_complete_utf8_boundary([self.piece(t) for t in stream])
        return self.prefix + tuple(stream[:cut]) + (self.filler,) * (need - cut)

    def extend(self, tokens: Sequence[int], n_more: int) -> tuple[int, ...]:
        """``tokens`` followed by ``n_more`` filler tokens: a prompt whose first ``len(tokens)`` tokens are
        already in the KV cache (used for decode-at-depth runs)."""
        if n_more < 0:
            raise ValueError("n_more must be >= 0")
        return tuple(tokens) + (self.filler,) * n_more

    def text(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` (strict UTF-8; :meth:`tokens` guarantees it decodes)."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8")


def _complete_utf8_boundaries(pieces: Sequence[bytes]) -> list[int]:
    """Every ``k < len(pieces)`` such that ``b"".join(pieces[:k])`` ends on a complete UTF-8 character."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out = [0]
    for i, piece in enumerate(pieces[:-1], start=1):
        decoder.decode(piece)
        if decoder.getstate()[0] == b"":
            out.append(i)
    return out


def _last_complete_utf8_boundary(pieces: Sequence[bytes]) -> int:
    """The largest ``k`` such that ``b"".join(pieces[:k])`` ends on a complete UTF-8 character.

    Pieces that are not UTF-8 at all (which a valid source text cannot produce) end the search early.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    best = 0
    for i, piece in enumerate(pieces, start=1):
        try:
            decoder.decode(piece)
        except UnicodeDecodeError:
            break
        if decoder.getstate()[0] == b"":
            best = i
    return best


@contextmanager
def vocab_builder(path: str) -> Iterator[PromptBuilder]:
    """A prompt builder on the vocabulary of the GGUF at ``path``, loaded without its weights in this process
    (for a run whose engines run in other processes).

    Raises:
        EngineError: llama.cpp could not read the vocabulary.
    """
    from chatphase.engine.logfile import default_log_path
    from chatphase.engine.prompting.vocab import VocabFile

    try:
        vocab = VocabFile(path, default_log_path())
    except RuntimeError as exc:
        raise EngineError(str(exc)) from None
    try:
        yield PromptBuilder(EngineTokenizer(vocab.vocab))
    finally:
        vocab.close()
