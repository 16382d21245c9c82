"""Synthetic GGUFs of a real model's size, for timings without a download (``chatphase models synth``).

A synthetic file has the exact tensor shapes and ggml types of a published model quantised by llama.cpp
(:mod:`chatphase.models.synth_shapes`) and a vocabulary of the real size, but random weights: each
quantised block is written directly as random bytes with a finite, plausible scale in its f16 scale
field(s) (weights of about 0.02 standard deviation), so no float copy of the model is ever made. Decode
reads the same bytes per token as the real model, prefill does the same arithmetic; the text it writes is
noise, so the file carries :data:`~chatphase.models.gguf_meta.SYNTHETIC_KEY` and every view labels it
*synthetic: timings only*.

The file is written with the ``gguf`` package's :class:`gguf.GGUFWriter` (header, metadata, tensor
infos), then tensor by tensor in chunks of at most :data:`CHUNK_BYTES`, one at a time, so the memory used
stays far under one layer's tensors; it is written beside the target as ``*.part`` and renamed when complete.

The vocabulary is a SentencePiece one (``tokenizer.ggml.model = llama``): ``<unk>``, ``<s>``, ``</s>``,
the 256 byte tokens, common English words and letters, then made-up pieces up to the real size.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chatphase.errors import UsageError
from chatphase.models.gguf_meta import SYNTHETIC_KEY, SYNTHETIC_LABEL
from chatphase.models.synth_shapes import BLOCK_ELEMENTS, ModelShape, PlannedTensor, tensor_plan

if TYPE_CHECKING:  # imported where used at run time (numpy and gguf cost an import)
    import gguf
    import numpy as np
    import numpy.typing as npt

#: the most bytes of random blocks held in memory at once.
CHUNK_BYTES = 16 * 2**20
#: free disk kept beyond the file itself (bytes).
DISK_MARGIN_BYTES = 256 * 2**20
#: ``general.file_type`` (llama.cpp's ``llama_ftype``) of each quantisation.
FILE_TYPES = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15}
#: bytes per block and the offsets of its f16 scale fields, with each one's typical value, per ggml type
#: (ggml-common.h: ``block_q4_0`` {d, qs}, ``block_q8_0`` {d, qs}, ``block_q5_0`` {d, qh, qs},
#: ``block_q4_K`` {d, dmin, scales, qs}, ``block_q6_K`` {ql, qh, scales, d}); the scales make
#: ``d × quant`` about 0.02 for uniformly random quants.
_BLOCKS: dict[str, tuple[int, tuple[tuple[int, float], ...]]] = {
    "Q4_0": (18, ((0, 0.004),)),
    "Q5_0": (22, ((0, 0.002),)),
    "Q8_0": (34, ((0, 0.0003),)),
    "Q4_K": (144, ((0, 0.00015), (2, 0.0001))),
    "Q6_K": (210, ((208, 0.00002),)),
}
_WORDS = (
    "the a an and of to in is it that for on with as at by from be this are was or not all each one two "
    "first then more time token model prompt phase read write long short fast slow memory cache step "
    "answer word user wait every make makes because attention keys values earlier later deeper context"
).split()
_PUNCT = list(".,;:!?'\"()-") + [str(d) for d in range(10)]


@dataclass(frozen=True)
class SynthPlan:
    """What a synthetic file holds: its tensors and ``data_bytes`` of tensor data (the file is that plus a
    header of a few MB for the vocabulary)."""

    shape: ModelShape
    quant: str
    tensors: tuple[PlannedTensor, ...]

    @property
    def data_bytes(self) -> int:
        return sum(tensor_bytes(t) for t in self.tensors)

    @property
    def largest_layer_bytes(self) -> int:
        """Bytes of the largest layer's tensors (the bound the writer's memory stays below)."""
        per: dict[str, int] = {}
        for t in self.tensors:
            if t.name.startswith("blk."):
                layer = t.name.split(".")[1]
                per[layer] = per.get(layer, 0) + tensor_bytes(t)
        return max(per.values(), default=0)


def plan(shape: ModelShape, quant: str) -> SynthPlan:
    """The :class:`SynthPlan` of ``shape`` in ``quant``.

    Raises:
        ValueError: an unknown ``quant``.
    """
    return SynthPlan(shape, quant, tuple(tensor_plan(shape, quant)))


def tensor_bytes(t: PlannedTensor) -> int:
    """Bytes of ``t``'s data: rows × blocks per row × block bytes (4 per element for F32)."""
    if t.ggml_type == "F32":
        return 4 * t.n_elements
    return t.n_elements // BLOCK_ELEMENTS[t.ggml_type] * _BLOCKS[t.ggml_type][0]


