"""Every bad model file gets one clear line and exit 2 before llama.cpp sees it; odd paths work.

Real files throughout: copies of the bundled default model (truncated, renamed into paths with spaces and
non-ASCII), an HTML page saved as .gguf, tiny GGUFs written with ``gguf.GGUFWriter``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from chatphase import cli
from chatphase.errors import ModelError
from chatphase.models.gguf_meta import architecture_supported, read_metadata, read_model_info


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    file_type: int = int(gguf.LlamaFileType.MOSTLY_Q8_0),
    split: tuple[int, int] | None = None,
    n_vocab: int = 300,
    chat_template: str | None = None,
) -> Path:
    """A small but complete GGUF: attention metadata, a vocabulary longer than the reader's skip threshold,
    one f32 tensor. ``split=(no, count)`` adds llama.cpp's split keys (``no`` counts from 1);
    ``chat_template`` a ``tokenizer.chat_template``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(256)
    w.add_file_type(file_type)
    w.add_token_list([f"t{i}".encode() for i in range(n_vocab)])
    if chat_template is not None:
        w.add_chat_template(chat_template)
    if split:
        w.add_uint16("split.no", split[0] - 1)
        w.add_uint16("split.count", split[1])
    w.add_tensor("token_embd.weight", np.arange(256, dtype=np.float32).reshape(4, 64) + (split[0] if split else 0))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_vocab_only(path: Path) -> Path:
    """A GGUF with metadata and a vocabulary but no tensors (as llama.cpp's ``ggml-vocab-*.gguf`` files)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list([b"a", b"b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_fifo(path: Path) -> Path:
    """A named pipe: opening it for reading would block, so it must be refused before any open()."""
    import os

    os.mkfifo(path)
    return path


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def html_file(tmp_path) -> Path:
    p = tmp_path / "model.gguf"
    p.write_text("<!DOCTYPE html><html><head><title>Hugging Face</title></head><body>Sign in</body></html>")
    return p


@pytest.fixture
def truncated_copy(tmp_path, default_model_path) -> Path:
    p = tmp_path / "truncated.gguf"
    with open(default_model_path, "rb") as src, open(p, "wb") as dst:
        dst.write(src.read(40 * 1024 * 1024))  # header intact, most tensor data gone
    return p


def bad_cases(tmp_path: Path, html: Path, truncated: Path) -> dict[str, tuple[Path, str]]:
    (tmp_path / "a dir.gguf").mkdir()
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "garbage.gguf").write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    (tmp_path / "v99.gguf").write_bytes(b"GGUF" + (99).to_bytes(4, "little") + b"\x00" * 64)
    (tmp_path / "loop.gguf").symlink_to("loop.gguf")
    (tmp_path / "dangling.gguf").symlink_to("gone.gguf")
    return {
        "missing": (tmp_path / "nope.gguf", "not found"),
        "directory": (tmp_path / "a dir.gguf", "is a directory"),
        "empty": (tmp_path / "empty.gguf", "is empty"),
        "html": (html, "not a GGUF file (it starts with '<!DO', not 'GGUF')"),
        "garbage header": (tmp_path / "garbage.gguf", "header cannot be read"),
        "newer version": (tmp_path / "v99.gguf", "GGUF version 99 is not supported (llama.cpp reads versions 2 and 3)"),
        "truncated": (truncated, "truncated"),
        "unsupported arch": (write_tiny_gguf(tmp_path / "alien.gguf", arch="notarealarch"), "not supported"),
        "fifo": (make_fifo(tmp_path / "pipe.gguf"), "not a regular file"),
        "vocabulary only": (write_vocab_only(tmp_path / "vocab.gguf"), "has no tensors"),
        "symlink loop": (tmp_path / "loop.gguf", "is a symlink loop"),
        "dangling symlink": (tmp_path / "dangling.gguf", "is a symlink to a missing file (gone.gguf)"),
    }


def test_each_bad_file_raises_model_error_with_reason(tmp_path, html_file, truncated_copy):
    for name, (path, phrase) in bad_cases(tmp_path, html_file, truncated_copy).items():
        with pytest.raises(ModelError) as err:
            read_model_info(path)
        assert phrase in str(err.value), name
        assert "\n" not in str(err.value), name


def test_cli_prints_one_line_and_exits_2_for_each_bad_file(tmp_path, html_file, truncated_copy, capsys):
    for name, (path, phrase) in bad_cases(tmp_path, html_file, truncated_copy).items():
        code, out, err = run_cli(capsys, "info", "--model", str(path))
        assert code == 2, name
        assert err.startswith("chatphase: ") and err.count("\n") == 1 and phrase in err, (name, err)
        assert "Traceback" not in err + out


def test_truncation_figures_name_both_sizes(truncated_copy, default_model_path):
    with pytest.raises(ModelError, match=r"needs [\d,]+ bytes, file has 41,943,040"):
        read_model_info(truncated_copy)


def test_paths_with_spaces_and_non_ascii_work(tmp_path, default_model_path, capsys):
    odd = tmp_path / "my models" / "modèle ünï 模型.gguf"
    odd.parent.mkdir()
    shutil.copyfile(default_model_path, odd)
    info = read_model_info(odd)
    assert info.architecture == "llama" and info.path == str(odd)
    code, out, err = run_cli(capsys, "info", "--model", str(odd), "--n-ctx", "512")
    assert code == 0, err
    assert "modèle ünï 模型.gguf" in out


def test_header_reader_matches_gguf_reader(default_model_path):
    """The fast header reader gives the same metadata and tensors as the package's own reader."""
    meta, fast = read_metadata(default_model_path)
    ref = gguf.GGUFReader(default_model_path)
    expected = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("tokenizer.ggml.") or k in meta}
    assert {k: v for k, v in meta.items() if k in expected} == expected
    assert meta["tokenizer.ggml.tokens.count"] == len(ref.fields["tokenizer.ggml.tokens"].data) == 49152
    assert [(t.name, t.data_offset, t.n_bytes) for t in fast.tensors] == [
        (t.name, t.data_offset, t.n_bytes) for t in ref.tensors
    ]


def test_default_model_info(default_model_info):
    i = default_model_info
    assert (i.architecture, i.n_layer, i.quantization, i.n_ctx_train) == ("llama", 30, "Q4_1", 8192)
    assert i.kv_bytes_per_token == 23_040
    assert (i.n_vocab, i.n_embd, i.split_count) == (49152, 576, 1)


def test_split_gguf_counts_all_parts_and_needs_them(tmp_path):
    first = write_tiny_gguf(tmp_path / "m-00001-of-00002.gguf", split=(1, 2))
    write_tiny_gguf(tmp_path / "m-00002-of-00002.gguf", split=(2, 2))
    info = read_model_info(first)
    assert info.split_count == 2 and info.n_params == 2 * 256
    assert info.size_bytes == first.stat().st_size + (tmp_path / "m-00002-of-00002.gguf").stat().st_size
    (tmp_path / "m-00002-of-00002.gguf").unlink()
    with pytest.raises(ModelError, match="missing 1 of 2 parts"):
        read_model_info(first)


def test_architecture_support_comes_from_this_llama_build():
    assert architecture_supported("llama") is True
    assert architecture_supported("qwen2") is True
    assert architecture_supported("notarealarch") is False
