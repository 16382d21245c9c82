"""GGUF header reading with the `gguf` package (no llama.cpp involved).

:func:`read_model_info` checks a file is a usable GGUF *before* llama.cpp sees it (a bad file passed to
llama.cpp can abort the process) and returns the facts the app shows: name, architecture, parameters,
quantisation, training context and KV bytes per token.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from chatphase.engine.kv import AttentionShape, attention_shape, kv_bytes_per_token
from chatphase.errors import ModelError

GGUF_MAGIC = b"GGUF"
#: keys whose values are large arrays we never need (vocabulary, merges, scores).
_SKIP_PREFIXES = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")


@dataclass(frozen=True)
class ModelInfo:
    """What chatphase knows about a GGUF model file.

    ``n_params`` counts tensor elements; ``size_bytes`` is the file size; ``kv_bytes_per_token`` assumes
    an f16 cache (llama.cpp's default) and, like ``attention`` (the geometry for other cache types), is
    ``None`` for models without a per-token KV cache.
    """

    path: str
    name: str
    architecture: str
    n_params: int
    size_bytes: int
    n_layer: int
    quantization: str
    n_ctx_train: int
    kv_bytes_per_token: int | None
    has_chat_template: bool
    attention: AttentionShape | None = None

    def to_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return asdict(self)


def read_metadata(path: str | os.PathLike) -> tuple[dict, object]:
    """Read a GGUF file's key/value metadata with :class:`gguf.GGUFReader`.

    Returns ``(metadata, reader)``: metadata maps key -> Python value (large tokenizer arrays skipped).

    Raises:
        ModelError: missing file, a directory, an empty file, not GGUF, or a header that cannot be parsed.
    """
    p = Path(path)
    if not p.exists():
        raise ModelError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelError(f"model path is a directory, not a GGUF file: {p}")
    size = p.stat().st_size
    if size == 0:
        raise ModelError(f"model file is empty: {p}")
    with open(p, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelError(f"not a GGUF file (bad magic {magic[:4]!r}): {p}")
    import gguf  # deferred: importing gguf costs ~0.2 s

    try:
        reader = gguf.GGUFReader(p)
    except Exception as exc:  # gguf raises ValueError/IndexError/struct errors on damaged headers
        raise ModelError(f"GGUF header cannot be read ({type(exc).__name__}: {exc}): {p}") from None
    meta: dict = {}
    for key, field in reader.fields.items():
        if key.startswith(_SKIP_PREFIXES):
            continue
        try:
            meta[key] = field.contents()
        except Exception:  # an odd value type must not make the model unusable
            continue
    return meta, reader


def read_model_info(path: str | os.PathLike) -> ModelInfo:
    """Validate a GGUF file and summarise it as :class:`ModelInfo`.

    Raises:
        ModelError: as :func:`read_metadata`, plus truncated tensor data or missing architecture.
    """
    p = Path(path)
    meta, reader = read_metadata(p)
    arch = meta.get("general.architecture")
    if not arch:
        raise ModelError(f"GGUF file has no general.architecture: {p}")
    size = p.stat().st_size
    tensors = reader.tensors
    end = max((t.data_offset + t.n_bytes for t in tensors), default=0)
    if end > size:
        raise ModelError(f"GGUF file is truncated: tensor data needs {end:,} bytes, file has {size:,}: {p}")
    try:
        shape: AttentionShape | None = attention_shape(meta, arch)
    except ValueError:
        shape = None
    kv_per_token = kv_bytes_per_token(shape) if shape else None
    return ModelInfo(
        path=str(p),
        name=str(meta.get("general.name") or p.stem),
        architecture=str(arch),
        n_params=int(sum(t.n_elements for t in tensors)),
        size_bytes=size,
        n_layer=int(meta.get(f"{arch}.block_count", 0)),
        quantization=_file_type_name(meta.get("general.file_type")),
        n_ctx_train=int(meta.get(f"{arch}.context_length", 0)),
        kv_bytes_per_token=kv_per_token,
        has_chat_template="tokenizer.chat_template" in meta,
        attention=shape,
    )


def _file_type_name(file_type) -> str:
    if file_type is None:
        return "unknown"
    import gguf

    try:
        return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"type {file_type}"
