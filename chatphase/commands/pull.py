"""``chatphase pull REPO[:QUANT|:FILE] [--quant Q | --file NAME] [--revision REV]``: fetch a GGUF from Hugging Face.

Files go to ``<models dir>/OWNER/NAME/`` (linked from the Hugging Face cache when already there, which
also works offline); split GGUFs come down whole. The result is validated like any model; a file that
is not a usable GGUF is removed again. Exit codes: 0 ok; 2 bad repo/quant/file or offline without a
cached copy; 1 the Hub unreachable or a failed download.
"""

from __future__ import annotations

import sys
from pathlib import Path

from chatphase.commands.options import add_setting_flag
from chatphase.engine.text import inert
from chatphase.errors import ChatPhaseError, UsageError
from chatphase.models import hub
from chatphase.models.gguf_meta import read_model_info
from chatphase.system import paths
from chatphase.units import fmt_bytes


def register(sub) -> None:
    p = sub.add_parser(
        "pull",
        help="download a GGUF model from Hugging Face into the models directory",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "repo",
        metavar="REPO",
        help="OWNER/NAME, optionally :QUANT or :FILE (e.g. bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M)",
    )
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--quant", "-q", metavar="Q", help="quantisation to pick from the repo's files (e.g. Q4_K_M)")
    sel.add_argument("--file", "-f", metavar="NAME", help="exact GGUF file in the repo")
    p.add_argument("--revision", metavar="REV", help="branch, tag or commit (default main)")
    add_setting_flag(p, "models_dir")
    p.set_defaults(func=run)


def run(args) -> int:
    spec = hub.parse_repo_spec(args.repo, revision=args.revision)
    if spec is None:
        raise UsageError(f"not a Hugging Face repo: {args.repo!r} (expected OWNER/NAME[:QUANT|:FILE])")
    if args.quant or args.file:
        if spec.quant or spec.filename:
            raise UsageError("give the quant or file either after ':' or with --quant/--file, not both")
        spec = hub.RepoSpec(spec.repo_id, filename=args.file, quant=args.quant, revision=args.revision)
    models_dir = Path(args.models_dir) if args.models_dir else paths.models_dir()
    result = hub.pull(spec, models_dir)
    try:
        info = read_model_info(result.path)
    except ChatPhaseError:
        if result.source != "present":
            for f in result.files:
                f.unlink(missing_ok=True)
        raise
    how = {"downloaded": "downloaded", "hf-cache": "linked from the Hugging Face cache", "present": "already present"}[
        result.source
    ]
    print(inert(f"{how}: {result.path}"), file=sys.stderr)
    print(
        inert(
            f"{info.name} · {info.architecture} · {info.quantization} · {fmt_bytes(info.size_bytes)}"
            f" · use with --model {spec.repo_id}:{Path(result.path).name}"
        )
    )
    return 0
