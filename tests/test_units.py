"""Figures and words for people (chatphase.units)."""

from __future__ import annotations

from chatphase.engine.metrics import STOP_REASONS
from chatphase.units import STOP_REASON_WORDS, fmt_stop_reason


def test_every_stop_reason_has_words_and_none_reads_stop_stop():
    assert set(STOP_REASON_WORDS) == set(STOP_REASONS)
    assert fmt_stop_reason("stop") == "end of reply" and fmt_stop_reason("context_full") == "context full"
    assert fmt_stop_reason("new_reason") == "new_reason"


def test_length_has_one_name_everywhere():
    """The transcript, the phase line and explain say what the Turns table, ``ask --json`` and the history say."""
    assert fmt_stop_reason("length") == "length"
