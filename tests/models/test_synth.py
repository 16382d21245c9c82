"""Synthetic models (``chatphase models synth``): the shape tables against the published parameter counts,
llama.cpp's quantiser's type choices, the writer's files, and a tiny synthetic model end to end through
the real engine (load, prefill, decode, KV bytes equal to what llama.cpp prints)."""

from __future__ import annotations

import pytest

from chatphase.cli import main
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import ModelLoaded, SamplingParams, TurnFinished, TurnRequest
from chatphase.models.gguf_meta import read_model_info
from chatphase.models.synth import CHUNK_BYTES, check_room, plan, synthetic_vocab, tensor_bytes, write_synthetic
from chatphase.models.synth_shapes import SHAPES, parse_spec, tensor_type

PUBLIC = [k for k, s in SHAPES.items() if s.listed]


def test_the_ten_shapes_are_listed():
    assert set(PUBLIC) == {"llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen3-0.6b", "qwen3-4b", "qwen3-8b",
                           "qwen3-30b-a3b", "gemma-3-1b", "gemma-3-4b", "mistral-7b"}  # fmt: skip


@pytest.mark.parametrize("key", PUBLIC)
def test_parameter_count_is_the_published_one_within_one_percent(key):
    shape = SHAPES[key]
    assert shape.n_params() == pytest.approx(shape.published_params, rel=0.01), shape.params_source


def test_exact_counts_where_the_publisher_gives_them():
    assert SHAPES["llama-3.2-1b"].n_params() == 1_235_814_400
    assert SHAPES["llama-3.1-8b"].n_params() == 8_030_261_248
    assert SHAPES["mistral-7b"].n_params() == 7_248_023_552


def test_quantiser_type_choices_follow_llama_cpp():
    # Q4_0: the output matrix (or a tied embedding) gets Q6_K; the rest Q4_0; norms F32
    assert tensor_type("Q4_0", "output", 4096, 0, 32) == "Q6_K"
    assert tensor_type("Q4_0", "token_embd", 4096, 0, 32) == "Q4_0"
    assert tensor_type("Q4_0", "norm", 4096, 0, 32) == "F32"
    assert tensor_type("Q8_0", "output", 4096, 0, 32) == "Q8_0"
    # Q4_K_M: attn_v / ffn_down get Q6_K in use_more_bits layers (first and last eighth, every third)
    assert [tensor_type("Q4_K_M", "ffn_down", 4096, i, 16) for i in (0, 1, 2, 3, 4, 14)] == [
        "Q6_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q6_K"
    ]  # fmt: skip
    # a row that is not a multiple of 256 falls back as llama.cpp's tensor_type_fallback does
    assert tensor_type("Q4_K_M", "weight", 1152, 5, 26) == "Q5_0"
    assert tensor_type("Q4_K_M", "output", 1152, 0, 26) == "Q8_0"


def test_file_sizes_are_those_of_real_quantised_models():
    # Llama-3.1-8B Q4_0 from llama-quantize is 4.66 GB (4,661,211,136 B of file: tensors + ~7 MB header)
    assert plan(SHAPES["llama-3.1-8b"], "Q4_0").data_bytes == pytest.approx(4.66e9, rel=0.01)
    # an 8B layer is far above the writer's chunk: memory stays under one layer's tensors
    assert plan(SHAPES["llama-3.1-8b"], "Q4_0").largest_layer_bytes > 3 * CHUNK_BYTES


def test_parse_spec_and_its_errors():
    shape, quant = parse_spec("Qwen3-4B:q4_k_m")
    assert (shape.key, quant) == ("qwen3-4b", "Q4_K_M")
    assert parse_spec("gemma-3-1b")[1] == "Q4_0"
    with pytest.raises(ValueError, match="unknown model shape"):
        parse_spec("gpt-5")
    with pytest.raises(ValueError, match="unknown quantisation"):
        parse_spec("qwen3-4b:Q2_K")


def test_vocabulary_is_exactly_the_size_asked_and_unique():
    tokens, scores, types = synthetic_vocab(151936)
    assert len(tokens) == len(scores) == len(types) == 151936 == len(set(tokens))
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and tokens[3 + 0x0A] == "<0x0A>"
    assert "▁the" in tokens


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "qwen3moe"])
@pytest.mark.parametrize("quant", ["Q4_0", "Q8_0", "Q4_K_M"])
def test_written_file_reads_back_with_its_shapes_and_label(tmp_path, arch, quant):
    synth = plan(SHAPES[f"tiny-{arch}"], quant)
    path = write_synthetic(synth, tmp_path / "m.gguf")
    info = read_model_info(path)
    assert info.synthetic and info.architecture == arch and info.quantization == quant
    assert info.n_params == SHAPES[f"tiny-{arch}"].n_params() and info.n_vocab == 2048
    assert synth.data_bytes < info.size_bytes < synth.data_bytes + 2**20
    assert not (tmp_path / "m.gguf.part").exists()
    from gguf import GGUFReader

    by_name = {t.name: t for t in GGUFReader(path).tensors}
    for t in synth.tensors:  # every tensor has the planned type and byte count
        assert by_name[t.name].tensor_type.name == t.ggml_type and int(by_name[t.name].n_bytes) == tensor_bytes(t)


