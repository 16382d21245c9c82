"""The memory plan's arithmetic and ``n_gpu_layers auto``'s choice, on faked projections (no llama.cpp, no GPU):
every layer fits, some do, none do, over one device and two; the budget of a device that reports free = total;
the refusal line; the plan's JSON round trip; llama.cpp's debug lines that place layers and KV caches."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import pytest

from chatphase.engine.fit_search import choose_context, choose_layers, choose_placement
from chatphase.engine.llamalog import LlamaLogCapture, parse_only
from chatphase.engine.memory_plan import (
    HOST,
    DevicePlan,
    MemoryPlan,
    budget,
    layer_ranges,
    parse_layer_ranges,
    plan_lines,
    with_draft,
)
from chatphase.units import fmt_bytes

MIB = 2**20
N_LAYER = 32
LAYER = 100 * MIB  # one repeating layer's weights and KV
OUTPUT = 300 * MIB  # the output layer
COMPUTE = 200 * MIB  # a GPU's compute buffer, with any layer on it or none (op_offload)


def fake_projector(free_mib: tuple[int, ...], margin_mib: int = 1024, calls: list[int] | None = None):
    """``project(n)`` over GPUs of ``free_mib`` free each, llama.cpp's split by free memory, layers as above."""
    n_dev = len(free_mib)

    def project(n: int) -> MemoryPlan:
        if calls is not None:
            calls.append(n)
        n = min(n, N_LAYER + 1)
        first = N_LAYER + 1 - n  # llama.cpp offloads the last layers (the output layer last)
        on = list(range(first, N_LAYER + 1))
        total_free = sum(free_mib)
        devices = []
        start = 0
        for i, free in enumerate(free_mib):  # a contiguous share per device, in proportion to its free memory
            share = round(len(on) * sum(free_mib[: i + 1]) / total_free) - start
            mine = on[start : start + share]
            start += share
            weights = sum(OUTPUT if il == N_LAYER else LAYER for il in mine)
            devices.append(
                DevicePlan(
                    f"GPU{i}", "fake", "gpu", weights, 0, COMPUTE, layers=tuple(il for il in mine if il < N_LAYER),
                    output_layer=N_LAYER in mine, free_bytes=free * MIB, total_bytes=2 * free * MIB,
                    budget_bytes=free * MIB, budget_note="free as the device reports it",
                )
            )  # fmt: skip
        host_layers = tuple(range(first))
        host = DevicePlan(HOST, "host memory", HOST, LAYER * len(host_layers), 0, COMPUTE, budget_bytes=2**40)
        return MemoryPlan("fake.gguf", N_LAYER, n, 4096, (*devices, host), margin_bytes=margin_mib * MIB)

    assert n_dev >= 1
    return project


def best_by_brute_force(project) -> int:
    return max(n for n in range(N_LAYER + 2) if project(n).within_margin())


def test_every_layer_fits_a_large_gpu_in_one_projection():
    calls: list[int] = []
    choice = choose_layers(fake_projector((80_000,), calls=calls), N_LAYER)
    assert choice.n_gpu_layers == N_LAYER + 1 and calls == [N_LAYER + 1]
    assert choice.why.startswith("all 32 layers + output fit: GPU0")
    assert choice.plan is not None and choice.plan.n_gpu_layers == N_LAYER + 1


@pytest.mark.parametrize("free_mib", [(2_048,), (3_000,), (1_900, 1_500), (4_000, 2_000)])
def test_some_layers_fit_the_most_that_leave_the_margin(free_mib):
    calls: list[int] = []
    project = fake_projector(free_mib, calls=calls)
    choice = choose_layers(project, N_LAYER)
    expected = best_by_brute_force(fake_projector(free_mib))
    assert 0 < expected < N_LAYER + 1
    assert choice.n_gpu_layers == expected
    assert choice.plan is not None and choice.plan.within_margin()
    assert not fake_projector(free_mib)(expected + 1).within_margin()
    assert len(calls) <= 8  # false position, not a walk over every count
    assert "one more would leave" in choice.why and "under the 1.0 GiB margin" in choice.why


def test_no_layer_fits_when_the_compute_buffer_alone_eats_the_margin():
    choice = choose_layers(fake_projector((1_100,)), N_LAYER)
    assert choice.n_gpu_layers == 0
    assert choice.why.startswith("no layer fits: GPU0 keeps 900.0 MiB with none, under the 1.0 GiB margin")


