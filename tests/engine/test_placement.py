"""Where llama.cpp put things, read from its own log lines and ggml's device list (no model, no GPU):
buffer sizes by kind and place, the flash-attention and allocation-failure lines, the silent slow paths,
why nothing is offloaded, and the quantised-V refusal."""

import ctypes

import pytest

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import BufferSize, DeviceInfo, memory_by_place
from chatphase.engine.llamalog import LlamaLogCapture
from chatphase.engine.local.ggml_devices import allocation_failure, buffer_sizes
from chatphase.engine.slow_paths import slow_paths, why_no_offload
from chatphase.errors import UsageError

VULKAN = DeviceInfo("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "gpu", 20 * 2**30, 24 * 2**30)
CPU = DeviceInfo("CPU", "Intel(R) Xeon(R) Processor", "cpu", 23 * 2**30, 24 * 2**30)

# llama.cpp's own lines, as its format strings print them (src/llama-model.cpp, llama-kv-cache.cpp,
# llama-context.cpp; ggml/src/ggml-alloc.c)
LOG = """load_tensors: offloaded 20/31 layers to GPU
load_tensors:   CPU_Mapped model buffer size =    30.52 MiB
load_tensors:      Vulkan0 model buffer size =    68.06 MiB
llama_context: Vulkan_Host  output buffer size =     0.19 MiB
llama_kv_cache:    Vulkan0 KV buffer size =    60.00 MiB
llama_kv_cache:        CPU KV buffer size =    30.00 MiB
llama_kv_cache: size =   90.00 MiB (  4096 cells,  30 layers,  1/1 seqs), K (f16):   45.00 MiB, V (f16):   45.00 MiB
llama_context: layer 0 is assigned to device Vulkan0 but Flash Attention is assigned to device CPU (usually due to missing support)
llama_context: Flash Attention not supported, set to disabled
llama_context:    Vulkan0 compute buffer size =    10.00 MiB
llama_context: Vulkan_Host compute buffer size =     2.00 MiB
llama_context:    Vulkan0 compute buffer size =    12.50 MiB
ggml_backend_alloc_ctx_tensors_from_buft_impl: failed to allocate Vulkan0 buffer of size 6442450944
"""


def feed(capture: LlamaLogCapture, text: str) -> None:
    for line in text.splitlines(keepends=True):
        capture.on_log(2, line.encode(), ctypes.c_void_p(0))


@pytest.fixture
def capture(tmp_path):
    cap = LlamaLogCapture(tmp_path / "engine.log", min_level=2)
    yield cap
    cap.close()


def test_buffer_lines_are_read_by_kind_and_place(capture):
    feed(capture, LOG)
    assert (capture.layers_offloaded, capture.layers_total) == (20, 31)
    mib = capture.buffer_mib()
    assert mib[("compute", "Vulkan0")] == 12.50  # printed again after a re-reserve: the last one counts
    assert mib[("KV", "Vulkan0")] == 60.0 and mib[("KV", "CPU")] == 30.0
    buffers = buffer_sizes(mib, (VULKAN, CPU))
    on = {(b.kind, b.buffer): b.on_device for b in buffers}
    assert on == {
        ("model", "CPU_Mapped"): False,
        ("model", "Vulkan0"): True,
        ("output", "Vulkan_Host"): False,  # pinned host memory is host memory
        ("KV", "Vulkan0"): True,
        ("KV", "CPU"): False,
        ("compute", "Vulkan0"): True,
        ("compute", "Vulkan_Host"): False,
    }
    place = memory_by_place(buffers)
    assert place["device"] == {"weights": round(68.06 * 2**20), "kv_cache": 60 * 2**20, "compute": round(12.5 * 2**20)}
    assert place["host"]["weights"] == round(30.52 * 2**20) and place["host"]["compute"] == 2 * 2**20
    assert capture.flash_attn_mismatch == ("Vulkan0", "CPU")
    assert capture.failed_allocation == ("Vulkan0", 6442450944)


def test_two_kv_caches_of_an_iswa_model_add_up(capture):
    feed(capture, "llama_kv_cache:    Vulkan0 KV buffer size =    12.00 MiB\n")
    feed(capture, "llama_kv_cache:    Vulkan0 KV buffer size =    60.00 MiB\n")
    assert capture.buffer_mib() == {("KV", "Vulkan0"): 72.0}


def test_a_failed_device_allocation_is_one_line_with_the_device_memory(monkeypatch):
    import chatphase.engine.local.ggml_devices as gd

    monkeypatch.setattr(gd, "devices", lambda: (VULKAN, CPU))
    line = allocation_failure(("Vulkan0", 6 * 2**30), {"n_ctx": 262144, "n_batch": 256})
    assert line.startswith("Vulkan0 could not allocate 6.0 GiB (20.0 GiB free) for a context of 262,144 tokens")
    assert "\n" not in line and "--n-ctx" in line
    assert allocation_failure(None, {"n_ctx": 1, "n_batch": 1}) is None


def _paths(buffers, offloaded=31, total=31, **kw):
    args = dict(
        layers_offloaded=offloaded,
        layers_total=total,
        buffers=buffers,
        amx=False,
        use_extra_bufts=True,
        flash_attn="auto",
        flash_attn_mismatch=None,
        type_k="f16",
        type_v="f16",
    )
    return slow_paths(**{**args, **kw})


def test_slow_paths_each_flagged_and_none_on_a_full_offload():
    on_device = (BufferSize("model", "Vulkan0", 1, True), BufferSize("KV", "Vulkan0", 1, True))
    assert _paths(on_device) == ()
    assert _paths((BufferSize("model", "CPU_Mapped", 1, False),), offloaded=0) == ()  # CPU only: nothing to flag
    (partial,) = _paths(on_device, offloaded=8)
    assert partial.startswith("partial offload: 8/31 layers on Vulkan0")
    (host_kv,) = _paths((BufferSize("model", "Vulkan0", 1, True), BufferSize("KV", "CPU", 1, False)))
    assert host_kv.startswith("KV cache on the host (CPU)") and "offload_kqv off" in host_kv
    (fa,) = _paths(on_device, flash_attn_mismatch=("Vulkan0", "CPU"), type_k="q8_0", type_v="q8_0")
    assert fa.startswith("flash attention off: Vulkan0 has no flash-attention kernel for K/V q8_0/q8_0")
    assert _paths(on_device, flash_attn="off", flash_attn_mismatch=("Vulkan0", "CPU")) == ()  # the user's choice
    (amx,) = _paths(on_device, amx=True, use_extra_bufts=False)
    assert amx.startswith("AMX off:")
    cpu_only = (BufferSize("model", "CPU_Mapped", 1, False),)
    (op,) = _paths(cpu_only, offloaded=0, op_offload_device="Vulkan0")  # 0 layers, yet prefill on the GPU
    assert op.startswith("prefill of the CPU layers on Vulkan0: ") and "--no-op-offload" in op


def test_op_offload_reaches_llama_cpps_context_params():
    from chatphase.engine.config import EngineConfig
    from chatphase.engine.local.llama_params import context_params

    assert context_params(EngineConfig().resolved()).op_offload is True
    assert context_params(EngineConfig(op_offload=False).resolved()).op_offload is False


def test_why_nothing_is_offloaded():
    assert why_no_offload(("CPU",), (CPU,), None) == "CPU-only build: no GPU support in this llama.cpp"
    hidden = why_no_offload(("Vulkan", "CPU"), (CPU,), None)
    assert hidden.startswith("the Vulkan backend found no GPU device") and "GGML_VK_VISIBLE_DEVICES=0" in hidden
    assert why_no_offload(("Vulkan", "CPU"), (VULKAN, CPU), 0) == "n_gpu_layers is 0 (--n-gpu-layers)"
    assert why_no_offload(("Vulkan", "CPU"), (VULKAN, CPU), None) is None
    assert why_no_offload(("CUDA", "CPU"), (CPU,), -1) == "the CUDA backend found no GPU device"
    # a build with the RPC backend: without --rpc it says how to reach rpc-servers; with them registered they
    # take layers as a GPU's would (and n_gpu_layers 0 is said as for a GPU)
    rpc_build = why_no_offload(("CPU", "RPC"), (CPU,), None)
    assert rpc_build and "RPC backend offloads to rpc-servers (--rpc HOST:PORT)" in rpc_build
    assert "CPU-only" not in rpc_build
    server = DeviceInfo("RPC0", "127.0.0.1:50052", "gpu", 2**30, 2**30, host="127.0.0.1:50052")
    assert why_no_offload(("CPU", "RPC"), (server, CPU), None) is None
    assert why_no_offload(("CPU", "RPC"), (server, CPU), 0) == "n_gpu_layers is 0 (--n-gpu-layers)"
    # scripts/llama_build.sh's libraries: Vulkan and RPC, no Vulkan device visible: both ways are said
    both = why_no_offload(("CPU", "RPC", "Vulkan"), (CPU,), None)
    assert both and both.startswith("the Vulkan backend found no GPU device") and both.endswith("(--rpc HOST:PORT)")


def test_a_quantised_v_cache_without_flash_attention_is_refused_before_llama_cpp():
    with pytest.raises(UsageError, match=r"quantised V cache .*needs flash attention"):
        EngineConfig(type_v="q8_0", flash_attn="off").validate()
    EngineConfig(type_v="q8_0", flash_attn="auto").validate()
    EngineConfig(type_k="q8_0", flash_attn="off").validate()  # a quantised K cache runs without it


def test_the_device_registry_lists_this_build():
    """ggml's registry through ctypes on the loaded libggml: at least the CPU backend and device."""
    from chatphase.engine.local import ggml_devices

    assert "CPU" in ggml_devices.backends()
    cpu = [d for d in ggml_devices.devices() if d.type == "cpu"]
    assert cpu and cpu[0].total_bytes > 0 and 0 < cpu[0].free_bytes <= cpu[0].total_bytes


def test_a_gpu_backend_that_did_not_start_is_still_the_builds_and_found_no_device(monkeypatch, tmp_path):
    """Seen on an NVIDIA H200 whose Vulkan driver the loader could not open: ggml registered no Vulkan backend
    (its instance failed), and the engine said "CPU-only build" of a Vulkan build. The build's backends are
    read from its libraries too, so the reason is the device, not the build."""
    import chatphase.engine.local.ggml_devices as gd

    for name in ("libggml.so", "libggml-base.so.0", "libggml-cpu.so.0.25.3", "libggml-vulkan.so.0.25.3",
                 "libggml-vulkan.so", "libggml-cuda.so", "libggml-rpc.so", "libllama.so"):  # fmt: skip
        (tmp_path / name).touch()
    assert gd.built_gpu_backends(tmp_path) == ("CUDA", "Vulkan")

    class Registry:  # ggml's registry with the CPU backend alone
        def ggml_backend_reg_count(self):
            return 1

        def ggml_backend_reg_get(self, i):
            return i

        def ggml_backend_reg_name(self, reg):
            return b"CPU"

    (tmp_path / "libggml-cuda.so").unlink()
    monkeypatch.setattr(gd, "_libggml", Registry)
    monkeypatch.setattr(gd, "lib_folder", lambda: tmp_path)
    assert gd.backends() == ("Vulkan", "CPU")
    why = why_no_offload(gd.backends(), (CPU,), -1)
    assert why.startswith("the Vulkan backend found no GPU device; a GPU needs its Vulkan driver")
    (tmp_path / "libggml-vulkan.so").unlink()
    (tmp_path / "libggml-vulkan.so.0.25.3").unlink()
    assert why_no_offload(gd.backends(), (CPU,), -1) == "CPU-only build: no GPU support in this llama.cpp"


def test_a_kv_cache_larger_than_the_device_is_refused_before_loading(monkeypatch, default_model_info):
    import chatphase.engine.local.ggml_devices as gd

    small = DeviceInfo("Vulkan0", "llvmpipe", "gpu", 2 * 2**30, 2 * 2**30)
    monkeypatch.setattr(gd, "devices", lambda: (small, CPU))
    s = {"n_ctx": 262144, "type_k": "f16", "type_v": "f16", "offload_kqv": True}
    line = gd.kv_too_big_for_device(default_model_info, s, 10**9)
    assert line.startswith("the KV cache on Vulkan0 would take 5.6 GiB at n_ctx 262,144, more than its 2.0 GiB")
    half = gd.kv_too_big_for_device(default_model_info, s, default_model_info.n_layer // 3)  # a third: 1.9 GiB
    assert half is None
    assert gd.kv_too_big_for_device(default_model_info, {**s, "offload_kqv": False}, 10**9) is None
    assert gd.kv_too_big_for_device(default_model_info, {**s, "n_ctx": 4096}, 10**9) is None
    monkeypatch.setattr(gd, "devices", lambda: (CPU,))
    assert gd.kv_too_big_for_device(default_model_info, s, 10**9) is None  # no device: nothing to refuse


def test_the_panel_texts_of_a_partial_offload(default_model_info):
    from chatphase.engine.events import LoadedModel, LoadedSettings
    from chatphase.ui.dashboard.system_figures import device_lines, gpu_offload_text, memory_text

    buffers = (
        BufferSize("model", "CPU_Mapped", 30 * 2**20, False),
        BufferSize("model", "Vulkan0", 68 * 2**20, True),
        BufferSize("KV", "Vulkan0", 6 * 2**20, True),
        BufferSize("compute", "Vulkan0", 10 * 2**20, True),
        BufferSize("output", "Vulkan_Host", 2**19, False),
    )
    loaded = LoadedModel(
        default_model_info, LoadedSettings(gpu_offload_supported=True), 1.0, 1, 1, 20, 31,
        backends=("Vulkan", "CPU"), devices=(VULKAN, CPU), buffers=buffers,
    )  # fmt: skip
    assert memory_text(loaded) == (
        "device: weights 68.0 MiB · KV 6.0 MiB · compute 10.0 MiB; host: weights 30.0 MiB · output 512.0 KiB"
    )
    assert device_lines(loaded) == [
        "Vulkan0 · llvmpipe (LLVM 15.0.6, 256 bits) · gpu · 20.0 GiB free of 24.0 GiB · engine holds 84.0 MiB"
    ]
    # the model's count of layers (llama.cpp's 31: + output, offloaded first)
    assert gpu_offload_text(loaded) == "on (19/30 layers + output)"
    from chatphase.ui.dashboard.system_figures import system_lines

    lines = system_lines(loaded, None)
    assert "GPU offload on (19/30 layers + output) · GPU memory – · backends Vulkan, CPU" in lines
    assert f"device {device_lines(loaded)[0]}" in lines and f"memory {memory_text(loaded)}" in lines
    hidden = LoadedModel(default_model_info, LoadedSettings(gpu_offload_supported=False), 1.0, 1, 1, 0, 31,
                         backends=("Vulkan", "CPU"), devices=(CPU,))  # fmt: skip
    assert gpu_offload_text(hidden).startswith("off (the Vulkan backend found no GPU device")


def test_where_each_layer_lives(default_model_info):
    """n_gpu_layers 20 of a 30-layer model, as llama.cpp assigns them (the output layer, then blocks 11-29, on the
    GPU): one line per place with its layers and its buffers, the GPU first; the panel shows them once a layer is
    offloaded, the System tab always."""
    from dataclasses import replace

    from chatphase.engine.events import LayerPlacement, LoadedModel, LoadedSettings
    from chatphase.engine.local.llama import placement
    from chatphase.ui.dashboard.system_figures import placement_lines, system_lines

    assigned = {i: "CPU" for i in range(11)} | {i: "Vulkan0" for i in range(11, 31)}  # 30 = the output layer
    places = placement(assigned, 30)
    assert places == (
        LayerPlacement("CPU", tuple(range(11)), False),
        LayerPlacement("Vulkan0", tuple(range(11, 30)), True),
    )
    buffers = (
        BufferSize("model", "CPU_Mapped", 30 * 2**20, False),
        BufferSize("model", "Vulkan0", 68 * 2**20, True),
        BufferSize("KV", "Vulkan0", 6 * 2**20, True),
        BufferSize("KV", "CPU", 3 * 2**20, False),
        BufferSize("compute", "Vulkan0", 10 * 2**20, True),
        BufferSize("output", "Vulkan_Host", 2**19, False),
    )
    loaded = LoadedModel(
        default_model_info, LoadedSettings(gpu_offload_supported=True), 1.0, 1, 1, 20, 31,
        backends=("Vulkan", "CPU"), devices=(VULKAN, CPU), buffers=buffers, placement=places,
    )  # fmt: skip
    assert placement_lines(loaded) == [
        "Vulkan0 · layers 11-29 + output · weights 68.0 MiB · KV 6.0 MiB · compute 10.0 MiB",
        "host · layers 0-10 · weights 30.0 MiB · KV 3.0 MiB · output 512.0 KiB",
    ]
    assert [line for line in system_lines(loaded, None) if line.startswith("layers on ")] == [
        f"layers on {line}" for line in placement_lines(loaded)
    ]
    assert placement_lines(replace(loaded, placement=())) == []


@pytest.mark.parametrize(
    ("after", "shown"),
    [
        # llvmpipe, measured: no VK_EXT_memory_budget, so ggml reports the heap as free before and after the load
        (2 * 2**30, "2.0 GiB · reports no usage (free = total) · engine holds 231.2 MiB"),
        # a device that counts usage: free went down by what was allocated (and more, the driver's own)
        (2 * 2**30 - 300 * 2**20, "1.7 GiB free of 2.0 GiB · engine holds 231.2 MiB"),
    ],
)
def test_the_device_line_says_what_the_engine_holds_and_whether_the_device_counts_usage(
    default_model_info, after, shown
):
    """Issue 32: on llvmpipe the device's free memory stayed at its total after a full offload, read fresh
    after the load (measured: 2147483648 free of 2147483648 before, after the load and after a turn), so
    "2.0 GiB free of 2.0 GiB" looked stale. The buffers are the default model's at n_ctx 4096, all layers
    on Vulkan0, as llama.cpp printed them."""
    from chatphase.engine.events import LoadedModel, LoadedSettings
    from chatphase.ui.dashboard.system_figures import device_lines, system_lines

    before = DeviceInfo("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "gpu", 2 * 2**30, 2 * 2**30)
    buffers = (
        BufferSize("model", "CPU_Mapped", round(28.69 * 2**20), False),
        BufferSize("model", "Vulkan0", round(92.10 * 2**20), True),
        BufferSize("output", "Vulkan_Host", round(0.19 * 2**20), False),
        BufferSize("KV", "Vulkan0", round(90.00 * 2**20), True),
        BufferSize("compute", "Vulkan0", round(49.12 * 2**20), True),
        BufferSize("compute", "Vulkan_Host", round(3.13 * 2**20), False),
    )
    loaded = LoadedModel(
        default_model_info, LoadedSettings(gpu_offload_supported=True), 1.0, 1, 1, 31, 31,
        backends=("Vulkan", "CPU"), devices=(DeviceInfo(**{**before.__dict__, "free_bytes": after}), CPU),
        buffers=buffers,
    )  # fmt: skip
    (line,) = device_lines(loaded)
    assert line == f"Vulkan0 · llvmpipe (LLVM 15.0.6, 256 bits) · gpu · {shown}"
    assert f"device {line}" in system_lines(loaded, None)  # the System tab shows the same line
    no_buffers = LoadedModel(default_model_info, LoadedSettings(gpu_offload_supported=True), 1.0, 1, 1, 31, 31,
                             backends=("Vulkan", "CPU"), devices=(before,))  # fmt: skip
    assert device_lines(no_buffers) == [
        "Vulkan0 · llvmpipe (LLVM 15.0.6, 256 bits) · gpu · 2.0 GiB · reports no usage (free = total)"
    ]


def test_how_flash_attention_auto_resolved_is_read_from_the_log(capture):
    assert capture.flash_attn_enabled is None
    feed(capture, "llama_context: flash_attn            = auto\n")
    assert capture.flash_attn_enabled is None
    feed(capture, "resolve_fused_ops: Flash Attention enabled\n")
    assert capture.flash_attn_enabled is True
    feed(capture, "resolve_fused_ops: Flash Attention not supported, set to disabled\n")
    assert capture.flash_attn_enabled is False
