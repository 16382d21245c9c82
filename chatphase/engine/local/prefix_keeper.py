"""The local engine's prefix store at work: restore a saved KV prefix when that beats recomputing it, save
the cache when the engine is idle.

**Restore** (:meth:`PrefixKeeper.restore`, before a turn's prefill, so TTFT includes it): the stored entry
sharing the most leading tokens with the prompt (:class:`~chatphase.engine.local.prefix_store.PrefixStore`)
is read, checked and handed to llama.cpp (``llama_state_seq_set_data`` into sequence 0), then cut to the
shared tokens (``llama_memory_seq_rm``) — when :func:`~chatphase.engine.restore_policy.decide_restore` says
the restore is quicker than the prefill it saves. Models whose state cannot be cut are restored only from an
entry that is wholly a prefix of the prompt: recurrent and hybrid models (one state per sequence, not one
per token) and sliding-window (iSWA) models such as Gemma 3, whose saved state holds only the window's last
``n_swa`` positions of the sliding-window layers (llama.cpp's ``state_write`` leaves out masked cells).

**Exact restore** (``prefix_cache = exact``, :meth:`PrefixKeeper.exact_cut`): each saved file records where the
saving run's evaluation batches began (:class:`~chatphase.engine.local.prefix_store.BatchRecord`); a restore keeps
the cells only up to the last of those at or before the shared tokens, and the prompt's prefill evaluates the rest
again from there, ``n_batch`` at a time as the saving run did, so the restored turn computes its last cells and its
logits as that run did (with flash attention on, a cell's values depend on the batch that computed it,
:mod:`chatphase.engine.exactness`). It costs the prefill of those tokens, up to ``n_batch``; the decision rule counts
them (:func:`~chatphase.engine.restore_policy.decide_restore`'s ``reprefill_tokens``). A file written before the
record existed is restored as ``on`` restores, with a note.

**Save** (:meth:`PrefixKeeper.idle`, :meth:`PrefixKeeper.flush`): the cache's state is copied out of the
context (``llama_state_seq_get_data``, a memory copy) on the engine's thread while it waits for a turn, and
written by a background thread; a turn that starts aborts the write (the ``.part`` is removed; the next idle
saves again). When: :data:`SAVE_IDLE_S` after a turn, once the cache holds :data:`SAVE_GROWTH_TOKENS` more
tokens than the last state saved or restored (a 4,000-token state of the default model is 88 MiB: a
write per turn would be ~90 MiB of I/O per message), and at close whatever grew by
:data:`~chatphase.engine.restore_policy.MIN_RESTORE_TOKENS`, within :data:`CLOSE_SAVE_S`.

**A store that cannot save** (a read-only folder, a full disk, a file in the folder's place) is said once to the
user, not only in the engine log (:meth:`PrefixKeeper.take_unsaved`, which the engine puts in the next turn's
``restore_note``): the keeper tries a small write when it opens (:func:`~chatphase.engine.local.prefix_store.
save_problem`), so that a run whose only save would come at close (``ask``) hears it at its turn, and a save that
fails later is said at the next turn.
"""

from __future__ import annotations

import ctypes
import threading
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as lc

from chatphase.engine.exactness import last_batch_start
from chatphase.engine.local.amx_probe import library_key
from chatphase.engine.local.kv_context import KvContext
from chatphase.engine.local.prefix import CacheText
from chatphase.engine.local.prefix_store import (
    FORMAT_VERSION,
    BatchRecord,
    Entry,
    PrefixStore,
    Rates,
    StoreRefused,
    default_cap_bytes,
    file_identity,
    mapped_state,
    save_problem,
    store_dir,
    store_key,
    write_entry,
)
from chatphase.engine.restore_policy import MIN_RESTORE_TOKENS, RestoreDecision, decide_restore

