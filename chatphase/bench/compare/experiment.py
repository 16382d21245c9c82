"""The comparison's record (:class:`~chatphase.bench.core.experiment.Experiment`)."""

from __future__ import annotations

from chatphase.bench.compare.plan import ComparePlan
from chatphase.bench.compare.result import CompareResult, write_compare_plot
from chatphase.bench.compare.run import make_run
from chatphase.bench.core.experiment import Experiment


def compare_rows(result: CompareResult) -> list[dict]:
    """Rows for ``--rerun``: one per turn and side."""
    figures = ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "kv_cache_bytes")
    return [{"turn": float(t.turn + 1), "side": t.side, **{f: getattr(t, f) for f in figures}} for t in result.turns]


EXPERIMENT = Experiment(
    "compare", "side by side", ComparePlan, make_run, CompareResult.from_dict, plot=write_compare_plot,
    pick="--compare", tab=True, server="local", server_note="bench --compare loads local models: chatphase compare takes "
    "--server", rows=compare_rows, key=("turn", "side"),
    figures=("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "kv_cache_bytes"),
)  # fmt: skip
