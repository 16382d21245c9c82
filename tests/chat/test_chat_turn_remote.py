"""A turn's figures from a remote server's events, whose token counts arrive only at the end."""

from __future__ import annotations

from chatphase.chat.turn import Turn
from chatphase.engine.events import FirstToken, PrefillProgress, PrefillStarted, TokensDecoded, TurnRequest


def test_figures_of_a_remote_turn_cut_off_after_its_prefill_progress():
    """llama-server reports prefill progress but no counts before the reply: the figures so far keep the
    prefill time and leave the counts and the rate unknown (they raised a TypeError on None)."""
    turn = Turn(turn_id=7, number=1, kind="send", user="hi", position=0, request=TurnRequest(7))
    turn.prefill = PrefillStarted(7, None, None, None, 0, 0)
    turn.progress = PrefillProgress(7, 12, 12, 40.0)
    turn.first_token(FirstToken(7, "Hel", 45.0, 45_000_000))
    turn.decoded(TokensDecoded(7, "lo", 1, 2, 65_000_000))
    metrics = turn.metrics_so_far()
    assert metrics is not None
    assert (metrics.prompt_tokens, metrics.cached_tokens, metrics.prefill_tokens) == (None, None, None)
    assert metrics.prefill_ms == 40.0 and metrics.prefill_tokens_per_s is None
    assert metrics.decode_tokens == 2 and turn.reply == "Hello"
