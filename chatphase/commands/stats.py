"""``chatphase stats``: what the recorded turns say per model (or ``--by backend|machine|version``, or several,
``--by model,version``): turns, the medians of TTFT, prefill and decode tokens/s, and the least-squares lines
TTFT = a + b × prompt tokens evaluated (with r²; a ≥ 0, through the origin where the free fit's a is negative) and
decode tokens/s against depth (:mod:`chatphase.history.query`), each over three distinct x values or more.

``--plot FILE.svg|png`` draws every turn with each group's line (two versions or builds: two lines, ``--by
version`` / ``--by backend``). Same filters as ``logs``. Exit codes: 0 ok; 1 the history cannot be read; 2 bad
usage (also a plot without matplotlib).
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import closing

from chatphase.commands.history_options import add_filter_options, filters_of, open_history
from chatphase.engine.text import inert, json_inert
from chatphase.history.query import GROUP_BY, MIN_FIT_X, GroupStats, group_stats, parse_by
from chatphase.plotting import check_plot_path
from chatphase.timing.fits import LinearFit
from chatphase.units import fmt_count, fmt_term


def register(sub) -> None:
    p = sub.add_parser(
        "stats",
        help="medians and fits of the recorded turns per model, backend, machine or version",
        description="Turns, median TTFT, prefill and decode rates, and TTFT vs prompt length fits, per group.",
    )
    p.add_argument(
        "--by", default="model", metavar="DIM", help=f"group by {', '.join(GROUP_BY)} (comma-separated; default model)"
    )
    add_filter_options(p)
    p.add_argument("--json", action="store_true", help="print the groups as a JSON list")
    p.add_argument("--plot", metavar="FILE", help="draw every turn and each group's lines (.svg or .png)")
    p.set_defaults(func=run)


def _num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _fit(fit: LinearFit | None, unit: str, distinct: int, what: str) -> str:
    """``20.0 + 0.5×n (r² 0.99)``, ``… through 0``; without a fit, how many distinct x values (``what``) there are."""
    if fit is None:
        return "-" if distinct == 0 else f"{fmt_count(distinct, what)} ({MIN_FIT_X} needed)"
    r2 = "-" if fit.r2 is None else f"{fit.r2:.2f}"
    origin = ", through 0" if fit.through_origin else ""
    return f"{fit.intercept:,.1f} {fmt_term(fit.slope, '.3g')}{unit} (r² {r2}{origin})"


def format_table(groups: list[GroupStats]) -> str:
    """Aligned columns, one group a line; group names inert."""
    head = ("GROUP", "TURNS", "TTFT ms", "PREFILL t/s", "DECODE t/s", "TTFT = a + b×prompt", "DECODE t/s = a + b×depth")
    body = [
        (
            inert(g.group),
            str(g.turns),
            _num(g.median_ttft_ms),
            _num(g.median_prefill_tokens_per_s),
            _num(g.median_decode_tokens_per_s),
            _fit(g.ttft_fit, "×n", g.distinct_x()[0], "prompt size"),
            _fit(g.decode_fit, "×d", g.distinct_x()[1], "depth"),
        )
        for g in groups
    ]
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (head, *body)]
    lines.append(
        f"(medians; TTFT fit over the prompt tokens each turn evaluated, ms; depth = KV tokens; a line needs turns at"
        f" {MIN_FIT_X} distinct prompt sizes or depths)"
    )
    if any(g.ttft_fit is not None and g.ttft_fit.through_origin for g in groups):
        lines.append(
            "(through 0: the free line's fixed cost a came out negative, which no turn pays; the least-squares line"
            " with a ≥ 0 is the one through the origin)"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print (and draw) the groups; see the module docstring."""
    by = parse_by(args.by)
    plot = check_plot_path(args.plot) if args.plot else None
    filters = filters_of(args)
    filters.where()  # bad filters are usage errors before the history is opened
    with closing(open_history()) as conn:
        groups = group_stats(conn, filters, by, points=plot is not None)
    if plot is not None:
        from chatphase.history.plot import write_history_plot

        write_history_plot(groups, plot)
    if args.json:
        sys.stdout.write(json_inert(json.dumps([g.to_dict() for g in groups], indent=2, ensure_ascii=False)) + "\n")
    elif not groups:
        print("no recorded turns with figures match")
    else:
        print(format_table(groups))
    if plot is not None:
        print(f"plot: {plot}", file=sys.stderr if args.json else sys.stdout)
    return 0
