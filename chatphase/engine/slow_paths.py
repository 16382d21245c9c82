"""Silent slow paths: placements and settings under which llama.cpp runs, correctly, but far slower than
the user may expect, and says so at most in its log. One plain line each, shown at load and in the panel.

- a partial offload: some layers on the device, the rest on the CPU, activations crossing every token;
- the KV cache in host memory while layers are on the device (``offload_kqv`` off): attention reads it
  across the bus (or runs on the CPU) at every token;
- flash attention wanted (``auto``) but turned off because the layer's device has no kernel for it with
  these K/V types (llama.cpp: ``layer N is assigned to device X but Flash Attention is assigned to device
  CPU``); a quantised V cache needs flash attention, so llama.cpp refuses that one outright
  (:func:`quantised_v_without_flash_attn`), it does not run slowly;
- layers on the CPU of a machine with a GPU, and llama.cpp's ``op_offload`` on (its default): a large batch's
  matrix products of those layers run on the GPU, their weights copied over for every batch. A fast GPU gains
  (seen: an 8B's prefill at 0 layers on an H200, 470 tok/s); a weak one loses many times over (Mesa's
  llvmpipe: 8 tok/s against the CPU's 406 on the default model);
- AMX off: on an Intel AMX CPU with llama.cpp's extra buffer types off (this build's AMX path failed the
  probe of :mod:`chatphase.engine.local.amx_probe`, or the user said so), prefill runs without the AMX kernels.
"""

from __future__ import annotations

from chatphase.engine.events import OFFLOAD_TYPES, BufferSize, DeviceInfo

#: KV cache element types that are not quantised (a quantised V cache needs flash attention in llama.cpp).
UNQUANTISED = frozenset({"f32", "f16", "bf16"})


def quantised_v_without_flash_attn(type_v: str, flash_attn: str) -> str | None:
    """The refusal line when ``type_v`` is quantised and flash attention is off (llama.cpp fails the
    context: ``quantized V cache was requested, but this requires Flash Attention``); ``None`` otherwise."""
    if type_v in UNQUANTISED or flash_attn != "off":
        return None
    return f"a quantised V cache (type_v {type_v}) needs flash attention: use --flash-attn auto or on, or --cache-type-v f16"


def slow_paths(
    *,
    layers_offloaded: int | None,
    layers_total: int | None,
    buffers: tuple[BufferSize, ...],
    amx: bool,
    use_extra_bufts: bool,
    flash_attn: str,
    flash_attn_mismatch: tuple[str, str] | None,
    type_k: str,
    type_v: str,
    amx_why: str = "",
    op_offload_device: str | None = None,
) -> tuple[str, ...]:
    """One line per slow path of a load (see the module docstring), from the offloaded layer count and the
    buffers llama.cpp printed (:class:`~chatphase.engine.events.BufferSize`); ``op_offload_device`` the GPU that
    llama.cpp's op offload sends the CPU layers' prefill to (``None``: no such layers, no GPU, or it is off)."""
    out = []
    device = next((b.buffer for b in buffers if b.on_device and b.kind == "model"), "the device")
    if layers_offloaded and layers_total and layers_offloaded < layers_total:
        out.append(
            f"partial offload: {layers_offloaded}/{layers_total} layers on {device}, the rest on the CPU "
            "(activations cross between them every token)"
        )
    if op_offload_device:
        out.append(
            f"prefill of the CPU layers on {op_offload_device}: llama.cpp sends a large batch's matrix products "
            "there, copying the layers' weights over for every batch (op offload; --no-op-offload keeps them on the "
            "CPU: a weak GPU loses many times over)"
        )
    kv = [b for b in buffers if b.kind == "KV"]
    if layers_offloaded and kv and not any(b.on_device for b in kv):
        out.append(
            f"KV cache on the host ({', '.join(sorted({b.buffer for b in kv}))}) while layers run on {device}: "
            "attention reads it from host memory every token (offload_kqv off)"
        )
    if flash_attn == "auto" and flash_attn_mismatch is not None:
        layer_dev, fa_dev = flash_attn_mismatch
        out.append(
            f"flash attention off: {layer_dev} has no flash-attention kernel for K/V {type_k}/{type_v} "
            f"(llama.cpp put it on {fa_dev}), so attention runs without it"
        )
    if amx and not use_extra_bufts:
        why = f" — {amx_why}" if amx_why else ""
        out.append(
            f"AMX off: llama.cpp's extra buffer types are off on this AMX CPU{why}; "
            "prefill runs without the AMX kernels; --extra-bufts on overrides"
        )
    return tuple(out)


def why_no_offload(backends: tuple[str, ...], devices: tuple[DeviceInfo, ...], n_gpu_layers: int | None) -> str | None:
    """Why no layer runs on a device, in words (``None`` when layers can be offloaded and are asked for):
    a CPU-only build (one with the RPC backend says how to reach rpc-servers), a GPU backend that found no device,
    or ``n_gpu_layers`` 0. Registered rpc-servers' devices (``host`` set) take layers as a GPU's would."""
    gpu_backends = [b for b in backends if b not in ("CPU", "BLAS", "RPC")]
    rpc = "; its RPC backend offloads to rpc-servers (--rpc HOST:PORT)" if "RPC" in backends else ""
    if not gpu_backends and not any(d.host for d in devices):
        return f"no GPU backend in this llama.cpp{rpc}" if rpc else "CPU-only build: no GPU support in this llama.cpp"
    if not any(d.type in OFFLOAD_TYPES for d in devices):
        hint = (
            "; a GPU needs its Vulkan driver (`vulkaninfo --summary` lists what the Vulkan loader finds), and a "
            "software device (llvmpipe) is used only with GGML_VK_VISIBLE_DEVICES=0"
            if "Vulkan" in gpu_backends
            else ""
        )
        return f"the {'/'.join(gpu_backends)} backend found no GPU device{hint}{rpc}"
    if n_gpu_layers == 0:
        return "n_gpu_layers is 0 (--n-gpu-layers)"
    return None
