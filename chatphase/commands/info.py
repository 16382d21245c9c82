"""``chatphase info [--model SPEC] [--n-ctx N] [--plan] [--json]``: what loading a model would take, before loading it.

Metadata from the GGUF header, KV-cache bytes per token and at n_ctx (for the chosen cache types),
the memory estimate (weights + KV + compute) against memory available, the CPU features llama.cpp
sees and the AMX decision, and whether this llama-cpp-python build can offload to a GPU.
A model that will not fit is reported with figures (exit 0), and refused only when even its KV cache
and compute buffers cannot be allocated (exit 2).

``--plan`` adds llama.cpp's own projection of the load per device (:mod:`chatphase.engine.local.projection`,
made in a child process): the layers and weights, KV cache, compute and output buffers each device gets at the
chosen settings, against its free memory, and the layer count ``--n-gpu-layers auto`` chooses. A count that would
not fit a GPU device is refused after the report, with the plan's line (exit 2), as a load would refuse it.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from chatphase.commands.options import add_model_options, settings_from_args
from chatphase.engine.events import DeviceInfo
from chatphase.engine.slow_paths import why_no_offload
from chatphase.engine.text import inert
from chatphase.errors import ModelError
from chatphase.models.gguf_meta import SYNTHETIC_LABEL, read_model_info
from chatphase.models.kv import kv_bytes_per_token
from chatphase.models.memory import assess, estimate
from chatphase.models.resolve import resolve_model
from chatphase.sessions.store import sessions_dir
from chatphase.system.cpu_features import enabled_features
from chatphase.system.paths import config_file
from chatphase.units import fmt_bytes, fmt_device_memory, fmt_params

GPU_BUILD_HINT = (
    "this llama-cpp-python build is CPU-only; for a GPU build reinstall from source with a backend, e.g. "
    'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir --no-binary llama-cpp-python llama-cpp-python==0.3.36 '
    "(Metal: -DGGML_METAL=on, Vulkan: -DGGML_VULKAN=on, ROCm: -DGGML_HIP=on)"
)


def register(sub) -> None:
    p = sub.add_parser(
        "info",
        help="model metadata, KV and memory estimate, CPU/GPU support of this build",
        description=__doc__.split("\n\n")[0],
    )
    add_model_options(p)
    p.add_argument(
        "--plan",
        action="store_true",
        help="add llama.cpp's own memory plan of the load per device (a projection, no weights read; about a second)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def system_report() -> dict:
    """What this llama.cpp build sees: ``system_info`` text, enabled features, AMX, GPU offload support,
    the ggml backends it has and the devices they found (name, description, type, memory free/total)."""
    import llama_cpp

    from chatphase.engine.local import ggml_devices
    from chatphase.engine.local.llama_params import cpu_system_info, offload_plan

    system_info = cpu_system_info()
    gpu_ok = ggml_devices.can_offload()
    auto = offload_plan({"extra_bufts": "auto", "n_gpu_layers": 0}, system_info, gpu_ok)
    return {
        "llama_cpp_version": getattr(llama_cpp, "__version__", "?"),
        "system_info": system_info,
        "cpu_features": enabled_features(system_info),
        "amx_detected": auto.amx,
        "extra_bufts_auto": f"{'on' if auto.use_extra_bufts else 'off'} ({auto.extra_bufts_why or 'no AMX'})",
        "gpu_offload_supported": gpu_ok,
        "backends": list(ggml_devices.backends()),
        "devices": [asdict(d) for d in ggml_devices.devices()],
    }


def build_report(args) -> dict:
    """The whole report as a JSON-ready dict (see the module docstring)."""
    settings = settings_from_args(args)
    path = resolve_model(settings.model, settings.models_dir, pull=getattr(args, "pull", False))
    info = read_model_info(path)
    est = estimate(
        info,
        settings.engine.n_ctx_before_load,
        settings.engine.n_ubatch_used,
        settings.engine.type_k,
        settings.engine.type_v,
    )
    verdict = assess(est)
    kv_per_token = (
        kv_bytes_per_token(info.attention, settings.engine.type_k, settings.engine.type_v) if info.attention else None
    )
    # llama.cpp's lines (ggml_vulkan: Found 1 Vulkan devices …) go to engine.log; only its calls are inside, so
    # that the details --verbose prints of a bad file (Python's, on fd 2) stay on the terminal
    from chatphase.engine.llamalog import llama_quiet  # imports llama.cpp: not when the CLI only parses arguments

    with llama_quiet():
        chat_format, system = chat_format_report(info, settings.engine.chat_template), system_report()
    plan = None
    if getattr(args, "plan", False):
        from chatphase.engine.memory_plan import plan_in_child

        try:
            plan = plan_in_child(str(path), settings.engine.to_dict()).to_dict()
        except ModelError as exc:  # the child failed: the rest of the report stands, the exit says it
            plan = {"error": str(exc)}
    return {
        **({"plan": plan} if plan is not None else {}),
        "chat_format": chat_format,
        "model": info.to_dict(),
        "kv": {
            "type_k": settings.engine.type_k,
            "type_v": settings.engine.type_v,
            "kv_bytes_per_token": kv_per_token,
            "n_ctx": settings.engine.n_ctx_before_load,
            "kv_cells": est.kv_cells,
            "kv_capacity_bytes": est.kv_cache_bytes,
        },
        "memory": {
            **est.to_dict(),
            "available_bytes": verdict.available_bytes,
            "swap_free_bytes": verdict.swap_free_bytes,
            "verdict": verdict.level,
            "message": verdict.message,
        },
        "system": system,
        "gpu_offload_off_because": why_no_offload(
            tuple(system["backends"]), tuple(DeviceInfo(**d) for d in system["devices"]), settings.engine.n_gpu_layers
        ),
        "paths": {
            "config_file": str(config_file()),
            "sessions_dir": str(sessions_dir()),
            "config_file_exists": config_file().is_file(),
        },
    }


def chat_format_report(info, override: str | None) -> dict:
    """The prompt format the engine will use (``label``, ``why``, end-of-turn ``stops``), or ``error``:
    the one line that makes ``chat`` and ``ask`` refuse the model."""
    from chatphase.engine.prompting.chat_format import TemplateError, format_before_load

    try:
        fmt = format_before_load(info, override, with_vocab=True)
    except TemplateError as exc:
        return {"error": str(exc)}
    except RuntimeError as exc:  # llama.cpp could not read the vocabulary
        return {"error": str(exc)}
    if fmt is None:  # not with with_vocab: a file without a template gets a format from its vocabulary
        return {"error": "no chat format"}
    return {"label": fmt.label, "why": fmt.why, "stops": list(fmt.stops)}


def run(args) -> int:
    report = build_report(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(inert(render(report)))  # the model's name and path, its metadata: the file's text
    if report["memory"]["verdict"] == "refuse":
        raise ModelError(report["memory"]["message"])
    if (report.get("plan") or {}).get("refusal") or (report.get("plan") or {}).get("error"):
        raise ModelError(report["plan"].get("refusal") or report["plan"]["error"])
    if "error" in report["chat_format"]:
        raise ModelError(report["chat_format"]["error"])
    return 0


def _plan_lines(fit: dict) -> list[str]:
    """The ``--plan`` rows: the layer count and why (the context's too, for n_ctx auto), then :func:`chatphase.engine.memory_plan.plan_lines`."""
    from chatphase.engine.memory_plan import MemoryPlan, plan_lines

    lines = []
    if fit.get("error"):
        return [f"memory plan    failed: {fit['error']}"]
    if fit.get("why"):
        lines.append(f"n_gpu_layers   {fit['why']}")
    if fit.get("n_ctx_why"):
        lines.append(f"n_ctx          {fit['n_ctx_why']}")
    if fit.get("unavailable"):
        lines.append(f"memory plan    none: {fit['unavailable']}")
    if fit.get("plan"):
        lines += [f"{label or '':<14} {text}" for label, text in plan_lines(MemoryPlan.from_dict(fit["plan"]))]
    if fit.get("refusal"):
        lines.append(f"refused        {fit['refusal']}")
    return lines


def _chat_format_line(fmt: dict) -> str:
    if "error" in fmt:
        return f"unusable: {fmt['error']}"
    stops = f" · stops at {' '.join(repr(s) for s in fmt['stops'])}" if fmt["stops"] else ""
    why = "" if fmt["why"] == "the model's own template" else f" · {fmt['why']}"
    return f"{fmt['label']}{why}{stops}"


def render(r: dict) -> str:
    """Human-readable lines of :func:`build_report`'s dict."""
    m, kv, mem, sysr = r["model"], r["kv"], r["memory"], r["system"]
    per_tok = fmt_bytes(kv["kv_bytes_per_token"]) if kv["kv_bytes_per_token"] else "– (no per-token KV cache)"
    lines = [
        f"model          {m['name']}",
        f"file           {m['path']}" + (f" (+{m['split_count'] - 1} parts)" if m["split_count"] > 1 else ""),
        f"architecture   {m['architecture']} · {m['n_layer']} layers · {fmt_params(m['n_params'])} parameters",
        f"quantisation   {m['quantization']} · {fmt_bytes(m['size_bytes'])} on disk",
        *(
            [f"synthetic      {SYNTHETIC_LABEL}: random weights in a real model's shapes; its text is noise"]
            if m.get("synthetic")
            else []
        ),
        f"context        trained {m['n_ctx_train'] or '?'} tokens · n_ctx {kv['n_ctx']} ({kv['kv_cells']} KV cells)"
        + (
            " · above the trained context: quality may degrade"
            if m["n_ctx_train"] and kv["n_ctx"] > m["n_ctx_train"]
            else ""
        )
        + ("" if m["has_chat_template"] else " · no chat template in the file"),
        f"chat format    {_chat_format_line(r['chat_format'])}",
        f"KV cache       {per_tok} per token ({kv['type_k']}/{kv['type_v']}) · {fmt_bytes(kv['kv_capacity_bytes'])} at n_ctx",
        f"memory         {mem['verdict']}: {mem['message']}",
        f"llama.cpp      llama-cpp-python {sysr['llama_cpp_version']} · {' '.join(sysr['cpu_features']) or 'no CPU features reported'}",
        f"AMX            {'detected' if sysr['amx_detected'] else 'not detected'} · extra buffer types auto = {sysr['extra_bufts_auto']}",
        f"backends       {', '.join(sysr['backends'])}",
        *(
            f"device         {d['name']} · {d['description']} · {d['type']} · "
            + fmt_device_memory(d["free_bytes"], d["total_bytes"])
            for d in sysr["devices"]
        ),
        "GPU offload    "
        + (
            f"none: {GPU_BUILD_HINT if sysr['backends'] == ['CPU'] else r['gpu_offload_off_because']}"
            if r["gpu_offload_off_because"]
            else "supported by this build (--n-gpu-layers; default auto: the most layers that fit)"
        ),
        *(_plan_lines(r["plan"]) if r.get("plan") else []),
        f"config file    {r['paths']['config_file']} ("
        + ("" if r["paths"]["config_file_exists"] else "none yet: defaults apply; ")
        + f"sessions: {r['paths']['sessions_dir']})",
    ]
    return "\n".join(lines)