def default_file_name(shape: ModelShape, quant: str) -> str:
    """``synthetic-<shape>-<QUANT>.gguf``: the file name says what it is."""
    return f"synthetic-{shape.key}-{quant}.gguf"


def check_room(target: Path, synth: SynthPlan) -> list[str]:
    """Check there is disk for the file and memory for the writer before any write; return warnings
    (the machine may lack the memory to *run* the model, which does not stop the write).

    Raises:
        UsageError: the target's folder is missing, the disk lacks room, or memory lacks a few chunks.
    """
    import psutil

    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"folder does not exist: {folder}")
    need = synth.data_bytes + DISK_MARGIN_BYTES
    free = shutil.disk_usage(folder).free
    if free < need:
        raise UsageError(
            f"not enough disk in {folder}: the file needs {need / 2**30:.2f} GiB with margin, {free / 2**30:.2f} GiB free"
        )
    available = psutil.virtual_memory().available
    if available < 4 * CHUNK_BYTES:
        raise UsageError(f"not enough memory to write: {available / 2**20:.0f} MiB available")
    warnings = []
    if synth.data_bytes > available:
        warnings.append(
            f"this machine has {available / 2**30:.1f} GiB of memory available and the model is "
            f"{synth.data_bytes / 2**30:.1f} GiB: it will page from disk when run"
        )
    return warnings


