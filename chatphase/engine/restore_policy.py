"""Restore a saved KV prefix, or recompute it: the one rule, for every backend.

Restoring a prefix costs reading its state (``restore_bytes`` at the store's read rate); recomputing it
costs a prefill of its tokens (at this machine's prefill rate for a prompt that deep). Restore when the
first is predicted shorter. On a CPU prefill is slow (hundreds of tokens per second) and the state is read
at hundreds of MB/s or more, so restoring wins above a few dozen tokens; on a GPU prefill runs at thousands
of tokens per second and a small model's state can be slower to read than to recompute (Mesh-LLM #1714) —
hence a rule fed with measured rates, not "always restore".

Pure: no I/O. The local engine (:mod:`chatphase.engine.local.prefix_keeper`) feeds it the rates it
measured; another backend (a server's slot API) can call :func:`decide_restore` with its own.
"""

from __future__ import annotations

from dataclasses import dataclass

#: below this many tokens a restore is not tried: a file's open, header and checks cost about a millisecond,
#: and a prefix this short recomputes in a few tens of milliseconds even on a slow CPU.
MIN_RESTORE_TOKENS = 32


@dataclass(frozen=True)
class RestoreDecision:
    """What :func:`decide_restore` chose: ``restore`` or recompute, the two predicted times in ms (``None``:
    a rate not measured yet) and ``why``, one plain line."""

    restore: bool
    predicted_restore_ms: float | None
    predicted_prefill_ms: float | None
    why: str


def decide_restore(
    restore_bytes: int,
    restore_tokens: int,
    read_bytes_per_s: float | None,
    prefill_tokens_per_s: float | None,
    reprefill_tokens: int = 0,
) -> RestoreDecision:
    """Restore ``restore_tokens`` tokens from a state of ``restore_bytes`` bytes, or recompute them?

    Args:
        restore_bytes: bytes to read for the restore (the state file's size).
        restore_tokens: prompt tokens the restore puts in the KV cache, sparing their prefill.
        read_bytes_per_s: the store's measured read rate (``None``: no restore measured yet).
        prefill_tokens_per_s: this machine's measured prefill rate at that depth (``None``: not measured).
        reprefill_tokens: stored tokens after those that an exact restore evaluates again
            (``prefix_cache = exact``: up to ``n_batch``), which a recompute evaluates too.

    Returns:
        restore when reading the state and prefilling the ``reprefill_tokens`` is quicker than prefilling
        ``restore_tokens + reprefill_tokens``: ``restore_bytes / read_bytes_per_s + reprefill_tokens /
        prefill_tokens_per_s < (restore_tokens + reprefill_tokens) / prefill_tokens_per_s``. A rate not
        measured yet: restore (the measurement it gives decides the next time), except below
        :data:`MIN_RESTORE_TOKENS`, which is always recomputed. ``predicted_restore_ms`` is the read alone
        (the re-prefilled tokens are the turn's prefill), ``predicted_prefill_ms`` the prefill it spares.
    """
    if restore_tokens < MIN_RESTORE_TOKENS:
        return RestoreDecision(False, None, None, f"{restore_tokens} tokens: recomputing is as quick")
    rate = prefill_tokens_per_s if prefill_tokens_per_s and prefill_tokens_per_s > 0 else None
    restore_ms = restore_bytes / read_bytes_per_s * 1000 if read_bytes_per_s and read_bytes_per_s > 0 else None
    prefill_ms = restore_tokens / rate * 1000 if rate else None
    again = f" (+{reprefill_tokens:,} tokens evaluated again either way)" if reprefill_tokens else ""
    if restore_ms is None or rate is None or prefill_ms is None:
        missing = "read rate" if restore_ms is None else "prefill rate"
        return RestoreDecision(True, restore_ms, prefill_ms, f"no {missing} measured yet: restoring measures it")
    reprefill_ms = reprefill_tokens / rate * 1000
    with_restore, without = restore_ms + reprefill_ms, prefill_ms + reprefill_ms
    if with_restore < without:
        return RestoreDecision(
            True,
            restore_ms,
            prefill_ms,
            f"restore ≈ {restore_ms:,.0f} ms beats prefill ≈ {prefill_ms:,.0f} ms{again}",
        )
    return RestoreDecision(
        False, restore_ms, prefill_ms, f"prefill ≈ {prefill_ms:,.0f} ms beats restore ≈ {restore_ms:,.0f} ms{again}"
    )
