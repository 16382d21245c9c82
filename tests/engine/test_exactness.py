"""The same reply, without a model: the record of where a KV cache's batches began, the exact cut of a kept or
restored cache, the stored files' record, the decision rule's re-prefill, the per-turn statement of exactness for
each kind of turn (faked inputs) and its words in the turn detail, ``ask``'s line and the system figures."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from chatphase.chat.exactness import EXACT_WORDS, INEXACT_WORDS, flash_attn_text, logits_pairs, logits_words
from chatphase.commands.ask import metrics_line
from chatphase.engine import exactness as ex
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import LoadedSettings
from chatphase.engine.exactness import cold_batch_starts, last_batch_start, turn_exactness
from chatphase.engine.local.kv_context import KvContext
from chatphase.engine.local.prefix_keeper import exact_cut
from chatphase.engine.local.prefix_store import MAGIC, BatchRecord, read_entry, write_entry
from chatphase.engine.metrics import TurnMetrics, compute_turn_metrics
from chatphase.engine.restore_policy import decide_restore
from chatphase.errors import UsageError
from chatphase.ui.dashboard.turn_detail import metric_pairs

KEY = "cd" * 32


def kv(n_batch: int = 256, n_ubatch: int = 256) -> KvContext:
    """A record without llama.cpp (as a :meth:`KvContext.what_if` copy): cuts change the record alone."""
    return KvContext(None, None, None, None, 4096, n_batch, n_ubatch=n_ubatch)  # type: ignore[arg-type]


def prefill(k: KvContext, n: int) -> None:
    """``n`` prompt tokens evaluated after the cache in ``n_batch`` chunks, as the engine's prefill does."""
    for start in range(0, n, k.n_batch):
        chunk = min(k.n_batch, n - start)
        k.batch_evaluated(len(k.tokens), chunk)
        k.tokens.extend([7] * chunk)


def decode_steps(k: KvContext, n: int) -> None:
    k.tokens.extend([9] * n)  # the decode loops append one token a step, and say nothing to the record


# -- the cold run's batches and the record ------------------------------------------------------------
def test_a_cold_prefill_begins_a_batch_every_n_batch_and_every_n_ubatch_inside():
    assert cold_batch_starts(487, 256, 256) == [0, 256]
    assert cold_batch_starts(256, 256, 256) == [0]
    assert cold_batch_starts(257, 256, 256) == [0, 256]
    assert cold_batch_starts(700, 512, 128) == [0, 128, 256, 384, 512, 640]
    assert cold_batch_starts(300, 256, 512) == [0, 256]  # llama.cpp clamps n_ubatch to n_batch
    assert cold_batch_starts(0, 256, 256) == []


def test_the_record_follows_prefill_decode_cuts_and_verify_batches():
    k = kv()
    prefill(k, 487)
    decode_steps(k, 5)
    assert k.batch_starts == [0, 256, *range(487, 492)]
    assert k.starts_below(487) == cold_batch_starts(487, 256, 256)
    k.drop_after(300)  # a new prompt shares 300 tokens
    assert k.batch_starts == [0, 256]
    prefill(k, 50)
    assert k.batch_starts == [0, 256, 300]
    k.batch_evaluated(len(k.tokens), 4)  # a verify batch of the last token and 3 drafts
    k.tokens.extend([1] * 4)
    k.drop_after(352)  # two drafts rejected
    decode_steps(k, 2)
    assert k.batch_starts == [0, 256, 300, 350, 352, 353]
    copy = k.what_if()
    copy.drop_after(0)
    assert copy.batch_starts == [] and k.batch_starts == [0, 256, 300, 350, 352, 353]


def test_an_exact_keep_falls_back_to_the_last_batch_start():
    k = kv()
    prefill(k, 487)
    decode_steps(k, 20)
    assert k.exact_keep(486) == 256  # the same prompt again: its last chunk is evaluated again, as one batch
    assert k.exact_keep(256) == 256 and k.exact_keep(255) == 0
    assert k.exact_keep(495) == 495  # inside the reply: every position was a decode step
    assert k.exact_keep(507) == 507  # the whole cache: a continuation begins a batch there
    assert last_batch_start([0, 256, 487], 486, 500) == 256 and last_batch_start([], 10, 20) == 0


def test_a_shift_marks_the_moved_cells_until_they_are_gone():
    k = kv()
    prefill(k, 600)
    assert k.shifted_below(600) is False
    k.shift_out(100, 300)  # the cells after 300 move down by 200
    assert len(k.tokens) == 400 and k.shifted_below(101) is True and k.shifted_below(100) is False
    assert k.batch_starts == [0, 312]  # 512 moved to 312; 256 fell inside the cut
    k.drop_after(100)
    assert k.shifted_below(1000) is False


