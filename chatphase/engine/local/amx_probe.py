"""Whether llama.cpp's Intel AMX path is safe in *this* build: a crash-contained probe, once per library build.

Why a probe and not a rule. On CPUs with AMX, llama.cpp's AMX extra buffer type faults at its first batched
matrix multiply (SIGILL at ``tilezero`` or a general-protection fault at ``ldtilecfg``) in builds compiled with
GCC 12 — Debian 12's compiler, which ``pip install llama-cpp-python`` uses there. The cause is the compiler's
``_tile_loadconfig`` intrinsic: it declares its memory operand as one pointer (``"m" (*(const void **)cfg)``,
8 bytes), so GCC drops the stores of the 64-byte tile configuration's rows and column widths in ggml's
``ggml_tile_config_init`` and ``ldtilecfg`` loads stack garbage. The CPU, the kernel and the hypervisor are fine
(``ARCH_REQ_XCOMP_PERM`` succeeds and a correctly compiled tile kernel runs; docs/architecture.md has the
evidence and the prefill measured with and without AMX). Whether a given ``libggml-cpu`` has the bug depends on
the compiler it was built with, which the library does not say, so chatphase asks the library: a child process
evaluates one batch of the bundled model with extra buffer types on and off and compares the logits. The
verdict is kept per library file (path, size, mtime) in the user cache directory
(``$CHATPHASE_CACHE_DIR`` overrides), so the probe runs once per llama.cpp install.

The probe must run the AMX kernels it judges, whatever else the build has. llama.cpp adds the CPU's extra
buffer types only when the model has no GPU device, and with one it also sends a batch's matrix multiplies
to the device (``op_offload``): a probe on a Vulkan or CUDA build with a device present compared two
identical GPU runs (max |Δlogit| exactly 0), called the AMX path safe, and a later run without the device
took that path and died (SIGILL). So both loads name no device (``llama_model_params.devices`` an empty
list) and keep every op on the CPU (``op_offload`` off); the probe reads llama.cpp's own load lines to see
that an AMX buffer was made, and a difference of exactly 0 is "not tested", never "safe". A verdict is kept
with :data:`PROBE_VERSION`: one from an earlier probe is asked again.

Run as ``python -m chatphase.engine.local.amx_probe``: prints one JSON line and exits 0 when both runs finished.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from chatphase.system.paths import cache_dir

if TYPE_CHECKING:  # imported where used: the probe's parent process never needs them
    import numpy as np
    import numpy.typing as npt

#: The plain CPU path itself gives other logits when the same tokens are evaluated one at a time instead of
#: in one batch (other kernels; on the default model max |Δlogit| 1.0 of a range of 44, 61/64 top tokens the
#: same): the AMX path passes when it stays within that spread (it measured 0.98 and 61/64 where it was
#: compiled right); a wrongly loaded tile configuration gives garbage or a crash.
SPREAD_FACTOR = 1.5
ARGMAX_SLACK = 2
_PROBE_TOKENS = 64
_TIMEOUT_S = 120.0
#: kept with each verdict: a verdict of another probe version is no verdict (version 1 could compare two GPU
#: runs and call that "safe").
PROBE_VERSION = 2


@dataclass(frozen=True)
class AmxVerdict:
    """``safe``: the AMX path ran and matched the plain CPU path; ``why``: one line on what the probe saw;
    ``conclusive``: the probe reached a verdict on the build (a crash or a comparison), so it is kept —
    a time-out or a probe that could not run (no bundled model, say) is asked again next time."""

    safe: bool
    why: str
    conclusive: bool = True


def _cache_file() -> Path:
    return cache_dir() / "amx-probe.json"


def library_key() -> str:
    """Identity of the llama.cpp CPU backend that is loaded: its ``libggml-cpu*`` files beside libllama."""
    import llama_cpp.llama_cpp as low

    lib_dir = Path(low._lib._name).parent
    files = sorted({f.resolve() for f in lib_dir.glob("libggml-cpu*")}) or [Path(low._lib._name)]
    parts = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        parts.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def _run_probe(timeout_s: float) -> AmxVerdict:
    cmd = [sys.executable, "-m", "chatphase.engine.local.amx_probe"]
    try:
        done = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return AmxVerdict(False, f"the AMX probe did not finish in {timeout_s:g} s", conclusive=False)
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return AmxVerdict(False, f"this llama.cpp build's AMX kernels crash ({name} in the probe)")
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return AmxVerdict(False, f"the AMX probe failed (exit {done.returncode})", conclusive=False)
    amx_buffers = [b for b in result.get("extra_buffers", []) if b.upper().startswith("AMX")]
    if not amx_buffers:
        return AmxVerdict(True, "this llama.cpp build has no AMX kernels (its load made no AMX buffer)")
    diff, same, ref = result["max_abs_diff"], result["argmax_same"], result["ref_max_abs_diff"]
    if diff == 0.0:  # other kernels never agree to the bit: the AMX path did not run
        return AmxVerdict(False, "the AMX probe's two runs were identical: the AMX path was not tested", False)
    figures = f"max |Δlogit| {diff:.3g}, the plain path's own {ref:.3g}"
    if diff <= SPREAD_FACTOR * ref + 1e-3 and same >= result["ref_argmax_same"] - ARGMAX_SLACK:
        return AmxVerdict(True, f"this llama.cpp build's AMX kernels agree with the plain CPU path ({figures})")
    return AmxVerdict(
        False,
        f"this llama.cpp build's AMX kernels give other logits ({figures}; "
        f"{same}/{result['positions']} top tokens the same)",
    )


def amx_verdict(timeout_s: float = _TIMEOUT_S) -> AmxVerdict:
    """The verdict for the loaded llama.cpp build: from the cache, else from a probe (seconds, once)."""
    key = library_key()
    path = _cache_file()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    entry = cached.get(key)
    if isinstance(entry, dict) and entry.get("probe") == PROBE_VERSION:
        return AmxVerdict(bool(entry["safe"]), str(entry["why"]))
    verdict = _run_probe(timeout_s)
    if verdict.conclusive:
        cached = {k: v for k, v in cached.items() if isinstance(v, dict) and v.get("probe") == PROBE_VERSION}
        cached[key] = {"safe": verdict.safe, "why": verdict.why, "probe": PROBE_VERSION}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cached, indent=1))
            tmp.replace(path)
        except OSError:
            pass
    return verdict


def _logits(model_path: str, extra_bufts: bool, tokens: list[int], step: int) -> npt.NDArray[np.float32]:
    """Logits of every position of ``tokens``, evaluated ``step`` tokens per ``llama_decode`` on the CPU
    alone (no GPU device, no op offload): an array of shape (len(tokens), n_vocab).

    Raises:
        RuntimeError: the model or context could not be made, or a decode failed.
    """
    import ctypes

    import llama_cpp as lc
    import numpy as np

    no_devices = (ctypes.c_void_p * 1)(None)  # a NULL-terminated list with no device: CPU only
    mp = lc.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.devices = ctypes.cast(no_devices, ctypes.c_void_p)
    mp.use_extra_bufts = extra_bufts
    model = lc.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        raise RuntimeError("the model did not load")
    cp = lc.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 2 * len(tokens)
    cp.n_threads = cp.n_threads_batch = 2
    cp.op_offload = False
    ctx = lc.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("the context could not be made")
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    rows = []
    for start in range(0, len(tokens), step):
        part = tokens[start : start + step]
        batch = lc.llama_batch_init(len(part), 0, 1)
        for i, t in enumerate(part):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, start + i, 1, 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(part)
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        lc.llama_synchronize(ctx)
        rows.append(np.ctypeslib.as_array(lc.llama_get_logits(ctx), shape=(len(part) * n_vocab,)).copy())
        lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return np.concatenate(rows).reshape(len(tokens), n_vocab)


def _main() -> int:
    import llama_cpp as lc
    import numpy as np

    from chatphase.engine.llamalog import model_buffers
    from chatphase.models.resolve import default_model_path

    log: list[bytes] = []  # llama.cpp's load lines say which buffers the weights went to; nothing is printed
    keep = lc.llama_log_callback(lambda level, text, user_data: log.append(text))
    lc.llama_log_set(keep, None)
    lc.llama_backend_init()
    path = str(default_model_path())
    tokens = [1] + [(97 * i + 13) % 40000 + 100 for i in range(_PROBE_TOKENS - 1)]
    plain = _logits(path, False, tokens, len(tokens))
    single = _logits(path, False, tokens, 1)  # the plain path's own spread: other kernels, same maths
    log.clear()
    extra = _logits(path, True, tokens, len(tokens))
    extra_buffers = model_buffers(b"".join(log).decode("utf-8", "replace"))

    def compare(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> tuple[float, int]:
        return float(np.nan_to_num(np.abs(a - b), nan=np.inf).max()), int((a.argmax(axis=1) == b.argmax(axis=1)).sum())

    diff, same = compare(plain, extra)
    ref_diff, ref_same = compare(plain, single)
    result = {
        "max_abs_diff": diff,
        "argmax_same": same,
        "ref_max_abs_diff": ref_diff,
        "ref_argmax_same": ref_same,
        "extra_buffers": extra_buffers,
    }
    print(json.dumps(dict(result, positions=len(tokens))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
