"""Summarise a device check (benchmarks/gpu_check.sh): GPU offload (-ngl -1) against none (-ngl 0).

Reads, from one folder: ``ask_gpu.json`` / ``ask_cpu.json`` (``chatphase ask --json``),
``bench_gpu.json`` / ``bench_cpu.json`` (``chatphase bench --format json``) and, if present,
``gpu_env.json`` (GPU name, compute capability, build seconds, written by gpu_check.sh). Writes
``gpu_summary.json`` there and prints a Markdown table.

Speed-ups are ratios of the GPU run to the CPU run on the same machine and model: prefill and
decode as ``tokens/s (GPU) ÷ tokens/s (CPU)`` (bench means), TTFT as ``ms (CPU) ÷ ms (GPU)``; > 1
means the GPU run is faster.

Exit status: 0 when the GPU run offloaded every layer (``layers_offloaded == layers_total``) and
the CPU run none; 1 when not (the reason is printed and kept in ``problems``); 2 when a file is
missing or is not the expected JSON (one line, no traceback).

Usage: python -m benchmarks.gpu_summary DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MODES = ("gpu", "cpu")


class SummaryError(Exception):
    """A result file is missing or malformed (the message names it)."""


def _load(folder: Path, name: str, required: bool = True) -> dict | None:
    path = folder / name
    if not path.exists():
        if required:
            raise SummaryError(f"{path} is missing")
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SummaryError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SummaryError(f"{path} does not hold a JSON object")
    return data


def _mean(row: dict, key: str) -> float | None:
    value = row.get(key)
    return value.get("mean") if isinstance(value, dict) else value


def run_figures(ask: dict, bench: dict) -> dict:
    """One mode's figures from its ``ask --json`` and ``bench --format json`` objects.

    Returns a dict: offload fields of ask's ``model``/``settings`` (``n_gpu_layers``,
    ``gpu_offload_supported``, ``layers_offloaded``, ``layers_total``, ``gpu_memory_bytes``,
    ``load_ms``), ``ask`` (first turn: ``prompt_tokens``, ``ttft_ms``, ``prefill_tokens_per_s``,
    ``decode_tokens``, ``decode_tokens_per_s``), ``prompt_sweep`` (per prompt length: mean ``ttft_ms``
    and ``prefill_tokens_per_s``) and ``depth_sweep`` (per KV depth: mean ``decode_tokens_per_s``
    and ``tpot_ms``).

    Raises:
        SummaryError: when ask's object has no turn or lacks ``model``/``settings``.
    """
    try:
        model, settings, turn = ask["model"], ask["settings"], ask["turns"][0]["metrics"]
    except (KeyError, IndexError, TypeError):
        raise SummaryError("ask JSON lacks model, settings or a turn's metrics") from None
    rows = bench.get("results") or []
    return {
        "n_gpu_layers": settings.get("n_gpu_layers"),
        "gpu_offload_supported": settings.get("gpu_offload_supported"),
        "layers_offloaded": model.get("layers_offloaded"),
        "layers_total": model.get("layers_total"),
        "gpu_memory_bytes": model.get("gpu_memory_bytes"),
        "load_ms": model.get("load_ms"),
        "notes": model.get("notes", []),
        "ask": {
            k: turn.get(k)
            for k in ("prompt_tokens", "ttft_ms", "prefill_tokens_per_s", "decode_tokens", "decode_tokens_per_s")
        },
        "prompt_sweep": [
            {
                "prompt_tokens": r["prompt_tokens"],
                "ttft_ms": _mean(r, "ttft_ms"),
                "prefill_tokens_per_s": _mean(r, "prefill_tokens_per_s"),
            }
            for r in rows
            if r.get("kind") == "prompt"
        ],
        "depth_sweep": [
            {
                "depth": r["depth"],
                "decode_tokens_per_s": _mean(r, "decode_tokens_per_s"),
                "tpot_ms": _mean(r, "tpot_ms"),
            }
            for r in rows
            if r.get("kind") == "depth"
        ],
    }


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def speedups(gpu: dict, cpu: dict) -> dict:
    """GPU ÷ CPU ratios per bench cell present in both runs (see the module docstring)."""
    cpu_prompt = {r["prompt_tokens"]: r for r in cpu["prompt_sweep"]}
    cpu_depth = {r["depth"]: r for r in cpu["depth_sweep"]}
    return {
        "prefill_tokens_per_s": {
            str(r["prompt_tokens"]): _ratio(
                r["prefill_tokens_per_s"], cpu_prompt[r["prompt_tokens"]]["prefill_tokens_per_s"]
            )
            for r in gpu["prompt_sweep"]
            if r["prompt_tokens"] in cpu_prompt
        },
        "ttft_ms": {
            str(r["prompt_tokens"]): _ratio(cpu_prompt[r["prompt_tokens"]]["ttft_ms"], r["ttft_ms"])
            for r in gpu["prompt_sweep"]
            if r["prompt_tokens"] in cpu_prompt
        },
        "decode_tokens_per_s": {
            str(r["depth"]): _ratio(r["decode_tokens_per_s"], cpu_depth[r["depth"]]["decode_tokens_per_s"])
            for r in gpu["depth_sweep"]
            if r["depth"] in cpu_depth
        },
    }


def offload_problems(gpu: dict, cpu: dict) -> list[str]:
    """Why the check does not show GPU offload (empty when it does)."""
    problems = []
    if not gpu["gpu_offload_supported"]:
        problems.append("the llama-cpp-python build has no GPU offload (gpu_offload_supported false)")
    total, done = gpu["layers_total"], gpu["layers_offloaded"]
    if not total or done != total:
        problems.append(f"-ngl -1 offloaded {done} of {total} layers, not all")
    if cpu["layers_offloaded"]:
        problems.append(f"-ngl 0 still offloaded {cpu['layers_offloaded']} layers")
    return problems


def summarise(folder: Path) -> dict:
    """Read the check's files in ``folder`` and return the summary (also written as gpu_summary.json).

    Raises:
        SummaryError: a required file is missing or malformed.
    """
    runs = {m: run_figures(_load(folder, f"ask_{m}.json"), _load(folder, f"bench_{m}.json")) for m in MODES}
    env = _load(folder, "gpu_env.json", required=False) or {}
    bench_gpu = _load(folder, "bench_gpu.json")
    summary = {
        "gpu_name": env.get("gpu_name"),
        "compute_cap": env.get("compute_cap"),
        "driver_version": env.get("driver_version"),
        "build_s": env.get("build_s"),
        "model": {
            k: bench_gpu.get("model", {}).get(k) for k in ("name", "path", "quantization", "size_bytes", "n_layer")
        },
        "system": bench_gpu.get("system", {}),
        "runs": runs,
        "speedup_gpu_over_cpu": speedups(runs["gpu"], runs["cpu"]),
        "problems": offload_problems(runs["gpu"], runs["cpu"]),
    }
    summary["offload_ok"] = not summary["problems"]
    (folder / "gpu_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _f(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def markdown(summary: dict) -> str:
    """The summary as a Markdown table: one row per bench cell, CPU and GPU side by side."""
    gpu, cpu = summary["runs"]["gpu"], summary["runs"]["cpu"]
    mem = gpu["gpu_memory_bytes"]
    head = (
        f"GPU: {summary['gpu_name'] or '–'} (compute capability {summary['compute_cap'] or '–'}); "
        f"model {summary['model']['name']} {summary['model']['quantization']}; "
        f"-ngl -1 offloaded {gpu['layers_offloaded']}/{gpu['layers_total']} layers, "
        f"GPU memory {'–' if mem is None else f'{mem / 2**20:,.0f} MiB'}"
    )
    lines = [
        head,
        "",
        "| cell | CPU (-ngl 0) | GPU (-ngl -1) | GPU ÷ CPU |",
        "| --- | ---: | ---: | ---: |",
    ]
    sp = summary["speedup_gpu_over_cpu"]
    cpu_prompt = {r["prompt_tokens"]: r for r in cpu["prompt_sweep"]}
    for r in gpu["prompt_sweep"]:
        c = cpu_prompt.get(r["prompt_tokens"], {})
        n = str(r["prompt_tokens"])
        lines.append(
            f"| prefill, {n}-token prompt (tok/s) | {_f(c.get('prefill_tokens_per_s'))} | "
            f"{_f(r['prefill_tokens_per_s'])} | {_f(sp['prefill_tokens_per_s'].get(n), 2)} |"
        )
        lines.append(
            f"| TTFT, {n}-token prompt (ms) | {_f(c.get('ttft_ms'))} | {_f(r['ttft_ms'])} | "
            f"{_f(sp['ttft_ms'].get(n), 2)} (CPU ÷ GPU) |"
        )
    cpu_depth = {r["depth"]: r for r in cpu["depth_sweep"]}
    for r in gpu["depth_sweep"]:
        c = cpu_depth.get(r["depth"], {})
        d = str(r["depth"])
        lines.append(
            f"| decode at depth {d} (tok/s) | {_f(c.get('decode_tokens_per_s'))} | "
            f"{_f(r['decode_tokens_per_s'])} | {_f(sp['decode_tokens_per_s'].get(d), 2)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI entry: ``gpu_summary.py DIR``; returns the exit status (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="gpu_summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", metavar="DIR", help="the folder gpu_check.sh wrote its results to")
    try:
        args = ap.parse_args(argv)
    except SystemExit as done:  # --help (0) or a usage error (2): argparse printed it
        return int(done.code or 0)
    try:
        summary = summarise(Path(args.dir))
    except SummaryError as exc:
        print(f"gpu_summary: {exc}", file=sys.stderr)
        return 2
    print(markdown(summary))
    for problem in summary["problems"]:
        print(f"gpu_summary: {problem}", file=sys.stderr)
    return 0 if summary["offload_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
