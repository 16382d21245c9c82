"""A llama.cpp vocabulary: tokenise text, render tokens as bytes, tell special tokens.

:class:`Vocab` wraps a ``llama_vocab`` pointer (of a loaded model, or of a vocabulary-only load,
:class:`VocabFile`: ``chatphase info`` names the chat format with one, ``bench --server`` builds its
exact-length prompts with one).
"""

from __future__ import annotations

import ctypes
import os

import llama_cpp as lc

_SPECIAL_ATTRS = lc.LLAMA_TOKEN_ATTR_CONTROL | lc.LLAMA_TOKEN_ATTR_USER_DEFINED


class Vocab:
    """Tokeniser and token renderer over a ``llama_vocab`` pointer (valid while its model lives)."""

    def __init__(self, vocab: lc.llama_vocab_p) -> None:
        self.ptr = vocab
        self._pieces: dict[int, bytes] = {}

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of ``text`` (special tokens such as ``<|im_start|>`` are parsed). Lone surrogates
        (text that is not valid Unicode) become U+FFFD rather than an error."""
        data = text.encode("utf-8", errors="replace")
        n_max = len(data) + 16
        buf = (lc.llama_token * n_max)()
        n = lc.llama_tokenize(self.ptr, data, len(data), buf, n_max, add_special, True)
        if n < 0:
            n_max = -n
            buf = (lc.llama_token * n_max)()
            n = lc.llama_tokenize(self.ptr, data, len(data), buf, n_max, add_special, True)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (cached; special tokens render empty unless ``special``)."""
        if not special and token in self._pieces:
            return self._pieces[token]
        size = 32
        while True:
            buf = ctypes.create_string_buffer(size)
            n = lc.llama_token_to_piece(self.ptr, token, buf, size, 0, special)
            if n >= 0:
                break
            size = -n
        out = buf.raw[:n]
        if not special:
            self._pieces[token] = out
        return out

    def render(self, token: int) -> bytes:
        """The bytes a token stands for in templated text (control tokens such as ``<|im_end|>`` as text)."""
        return self.piece(token) or self.piece(token, special=True)

    def is_special(self, token: int) -> bool:
        """Whether ``token`` is a control or user-defined token (``llama_vocab_get_attr``): a chat template's
        marker or BOS/EOS rather than text."""
        return bool(lc.llama_vocab_get_attr(self.ptr, token) & _SPECIAL_ATTRS)

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends a generation (``llama_vocab_is_eog``: EOS, ``<|im_end|>``, ``<|eot_id|>``…)."""
        return bool(lc.llama_vocab_is_eog(self.ptr, token))

    def has_special(self, text: str) -> bool:
        """Whether ``text`` is one control or user-defined token of this vocabulary (a chat marker the
        model was trained on), not plain text spelled by several tokens."""
        tokens = self.tokenize(text)
        return len(tokens) == 1 and bool(lc.llama_vocab_get_attr(self.ptr, tokens[0]) & _SPECIAL_ATTRS)

    def special_text(self, token: int) -> str:
        """The text of a special token (BOS, EOS) for templates; ``""`` for a negative (absent) id."""
        return self.piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""

    @property
    def bos_text(self) -> str:
        return self.special_text(lc.llama_vocab_bos(self.ptr))

    @property
    def eos_text(self) -> str:
        return self.special_text(lc.llama_vocab_eos(self.ptr))


class VocabFile:
    """The vocabulary of the GGUF at ``path`` loaded without its weights (llama.cpp's ``vocab_only``), as
    :attr:`vocab`. The one place a vocabulary-only model is loaded: llama.cpp's log goes to ``log_path``
    (:class:`~chatphase.engine.llamalog.LlamaLogCapture`, as for the engine) from before the load until
    :meth:`close`, never to the terminal. A context manager whose ``with`` gives the :class:`Vocab`.

    Raises:
        RuntimeError: llama.cpp could not read the vocabulary.
    """

    def __init__(self, path: str | os.PathLike[str], log_path: str | os.PathLike[str]) -> None:
        from chatphase.engine.llamalog import LlamaLogCapture

        self._log = LlamaLogCapture(log_path)
        self._model = None
        try:
            lc.llama_backend_init()
            params = lc.llama_model_default_params()
            params.vocab_only = True
            self._model = lc.llama_model_load_from_file(str(path).encode("utf-8"), params)
        finally:
            if not self._model:
                self._log.close()
        if not self._model:
            raise RuntimeError(f"llama.cpp could not read the vocabulary of {path} (see {log_path})")
        self.vocab = Vocab(lc.llama_model_get_vocab(self._model))

    def close(self) -> None:
        """Free the model, then stop capturing the log. Idempotent."""
        if self._model:
            lc.llama_model_free(self._model)
            self._model = None
        self._log.close()

    def __enter__(self) -> Vocab:
        return self.vocab

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_vocab(path: str | os.PathLike[str], log_path: str | os.PathLike[str]) -> VocabFile:
    """``with load_vocab(path, log_path) as vocab``: a :class:`VocabFile`, freed on exit."""
    return VocabFile(path, log_path)
