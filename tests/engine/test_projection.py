"""llama.cpp's memory projection (chatphase/engine/local/projection.py) against the real load: for the default model,
Gemma 3 270M (sliding-window layers) and synthetic Llama 3.2 1B and 3.1 8B, the plan's per-device totals are within 3 % of
llama.cpp's own buffer lines after the load; chatphase's quick estimate (chatphase/models/memory.py, the picker's)
against the projection; an 8B plan reads no weights; the bindings' structs against the vendored llama.h; and a
build where the projection cannot be read gives one line, not a crash."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import LayerPlacement, ModelLoaded
from chatphase.engine.local import llama_ext
from chatphase.engine.local.llama import LlamaEngine
from chatphase.engine.local.llama_ext import ProjectionUnavailable
from chatphase.engine.local.projection import fit_layers, project
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.memory import estimate
from chatphase.models.synth import plan as synth_plan
from chatphase.models.synth import write_synthetic
from chatphase.models.synth_shapes import SHAPES

pytestmark = pytest.mark.model

#: the vendored llama.cpp of the installed llama-cpp-python, where scripts/llama_build.sh unpacks it.
VENDORED_H = (
    Path.home() / ".cache/chatphase/llama-cpp-0.3.36-src/llama_cpp_python-0.3.36/vendor/llama.cpp/include/llama.h"
)


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synth")


@pytest.fixture(scope="session")
def synth_1b(synth_dir):
    """A synthetic Llama 3.2 1B (Q4_0), its tensor data a hole of zeros: a real load maps zeros, no disk used."""
    return read_model_info(
        write_synthetic(synth_plan(SHAPES["llama-3.2-1b"], "Q4_0"), synth_dir / "1b.gguf", layout_only=True)
    )


@pytest.fixture(scope="session")
def synth_8b(synth_dir):
    return read_model_info(
        write_synthetic(synth_plan(SHAPES["llama-3.1-8b"], "Q4_0"), synth_dir / "8b.gguf", layout_only=True)
    )


def real_load(info, config: EngineConfig, tmp_path):
    engine = LlamaEngine(info, config, log_path=tmp_path / "engine.log")
    events = list(engine.load())
    assert isinstance(events[-1], ModelLoaded), events
    return engine, events[-1].model


def check_against_real_load(info, tmp_path, extra_bufts: str):
    config = EngineConfig(n_ctx=2048, extra_bufts=extra_bufts)
    engine, loaded = real_load(info, config, tmp_path)
    try:
        s = config.resolved()
        plan = project(info.path, s, loaded.settings.n_gpu_layers or 0, bool(loaded.settings.use_extra_bufts), 0)
    finally:
        engine.close()
    by_kind: dict[str, int] = {}
    for b in loaded.buffers:
        by_kind[b.kind] = by_kind.get(b.kind, 0) + b.bytes
    host = plan.host
    assert host is not None and not plan.gpus  # this machine: the host alone
    # each part, and the total, within 3 % of llama.cpp's own lines (printed in MiB with 2 decimals)
    assert host.kv_cache_bytes == pytest.approx(by_kind["KV"], rel=0.03, abs=6_000)
    assert host.compute_bytes == pytest.approx(by_kind["compute"], rel=0.03)
    assert host.output_bytes == pytest.approx(by_kind["output"], abs=6_000)
    mapped = sum(b.bytes for b in loaded.buffers if b.buffer == "CPU_Mapped")
    if mapped and any(b.buffer == "CPU_REPACK" for b in loaded.buffers):
        # CPU_Mapped maps the file's whole tensor range, repacked tensors' bytes included: what is allocated agrees
        assert host.allocated_bytes == pytest.approx(sum(by_kind.values()) - mapped, rel=0.03)
        assert host.mapped_bytes < mapped
    else:
        assert host.planned_bytes == pytest.approx(sum(by_kind.values()), rel=0.03)
        assert host.mapped_bytes == pytest.approx(mapped, rel=0.03)
    assert host.layers == tuple(range(info.n_layer)) and host.output_layer
    assert loaded.placement == (LayerPlacement("CPU", host.layers, True),)  # where the load put them: the plan's
    assert sum(c.bytes for c in plan.kv_caches) == host.kv_cache_bytes
    assert plan.n_ctx == loaded.settings.n_ctx
    return plan


@pytest.mark.parametrize("extra_bufts", ["off", "auto"])
def test_default_model_plan_matches_the_load(default_model_info, tmp_path, extra_bufts):
    plan = check_against_real_load(default_model_info, tmp_path, extra_bufts)
    assert [(c.kind, c.layers, c.type_k) for c in plan.kv_caches] == [("full", 30, "f16")]


@pytest.mark.parametrize("extra_bufts", ["off", "auto"])
def test_gemma_plan_matches_the_load_with_its_sliding_window_cache(gemma_model_info, tmp_path, extra_bufts):
    plan = check_against_real_load(gemma_model_info, tmp_path, extra_bufts)
    # llama.cpp's two caches: 3 global layers and 15 sliding-window ones (a full-size SWA cache by default)
    assert [(c.kind, c.layers, c.cells) for c in plan.kv_caches] == [("full", 3, 2048), ("swa", 15, 2048)]


@pytest.mark.parametrize("extra_bufts", ["off", "auto"])
def test_synthetic_1b_plan_matches_the_load(synth_1b, tmp_path, extra_bufts):
    check_against_real_load(synth_1b, tmp_path, extra_bufts)


def test_synthetic_8b_plan_matches_the_load(synth_8b, tmp_path):
    """The 8B too (its file a hole of zeros: the load maps it, nothing is read from a disk); without the extra buffer
    types, which would repack 4.3 GiB of weights into memory for nothing the plan checks."""
    plan = check_against_real_load(synth_8b, tmp_path, "off")
    assert [(c.kind, c.layers) for c in plan.kv_caches] == [("full", 32)]


@pytest.mark.parametrize("which", ["default", "gemma", "1b", "8b"])
def test_the_pickers_quick_estimate_agrees_with_the_projection(request, which):
    """models/memory.py estimates without llama.cpp (the picker lists many models): its KV cache is llama.cpp's
    exactly, its total within 10 % of the projection; compute errs high, within 25 %."""
    fixture = {"default": "default_model_info", "gemma": "gemma_model_info", "1b": "synth_1b", "8b": "synth_8b"}
    info = request.getfixturevalue(fixture[which])
    config = EngineConfig(n_ctx=4096)
    s = config.resolved()
    plan = project(info.path, s, 0, False, 0)
    est = estimate(info, 4096, config.n_ubatch_used, "f16", "f16")
    host = plan.host
    assert host is not None
    assert est.kv_cache_bytes == host.kv_cache_bytes
    assert est.total_bytes == pytest.approx(plan.total_bytes, rel=0.10)
    assert host.compute_bytes <= est.compute_bytes <= 1.25 * host.compute_bytes


def _read_chars() -> int:
    return int(re.search(r"rchar: (\d+)", Path("/proc/self/io").read_text()).group(1))


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="reads /proc/self/io (Linux)")
def test_an_8b_plan_reads_no_weights(synth_8b):
    s = EngineConfig(n_ctx=8192).resolved()
    project(synth_8b.path, s, 0, False, 0)  # llama.cpp's first load initialises its backends
    before = _read_chars()
    plan = project(synth_8b.path, s, 0, False, 0)
    read = _read_chars() - before
    assert plan.host is not None and plan.host.weights_bytes > 4 * 2**30
    assert read < 64 * 2**20, f"read {read:,} bytes of a {synth_8b.size_bytes:,}-byte file"
    assert plan.kv_caches[0].bytes == 8192 * 32 * 2 * 8 * 128 * 2  # n_ctx × layers × K,V × KV heads × head dim × f16


def test_a_missing_symbol_is_one_line_and_auto_falls_back_to_every_layer(default_model_info, monkeypatch):
    monkeypatch.setattr(llama_ext, "BREAKDOWN_SYMBOL", "_Z_no_such_symbol")
    llama_ext._breakdown_fn.cache_clear()
    try:
        s = EngineConfig(n_ctx=512).resolved()
        with pytest.raises(ProjectionUnavailable, match=r"^this libllama has no llama_get_memory_breakdown") as e:
            project(default_model_info.path, s, 0, False, 0)
        assert "\n" not in str(e.value)
        fit = fit_layers(default_model_info.path, s, 30, False, gpu_ok=True, why_not=None)
        assert fit.n_gpu_layers == 31 and fit.plan is None
        assert fit.why == f"auto: every layer, as without a plan ({e.value})"
    finally:
        llama_ext._breakdown_fn.cache_clear()


def test_another_platform_is_one_line(monkeypatch):
    monkeypatch.setattr(llama_ext.platform, "machine", lambda: "aarch64")
    llama_ext._breakdown_fn.cache_clear()
    try:
        with pytest.raises(ProjectionUnavailable, match=r"x86-64 Linux C\+\+ ABI; not on linux aarch64$"):
            llama_ext._breakdown_fn()
    finally:
        llama_ext._breakdown_fn.cache_clear()


def test_cpu_only_auto_is_zero_layers_with_the_reason_and_no_projection(default_model_info, monkeypatch):
    def no_projection(*args, **kwargs):
        raise AssertionError("projected")

    monkeypatch.setattr("chatphase.engine.local.projection.project", no_projection)
    s = EngineConfig().resolved()
    why = "CPU-only build: no GPU support in this llama.cpp"
    fit = fit_layers(default_model_info.path, s, 30, False, gpu_ok=False, why_not=why)
    assert (fit.n_gpu_layers, fit.why, fit.plan) == (0, f"auto: 0 layers, {why}", None)


def _fields_of(header: str, struct: str) -> list[str]:
    body = re.search(rf"struct {struct} {{(.*?)\n    }};", header, re.S)
    assert body, struct
    names = []
    for line in body.group(1).splitlines():
        line = line.split("//")[0].strip()
        if m := re.match(r"(?:const\s+)?(?:struct\s+|enum\s+)?[\w\s\*]+?[\s\*](\w+)\s*;$", line):
            names.append(m.group(1))
    return names


@pytest.mark.skipif(not VENDORED_H.is_file(), reason="the vendored llama.cpp source is not unpacked")
@pytest.mark.parametrize("struct", ["llama_model_params", "llama_context_params"])
def test_the_bindings_structs_are_the_vendored_headers(struct):
    """The projection sets ``no_alloc`` and ``load_mode`` through the bindings' ``llama_model_params``: its fields must
    be llama.h's, in order (a field missing before them would shift them)."""
    import llama_cpp

    ours = [name for name, *_ in getattr(llama_cpp, struct)._fields_]
    assert ours == _fields_of(VENDORED_H.read_text(), struct)


