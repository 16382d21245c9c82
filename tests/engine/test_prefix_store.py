"""The prefix store without a model: the decision rule, the file format's checks, atomic and killed saves,
LRU eviction, ``chatphase cache``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chatphase.cli import main
from chatphase.engine.local.prefix import CacheText
from chatphase.engine.local.prefix_store import (
    PART,
    SUFFIX,
    PrefixStore,
    Rates,
    StoreRefused,
    evict,
    list_files,
    read_entry,
    read_state,
    store_dir,
    write_entry,
)
from chatphase.engine.restore_policy import MIN_RESTORE_TOKENS, decide_restore

KEY = "ab" * 32


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    """Each test its own prefix store (the session's cache dir holds what other tests' engines saved)."""
    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path / "cache"))


def _write(directory: Path, tokens=range(100), state=b"\x01" * 4096, key=KEY) -> Path:
    path = write_entry(directory, key, "m", list(tokens), [len(tokens)], [5], b"hello", state)
    assert path is not None
    return path


# -- the decision rule ---------------------------------------------------------------------------------
def test_restore_when_reading_beats_prefill():
    # 90 MiB at 900 MiB/s = 100 ms against 4,096 tokens at 400 tok/s = 10.2 s
    d = decide_restore(90 << 20, 4096, 900 * 2**20, 400.0)
    assert d.restore and d.predicted_restore_ms == pytest.approx(100) and d.predicted_prefill_ms == pytest.approx(10240)
    assert "beats prefill" in d.why


def test_recompute_when_prefill_beats_reading():
    # a GPU: 4,096 tokens at 20,000 tok/s = 205 ms against 90 MiB from a 200 MiB/s disk = 450 ms
    d = decide_restore(90 << 20, 4096, 200 * 2**20, 20_000.0)
    assert not d.restore and d.predicted_prefill_ms == pytest.approx(204.8) and "beats restore" in d.why


def test_unmeasured_rates_restore_and_short_prefixes_recompute():
    assert decide_restore(1 << 20, 500, None, 400.0).restore
    assert "read rate" in decide_restore(1 << 20, 500, None, 400.0).why
    assert decide_restore(1 << 20, 500, 1e9, None).restore
    assert not decide_restore(1, MIN_RESTORE_TOKENS - 1, 1e12, 1.0).restore


def test_rates_are_kept_per_key_and_the_nearest_depth_is_used(tmp_path):
    r = Rates(tmp_path, KEY)
    r.add_prefill(1000, 1000, 2000.0)  # 500 tok/s
    r.add_prefill(4000, 1000, 4000.0)  # 250 tok/s
    r.add_restore(100 << 20, 50.0)
    r.save()
    again = Rates(tmp_path, KEY)
    assert again.prefill_tokens_per_s(3500) == pytest.approx(250)
    assert again.prefill_tokens_per_s(900) == pytest.approx(500)
    assert again.restore_bytes_per_s == pytest.approx((100 << 20) / 0.05)
    assert Rates(tmp_path, "other").restore_bytes_per_s is None


# -- files -----------------------------------------------------------------------------------------------
def test_a_file_round_trips(tmp_path):
    path = _write(tmp_path, range(10, 110), b"xyz" * 1000)
    e = read_entry(path)
    assert list(e.tokens) == list(range(10, 110)) and e.text == b"hello" and e.ntok == [100] and e.nbytes == [5]
    assert bytes(read_state(e)) == b"xyz" * 1000


def test_a_truncated_file_is_refused(tmp_path):
    path = _write(tmp_path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(StoreRefused, match="truncated"):
        read_entry(path)


def test_a_damaged_state_is_refused(tmp_path):
    path = _write(tmp_path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(StoreRefused, match="damaged"):
        read_state(read_entry(path))


def test_damaged_tokens_and_foreign_files_are_refused(tmp_path):
    path = _write(tmp_path)
    data = bytearray(path.read_bytes())
    data[data.index(b"hello")] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(StoreRefused, match="damaged"):
        read_entry(path)
    path.write_bytes(b"GGUF" + b"\0" * 100)
    with pytest.raises(StoreRefused, match="not a chatphase prefix file"):
        read_entry(path)


def test_a_file_of_another_key_is_not_used_and_is_removed(tmp_path):
    path = _write(tmp_path, key="cd" * 32)
    os.replace(path, tmp_path / (KEY[:16] + "-x" + SUFFIX))  # named as ours, holding another key
    store = PrefixStore(tmp_path, KEY, 1 << 30)
    assert store.entries() == [] and "other settings" in store.refused[0]
    assert not list(tmp_path.glob(f"*{SUFFIX}"))


def test_the_longest_shared_prefix_wins_and_whole_only_skips_cuts(tmp_path):
    _write(tmp_path, range(100))
    _write(tmp_path, [*range(50), *range(1000, 1100)])
    store = PrefixStore(tmp_path, KEY, 1 << 30)
    prompt = bytes(__import__("array").array("i", [*range(80), 7, 7]))
    entry, n = store.longest(prompt, 1000, whole_only=False)
    assert n == 80 and list(entry.tokens) == list(range(100))
    assert store.longest(prompt, 1000, whole_only=True) == (None, 0)
    assert store.longest(prompt, 60, whole_only=False)[1] == 60


def test_an_aborted_save_leaves_no_file(tmp_path):
    path = write_entry(tmp_path, KEY, "m", [1, 2], [], [], b"", b"\0" * (20 << 20), abort=lambda: True)
    assert path is None and not list(tmp_path.iterdir())


SLOW_SAVE = """
import sys, time
from pathlib import Path
from chatphase.engine.local.prefix_store import write_entry
def slow():
    print("writing", flush=True)
    time.sleep(0.2)
    return False