#: seconds the engine waits idle after a turn before it saves (the user is reading the reply).
SAVE_IDLE_S = 2.0
#: tokens the cache must have grown by since the last state saved or restored before an idle save.
SAVE_GROWTH_TOKENS = 256
#: the shortest prefix worth saving.
SAVE_MIN_TOKENS = 64
#: the longest a close waits for a save (the process host kills the engine 2 s after asking it to stop).
CLOSE_SAVE_S = 1.5


@dataclass(frozen=True)
class Restored:
    """A restore that happened: ``tokens`` now in the KV cache, ``ms`` it took (read, check, llama.cpp),
    ``state_bytes`` read, the ``decision`` that chose it and the entry's ``known`` text record; ``exact``: cut at
    a batch start of the run that saved it (:meth:`PrefixKeeper.exact_cut`)."""

    tokens: int
    ms: float
    state_bytes: int
    decision: RestoreDecision
    known: CacheText
    exact: bool = False


def key_parts(model_path: str, settings: dict[str, Any], use_extra_bufts: bool, n_gpu_layers: int) -> dict[str, Any]:
    """What a saved state depends on, beyond what llama.cpp checks itself (the layer count, K/V types and row
    sizes, V's layout): the model file's identity (:func:`~chatphase.engine.local.prefix_store.file_identity`),
    the llama.cpp build (the bindings' version and the loaded libraries' files), the KV cache types, flash
    attention, the sequences per context (streams), and the weight placement and repacking that change the
    computed values' last bits (so a restored prefix answers exactly as its recompute would). Not ``n_ctx``:
    a state loads into any context with room for its cells, which the lookup checks."""
    import llama_cpp.llama_cpp as low

    lib = Path(low._lib._name)
    st = lib.stat()
    return {
        "format": FORMAT_VERSION,
        "model": file_identity(model_path),
        "llama_cpp": lc.__version__,
        "libllama": f"{st.st_size}:{st.st_mtime_ns}",
        "ggml_cpu": library_key(),
        "type_k": settings["type_k"],
        "type_v": settings["type_v"],
        "flash_attn": settings["flash_attn"],
        "n_seq_max": settings.get("n_seq_max", 1),
        "extra_bufts": use_extra_bufts,
        "n_gpu_layers": n_gpu_layers,
        "offload_kqv": settings.get("offload_kqv", True),
    }