def test_auto_on_the_real_projection_of_the_default_model(default_model_info):
    """With GPU offload said to be there but no GPU device in llama.cpp's plan (this machine), auto projects every
    layer and chooses none, saying so; the plan it keeps is the real one."""
    s = EngineConfig(n_ctx=1024).resolved()
    fit = fit_layers(default_model_info.path, s, 30, False, gpu_ok=True, why_not=None)
    assert (fit.n_gpu_layers, fit.why) == (0, "auto: no GPU device in llama.cpp's plan")
    assert fit.plan is not None and fit.plan.host is not None and fit.plan.host.kv_cache_bytes == 1024 * 23_040


def _fake_gpu_engine(monkeypatch, fit):
    """The engine on a build said to offload, its fit the given :class:`FitResult` (llama.cpp, with no device here,
    offloads nothing whatever the count)."""
    from chatphase.engine.local import ggml_devices
    from chatphase.engine.local import llama as engine_module

    asked = []
    monkeypatch.setattr(ggml_devices, "can_offload", lambda: True)
    monkeypatch.setattr(engine_module, "fit_layers", lambda *a, **k: asked.append((a, k)) or fit)
    return asked


def test_engine_loads_the_count_auto_chose_and_says_why(default_model_info, tmp_path, monkeypatch):
    from chatphase.engine.memory_plan import FitResult

    why = "auto: 12 (11/30 layers + output) fit: Vulkan0 1.0 GiB of 2.0 GiB, 1.0 GiB left; one more would leave …"
    asked = _fake_gpu_engine(monkeypatch, FitResult(12, why, None))
    engine, loaded = real_load(default_model_info, EngineConfig(n_ctx=512), tmp_path)
    engine.close()
    assert asked and asked[0][0][1]["n_gpu_layers"] is None  # auto reached the fit
    assert (loaded.settings.n_gpu_layers, loaded.settings.n_gpu_layers_why) == (12, why)
    assert f"n_gpu_layers {why}" in loaded.notes
    assert loaded.settings.to_dict()["n_gpu_layers_why"] == why  # ask --json's settings


