"""The local engine's record of a turn's tokens (:class:`~chatphase.engine.tokens.TurnTokens`), cut from the values
its metrics are computed from, and the vocabulary's pieces they need (rendered by llama.cpp, kept per id)."""

from __future__ import annotations

from collections.abc import Sequence

from chatphase.engine.local.generation import Generated
from chatphase.engine.local.overflow_turn import Overflow
from chatphase.engine.prompting.vocab import Vocab
from chatphase.engine.tokens import Piece, TurnTokens


def piece_text(data: bytes) -> str:
    """A token's bytes as text: UTF-8, a byte of a character split across tokens as ``\\xNN``."""
    return data.decode("utf-8", "backslashreplace")


class TokenRecorder:
    """Builds each turn's :class:`TurnTokens` for one vocabulary; its pieces are rendered once per id
    (``llama_token_to_piece`` with control tokens as text, ``llama_vocab_get_attr``) and kept."""

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self._pieces: dict[int, Piece] = {}

    def piece(self, token: int) -> Piece:
        out = self._pieces.get(token)
        if out is None:
            vocab = self._vocab
            out = self._pieces[token] = Piece(piece_text(vocab.render(token)), vocab.is_special(token))
        return out

    def turn(
        self,
        prompt: Sequence[int],
        restored: int,
        cached: int,
        evaluated: int,
        ovf: Overflow | None,
        out: Generated,
        t_submit_ns: int,
        thinking_tokens: int = 0,
    ) -> TurnTokens:
        """The turn whose ``prompt`` had its first ``cached`` tokens in the KV cache (``restored`` of them from the
        prefix store), ``evaluated`` of the rest evaluated, ``ovf`` its overflow and ``out`` its reply, the first
        ``thinking_tokens`` of it a thinking block — the values its :class:`~chatphase.engine.metrics.TurnMetrics`
        holds."""
        left = ovf.left_out_ids if ovf is not None else []
        pieces = {t: self.piece(t) for t in {*prompt, *left, *out.ids}}
        return TurnTokens(
            prompt_ids=prompt,
            restored=restored,
            cached=cached,
            prefilled=evaluated,
            left_out_ids=left,
            left_out_how="shifted" if ovf is not None and ovf.policy == "shift" else "dropped",
            reply_ids=out.ids,
            reply_t_ns=[t - t_submit_ns for t in out.times],
            reply_accepted=out.accepted,
            spec_steps=tuple(out.steps),
            pieces=pieces,
            thinking_tokens=min(thinking_tokens, len(out.ids)),
        )
