"""GGUF header reading with the `gguf` package (no llama.cpp involved).

:func:`read_model_info` checks a file is a usable GGUF *before* llama.cpp sees it (a bad file passed to
llama.cpp can abort the process) and returns the facts the app shows: name, architecture, parameters,
quantisation, training context and KV bytes per token.

Speed: :class:`gguf.GGUFReader` builds one numpy view per element of every metadata array, so the
vocabulary (49,152 tokens and 48,900 merges in SmolLM2) costs ~2 s per file. :class:`_HeaderReader` is a
``GGUFReader`` that reads scalar arrays as one view and only *steps over* large string arrays (keeping
their length, e.g. the vocabulary size); everything else is the package's own parsing. It relies on the
reader's internal ``_get_field_parts`` / ``_build_tensors``; if a future ``gguf`` release changes them,
:func:`read_metadata` falls back to the plain reader (correct, only slower).
Measured side by side with ``python benchmarks/gguf_reader.py`` on the 98 MB default model (2 shared cores):
59 ms vs 5,542 ms, a ratio of ~94x (``tests/models/test_models_validation.py`` checks both readers give the same
metadata and tensors).

Validation order (each failure is one :class:`~chatphase.errors.ModelError` line): missing, directory,
empty, bad magic (e.g. an HTML page saved as ``.gguf``), unparsable header, tensor data shorter than the
header says (truncated), missing split parts, no or unsupported architecture, no tensors at all
(a vocabulary-only file).
"""

from __future__ import annotations

import errno
import functools
import importlib.util
import logging
import os
import re
import struct
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chatphase.errors import ModelError
from chatphase.models.kv import AttentionShape, attention_shape, kv_bytes_per_token

if TYPE_CHECKING:  # importing gguf costs ~0.2 s: at run time it is imported where it is used
    import gguf

GGUF_MAGIC = b"GGUF"
#: the GGUF versions llama.cpp reads (its gguf.cpp refuses v1 and anything newer than v3).
GGUF_VERSIONS = (2, 3)
#: keys whose values are large arrays we never need (vocabulary, merges, scores).
_SKIP_PREFIXES = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
)
#: string arrays longer than this are stepped over, not materialised.
_LONG_STRING_ARRAY = 256
#: ``name-00001-of-00003.gguf``: llama.cpp's split naming (``llama_split_prefix``).
#: GGUF key of a synthetic model (random weights of a real model's shapes: ``chatphase models synth``),
#: and the label every view shows for one.
SYNTHETIC_KEY = "chatphase.synthetic"
SYNTHETIC_LABEL = "synthetic: timings only"
SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class ModelInfo:
    """What chatphase knows about a GGUF model file.

    ``name`` is the file name without ``.gguf`` and split suffix (what users know a model by; the
    metadata's ``general.name`` is often a training-run label). ``n_params`` counts tensor elements;
    ``n_params``, ``size_bytes``, ``n_layer`` and ``n_ctx_train`` are ``None`` for a served model whose server
    does not say (:func:`chatphase.engine.remote.engine.remote_model_info`), never for a file read here;
    ``size_bytes`` is the file size (all parts of a split model);
    ``kv_bytes_per_token`` assumes an f16 cache (llama.cpp's default) and, like ``attention`` (the
    geometry for other cache types), is ``None`` for models without a per-token KV cache. ``n_vocab`` and
    ``n_embd`` feed the compute-buffer estimate (:mod:`chatphase.models.memory`); ``split_count`` is the
    number of files of a split GGUF (``path`` is the first); ``synthetic`` marks random weights in a real
    model's shapes (:data:`SYNTHETIC_KEY`): its text is noise, its timings are real; ``embedding_bytes``
    the bytes of the token embedding when the model has a separate output matrix (a token reads one row of
    it, :func:`chatphase.models.roofline.weight_bytes_per_token`), else 0.
    """

    path: str
    name: str
    architecture: str
    n_params: int | None
    size_bytes: int | None
    n_layer: int | None
    quantization: str
    n_ctx_train: int | None
    kv_bytes_per_token: int | None
    has_chat_template: bool
    attention: AttentionShape | None = None
    n_vocab: int = 0
    n_embd: int = 0
    split_count: int = 1
    synthetic: bool = False
    embedding_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)


class _Truncated(Exception):
    def __init__(self, needed: int, have: int):
        super().__init__(f"needs {needed} bytes, has {have}")
        self.needed, self.have = needed, have


