"""A prefix restore as the views show it: the phase line's words, the timeline's segments, the turn detail,
the side panel's prompt row, ``ask``'s line and the resumed-chat notice."""

from __future__ import annotations

from dataclasses import replace

from dashboard_support import TURNS

from chatphase.chat.listener import Notice
from chatphase.commands.ask import metrics_line
from chatphase.engine.events import PrefillStarted
from chatphase.ui.dashboard.history_table import format_row
from chatphase.ui.dashboard.timeline import time_segments, token_segments
from chatphase.ui.dashboard.turn_detail import metric_pairs
from chatphase.units import fmt_cached, fmt_restore

RESTORED = replace(
    TURNS[1], cached_tokens=4_200, prompt_tokens=4_300, prefill_tokens=100, restored_tokens=4_096,
    restore_ms=120.0, restore_bytes=90 * 2**20, tokenize_ms=2.0, prefill_ms=300.0, ttft_ms=450.0,
)  # fmt: skip


def test_the_phase_line_names_the_restore_and_the_prefill_it_spared():
    assert fmt_restore(4_096, 90 * 2**20, 120.0, 11_000.0) == "RESTORE 4,096 tok · 90.0 MiB · 0.12 s (prefill ≈ 11.0 s)"
    assert fmt_restore(4_096, 90 * 2**20, 120.0, None) == "RESTORE 4,096 tok · 90.0 MiB · 0.12 s"
    assert fmt_cached(4_200, 4_096) == "4,200 cached: 4,096 restored" and fmt_cached(5, None) == "5 cached"


def test_the_timeline_shows_restored_tokens_apart_and_the_restore_before_the_prefill():
    assert token_segments(RESTORED) == [("cached", 104.0), ("restored", 4_096.0), ("evaluated", 100.0)]
    assert token_segments(TURNS[1]) == [("cached", float(TURNS[1].cached_tokens)), ("evaluated", float(TURNS[1].prefill_tokens))]  # fmt: skip
    segments = time_segments(RESTORED)
    assert [k for k, _ in segments[:4]] == ["tokenize", "restore", "prefill", "first"]
    assert dict(segments)["first"] == 450.0 - 2.0 - 120.0 - 300.0


def test_the_turn_detail_and_ask_line_carry_the_restore():
    pairs = dict(metric_pairs(RESTORED))
    assert pairs["restored tokens"] == "4,096" and pairs["restore bytes"] == "90.0 MiB" and "restore ms" in pairs
    assert "restored tokens" not in dict(metric_pairs(TURNS[1]))
    assert "restored 4096 tok (90.0 MiB) in 120 ms" in metrics_line(1, RESTORED)
    assert "restored" not in metrics_line(1, TURNS[1])


def test_the_reuse_notice_says_how_many_tokens_came_from_disk():
    ev = PrefillStarted(1, 4_300, 4_200, 100, 0, 0, restored_tokens=4_096, restore_ms=120.0, restore_bytes=1)
    assert "(4,096 restored from disk in 120 ms)" in Notice.reuse("t", ev).text


def test_the_history_row_marks_restored_tokens():
    assert format_row(2, RESTORED)[1] == "4,300\n4,200 ⤓4,096"
    assert "⤓" not in format_row(2, TURNS[1])[1]


def test_a_refused_prefix_file_is_one_notice_that_ask_prints(capsys):
    from chatphase.commands.ask import _Printer

    printer = _Printer(as_json=False)
    printer.notice(
        Notice("prefix", "Prefix store", "prefix store: x.kvs: damaged (its state fails its check); not used")
    )
    assert (
        capsys.readouterr().err.strip()
        == "chatphase: prefix store: x.kvs: damaged (its state fails its check); not used"
    )