def test_a_restore_takes_the_entrys_record_or_says_it_is_unknown():
    k = kv()
    k.restored([5] * 300, _known(300), [0, 256, 299], None, False)
    assert k.batch_starts == [0, 256, 299] and k.shifted_below(300) is False
    k.restored([5] * 300, _known(300), None, None, shift_unknown=True)
    assert k.batch_starts is None and k.shifted_below(300) is None and k.exact_keep(299) == 299
    prefill(k, 10)
    assert k.batch_starts is None  # unknown stays unknown until the cache is emptied
    k.drop_after(0)
    prefill(k, 10)
    assert k.batch_starts == [0] and k.shifted_below(10) is False


def _known(n: int):
    from chatphase.engine.local.prefix import CacheText

    return CacheText.of(b"x" * n, [n], [n])


# -- the stored record and the exact cut -----------------------------------------------------------------
def test_a_saved_file_records_its_batches_and_an_older_one_reads_as_unknown(tmp_path):
    record = BatchRecord([0, 256, *range(487, 500)], 256, None, False)
    path = write_entry(tmp_path, KEY, "m", list(range(500)), [500], [3], b"abc", b"\x02" * 64, batches=record)
    assert path is not None
    entry = read_entry(path)
    assert entry.batches == record
    assert exact_cut(entry, 486, 256) == (256, None)
    assert exact_cut(entry, 500, 256) == (500, None)  # all of it: nothing evaluated again
    assert exact_cut(entry, 490, 256) == (490, None)  # a decode step began there
    n, note = exact_cut(entry, 486, 128)
    assert n == 486 and note is not None and "n_ubatch 256" in note

    old = write_entry(tmp_path, KEY, "m", list(range(300)), [300], [3], b"abc", b"\x02" * 64)
    assert old is not None
    data = old.read_bytes()
    assert b"batches" not in data and data.startswith(MAGIC)  # the header as an older chatphase wrote it
    entry = read_entry(old)
    assert entry.batches is None
    n, note = exact_cut(entry, 299, 256)
    assert n == 299 and note is not None and "does not record its batches" in note


def test_a_malformed_record_reads_as_unknown():
    assert BatchRecord.from_json({"starts": [0, "x"], "n_ubatch": 256}) is None
    assert BatchRecord.from_json({"starts": [0], "n_ubatch": 0}) is None
    assert BatchRecord.from_json(None) is None
    assert BatchRecord.from_json(json.loads(json.dumps(BatchRecord(None, 64).to_json()))) == BatchRecord(None, 64)


def test_the_rule_counts_the_tokens_an_exact_restore_evaluates_again():
    # 200 tokens spared at 400 tok/s (500 ms) against a 90 MiB read at 900 MiB/s (100 ms); 231 evaluated again
    d = decide_restore(90 << 20, 200, 900 * 2**20, 400.0, reprefill_tokens=231)
    assert d.restore and d.predicted_prefill_ms == pytest.approx(500) and d.predicted_restore_ms == pytest.approx(100)
    assert "231 tokens evaluated again" in d.why
    # only 40 spared: below the shortest restore, whatever was shared
    assert not decide_restore(90 << 20, 20, 900 * 2**20, 400.0, reprefill_tokens=231).restore


def test_exact_is_a_choice_of_the_prefix_cache_setting():
    assert EngineConfig(prefix_cache="exact").validate().prefix_cache == "exact"
    with pytest.raises(UsageError):
        EngineConfig(prefix_cache="fast").validate()
    from dataclasses import fields

    meta = next(f for f in fields(EngineConfig) if f.name == "prefix_cache").metadata
    assert "n_batch" in meta["help"] and "n_batch" in meta["hint"]  # what exact costs, where it is chosen


# -- the statement, per kind of turn -------------------------------------------------------------------------
def statement(**given):
    args = {
        "flash_attn_enabled": True,
        "cpu_only": True,
        "prompt_starts": [0, 256],
        "shifted": False,
        "cold_starts": [0, 256],
        "cached_tokens": 0,
        "restored": False,
        "exact_restore": False,
        "verify_batches": 0,
    }
    return turn_exactness(**{**args, **given})