class PrefixKeeper:
    """The prefix store of one loaded model and context (made by the engine when the store is on).

    Args:
        kv: the engine's context and the record of its KV cache (the keeper saves sequence 0's state from it and
            restores into it).
        parts: :func:`key_parts`; model_name: shown by ``chatphase cache``.
        cap_bytes: the store's size cap (``None``: :func:`~chatphase.engine.local.prefix_store.default_cap_bytes`).
        directory: the store (default :func:`~chatphase.engine.local.prefix_store.store_dir`).
    """

    def __init__(
        self,
        kv: KvContext,
        parts: dict[str, Any],
        model_name: str,
        cap_bytes: int | None = None,
        directory: Path | None = None,
    ) -> None:
        self._kv, model = kv, kv.model
        self.model_name, self.n_ctx = model_name, kv.n_ctx
        self.directory = directory or store_dir()
        self.key = store_key(parts)
        recurrent = bool(lc.llama_model_is_recurrent(model)) or bool(lc.llama_model_is_hybrid(model))
        swa = int(lc.llama_model_n_swa(model)) > 0
        #: the state cannot be cut at a token: only an entry wholly a prefix of the prompt is restored.
        self.whole_only = recurrent or swa
        self.why_whole = (
            "a recurrent or hybrid model's state is one per sequence"
            if recurrent
            else "llama.cpp saves only the last window of the sliding-window layers"
            if swa
            else None
        )
        cap = default_cap_bytes(self.directory) if cap_bytes is None else cap_bytes
        self.store = PrefixStore(self.directory, self.key, cap)
        self.rates = Rates(self.directory, self.key)
        self._lock = threading.Lock()  # the store's bookkeeping, shared with the writer thread
        self._abort = threading.Event()
        self._writer: threading.Thread | None = None
        self._covered = 0  # tokens of the current cache that a saved or restored state holds
        self._turn_end = time.monotonic()
        self._pending = False  # a turn ended since the last save
        self._savable = False  # the cache holds what a store turn left (a bench turn's is never saved)
        self.last_save: tuple[int, float, float] | None = None  # (bytes, copy ms, write ms) of the last save
        self.lines: list[str] = []  # one line per event worth the engine log
        self.refused_now: list[str] = []  # files refused at the last lookup, for the user
        self._unsaved: str | None = None  # why the store cannot save, for the user (said once: :meth:`take_unsaved`)
        self._unsaved_said = False
        problem = save_problem(self.directory)
        if problem is not None:
            self._cannot_save(problem)

    # -- restore ----------------------------------------------------------------------------------
    def alternatives(self) -> list[tuple[Sequence[int], CacheText]]:
        """The stored entries as ``(tokens, text record)``, for the prompt encoder to reuse their tokens."""
        with self._lock:
            entries = self.store.entries()
        out: list[tuple[Sequence[int], CacheText]] = []
        for e in entries:
            try:
                out.append((e.tokens, CacheText.of(e.text, e.ntok, e.nbytes)))
            except ValueError:
                continue
        return out

    def find(self, prompt: Sequence[int], cached: int) -> tuple[Entry, int] | None:
        """The entry to restore for ``prompt`` and the tokens it gives, when it gives more than the ``cached``
        ones by at least :data:`MIN_RESTORE_TOKENS`; ``None`` otherwise."""
        blob = array("i", prompt).tobytes()
        with self._lock:
            entry, n = self.store.longest(blob, min(len(prompt) - 1, self.n_ctx - 1), self.whole_only)
            self._log_refused()
        if entry is None or n - cached < MIN_RESTORE_TOKENS:
            return None
        return entry, n

    def decide(self, entry: Entry, tokens: int, depth: int, reprefill_tokens: int = 0) -> RestoreDecision:
        """The rule's verdict on restoring ``entry`` to spare the prefill of ``tokens`` tokens, after which an exact
        restore evaluates ``reprefill_tokens`` of the stored ones again, ending at prompt depth ``depth``
        (:func:`decide_restore`, with the prefill rate measured nearest that depth)."""
        rate = self.rates.prefill_tokens_per_s(depth)
        return decide_restore(entry.state_bytes, tokens, self.rates.restore_bytes_per_s, rate, reprefill_tokens)

    def exact_cut(self, entry: Entry, n: int) -> tuple[int, str | None]:
        """:func:`exact_cut` of ``entry``'s first ``n`` tokens for this context."""
        return exact_cut(entry, n, self._kv.n_ubatch)

    def restore(self, entry: Entry, n: int, decision: RestoreDecision, exact: bool = False) -> Restored | str:
        """Put ``entry``'s first ``n`` tokens' KV state into sequence 0 (cleared first); the context's record
        follows (with the batches the entry records). ``exact``: ``n`` came from :meth:`exact_cut`. Returns the
        restore, or the one line saying why the file was refused (sequence 0 and the record are then empty: the
        prompt is recomputed)."""
        t0 = time.perf_counter_ns()
        kv = self._kv
        lc.llama_memory_seq_rm(kv.mem, 0, -1, -1)
        try:
            with mapped_state(entry) as view:
                arr = (ctypes.c_uint8 * len(view)).from_buffer(view)
                try:
                    if lc.llama_state_seq_set_data(kv.ptr, arr, len(view), 0) != len(view):
                        raise StoreRefused(f"{entry.path.name}: llama.cpp refused its state (see the engine log)")
                finally:
                    del arr  # the mapping closes at the end of the with: no pointer into it may remain
            if n < entry.n_tokens and not lc.llama_memory_seq_rm(kv.mem, 0, n, -1):
                raise StoreRefused(f"{entry.path.name}: its state cannot be cut at {n:,} tokens")
            if lc.llama_memory_seq_pos_max(kv.mem, 0) != n - 1:
                raise StoreRefused(f"{entry.path.name}: its state does not end at position {n - 1:,}")
        except StoreRefused as exc:
            lc.llama_memory_seq_rm(kv.mem, 0, -1, -1)
            kv.restored((), CacheText())
            with self._lock:
                self.store.refuse(entry.path, str(exc))
            line = f"prefix store: {exc}; recomputing the prompt"
            self.lines.append(line)
            return line
        ms = (time.perf_counter_ns() - t0) / 1e6
        self.rates.add_restore(entry.state_bytes, ms)
        with self._lock:
            self.store.touch(entry)
        self._covered = n
        known = CacheText.of(entry.text, entry.ntok, entry.nbytes)
        known.truncate(n)
        record = entry.batches
        if record is None:
            kv.restored(entry.tokens[:n], known, None, None, shift_unknown=True)
        else:
            starts = record.starts if record.n_ubatch == kv.n_ubatch else None
            kv.restored(entry.tokens[:n], known, starts, record.shifted_from, record.shift_unknown)
        return Restored(n, ms, entry.state_bytes, decision, known, exact)

    def _log_refused(self) -> None:
        for line in self.store.refused:
            self.lines.append(f"prefix store: {line}; not used")
            self.refused_now.append(line)
        self.store.refused.clear()

    def take_refused(self) -> str | None:
        """One line for the files refused since the last call (``None``: none), for the user."""
        lines, self.refused_now = self.refused_now, []
        if not lines:
            return None
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        return f"prefix store: {lines[0]}{more}; not used"

    # -- save ---------------------------------------------------------------------------------------
    def _cannot_save(self, why: str) -> None:
        line = (
            f"prefix store: cannot save in {self.directory} ({why}); a later run or restart prefills this prompt cold"
        )
        self.lines.append(line)
        if not self._unsaved_said:
            self._unsaved = line

    def take_unsaved(self) -> str | None:
        """The one line saying that the store cannot save, the first time it is asked after that was found; then
        ``None`` for the keeper's life (the engine log keeps every failure)."""
        line, self._unsaved = self._unsaved, None
        if line is not None:
            self._unsaved_said = True
        return line

    def turn_started(self) -> None:
        """A turn starts: a save being written gives way (its ``.part`` is removed)."""
        self._abort.set()

    def turn_ended(self, n_cache: int, kept: int, prefill: tuple[int, int, float] | None) -> None:
        """A turn ended with ``n_cache`` tokens in the cache, the first ``kept`` of them there before it;
        ``prefill``: ``(end depth, tokens evaluated, ms)`` for the decision rule's prefill rate."""
        self._covered = min(self._covered, kept)
        self._turn_end = time.monotonic()
        self._pending = self._savable = True
        if prefill is not None and prefill[1] >= SAVE_MIN_TOKENS:
            self.rates.add_prefill(*prefill)

    def other_turn(self) -> None:
        """A turn that may not use the store ran (a bench's cold prefill): its cache is not saved."""
        self._abort.set()
        self._pending = self._savable = False
        self._covered = 0

    def idle(self) -> None:
        """The engine waits for a turn: save the cache when the save policy says so (module docstring)."""
        cache = self._kv.tokens
        if not (self._pending and self._savable) or time.monotonic() - self._turn_end < SAVE_IDLE_S:
            return
        self._pending = False
        if len(cache) >= SAVE_MIN_TOKENS and len(cache) - self._covered >= SAVE_GROWTH_TOKENS:
            self._save(deadline=None)
        self.rates.save()

    def flush(self, within_s: float = CLOSE_SAVE_S) -> None:
        """Before the engine closes: save what is not saved yet, waiting at most ``within_s`` seconds in all
        (a write that runs over is abandoned; its ``.part`` removed)."""
        deadline = time.monotonic() + within_s
        self._wait_writer(deadline)
        cache = self._kv.tokens
        if self._savable and len(cache) >= SAVE_MIN_TOKENS and len(cache) - self._covered >= MIN_RESTORE_TOKENS:
            self._save(deadline=deadline)
            self._wait_writer(deadline)
        self.rates.save()

    def _wait_writer(self, deadline: float) -> None:
        writer = self._writer
        if writer is not None:
            writer.join(max(0.0, deadline - time.monotonic()))
            if writer.is_alive():
                self._abort.set()
                writer.join(0.2)  # it stops at its next 8 MiB step

    def _save(self, deadline: float | None) -> None:
        """Copy sequence 0's state and its record out of the context; a thread writes them."""
        if self._writer is not None and self._writer.is_alive():
            return  # one save at a time; the next idle or the close saves the rest
        t0 = time.perf_counter_ns()
        kv = self._kv
        size = int(lc.llama_state_seq_get_size(kv.ptr, 0))
        buf = bytearray(size)
        arr = (ctypes.c_uint8 * size).from_buffer(buf)
        got = int(lc.llama_state_seq_get_data(kv.ptr, arr, size, 0))
        del arr
        if got != size:
            self.lines.append(f"prefix store: llama.cpp gave {got:,} of {size:,} state bytes; not saved")
            return
        copy_ms = (time.perf_counter_ns() - t0) / 1e6
        tokens = list(kv.tokens)
        record = kv.known.copy()
        record.truncate(len(tokens))
        ntok, nbytes = record.boundaries
        batches = BatchRecord(kv.batch_starts, kv.n_ubatch, kv.shifted_from, kv.shift_unknown)
        self._covered = len(tokens)
        self._abort.clear()
        abort = self._abort

        def aborted() -> bool:
            return abort.is_set() or (deadline is not None and time.monotonic() > deadline)

        def write() -> None:
            t1 = time.perf_counter_ns()
            try:
                path = write_entry(
                    self.directory,
                    self.key,
                    self.model_name,
                    tokens,
                    ntok,
                    nbytes,
                    record.text,
                    buf,
                    aborted,
                    batches=batches,
                )
            except OSError as exc:
                self._cannot_save(exc.strerror or str(exc))
                self._covered = 0
                return
            if path is None:
                self._covered = 0  # given way to a turn: the next idle saves again
                self._pending = True
                return
            self.last_save = (size, copy_ms, (time.perf_counter_ns() - t1) / 1e6)
            self.lines.append(
                f"prefix store: saved {len(tokens):,} tokens, {size / 2**20:,.1f} MiB "
                f"(copy {copy_ms:,.0f} ms, write {self.last_save[2]:,.0f} ms)"
            )
            with self._lock:
                self.store.added(path, supersede=not self.whole_only)

        self._writer = threading.Thread(target=write, name="chatphase-prefix-save", daemon=True)
        self._writer.start()

    def close(self) -> None:
        """Stop a write in flight (its ``.part`` is removed)."""
        self._abort.set()
        if self._writer is not None:
            self._writer.join(0.2)


def exact_cut(entry: Entry, n: int, n_ubatch: int) -> tuple[int, str | None]:
    """Where an exact restore of ``entry``'s first ``n`` tokens cuts, in a context of sub-batch ``n_ubatch``: the
    last batch start of the run that saved it at or before ``n`` (``n`` itself at the end of its cells: a
    continuation begins a batch there), and ``None``; or ``n`` and one line when the file does not say (written
    before the record, or under another ``n_ubatch``): the restore is then a fast one."""
    record = entry.batches
    if n >= entry.n_tokens:
        return n, None
    if record is None or record.starts is None or record.n_ubatch != n_ubatch:
        why = (
            f"it was saved under n_ubatch {record.n_ubatch}"
            if record is not None and record.starts is not None
            else "it does not record its batches (saved by an older chatphase, or from such a file)"
        )
        return n, f"prefix store: restored as prefix_cache = on restores, not exactly: {why}"
    return last_batch_start(record.starts, n, entry.n_tokens), None


def cap_bytes_of(setting_mib: int | None) -> int | None:
    """The store's cap in bytes from the ``prefix_cache_mib`` setting (``None``: the default share of free disk)."""
    return None if setting_mib is None else setting_mib * 2**20