def test_engine_refuses_a_count_that_would_not_fit_before_loading(default_model_info, tmp_path, monkeypatch):
    from chatphase.engine.events import EngineFailed
    from chatphase.engine.memory_plan import FitResult

    line = "n_gpu_layers 31 (30/30 layers + output) would not fit Vulkan0: it needs 3.8 GiB there (…)"
    _fake_gpu_engine(monkeypatch, FitResult(31, None, None, refusal=line))
    engine = LlamaEngine(default_model_info, EngineConfig(n_ctx=512, n_gpu_layers=-1), log_path=tmp_path / "e.log")
    events = list(engine.load())
    engine.close()
    assert events == [EngineFailed(line, fatal=True)]
    assert "llama_model_loader" not in (tmp_path / "e.log").read_text()  # refused before llama.cpp read the file


def test_n_ctx_auto_loads_the_largest_context_that_fits(default_model_info, tmp_path):
    """``n_ctx auto`` on this machine (the host alone): the default model's training context fits the host's
    available memory, so the load runs at it and says why (the load notice, LoadedSettings, ask --json)."""
    engine, loaded = real_load(default_model_info, EngineConfig(n_ctx=None), tmp_path)
    engine.close()
    train = default_model_info.n_ctx_train
    assert train and loaded.settings.n_ctx == train
    why = loaded.settings.n_ctx_why
    assert why is not None and why.startswith(f"auto: {train:,}, the model's training context, fits: host allocates ")
    assert f"n_ctx {why}" in loaded.notes
    assert loaded.settings.to_dict()["n_ctx_why"] == why
    assert loaded.llama_kv_cache_bytes == train * 23_040  # llama.cpp's own cache, at the chosen size


