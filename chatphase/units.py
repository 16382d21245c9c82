"""Human-readable figures, shared by the CLI and the TUI: one formatter per kind of figure (binary units
for bytes, as llama.cpp prints them; an undefined figure, ``None``, is :data:`DASH`), and the one parser
of a typed list of counts."""

from __future__ import annotations

#: what an undefined figure shows.
DASH = "–"


def fmt_bytes(n: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; ``None`` -> ``"–"``."""
    if n is None:
        return DASH
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def fmt_mib(n: float | None) -> str:
    """Bytes as a bare MiB figure for table cells: ``1572864`` -> ``"1.5"``; ``None`` -> ``"–"``."""
    return DASH if n is None else f"{n / 2**20:.1f}"


def fmt_seconds(seconds: float | None) -> str:
    """A duration for people: ``4.1 s``, ``1 min 12 s``; ``None`` -> ``"–"``."""
    if seconds is None:
        return DASH
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def fmt_duration_ms(ms: float | None) -> str:
    """A duration given in ms, for people: ``124 ms`` under a second (where ``0.1 s`` would round a short
    prefill to nothing), else as :func:`fmt_seconds`; ``None`` -> ``"–"``."""
    if ms is None:
        return DASH
    return f"{ms:,.0f} ms" if ms < 999.5 else fmt_seconds(ms / 1000)


def fmt_ms(ms: float | None) -> str:
    """Milliseconds with sensible precision; ``None`` -> ``"–"``."""
    if ms is None:
        return DASH
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:,.0f} ms"


def fmt_rate(tokens_per_s: float | None) -> str:
    """Tokens per second; ``None`` (undefined) -> ``"–"``."""
    return DASH if tokens_per_s is None else f"{tokens_per_s:,.1f} tok/s"


def fmt_value(v: object) -> str:
    """A setting as text, :data:`DASH` when unknown (``None``)."""
    return DASH if v is None else str(v)


def fmt_restore(tokens: int, restore_bytes: int | None, restore_ms: float | None, prefill_ms: float | None) -> str:
    """A prefix restore as the phase line says it: ``RESTORE 4,096 tok · 90.0 MiB · 0.12 s (prefill ≈ 11.0 s)``
    (the prefill it spared, as predicted, in brackets when known)."""
    spared = f" (prefill ≈ {fmt_seconds(prefill_ms / 1000)})" if prefill_ms is not None else ""
    took = DASH if restore_ms is None else f"{restore_ms / 1000:.2f} s"
    return f"RESTORE {tokens:,} tok · {fmt_bytes(restore_bytes)} · {took}{spared}"


def fmt_cached(cached: int | None, restored: int | None) -> str:
    """The prompt's cached tokens in words, with the part restored from the prefix store when there is one:
    ``1,200 cached`` or ``1,200 cached: 1,100 restored``."""
    return f"{fmt_int(cached)} cached" + (f": {restored:,} restored" if restored else "")


def fmt_int(n: int | None) -> str:
    """Thousands-separated integer."""
    return DASH if n is None else f"{n:,}"


def fmt_term(x: float, spec: str) -> str:
    """``"+ 1.500"`` / ``"− 0.0244"``: a term's sign and magnitude (formatted with ``spec``, e.g. ``".3f"``,
    ``".3g"``), for printed equations: ``a − b×d``, never ``a + -b×d``."""
    return f"{'−' if x < 0 else '+'} {abs(x):{spec}}"


def fmt_count(n: int, noun: str) -> str:
    """``1, "turn"`` -> ``"1 turn"``; ``1200, "turn"`` -> ``"1,200 turns"`` (plural with an ``s``)."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


#: a turn's ``stop_reason`` (:data:`chatphase.engine.metrics.STOP_REASONS`) in words, for people. ``length``
#: (the reply hit max_tokens) keeps its one name: the metrics, ``ask --json``, the history and llama-server's
#: ``finish_reason`` call it that.
STOP_REASON_WORDS: dict[str, str] = {
    "stop": "end of reply",  # the model's end token or a stop string
    "length": "length",  # the reply hit the sampling setting's max_tokens
    "cancelled": "cancelled",
    "context_full": "context full",
    "error": "error",
}


def fmt_stop_reason(reason: str) -> str:
    """``"stop"`` -> ``"end of reply"`` (:data:`STOP_REASON_WORDS`); an unknown reason as it is."""
    return STOP_REASON_WORDS.get(reason, reason)


def fmt_at_threads(n: int | None) -> str:
    """`` at 2 threads`` (``""`` when unknown): the decode thread count a figure was measured at."""
    return "" if n is None else f" at {fmt_count(n, 'thread')}"


def fmt_params(n: int | None) -> str:
    """Parameter count: ``134515008`` -> ``135M``, ``1_235_814_400`` -> ``1.2B``, ``12e9`` -> ``12B``."""
    if n is None:
        return DASH
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}" if n < 10 * div else f"{n / div:.0f}{unit}"
    return str(n)


def fmt_device_memory(free_bytes: int, total_bytes: int, held_bytes: int | None = None) -> str:
    """A device's memory as ``ggml_backend_dev_memory`` reports it, beside what the engine itself allocated
    there (``held_bytes``: llama.cpp's buffers on that device; ``None`` before a load): ``1.5 GiB free of
    2.0 GiB · engine holds 231.2 MiB``. A device that reports free = total counts no usage at all (ggml's
    CPU device by design, Vulkan drivers without ``VK_EXT_memory_budget`` such as llvmpipe: ggml then
    reports the heap size as free), so its free figure never moves: ``2.0 GiB · reports no usage (free =
    total) · engine holds 231.2 MiB``."""
    if total_bytes <= 0:
        figure = "memory not reported"
    elif free_bytes == total_bytes:
        figure = f"{fmt_bytes(total_bytes)} · reports no usage (free = total)"
    else:
        figure = f"{fmt_bytes(free_bytes)} free of {fmt_bytes(total_bytes)}"
    return figure if held_bytes is None else f"{figure} · engine holds {fmt_bytes(held_bytes)}"


def parse_counts(text: str) -> tuple[int, ...]:
    """``"64, 256,1024"`` -> ``(64, 256, 1024)``: token counts, sequence counts; ``""`` or ``"none"`` ->
    ``()``.

    Raises:
        ValueError: for anything but whole numbers separated by commas or spaces (its message says so).
    """
    parts = text.replace(",", " ").split()
    if [p.lower() for p in parts] in ([], ["none"]):
        return ()
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"expected comma-separated whole numbers like 64,256,1024 (got {text.strip()!r})") from None