def synthetic_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types (gguf ``TokenType``: 1 normal, 2 unknown, 3 control, 6 byte) of a
    SentencePiece vocabulary of exactly ``n_vocab`` tokens.

    Raises:
        ValueError: ``n_vocab`` too small for the special and byte tokens.
    """
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    if n_vocab < len(tokens) + 64:
        raise ValueError(f"a vocabulary needs at least {len(tokens) + 64} tokens")
    seen = set(tokens)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    base = ["▁"] + [f"▁{w}" for w in _WORDS] + letters + [c.upper() for c in letters] + _PUNCT + _WORDS

    def made_up() -> Iterator[str]:
        n = 0
        while True:
            n += 1
            k, s = n, ""
            while k:
                k, r = divmod(k - 1, 26)
                s = letters[r] + s
            yield ("▁" if n % 2 else "") + s

    pieces = iter(base)
    more = made_up()
    while len(tokens) < n_vocab:
        piece = next(pieces, None) or next(more)
        if piece in seen:
            continue
        seen.add(piece)
        tokens.append(piece)
        types.append(1)
    scores = [0.0] * 259 + [-float(i) for i in range(n_vocab - 259)]
    return tokens, scores, types


def _random_blocks(rng: np.random.Generator, ggml_type: str, n_blocks: int) -> npt.NDArray[np.uint8]:
    import numpy as np

    size, scales = _BLOCKS[ggml_type]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for offset, typical in scales:
        d = (typical * (0.5 + rng.random(n_blocks, dtype=np.float32))).astype(np.float16)
        blocks[:, offset : offset + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def _chunks(rng: np.random.Generator, t: PlannedTensor) -> Iterator[npt.NDArray[Any]]:
    """``t``'s data as uint8 (or float32) arrays of at most :data:`CHUNK_BYTES`, in file order."""
    import numpy as np

    if t.ggml_type == "F32":
        yield np.ones(t.shape, dtype=np.float32)  # RMS-norm weights of 1 (Gemma's are stored +1 already)
        return
    blocks_per_row = t.shape[0] // BLOCK_ELEMENTS[t.ggml_type]
    rows = t.n_elements // t.shape[0]
    row_bytes = blocks_per_row * _BLOCKS[t.ggml_type][0]
    step = max(1, CHUNK_BYTES // row_bytes)
    for start in range(0, rows, step):
        n = min(step, rows - start)
        yield _random_blocks(rng, t.ggml_type, n * blocks_per_row).reshape(-1)


def _writer(path: Path, synth: SynthPlan) -> gguf.GGUFWriter:
    """A :class:`gguf.GGUFWriter` with the metadata and tensor infos of ``synth`` added."""
    import gguf
    import numpy as np

    s = synth.shape
    w = gguf.GGUFWriter(path, s.architecture)
    w.add_name(f"{s.name} (synthetic: timings only)")
    w.add_description(f"random weights in the shapes of {s.name}, {synth.quant}, written by chatphase")
    w.add_string(SYNTHETIC_KEY, SYNTHETIC_LABEL)
    w.add_file_type(FILE_TYPES[synth.quant])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(s.rope_freq_base)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_vocab_size(s.n_vocab)
    for key, value in s.extra.items():
        full = f"{s.architecture}.{key}"
        w.add_uint32(full, value) if isinstance(value, int) else w.add_float32(full, value)
    tokens, scores, types = synthetic_vocab(s.n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    for t in synth.tensors:
        numpy_shape = tuple(reversed(t.shape))
        if t.ggml_type == "F32":
            w.add_tensor_info(t.name, numpy_shape, np.dtype(np.float32), tensor_bytes(t))
        else:
            row_bytes = tensor_bytes(t) // (t.n_elements // t.shape[0])
            raw = gguf.GGMLQuantizationType[t.ggml_type]
            w.add_tensor_info(t.name, (*numpy_shape[:-1], row_bytes), np.dtype(np.uint8), tensor_bytes(t), raw)
    return w


def write_synthetic(
    synth: SynthPlan,
    target: Path,
    progress: Callable[[int, int, str], None] | None = None,
    seed: int = 0,
    layout_only: bool = False,
) -> Path:
    """Write ``synth`` to ``target`` (via ``target.part``, renamed at the end); ``progress(done_bytes,
    total_bytes, tensor_name)`` after each chunk. Returns ``target``.

    ``layout_only``: the header and tensor infos only, the tensor data left a hole of zeros (sparse where
    the file system allows: an 8B file in milliseconds, no disk used): a file of the right size and layout for
    what reads no weights (llama.cpp's memory projection, :mod:`chatphase.engine.local.projection`) or reads
    zeros harmlessly (a load timed without decoding).

    Raises:
        UsageError: a write error (a full disk, ...; :func:`check_room` checks before); the partial file is
            removed, also when interrupted.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    part = target.with_name(target.name + ".part")
    total, done = synth.data_bytes, 0
    writer = _writer(part, synth)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None  # the header writes opened it
        fout = writer.fout[0]
        for t in synth.tensors:
            # the gguf writer's write_tensor_data, in chunks: pad to the alignment, the data, pad after it
            writer.write_padding(fout, fout.tell())
            start = fout.tell()
            if layout_only:
                fout.seek(tensor_bytes(t), os.SEEK_CUR)
                fout.truncate()  # the hole up to here: the file has its full size even if nothing follows
                done += tensor_bytes(t)
            for chunk in () if layout_only else _chunks(rng, t):
                chunk.tofile(fout)
                done += chunk.nbytes
                del chunk  # before the next one is made: one chunk in memory at a time
                if progress is not None:
                    progress(done, total, t.name)
            if fout.tell() - start != tensor_bytes(t):
                raise OSError(f"tensor {t.name} wrote {fout.tell() - start} bytes, expected {tensor_bytes(t)}")
            writer.write_padding(fout, tensor_bytes(t))
        writer.close()
        os.replace(part, target)
    except OSError as exc:
        writer.close()
        part.unlink(missing_ok=True)
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from None
    except BaseException:
        writer.close()
        part.unlink(missing_ok=True)
        raise
    return target
