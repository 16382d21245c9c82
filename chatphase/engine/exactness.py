"""Whether a turn's logits are the ones a cold run of its prompt computes: the engine's statement, per turn.

Why a turn can differ (docs/engine-settings.md, "Flash attention and the same reply"): with flash attention on,
llama.cpp's CPU kernel (``ggml_compute_forward_flash_attn_ext_f16``) takes one of three paths by the shape of the
batch — one query row over 512 KV cells or more is split across the threads (each sums its own KV chunk, the
partials are reduced); a batch of rows at least the tile size runs a tiled kernel that accumulates in f32; anything
else runs a one-chunk kernel with an FP16 accumulator. So a token's logits depend on how the batch that evaluated
it was cut, and greedy replies can part at a near-tie. With flash attention off the same arms measured
bit-identical on the CPU (docs/measured.md).

A run's batches are told by their starts: every position where an evaluation batch (an ``n_ubatch`` sub-batch of a
``llama_decode``) began (:attr:`~chatphase.engine.local.kv_context.KvContext.batch_starts`). A prompt whose cells
were computed in the batches a cold prefill makes (:func:`cold_batch_starts`) has the cold run's logits, whichever
way the cells came: a cold prefill, an exact restore (``prefix_cache = exact``) or cells kept from a turn that made
the same cuts.

Pure: the local engine feeds :func:`turn_exactness` what it did; a remote server's turn stays unknown (``None``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

#: flash attention is off on the CPU: batched and one-token evaluation measured bit-identical (True).
FLASH_ATTN_OFF = "flash_attn_off"
#: the prompt was evaluated from an empty KV cache, in ``n_batch`` chunks from position 0 (True).
COLD_PREFILL = "cold_prefill"
#: restored from the prefix store up to a batch start of the run that saved it, the rest evaluated again in the
#: cold run's batches (``prefix_cache = exact``; True).
EXACT_RESTORE = "exact_restore"
#: cells kept in memory were computed in the cold run's batches (an exact reuse, or a cut that fell on one; True).
SAME_BATCHES = "same_batches"
#: restored from the prefix store up to the prompt's last token, which was then evaluated alone (False).
RESTORED_LAST_TOKEN = "restored_last_token"
#: cells kept from earlier turns (the chat's own KV cache) were computed in other batches than a cold run's (False).
CACHE_REUSE = "cache_reuse"
#: the KV cache was shifted (overflow ``shift``): its keys were rotated to new positions, not computed there (False).
KV_SHIFT = "kv_shift"
#: a speculative verify batch evaluated drafted tokens in one batch where plain decode takes one at a time (False).
SPECULATIVE = "speculative"

#: every reason, in the order the statement is decided.
REASONS: tuple[str, ...] = (
    KV_SHIFT,
    FLASH_ATTN_OFF,
    SPECULATIVE,
    COLD_PREFILL,
    EXACT_RESTORE,
    SAME_BATCHES,
    RESTORED_LAST_TOKEN,
    CACHE_REUSE,
)


def cold_batch_starts(n_tokens: int, n_batch: int, n_ubatch: int) -> list[int]:
    """The positions where a cold prefill of ``n_tokens`` begins its batches: one ``llama_decode`` per ``n_batch``
    chunk from 0, each split by llama.cpp into sub-batches of ``n_ubatch`` (at most ``n_batch``: llama.cpp clamps
    it). Shape: sorted, ``0`` first when ``n_tokens > 0``."""
    n_ubatch = max(1, min(n_ubatch, n_batch))
    return [
        start
        for chunk in range(0, n_tokens, n_batch)
        for start in range(chunk, min(chunk + n_batch, n_tokens), n_ubatch)
    ]


def last_batch_start(starts: Sequence[int], keep: int, n_cells: int) -> int:
    """The most of the first ``keep`` of ``n_cells`` cells (computed in batches beginning at ``starts``, sorted)
    that can be kept so that evaluating the rest again, batched as the run that made them was, computes them as
    it did: ``keep`` at the end of the cells (any later evaluation begins a batch there), else the last start at
    or before ``keep`` (0 when none)."""
    if keep >= n_cells:
        return keep
    i = bisect_right(starts, keep) - 1
    return starts[i] if i >= 0 else 0


def turn_exactness(
    *,
    flash_attn_enabled: bool | None,
    cpu_only: bool,
    prompt_starts: Sequence[int] | None,
    shifted: bool | None,
    cold_starts: Sequence[int],
    cached_tokens: int,
    restored: bool,
    exact_restore: bool,
    verify_batches: int,
) -> tuple[bool | None, str | None]:
    """The turn's statement ``(logits_exact, logits_exact_reason)`` (reasons: this module's constants).

    Args:
        flash_attn_enabled: how flash attention resolved (``None``: unknown, taken as on).
        cpu_only: no layer and no batch ran on a GPU (the flash-attention-off shortcut was measured on the CPU).
        prompt_starts: the batch starts of the prompt's cells (``None``: unknown — cells restored from an entry
            saved without the record).
        shifted: some of the prompt's cells hold keys moved by a KV shift (``None``: unknown, as above).
        cold_starts: :func:`cold_batch_starts` of the prompt.
        cached_tokens: prompt tokens kept or restored rather than evaluated this turn.
        restored: some of them came from the prefix store; exact_restore: it cut them at a recorded batch start.
        verify_batches: speculative verify steps that evaluated drafted tokens (a step of one token is plain).

    Returns:
        ``True`` when a cold run of the prompt at the same settings computes the same logits (and thread counts:
        see docs/engine-settings.md), ``False`` when they can differ, with the reason.
    """
    if shifted:
        return False, KV_SHIFT
    if flash_attn_enabled is False and cpu_only and shifted is False:
        return True, FLASH_ATTN_OFF
    if verify_batches:
        return False, SPECULATIVE
    if prompt_starts is None:  # a fast restore of a file that does not record its batches
        return False, RESTORED_LAST_TOKEN if restored else CACHE_REUSE
    if list(prompt_starts) == list(cold_starts):
        if cached_tokens == 0:
            return True, COLD_PREFILL
        return True, EXACT_RESTORE if restored and exact_restore else SAME_BATCHES
    # restored exactly, its cells as the saving run computed them: that run's batches were not a cold run's
    return False, RESTORED_LAST_TOKEN if restored and not exact_restore else CACHE_REUSE
