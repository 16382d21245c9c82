"""Run in a child process by tests/engine/test_gpu_vulkan.py, under whichever llama.cpp build its environment picks
(``LLAMA_CPP_LIB_PATH``): prints one JSON object on stdout.

``greedy N_GPU_LAYERS STEPS``: greedy decoding of a fixed prompt on llama.cpp's C API directly (not the
engine, so the comparison between backends does not go through the code under test): per step the chosen
token and the logits of the top 20 tokens. ``panel [ENGINE SETTINGS AS JSON]``: the engine's LoadedModel as
the panel shows it (device lines, memory text, offload text, slow paths), and ggml's device memory readings
(``ggml_backend_dev_memory``, ``{name: [free, total]}``) before and after the load and in the loaded event.
"""

from __future__ import annotations

import ctypes
import json
import sys

import numpy as np

PROMPT = "The capital of France is"


def greedy(n_gpu_layers: int, steps: int) -> dict:
    import llama_cpp as lc

    from chatphase.models.resolve import default_model_path

    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.n_gpu_layers = n_gpu_layers
    mp.use_extra_bufts = False  # Intel AMX CPUs crash on batched prefill with them (tests run on both kinds)
    model = lc.llama_model_load_from_file(str(default_model_path()).encode(), mp)
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 256, 64, 2, 2
    ctx = lc.llama_init_from_model(model, cp)
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    buf = (lc.llama_token * 64)()
    n = lc.llama_tokenize(vocab, PROMPT.encode(), len(PROMPT), buf, 64, True, True)
    tokens = list(buf[:n])
    out = []
    batch = tokens
    for _ in range(steps):
        arr = (lc.llama_token * len(batch))(*batch)
        if lc.llama_decode(ctx, lc.llama_batch_get_one(arr, len(batch))) != 0:
            raise RuntimeError("llama_decode failed")
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
        top = np.argsort(logits)[::-1][:20]
        out.append({"token": int(top[0]), "top": {int(t): float(logits[t]) for t in top}})
        batch = [int(top[0])]
    piece = ctypes.create_string_buffer(64)
    text = b""
    for step in out:
        k = lc.llama_token_to_piece(vocab, step["token"], piece, 64, 0, False)
        text += piece.raw[: max(k, 0)]
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return {"steps": out, "text": text.decode(errors="replace"), "prompt_tokens": n}


def panel(settings: dict) -> dict:
    from chatphase.engine.config import EngineConfig
    from chatphase.engine.events import ModelLoaded
    from chatphase.engine.local import ggml_devices
    from chatphase.engine.local.llama import LlamaEngine
    from chatphase.models.gguf_meta import read_model_info
    from chatphase.models.resolve import default_model_path
    from chatphase.ui.dashboard.system_figures import device_lines, gpu_offload_text, memory_text

    def readings() -> dict:
        return {d.name: [d.free_bytes, d.total_bytes] for d in ggml_devices.devices()}

    path = settings.pop("model_path", None) or default_model_path()  # a file of the test's own, or the default
    before = readings()  # ggml_backend_dev_memory before the load, and after it (the engine still open)
    engine = LlamaEngine(read_model_info(path), EngineConfig(**settings))
    try:
        (event,) = engine.load()
        after = readings()
    finally:
        engine.close()
    if not isinstance(event, ModelLoaded):
        return {"error": event.message}
    loaded = event.model
    return {
        "devices": device_lines(loaded),
        "memory": memory_text(loaded),
        "offload": gpu_offload_text(loaded),
        "slow_paths": list(loaded.slow_paths),
        "n_gpu_layers": loaded.settings.n_gpu_layers,
        "n_gpu_layers_why": loaded.settings.n_gpu_layers_why,
        "log_path": loaded.log_path,
        "read_before": before,
        "read_after": after,
        "loaded_devices": {d.name: [d.free_bytes, d.total_bytes] for d in loaded.devices},
    }


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "greedy":
        result = greedy(int(sys.argv[2]), int(sys.argv[3]))
    else:
        result = panel(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
    print(json.dumps(result))
