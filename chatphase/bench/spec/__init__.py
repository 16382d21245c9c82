"""Decode modes side by side (``chatphase bench --spec``): plain, prompt lookup, a draft model; the verify cost."""

from chatphase.bench.spec.arms import format_costs, format_rows, parse_arms, run_arms, summary_rows, verify_cost

__all__ = ["format_costs", "format_rows", "parse_arms", "run_arms", "summary_rows", "verify_cost"]