def test_the_statement_for_each_kind_of_turn():
    assert statement() == (True, ex.COLD_PREFILL)
    # a follow-up in a chat: the cells of the last turn's reply were decode steps
    assert statement(prompt_starts=[0, 256, 487, 488, 489, 490], cold_starts=[0, 256], cached_tokens=490) == (
        False,
        ex.CACHE_REUSE,
    )
    fast = {"prompt_starts": [0, 256, 486], "cached_tokens": 486, "restored": True}
    assert statement(**fast) == (False, ex.RESTORED_LAST_TOKEN)
    assert statement(cached_tokens=256, restored=True, exact_restore=True) == (True, ex.EXACT_RESTORE)
    assert statement(cached_tokens=256) == (True, ex.SAME_BATCHES)  # kept in memory, cut at the cold run's batch
    assert statement(verify_batches=3) == (False, ex.SPECULATIVE)
    assert statement(**fast, flash_attn_enabled=False) == (True, ex.FLASH_ATTN_OFF)
    assert statement(verify_batches=3, flash_attn_enabled=False) == (True, ex.FLASH_ATTN_OFF)
    # off on a GPU: only the batches decide (a GPU's kernels were not measured batch-independent)
    assert statement(**fast, flash_attn_enabled=False, cpu_only=False) == (False, ex.RESTORED_LAST_TOKEN)
    assert statement(shifted=True, flash_attn_enabled=False) == (False, ex.KV_SHIFT)
    # a restore of a file that does not record its batches
    unknown = {"prompt_starts": None, "shifted": None, "cached_tokens": 486, "restored": True}
    assert statement(**unknown) == (False, ex.RESTORED_LAST_TOKEN)
    assert statement(**unknown, flash_attn_enabled=False) == (False, ex.RESTORED_LAST_TOKEN)
    # an exact restore of a chat's cache: as that chat computed it, not as a cold run
    assert statement(prompt_starts=[0, 256, 300], cached_tokens=300, restored=True, exact_restore=True) == (
        False,
        ex.CACHE_REUSE,
    )
    assert set(EXACT_WORDS) | set(INEXACT_WORDS) == set(ex.REASONS)


# -- the words -------------------------------------------------------------------------------------------------
def metrics(**fields) -> TurnMetrics:
    m = compute_turn_metrics(
        t_submit_ns=0,
        t_prefill_start_ns=1_000_000,
        t_prefill_end_ns=5_000_000,
        token_times_ns=[6_000_000, 7_000_000],
        prompt_tokens=487,
        cached_tokens=486,
        kv_cache_tokens=489,
        kv_bytes_per_token=1,
        kv_capacity_bytes=4096,
        stop_reason="length",
    )
    return replace(m, **fields)


def test_the_words_say_when_and_why_logits_are_not_a_cold_runs():
    fast = metrics(logits_exact=False, logits_exact_reason=ex.RESTORED_LAST_TOKEN)
    assert logits_words(fast, True) == "batch-dependent (restored, flash attention on)"
    assert logits_words(fast) == "batch-dependent (restored)"
    assert logits_words(metrics(logits_exact=True, logits_exact_reason=ex.EXACT_RESTORE)) == "exact (exact restore)"
    assert logits_words(metrics(logits_exact=False, logits_exact_reason=ex.KV_SHIFT)) == "shifted (KV cache shifted)"
    assert logits_words(metrics()) is None and logits_pairs(metrics()) == []
    assert ("logits", "batch-dependent (restored)") in metric_pairs(fast)
    assert not [p for p in metric_pairs(metrics()) if p[0] == "logits"]  # unknown (a server's): no row

    line = metrics_line(2, fast, True)
    assert "logits: batch-dependent (restored, flash attention on)" in line
    exact = metrics(logits_exact=True, logits_exact_reason=ex.COLD_PREFILL)
    assert "logits" not in metrics_line(2, exact, True) and "logits" not in metrics_line(2, metrics(), None)
    assert TurnMetrics.from_dict(fast.to_dict()) == fast  # ask --json and history.db carry the fields


def test_the_flash_attention_setting_shows_how_auto_resolved():
    s = LoadedSettings(**EngineConfig().resolved())
    assert flash_attn_text(s) == "auto"  # the log did not say
    assert flash_attn_text(replace(s, flash_attn_enabled=True)) == "auto (on)"
    assert flash_attn_text(replace(s, flash_attn_enabled=False)) == "auto (off)"
    assert flash_attn_text(replace(s, flash_attn="off", flash_attn_enabled=False)) == "off"
    assert replace(s, flash_attn_enabled=True).to_dict()["flash_attn_enabled"] is True  # ask --json's settings