def test_a_smaller_margin_fits_more_layers():
    wide = choose_layers(fake_projector((3_000,), margin_mib=1024), N_LAYER).n_gpu_layers
    narrow = choose_layers(fake_projector((3_000,), margin_mib=0), N_LAYER).n_gpu_layers
    assert narrow == best_by_brute_force(fake_projector((3_000,), margin_mib=0)) > wide


def test_no_gpu_in_the_plan_chooses_none():
    def project(n: int) -> MemoryPlan:
        host = DevicePlan(HOST, "host memory", HOST, LAYER * N_LAYER, 0, COMPUTE, budget_bytes=2**40)
        return MemoryPlan("fake.gguf", N_LAYER, n, 4096, (host,))

    choice = choose_layers(project, N_LAYER)
    assert choice.n_gpu_layers == 0 and "no GPU device" in choice.why


def test_budget_of_a_device_that_reports_free_equal_to_total():
    assert budget(1_500 * MIB, 2_048 * MIB, 100 * MIB, "CUDA0") == (1_500 * MIB, "free as the device reports it")
    limit, note = budget(2_048 * MIB, 2_048 * MIB, 300 * MIB, "Vulkan0")
    assert limit == 1_748 * MIB
    assert note.startswith("Vulkan0 reports free = total (it counts no usage): planned against its total less the")
    assert budget(24 * 2**30, 24 * 2**30, available_bytes=20 * 2**30)[0] == 20 * 2**30  # the host: the OS's figure


def test_overflow_line_has_the_plans_numbers():
    plan = fake_projector((2_048,))(N_LAYER + 1)
    line = plan.overflow_line()
    assert line is not None and "\n" not in line
    assert line.startswith("n_gpu_layers 33 (32/32 layers + output) would not fit GPU0: it needs 3.6 GiB there")
    assert "weights 3.4 GiB + KV 0 B + compute 200.0 MiB" in line and "has 2.0 GiB" in line
    assert fake_projector((80_000,))(N_LAYER + 1).overflow_line() is None