def _header_reader_class() -> type[gguf.GGUFReader]:
    """Build the fast reader class lazily (importing ``gguf`` costs ~0.2 s)."""
    import gguf
    import numpy as np

    class _HeaderReader(gguf.GGUFReader):
        """``GGUFReader`` that skips the per-element work on large arrays (see the module docstring)."""

        def _get_field_parts(
            self, orig_offs: int, raw_type: int
        ) -> tuple[int, list[Any], list[int], list[gguf.GGUFValueType]]:
            if gguf.GGUFValueType(raw_type) != gguf.GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            offs = orig_offs
            raw_itype = self._get(offs, np.uint32)
            alen = self._get(offs + 4, np.uint64)
            offs += 12
            itype = gguf.GGUFValueType(raw_itype[0])
            count = int(alen[0])
            nptype = self.gguf_scalar_to_np.get(itype)
            if nptype is not None:
                values = self._get(offs, nptype, count)
                if len(values) != count:
                    raise ValueError("array runs past the end of the file")
                return 12 + int(values.nbytes), [raw_itype, alen, values], [2], [gguf.GGUFValueType.ARRAY, itype]
            if itype == gguf.GGUFValueType.STRING and count > _LONG_STRING_ARRAY:
                buf = memoryview(self.data)  # type: ignore[arg-type]  # numpy's memmap is a buffer; its stubs miss __buffer__
                swapped = ">Q" if sys.byteorder == "little" else "<Q"
                unpack = struct.Struct("=Q" if self.byte_order == "I" else swapped).unpack_from  # I = host order
                for _ in range(count):  # step over each string: 8-byte length + bytes
                    offs += 8 + unpack(buf, offs)[0]
                if offs > len(self.data):
                    raise ValueError("string array runs past the end of the file")
                return offs - orig_offs, [raw_itype, alen], [], [gguf.GGUFValueType.ARRAY, itype]
            return super()._get_field_parts(orig_offs, raw_type)

        def _build_tensors(self, start_offs: int, fields: list[gguf.ReaderField]) -> None:
            end = 0
            for field in fields:  # parts: name_len, name, n_dims, dims, dtype, offset (gguf's layout)
                dims, raw_dtype, offset = field.parts[3], field.parts[4], field.parts[5]
                block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_dtype[0]))]
                n_elems = int(np.prod(dims, dtype=np.uint64))
                end = max(end, start_offs + int(offset[0]) + n_elems * type_size // block)
            if end > len(self.data):
                raise _Truncated(end, len(self.data))
            super()._build_tensors(start_offs, fields)

    return _HeaderReader


@functools.lru_cache(maxsize=1)
def _reader_classes() -> tuple[type[gguf.GGUFReader], ...]:
    import gguf

    try:
        return (_header_reader_class(), gguf.GGUFReader)
    except Exception:  # a gguf release without the internals we override
        return (gguf.GGUFReader,)


def _why_missing(p: Path) -> str:
    """Why ``p``, which does not exist as a file, cannot be opened: not found, a symlink loop, or a symlink
    to nothing."""
    if not p.is_symlink():
        return "model file not found"
    try:
        p.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "model file is a symlink loop"
    return f"model file is a symlink to a missing file ({os.readlink(p)})"


def read_metadata(path: str | os.PathLike[str]) -> tuple[dict[str, Any], gguf.GGUFReader]:
    """Read a GGUF file's key/value metadata with a :class:`gguf.GGUFReader`.

    Returns ``(metadata, reader)``: metadata maps key -> Python value (large tokenizer arrays skipped;
    ``tokenizer.ggml.tokens.count`` holds the vocabulary size when known).

    Raises:
        ModelError: missing file, a directory or other non-file, an empty or unreadable file, not GGUF,
            a header that cannot be parsed,
            or tensor data shorter than the header says (truncated).
    """
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{_why_missing(p)}: {p}")
    if p.is_dir():
        raise ModelError(f"model path is a directory, not a GGUF file: {p}")
    if not p.is_file():
        raise ModelError(f"model path is not a regular file: {p}")
    size = p.stat().st_size
    if size == 0:
        raise ModelError(f"model file is empty: {p}")
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise ModelError(f"cannot read model file ({exc.strerror or exc}): {p}") from None
    magic = head[:4]
    if magic != GGUF_MAGIC:
        start = magic.decode("latin-1").translate({i: "." for i in range(32)} | {127: "."})
        raise ModelError(f"not a GGUF file (it starts with {start!r}, not 'GGUF'): {p}")
    if len(head) == 8:
        version = min(int.from_bytes(head[4:], "little"), int.from_bytes(head[4:], "big"))  # either byte order
        if version not in GGUF_VERSIONS:
            known = " and ".join(map(str, GGUF_VERSIONS))
            raise ModelError(f"GGUF version {version} is not supported (llama.cpp reads versions {known}): {p}")
    reader = None
    error: Exception | None = None
    for cls in _reader_classes():
        try:
            reader = cls(p)
            break
        except _Truncated as exc:
            raise ModelError(
                f"GGUF file is truncated: tensor data needs {exc.needed:,} bytes, file has {exc.have:,}: {p}"
            ) from None
        except Exception as exc:  # gguf raises ValueError/IndexError/KeyError on damaged headers
            error = error or exc
    if reader is None:  # gguf's own words (an IndexError deep in numpy) go to the debug log (--verbose)
        logging.getLogger(__name__).debug("GGUF header of %s: %r", p, error, exc_info=error)
        raise ModelError(
            f"GGUF header cannot be read: the file is damaged or cut short; download or copy it again: {p}"
        )
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith(_SKIP_PREFIXES):
            if key == "tokenizer.ggml.tokens" and len(field.parts) >= 5:  # key len, key, type, item type, count
                meta["tokenizer.ggml.tokens.count"] = int(field.parts[4][0])
            continue
        try:
            meta[key] = field.contents()
        except Exception:  # an odd value type must not make the model unusable
            continue
    return meta, reader


def split_parts(path: str | os.PathLike[str], count: int) -> list[Path]:
    """All files of a split GGUF given its first part (``x-00001-of-0000N.gguf``), in order.

    Raises:
        ModelError: when the name does not follow llama.cpp's split naming or a part is missing.
    """
    p = Path(path)
    m = SPLIT_RE.match(p.name)
    if not m or int(m["no"]) != 1 or int(m["count"]) != count:
        raise ModelError(
            f"split GGUF ({count} parts) must be opened by its first part NAME-00001-of-{count:05d}.gguf: {p}"
        )
    parts = [p.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [q.name for q in parts if not q.is_file()]
    if missing:
        raise ModelError(f"split GGUF is missing {len(missing)} of {count} parts ({', '.join(missing[:3])}): {p}")
    return parts


@functools.lru_cache(maxsize=1)
def _llama_library_bytes() -> bytes | None:
    spec = importlib.util.find_spec("llama_cpp")
    for location in (spec.submodule_search_locations or []) if spec else []:
        for lib in sorted(Path(location, "lib").glob("libllama.*")) + sorted(Path(location).glob("libllama.*")):
            if lib.is_file():
                return lib.read_bytes()
    return None


def architecture_supported(arch: str) -> bool | None:
    """Whether this build of llama.cpp knows the GGUF architecture ``arch``.

    llama.cpp has no API listing its architectures; its table (``LLM_ARCH_NAMES`` in ``llama-arch.cpp``) is
    compiled into ``libllama`` as NUL-terminated strings, so a name absent from the library is certainly
    unknown to this build. (A name that merely ends another string would pass; llama.cpp then reports it.)
    Without the library file it falls back to the ``gguf`` package's list (``gguf.MODEL_ARCH_NAMES``, the
    Python side of the same repository), and returns ``None`` when neither is available.
    """
    data = _llama_library_bytes()
    if data is not None:
        return arch.encode() + b"\0" in data
    try:
        import gguf

        return arch in set(gguf.MODEL_ARCH_NAMES.values())
    except Exception:
        return None


def read_model_info(path: str | os.PathLike[str]) -> ModelInfo:
    """Validate a GGUF file (all parts, if split) and summarise it as :class:`ModelInfo`.

    Raises:
        ModelError: as :func:`read_metadata`, plus missing split parts or a missing/unsupported architecture.
    """
    p = Path(path)
    meta, reader = read_metadata(p)
    arch = meta.get("general.architecture")
    if not arch:
        raise ModelError(f"GGUF file has no general.architecture: {p}")
    if architecture_supported(str(arch)) is False:
        raise ModelError(f"architecture {arch!r} is not supported by this llama.cpp build (llama-cpp-python): {p}")
    tensors = list(reader.tensors)
    size = p.stat().st_size
    split_count = int(meta.get("split.count", 1) or 1)
    if split_count > 1:
        for part in split_parts(p, split_count)[1:]:
            _, part_reader = read_metadata(part)
            tensors.extend(part_reader.tensors)
            size += part.stat().st_size
    if not tensors:
        raise ModelError(f"GGUF file has no tensors (a vocabulary-only file?), nothing to run: {p}")
    try:
        shape: AttentionShape | None = attention_shape(meta, arch)
    except ValueError:
        shape = None
    kv_per_token = kv_bytes_per_token(shape) if shape else None
    by_name = {t.name: t for t in tensors}
    untied = "output.weight" in by_name and "token_embd.weight" in by_name
    return ModelInfo(
        path=str(p),
        name=re.sub(r"-\d{5}-of-\d{5}$", "", p.stem),  # the file name: what users know a model by
        architecture=str(arch),
        n_params=int(sum(t.n_elements for t in tensors)),
        size_bytes=size,
        n_layer=int(meta.get(f"{arch}.block_count", 0)),
        quantization=_file_type_name(meta.get("general.file_type")),
        n_ctx_train=int(meta.get(f"{arch}.context_length", 0)),
        kv_bytes_per_token=kv_per_token,
        has_chat_template="tokenizer.chat_template" in meta,
        attention=shape,
        n_vocab=int(meta.get(f"{arch}.vocab_size") or meta.get("tokenizer.ggml.tokens.count") or 0),
        n_embd=int(meta.get(f"{arch}.embedding_length", 0)),
        split_count=split_count,
        synthetic=SYNTHETIC_KEY in meta,
        embedding_bytes=int(by_name["token_embd.weight"].n_bytes) if untied else 0,
    )


def read_chat_template(path: str | os.PathLike[str]) -> str | None:
    """The GGUF's ``tokenizer.chat_template`` (Jinja source), ``None`` when it has none.

    Raises:
        ModelError: as :func:`read_metadata`.
    """
    template = read_metadata(path)[0].get("tokenizer.chat_template")
    return template if isinstance(template, str) and template else None


def _file_type_name(file_type: Any) -> str:
    if file_type is None:
        return "unknown"
    import gguf

    try:
        return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"type {file_type}"