def test_a_draft_model_is_counted_in_the_plan(default_model_info):
    """``spec draft:MODEL``: the draft model's own projection (its load and its one-sequence context, as the engine
    makes them) is added on each device, and the plan names it; without a draft the plan is the target's alone."""
    s = EngineConfig(n_ctx=1024, spec="draft:default").resolved()
    fit = fit_layers(default_model_info.path, s, 30, False, gpu_ok=False, why_not="CPU-only build", plan_always=True)
    alone = project(default_model_info.path, {**s, "spec": "off"}, 0, False, 0)
    draft = project(default_model_info.path, {**s, "n_seq_max": 1}, 0, False, 0)
    plan = fit.plan
    assert plan is not None and plan.host is not None and alone.host is not None and draft.host is not None
    assert plan.draft_model == default_model_info.path.rsplit("/", 1)[-1]
    assert plan.host.draft_bytes == draft.host.planned_bytes > 0
    assert plan.host.planned_bytes == alone.host.planned_bytes + draft.host.planned_bytes
    assert plan.host.mapped_bytes == alone.host.mapped_bytes + draft.host.mapped_bytes
    assert any(n.startswith(f"with the draft model {plan.draft_model} (spec draft:): host ") for n in plan.notes)
    missing = fit_layers(default_model_info.path, {**s, "spec": "draft:/nonexistent/d.gguf"}, 30, False,
                         gpu_ok=False, why_not="CPU-only build", plan_always=True)  # fmt: skip
    assert missing.plan is not None and missing.plan.draft_model is None and missing.plan.host is not None
    assert missing.plan.host.draft_bytes == 0
    assert any(n.startswith("the draft model is not counted: ") for n in missing.plan.notes)


def test_a_moe_models_experts_can_be_planned_on_the_host(tmp_path):
    """A synthetic mixture-of-experts model (Qwen3 MoE's tensors, tiny): its expert tensors are found, and the
    projection with them kept on the host (llama.cpp's -ot exps=CPU, through tensor_buft_overrides) is made and
    says so; on this machine (the host alone) every byte is on the host either way."""
    from chatphase.engine.local.projection import has_experts

    moe = write_synthetic(synth_plan(SHAPES["tiny-qwen3moe"], "Q4_0"), tmp_path / "moe.gguf")
    dense = write_synthetic(synth_plan(SHAPES["tiny-qwen3"], "Q4_0"), tmp_path / "dense.gguf")
    assert has_experts(str(moe)) and not has_experts(str(dense))
    s = EngineConfig(n_ctx=512).resolved()
    plain = project(str(moe), s, 0, False, 0)
    kept = project(str(moe), s, 0, False, 0, experts_on_host=True)
    assert kept.experts_on_host and not plain.experts_on_host
    assert kept.host is not None and plain.host is not None
    assert kept.host.planned_bytes == plain.host.planned_bytes and kept.host.layers == plain.host.layers == (0, 1)


def test_an_rpc_build_with_no_server_sends_no_layer_to_no_device(default_model_info, tmp_path, monkeypatch):
    """llama.cpp's ``llama_supports_gpu_offload`` is true for any build with the RPC backend (scripts/llama_build.sh's
    libraries), servers or none. With no device to take them, ``--n-gpu-layers -1`` is said to be ignored, and why;
    the layers stay on the CPU, and no slow path speaks of a device that is not there."""
    import llama_cpp

    from chatphase.engine.local import ggml_devices

    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    monkeypatch.setattr(ggml_devices, "backends", lambda: ("CPU", "RPC"))
    engine, loaded = real_load(default_model_info, EngineConfig(n_ctx=512, n_gpu_layers=-1), tmp_path)
    engine.close()
    why = "no GPU backend in this llama.cpp; its RPC backend offloads to rpc-servers (--rpc HOST:PORT)"
    assert f"n_gpu_layers=-1 ignored: {why}" in loaded.notes
    assert loaded.settings.n_gpu_layers == 0 and not loaded.settings.gpu_offload_supported
    assert not any("device" in line for line in loaded.slow_paths), loaded.slow_paths