def _fit_over(monkeypatch, free_mib: int, free_equals_total: bool):
    """:func:`fit_layers` on :func:`fake_projector`'s plans of one GPU of ``free_mib`` (``free_equals_total``: a
    device that counts no usage, as Mesa's llvmpipe, planned through :func:`budget`)."""
    from chatphase.engine.local import projection

    def project(path, settings, n, use_extra_bufts, margin_bytes, held_bytes=None, experts_on_host=False):
        plan = fake_projector((free_mib,), margin_mib=margin_bytes // MIB)(n)
        if not free_equals_total:
            return plan
        limit, note = budget(free_mib * MIB, free_mib * MIB, 0, "GPU0")
        gpu = replace(plan.devices[0], free_bytes=free_mib * MIB, total_bytes=free_mib * MIB)
        return replace(plan, devices=(replace(gpu, budget_bytes=limit, budget_note=note), *plan.devices[1:]))

    monkeypatch.setattr(projection, "project", project)

    def fit(n_gpu_layers: int | None, margin_mib: int):
        s = {"n_gpu_layers": n_gpu_layers, "gpu_margin_mib": margin_mib, "n_ctx": 4096}
        return projection.fit_layers("fake.gguf", s, N_LAYER, False, gpu_ok=True, why_not=None)

    return fit


@pytest.mark.parametrize("free_equals_total", [False, True])
def test_a_count_past_what_fits_is_refused_before_the_load_with_the_plans_numbers(monkeypatch, free_equals_total):
    """A count the user forces past auto's: refused (the plan's one line) where the plan overflows the device,
    also on a device that reports free = total (it would over-commit, not refuse); a count inside the device
    but inside the margin auto keeps loads, and says so; auto's own count is never refused."""
    fit = _fit_over(monkeypatch, 2_048, free_equals_total)
    edge = fit(None, 0)  # no margin: auto's count is the most the device holds
    assert 0 < edge.n_gpu_layers < N_LAYER + 1 and edge.refusal is None
    assert edge.n_gpu_layers == best_by_brute_force(fake_projector((2_048,), margin_mib=0))
    forced = fit(edge.n_gpu_layers + 2, 0)
    assert forced.refusal is not None and forced.plan is not None and forced.plan.over()
    d = forced.plan.over()[0]
    assert forced.refusal.startswith(
        f"n_gpu_layers {edge.n_gpu_layers + 2} ({edge.n_gpu_layers + 1}/32 layers + output) would not fit GPU0: "
        f"it needs {fmt_bytes(d.planned_bytes)} there (weights {fmt_bytes(d.weights_bytes)} + KV 0 B + "
        f"compute 200.0 MiB) and has 2.0 GiB"
    )
    said = " (GPU0 reports free = total (it counts no usage))" if free_equals_total else ""
    assert forced.refusal.startswith(f"and has 2.0 GiB{said}; use fewer", forced.refusal.index("and has"))
    assert fit(edge.n_gpu_layers, 0).refusal is None  # the count auto chose, asked for by number
    kept = fit(None, 1024)  # the default margin: auto keeps 1 GiB; two more layers fit, under the margin
    inside = fit(kept.n_gpu_layers + 2, 1024)
    assert inside.refusal is None and inside.n_gpu_layers == kept.n_gpu_layers + 2
    assert inside.why is not None and "under the 1.0 GiB margin auto keeps (--gpu-margin-mib)" in inside.why


KV_CELL = 4 * 2**10  # one layer's K and V per context cell


def fake_ctx_projector(free_mib: int | None, host_mib: int = 2**20, calls: list[tuple[int, int]] | None = None):
    """``project(n_gpu_layers, n_ctx)``: :func:`fake_projector`'s layers on one GPU of ``free_mib`` (``None``: no
    GPU), each layer's KV cache (:data:`KV_CELL` a cell) where the layer is, the host against ``host_mib``."""

    def project(n: int, n_ctx: int) -> MemoryPlan:
        if calls is not None:
            calls.append((n, n_ctx))
        plan = fake_projector((free_mib or 1,))(n)
        gpu, host = plan.devices
        kv = KV_CELL * n_ctx
        host = replace(host, kv_cache_bytes=kv * len(host.layers) if free_mib else kv * N_LAYER,
                       weights_bytes=host.weights_bytes if free_mib else LAYER * N_LAYER + OUTPUT,
                       budget_bytes=host_mib * MIB)  # fmt: skip
        if free_mib is None:  # a CPU load maps its weights from the file
            return replace(plan, n_ctx=n_ctx, devices=(replace(host, mapped_bytes=host.weights_bytes),))
        gpu = replace(gpu, kv_cache_bytes=kv * len(gpu.layers))
        return replace(plan, n_ctx=n_ctx, devices=(gpu, host))

    return project


def largest_ctx_by_brute_force(project, n_gpu_layers: int, low: int, high: int) -> int:
    return max(c for c in range(low, high + 1, 256) if project(n_gpu_layers, c).fits())


def test_n_ctx_auto_is_the_training_context_where_it_fits():
    calls: list[tuple[int, int]] = []
    choice = choose_context(fake_ctx_projector(80_000, calls=calls), N_LAYER, 131_072, None)
    assert (choice.n_ctx, choice.layers.n_gpu_layers) == (131_072, N_LAYER + 1) and calls == [(N_LAYER + 1, 131_072)]
    assert choice.why.startswith("auto: 131,072, the model's training context, fits: GPU0 ")


def test_n_ctx_auto_is_the_largest_that_fits_with_every_layer():
    """llama.cpp's order: every layer kept, the context shrunk toward 4096 until the device keeps its margin."""
    calls: list[tuple[int, int]] = []
    project = fake_ctx_projector(6_000, calls=calls)
    choice = choose_context(project, N_LAYER, 131_072, None)
    expected = largest_ctx_by_brute_force(fake_ctx_projector(6_000), N_LAYER + 1, 4096, 131_072)
    assert 4096 < expected < 131_072 and expected % 256 == 0
    assert (choice.n_ctx, choice.layers.n_gpu_layers) == (expected, N_LAYER + 1)
    assert not fake_ctx_projector(6_000)(N_LAYER + 1, expected + 256).fits()
    assert choice.why.startswith(f"auto: {expected:,} of the training context's 131,072 fits: GPU0 ")
    assert len(calls) <= 8 and all(n == N_LAYER + 1 for n, _ in calls)


def test_n_ctx_auto_is_the_least_and_the_layers_fitted_at_it_when_every_layer_does_not_fit():
    choice = choose_context(fake_ctx_projector(3_000), N_LAYER, 131_072, None)
    at_least = fake_ctx_projector(3_000)
    expected = max(n for n in range(N_LAYER + 2) if at_least(n, 4096).fits())
    assert (choice.n_ctx, choice.layers.n_gpu_layers) == (4096, expected) and 0 < expected < N_LAYER + 1
    assert choice.why == "auto: 4,096, the least auto chooses (llama.cpp's fit_params_min_ctx), the layers fitted at it"


def test_n_ctx_auto_with_a_count_given_keeps_the_count():
    choice = choose_context(fake_ctx_projector(6_000), N_LAYER, 131_072, 10)
    expected = largest_ctx_by_brute_force(fake_ctx_projector(6_000), 10, 4096, 131_072)
    assert (choice.n_ctx, choice.layers.n_gpu_layers) == (expected, 10)
    tight = choose_context(fake_ctx_projector(3_000), N_LAYER, 131_072, N_LAYER + 1)
    assert tight.n_ctx == 4096 and tight.layers.n_gpu_layers == N_LAYER + 1  # the load's refusal says the rest
    assert "even it does not fit" in tight.why


def test_n_ctx_auto_on_the_host_alone_and_a_short_training_context():
    """No GPU device: the host's allocation (its KV cache and compute) against its budget less the margin; a model
    trained on 2,048 tokens gets 2,048 at most."""
    host_only = fake_ctx_projector(None, host_mib=4_000)
    choice = choose_context(host_only, N_LAYER, 131_072, 0)
    assert choice.n_ctx == largest_ctx_by_brute_force(host_only, 0, 4096, 131_072)
    assert choice.why.startswith(f"auto: {choice.n_ctx:,} of the training context's 131,072 fits: host allocates ")
    short = choose_context(fake_ctx_projector(80_000), N_LAYER, 2_048, None)
    assert short.n_ctx == 2_048 and short.why.startswith("auto: 2,048, the model's training context, fits")


def test_a_draft_model_on_the_gpu_leaves_fewer_layers_to_auto():
    """A draft model's plan (:func:`with_draft`) adds its bytes on each device: auto fits the target's layers in
    what is left, the refusal line names the draft's share, and the plan round-trips."""
    gpu = DevicePlan("GPU0", "fake", "gpu", 400 * MIB, 50 * MIB, 100 * MIB, mapped_bytes=0)
    host = DevicePlan(HOST, "host memory", HOST, 10 * MIB, 0, 5 * MIB, mapped_bytes=10 * MIB)
    draft = MemoryPlan("draft.gguf", 8, 9, 4096, (gpu, host))
    plain = fake_projector((3_000,))

    def drafted(n: int) -> MemoryPlan:
        return with_draft(plain(n), draft)

    without, withd = choose_layers(plain, N_LAYER), choose_layers(drafted, N_LAYER)
    assert withd.n_gpu_layers == best_by_brute_force(drafted) < without.n_gpu_layers
    p = drafted(N_LAYER + 1)
    assert p.draft_model == "draft.gguf" and p.devices[0].draft_bytes == 550 * MIB
    assert p.devices[0].planned_bytes == plain(N_LAYER + 1).devices[0].planned_bytes + 550 * MIB
    assert p.host is not None and p.host.draft_bytes == 15 * MIB and p.host.mapped_bytes == 10 * MIB
    assert p.notes[-1] == "with the draft model draft.gguf (spec draft:): GPU0 550.0 MiB, host 15.0 MiB"
    line = p.overflow_line()
    assert line is not None and "+ draft model 550.0 MiB)" in line
    import json

    assert MemoryPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


EXPERTS = 0.8  # the share of a MoE layer's weights in its experts


def fake_moe_projector(free_mib: int, calls: list[tuple[int, bool]] | None = None):
    """``project(n, experts_on_host)``: :func:`fake_projector`'s plans, with each GPU layer's experts moved to the
    host when asked (its share :data:`EXPERTS` of the layer)."""

    def project(n: int, experts_on_host: bool) -> MemoryPlan:
        if calls is not None:
            calls.append((n, experts_on_host))
        plan = fake_projector((free_mib,))(n)
        if not experts_on_host:
            return plan
        gpu, host = plan.devices
        moved = round(len(gpu.layers) * LAYER * EXPERTS)
        gpu = replace(gpu, weights_bytes=gpu.weights_bytes - moved)
        host = replace(host, weights_bytes=host.weights_bytes + moved)
        return replace(plan, devices=(gpu, host), experts_on_host=True)

    return project


def test_a_moe_model_keeps_its_experts_on_the_host_when_every_layer_then_fits():
    """As llama.cpp's --cpu-moe: every layer does not fit 3,000 MiB with its experts, but does with them on the
    host (3,500 MiB of weights less 80 % of 32 layers'); a dense model, or one that fits whole, is planned as
    before; where even the experts on the host leave too little, the layers are fitted with their experts."""
    calls: list[tuple[int, bool]] = []
    choice = choose_placement(fake_moe_projector(3_000, calls), N_LAYER, has_experts=True)
    assert (choice.n_gpu_layers, choice.experts_on_host) == (N_LAYER + 1, True)
    assert choice.plan is not None and choice.plan.experts_on_host and choice.plan.within_margin()
    assert choice.why.startswith("all 32 layers + output fit with the experts on the host (llama.cpp's -ot exps=CPU)")
    assert calls == [(N_LAYER + 1, False), (N_LAYER + 1, True)]
    dense = choose_placement(fake_moe_projector(3_000), N_LAYER, has_experts=False)
    assert not dense.experts_on_host and dense.n_gpu_layers == best_by_brute_force(fake_projector((3_000,)))
    whole = choose_placement(fake_moe_projector(80_000), N_LAYER, has_experts=True)
    assert (whole.n_gpu_layers, whole.experts_on_host) == (N_LAYER + 1, False)
    tight = choose_placement(fake_moe_projector(1_600), N_LAYER, has_experts=True)
    assert not tight.experts_on_host and tight.n_gpu_layers == best_by_brute_force(fake_projector((1_600,)))
    assert "; with the experts on the host every layer would leave GPU0 " in tight.why
    lines = plan_lines(choice.plan)
    assert lines[0][1].startswith("n_gpu_layers 33 (32/32 layers + output) · experts on the host (-ot exps=CPU) · ")


def test_plan_round_trips_through_json():
    import json

    plan = fake_projector((1_900, 1_500))(20)
    again = MemoryPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    assert plan.to_dict()["devices"][0]["layers"] == layer_ranges(plan.devices[0].layers)


def test_layer_ranges():
    assert layer_ranges((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    assert layer_ranges(()) == ""
    assert parse_layer_ranges("0-2,5,7-8") == (0, 1, 2, 5, 7, 8)


def feed(capture: LlamaLogCapture, level: int, text: str) -> None:
    for line in text.splitlines(keepends=True):
        capture.on_log(level, line.encode(), ctypes.c_void_p(0))


def test_layer_devices_are_read_from_debug_lines_that_are_not_written(tmp_path):
    # llama.cpp's own debug lines (src/llama-model.cpp, load_tensors), layer 26 being the output layer
    cap = LlamaLogCapture(tmp_path / "engine.log", min_level=2)
    feed(cap, 1, "load_tensors: layer   0 assigned to device CPU, is_swa = 1\n")
    feed(cap, 1, "load_tensors: layer  25 assigned to device Vulkan0, is_swa = 0\n")
    feed(cap, 1, "load_tensors: layer  26 assigned to device Vulkan0, is_swa = 0\n")
    cap.close()
    assert cap.layer_devices == {0: "CPU", 25: "Vulkan0", 26: "Vulkan0"} and cap.swa_layers == {0}
    assert "assigned" not in (tmp_path / "engine.log").read_text()


def test_iswa_kv_cache_lines_are_labelled(tmp_path):
    # Gemma 3's two caches, as llama-kv-cache-iswa.cpp and llama-kv-cache.cpp print them
    lines = """llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells
llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers,  1/1 seqs), K (f16):    6.00 MiB, V (f16):    6.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 4096 cells
llama_kv_cache: size =   60.00 MiB (  4096 cells,  15 layers,  1/1 seqs), K (q8_0):   30.00 MiB, V (f16):   30.00 MiB
"""
    with parse_only() as cap:
        feed(cap, 2, lines)
    assert [(c.kind, c.layers, c.type_k, c.mib) for c in cap.kv_caches] == [
        ("full", 3, "f16", 12.0),
        ("swa", 15, "q8_0", 60.0),
    ]
    assert cap.kv_cache_mib == 60.0  # the last line, as before


def test_an_rpc_servers_plan_names_its_host_and_survives_json():
    import json

    rpc = DevicePlan("RPC0", "10.0.0.2:50052", "gpu", 40 * MIB, 5 * MIB, 10 * MIB, layers=(0, 1), host="10.0.0.2:50052")
    host = DevicePlan(HOST, "host memory", HOST, 10 * MIB, 0, 5 * MIB, budget_bytes=2**40)
    plan = MemoryPlan("fake.gguf", 2, 2, 4096, (rpc, host))
    labels = [label for label, _text in plan_lines(plan)]
    assert "RPC0 at 10.0.0.2:50052" in labels and HOST in labels
    assert MemoryPlan.from_dict(json.loads(json.dumps(plan.to_dict()))).devices[0].host == "10.0.0.2:50052"
