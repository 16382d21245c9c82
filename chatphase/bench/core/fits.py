"""The sweep's ``fits`` object: the least-squares lines (:func:`chatphase.timing.fits.linear_fit`) through a sweep's
samples, as saved in its JSON.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatphase.timing.fits import linear_fit


def sweep_fits(samples: Sequence) -> dict:
    """The JSON ``fits`` object from counted :class:`~chatphase.bench.core.results.Sample` records.

    ``ttft_ms_vs_prompt_tokens`` uses the ``"prompt"`` samples (intercept ms, slope ms per prompt token);
    ``decode_tokens_per_s_vs_depth`` and ``tpot_ms_vs_depth`` use the ``"depth"`` samples (intercept at
    depth 0; slope per token of depth). A fit that cannot be determined is ``None``.
    """
    prompt = [s for s in samples if s.kind == "prompt" and not s.warmup]
    depth = [s for s in samples if s.kind == "depth" and not s.warmup]

    def fit(points, xname, yname, y_unit, slope_unit):
        f = linear_fit([getattr(s, xname) for s in points], [getattr(s, yname) for s in points])
        return (
            None
            if f is None
            else {**f.to_dict(), "x": xname, "y": yname, "intercept_unit": y_unit, "slope_unit": slope_unit}
        )

    return {
        "ttft_ms_vs_prompt_tokens": fit(prompt, "prompt_tokens", "ttft_ms", "ms", "ms per prompt token"),
        "decode_tokens_per_s_vs_depth": fit(
            depth, "depth", "decode_tokens_per_s", "tokens/s", "tokens/s per token of depth"
        ),
        "tpot_ms_vs_depth": fit(depth, "depth", "tpot_ms", "ms", "ms per token of depth"),
    }
