"""Whether restoring a saved KV-cache prefix beats recomputing it: one pure rule, from measured rates.

Restore when the predicted restore time, ``bytes / read_bytes_per_s``, is below the predicted recompute
time, ``tokens / prefill_tokens_per_s``; else recompute. Both rates are measurements of this store and this
model (a restore's bytes over its time; the prefill rate of earlier turns). Where a rate has not been
measured yet the prefix is restored, which measures it: restoring reads what was saved, and a wrong guess
costs one read, never a wrong reply (the server compares the restored tokens with the new prompt).
"""

from __future__ import annotations

from chatphase.units import fmt_bytes, fmt_int, fmt_ms


def should_restore(
    tokens: int, bytes: int, read_bytes_per_s: float | None, prefill_tokens_per_s: float | None
) -> tuple[bool, str]:
    """``(restore?, why in words)`` for a saved prefix of ``tokens`` tokens held in ``bytes`` bytes.

    ``read_bytes_per_s``: the store's measured read rate (``None``: not measured yet);
    ``prefill_tokens_per_s``: this model's measured prefill rate (``None``: not measured yet).
    """
    if tokens <= 0 or bytes <= 0:
        return False, "nothing saved to restore"
    size = f"{fmt_int(tokens)} tok · {fmt_bytes(bytes)}"
    if not read_bytes_per_s or read_bytes_per_s <= 0:
        return True, f"{size}: no read rate measured yet, restoring measures one"
    restore_ms = bytes / read_bytes_per_s * 1000
    if not prefill_tokens_per_s or prefill_tokens_per_s <= 0:
        return True, f"{size}: restore ≈ {fmt_ms(restore_ms)}; no prefill rate measured yet"
    prefill_ms = tokens / prefill_tokens_per_s * 1000
    if restore_ms < prefill_ms:
        return True, f"{size}: restore ≈ {fmt_ms(restore_ms)} < prefill ≈ {fmt_ms(prefill_ms)}"
    return False, f"{size}: restore ≈ {fmt_ms(restore_ms)} ≥ prefill ≈ {fmt_ms(prefill_ms)}, recomputing is faster"