def test_layout_only_file_is_the_full_files_header_and_size_with_zeros_for_data(tmp_path):
    """For what reads no weights (llama.cpp's memory projection): the same bytes up to the data, the same size, the
    data zeros (a hole where the file system has them)."""
    synth = plan(SHAPES["tiny-llama"], "Q4_0")
    full = write_synthetic(synth, tmp_path / "full.gguf")
    hole = write_synthetic(synth, tmp_path / "hole.gguf", layout_only=True)
    a, b = full.read_bytes(), hole.read_bytes()
    assert len(a) == len(b)
    start = len(a) - synth.data_bytes - 4096  # the header ends before the data (some padding aside)
    assert b[:start] == a[:start] and not any(b[len(b) - synth.data_bytes :])
    from gguf import GGUFReader

    assert [(t.name, int(t.data_offset)) for t in GGUFReader(hole).tensors] == [
        (t.name, int(t.data_offset)) for t in GGUFReader(full).tensors
    ]


def test_check_room_refuses_a_disk_too_small(tmp_path, monkeypatch):
    import shutil

    from chatphase.errors import UsageError

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(UsageError, match="not enough disk"):
        check_room(tmp_path / "x.gguf", plan(SHAPES["tiny-llama"], "Q4_0"))
    with pytest.raises(UsageError, match="folder does not exist"):
        check_room(tmp_path / "nope" / "x.gguf", plan(SHAPES["tiny-llama"], "Q4_0"))


def test_cli_writes_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "tiny.gguf"
    assert main(["models", "synth", "tiny-qwen3:Q8_0", "-o", str(out)]) == 0
    assert read_model_info(out).synthetic
    assert main(["models", "synth", "tiny-qwen3:Q8_0", "-o", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["models", "synth", "nope"]) == 2
    assert "unknown model shape 'nope'" in capsys.readouterr().err
    assert main(["models", "--models-dir", str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert "s  tiny.gguf" in listing and "synthetic: timings only" in listing


@pytest.fixture(params=["llama", "gemma3"])
def tiny_synthetic(request, tmp_path):
    return read_model_info(write_synthetic(plan(SHAPES[f"tiny-{request.param}"], "Q4_0"), tmp_path / "t.gguf"))


@pytest.mark.model
@pytest.mark.parametrize(("type_k", "type_v"), [("f16", "f16"), ("q8_0", "q8_0")])
def test_tiny_synthetic_model_runs_through_the_engine(tiny_synthetic, tmp_path, type_k, type_v):
    from chatphase.engine.local.llama import LlamaEngine

    cfg = EngineConfig(n_ctx=512, type_k=type_k, type_v=type_v, flash_attn="on", n_threads=1)
    engine = LlamaEngine(tiny_synthetic, cfg, log_path=tmp_path / "engine.log")
    try:
        loaded = [e for e in engine.load() if isinstance(e, ModelLoaded)][-1].model
        # the KV formula agrees with what llama.cpp printed (MiB with 2 decimals), for each cache type
        assert loaded.kv_capacity_bytes == 512 * loaded.kv_bytes_per_token
        assert abs(loaded.llama_kv_cache_bytes - loaded.kv_capacity_bytes) <= 0.005 * 2**20
        assert loaded.kv_bytes_per_token == (1024 if type_k == "f16" else 544)
        request = TurnRequest(
            turn_id=1, prompt_token_ids=tuple(range(300, 364)), reset_cache=True, ignore_eos=True,
            sampling=SamplingParams(max_tokens=8, temperature=0.0),
        )  # fmt: skip
        m = [e for e in engine.run_turn(request) if isinstance(e, TurnFinished)][-1].metrics
        assert m.prefill_tokens == 64 and m.decode_tokens == 8 and m.stop_reason == "length"
        assert m.decode_tokens_per_s > 0 and m.ttft_ms > 0
    finally:
        engine.close()


@pytest.mark.model
def test_fallback_types_load_in_llama_cpp(tmp_path):
    """Rows that are not a multiple of 256 (Gemma-3-1B's 1152) get Q5_0 / Q8_0 in Q4_K_M, as llama.cpp's
    quantiser gives them; llama.cpp loads and runs such a file."""
    from dataclasses import replace

    from chatphase.engine.local.llama import LlamaEngine

    shape = replace(SHAPES["tiny-gemma3"], n_embd=288, n_ff=576)
    synth = plan(shape, "Q4_K_M")
    assert {t.ggml_type for t in synth.tensors} >= {"Q5_0", "Q8_0", "F32"}
    info = read_model_info(write_synthetic(synth, tmp_path / "f.gguf"))
    engine = LlamaEngine(info, EngineConfig(n_ctx=256, n_threads=1), log_path=tmp_path / "engine.log")
    try:
        assert [e for e in engine.load() if isinstance(e, ModelLoaded)]
        request = TurnRequest(
            turn_id=1, prompt_token_ids=tuple(range(300, 316)), reset_cache=True, ignore_eos=True,
            sampling=SamplingParams(max_tokens=4, temperature=0.0),
        )  # fmt: skip
        m = [e for e in engine.run_turn(request) if isinstance(e, TurnFinished)][-1].metrics
        assert m.decode_tokens == 4
    finally:
        engine.close()