write_entry(Path(sys.argv[1]), "ab" * 32, "m", [1, 2, 3], [], [], b"", b"\\1" * (64 << 20), abort=slow)
"""


def test_a_save_killed_midway_leaves_nothing_that_is_read(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SAVE, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for _ in range(3):
        assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(tmp_path.glob(f".*{PART}")), "the half-written save is a .part"
    assert list_files(tmp_path) == [] and PrefixStore(tmp_path, KEY, 1 << 30).entries() == []


def test_least_recently_used_files_are_evicted_first(tmp_path):
    old = _write(tmp_path, range(10), b"\0" * 10_000)
    new = _write(tmp_path, range(20), b"\0" * 10_000)
    past = time.time() - 100
    os.utime(old, (past, past))
    evict(tmp_path, 15_000)
    assert not old.exists() and new.exists()


def test_cache_text_round_trips_its_boundaries():
    known = CacheText()
    known.add_prompt(3, b"abc")
    known.add_pieces([b"d", b"e"])
    again = CacheText.of(known.text, *known.boundaries)
    assert again.split(b"abcdeX") == known.split(b"abcdeX") == (5, 5)
    with pytest.raises(ValueError):
        CacheText.of(b"abc", [1, 0], [1, 3])


# -- chatphase cache ----------------------------------------------------------------------------------
def test_cache_lists_and_clears(capsys, monkeypatch):
    monkeypatch.setenv("CHATPHASE_PREFIX_CACHE_MIB", "3")
    _write(store_dir(), range(300))
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "300" in out and "1 saved prefix," in out and "cap 3.0 MiB: prefix_cache_mib" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 saved prefix (" in capsys.readouterr().out
    assert main(["cache"]) == 0 and "no saved prefixes" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["cache"], ["cache", "--json"], ["cache", "clear"]])
@pytest.mark.parametrize("where", ["store", "parent"])
def test_cache_says_when_the_stores_path_is_not_a_folder(capsys, argv, where):
    """A plain file where the store's folder (or a folder above it) should be: one line, exit 1 — not 'no saved
    prefixes … the store is on' and 'removed 0'."""
    blocked = store_dir() if where == "store" else store_dir().parent
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("not a folder\n")
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"the prefix store's path {blocked} is not a folder" in err and blocked.read_text() == "not a folder\n"
