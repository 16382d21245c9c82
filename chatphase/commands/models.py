"""``chatphase models [--json]``: every model chatphase can use — the bundled default, the models
directory, the Hugging Face cache — with architecture, parameters, quantisation, size, training context
and KV bytes per token. Files that fail validation are listed separately with the reason.

``chatphase models synth SHAPE[:QUANT]`` writes a synthetic GGUF (random weights in a real model's
shapes, :mod:`chatphase.models.synth`) into the models directory, for timings without a download.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from chatphase.commands.options import add_setting_flag
from chatphase.engine.text import inert
from chatphase.errors import UsageError
from chatphase.models.gguf_meta import SYNTHETIC_LABEL
from chatphase.models.resolve import FIGURE_COLUMNS, list_models
from chatphase.models.synth_shapes import QUANTS, SHAPES
from chatphase.system.paths import models_dir


def register(sub) -> None:
    p = sub.add_parser(
        "models",
        help="list local GGUF models (models directory, Hugging Face cache, bundled default)",
        description=__doc__.split("\n\n")[0],
    )
    add_setting_flag(p, "models_dir")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run)
    shapes = ", ".join(k for k, v in SHAPES.items() if v.listed)
    sub_models = p.add_subparsers(dest="models_command", metavar="synth")
    s = sub_models.add_parser(
        "synth",
        help="write a synthetic GGUF: a real model's shapes and vocabulary size, random weights (timings only)",
        description=f"Write random weights in the exact shapes of a popular model ({SYNTHETIC_LABEL}). "
        f"Shapes: {shapes}. Quantisations: {', '.join(QUANTS)}.",
    )
    s.add_argument("spec", metavar="SHAPE[:QUANT]", help=f"e.g. llama-3.2-1b:Q4_0 (QUANT default Q4_0; {shapes})")
    s.add_argument("--output", "-o", metavar="FILE", help="where to write (default: the models directory)")
    add_setting_flag(s, "models_dir", dest="synth_models_dir")
    s.add_argument("--seed", type=int, default=0, metavar="S", help="random seed of the weights (default 0)")
    s.add_argument("--force", action="store_true", help="replace an existing file")
    s.set_defaults(func=run_synth)


def run(args) -> int:
    entries = list_models(args.models_dir)
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], indent=2))
        return 0
    header = ("", "MODEL (--model)", *FIGURE_COLUMNS, "SOURCE")
    rows: list[tuple[str, ...]] = [header]
    broken = []
    for e in entries:
        if e.info is None:
            broken.append(e)
            continue
        mark = "*" if e.is_default else "s" if e.info.synthetic else ""
        # file names and GGUF metadata: inert before they are measured
        rows.append(tuple(map(inert, (mark, e.spec or f"(default) {e.info.name}", *e.figures(), e.source))))
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    print(f"\n* default model · s {SYNTHETIC_LABEL} (random weights) · KV/TOK = f16 KV cache bytes per token")
    for e in broken:
        print(inert(f"unusable: {e.error}"))
    return 0


def run_synth(args) -> int:
    """Check the spec, the room on disk and in memory, then write with a progress bar on stderr."""
    from chatphase.models.synth import check_room, default_file_name, plan, write_synthetic
    from chatphase.models.synth_shapes import parse_spec

    try:
        shape, quant = parse_spec(args.spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    synth = plan(shape, quant)
    if args.output:
        target = Path(args.output).expanduser()
    else:
        chosen = args.synth_models_dir or args.models_dir
        folder = Path(chosen).expanduser() if chosen else models_dir()
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / default_file_name(shape, quant)
    if target.suffix.lower() != ".gguf":
        raise UsageError(f"the output must end in .gguf: {target}")
    if target.exists() and not args.force:
        raise UsageError(f"{target} exists (--force replaces it)")
    for warning in check_room(target, synth):
        print(inert(f"chatphase: warning: {warning}"), file=sys.stderr)
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task(f"writing {shape.name} {quant}", total=synth.data_bytes)
        write_synthetic(synth, target, lambda done, total, name: bar.update(task, completed=done), seed=args.seed)
    print(
        f"chatphase: wrote {target} ({synth.data_bytes / 2**30:.2f} GiB, {shape.n_params() / 1e9:.2f} B parameters, "
        f"{quant}; {SYNTHETIC_LABEL}): chatphase bench --model {target}",
        file=sys.stderr,
    )
    return 0
