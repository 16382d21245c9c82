"""The prefix store's files: saved KV states of token prefixes, in the user cache directory.

One file per saved prefix, ``<dir>/<key[:16]>-<tokens hash>.kvs`` (``dir``: :func:`store_dir`, ``prefix`` in
the cache folder of :mod:`chatphase.system.paths`), laid out as::

    b"CPKVSEQ1" · u32 header length · header (JSON, UTF-8) · tokens (int32 LE × n_tokens)
    · boundaries (int32 × n_bounds token counts, then int32 × n_bounds byte counts) · text (UTF-8)
    · state (llama.cpp's ``llama_state_seq_get_data`` of sequence 0, ``state_bytes``)

The header holds the store key (:func:`store_key`: what makes a state wrong elsewhere), the counts, a
CRC-32 of the metadata and of the state, and how the saving run computed the cells (``batches``,
:class:`BatchRecord`: where its evaluation batches began, for an exact restore, ``prefix_cache = exact``; files
written before it lack the key and are read all the same, their batches unknown). llama.cpp's own checks on a state (its reader, ``llama_kv_cache::
state_read_data``) cover the layer count, the K and V types and row sizes and V's layout (flash attention)
— not which weights made it: a file of another model of the same shape would load silently and answer
wrongly, hence the key. A truncated or damaged file fails the size or CRC check (``zlib.crc32``, about
6 GB/s: 15 ms on a 90 MiB state) before llama.cpp sees it. The boundaries and text are the
:class:`~chatphase.engine.local.prefix.CacheText` of the tokens, so that a resumed chat's prompt reuses the
sampled reply tokens by their text.

Writes are atomic: a ``.part`` file renamed into place when complete, so a killed save leaves only a
``.part`` that is never read (and is removed by the next store opened after an hour). No ``fsync``: a file
that an OS crash left half-written fails the CRC check and is refused.

Pure Python, no llama.cpp: ``chatphase cache`` lists and clears the store without loading a model.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import struct
import time
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatphase.errors import EngineError
from chatphase.system.paths import cache_dir

MAGIC = b"CPKVSEQ1"
FORMAT_VERSION = 1
SUFFIX = ".kvs"
PART = ".part"
RATES_FILE = "rates.json"
#: bytes written per step; a save checks between steps whether a turn wants the machine back.
WRITE_CHUNK = 8 << 20
#: the default cap on the store: this share of the free disk, at most :data:`CAP_CEILING_BYTES`.
CAP_DISK_SHARE = 0.05
CAP_CEILING_BYTES = 4 << 30
#: a ``.part`` file older than this is a save that was killed: removed when a store is opened.
STALE_PART_S = 3600.0
#: prefill samples kept per key for the decision rule.
MAX_PREFILL_SAMPLES = 32
#: bytes :func:`save_problem` writes to learn whether a store can save (a block: a full disk refuses it).
PROBE_BYTES = 4096


class StoreRefused(EngineError):
    """A stored file that must not be used (damaged, truncated, foreign, stale): the message is one line."""


def store_dir() -> Path:
    """``prefix`` in :func:`chatphase.system.paths.cache_dir` (``$CHATPHASE_CACHE_DIR``)."""
    return cache_dir() / "prefix"


def not_a_folder(directory: Path) -> Path | None:
    """The path that keeps ``directory`` from being a folder: itself, or the nearest existing parent, when that
    is not a folder (a plain file in its place); ``None`` when it is one, or can be made."""
    probe = directory
    while not probe.is_dir():
        if probe.exists() or probe.is_symlink():
            return probe
        if probe == probe.parent:
            return None
        probe = probe.parent
    return None


def save_problem(directory: Path) -> str | None:
    """Why no prefix can be saved in ``directory`` (the OS's reason, or the path that is not a folder), ``None``
    when one can: the folder is made if missing and a probe file of :data:`PROBE_BYTES` written there and removed.
    """
    blocked = not_a_folder(directory)
    if blocked is not None:
        return f"{blocked} is not a folder"
    probe = directory / f".probe.{os.getpid()}{PART}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(bytes(PROBE_BYTES))
    except OSError as exc:
        with suppress(OSError):
            probe.unlink(missing_ok=True)
        return exc.strerror or str(exc)
    with suppress(OSError):
        probe.unlink()
    return None


def default_cap_bytes(directory: Path) -> int:
    """The store's default size cap: :data:`CAP_DISK_SHARE` of the free disk where ``directory`` lives (its
    nearest existing parent), at most :data:`CAP_CEILING_BYTES`."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return 0
    return min(CAP_CEILING_BYTES, int(free * CAP_DISK_SHARE))


def store_key(parts: dict[str, object]) -> str:
    """The store key (hex SHA-256) of ``parts``, a JSON-ready dict of everything a state depends on."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()


def file_identity(path: str | os.PathLike[str], sample: int = 1 << 20) -> str:
    """A model file's identity: its size, mtime and a SHA-256 of its first and last ``sample`` bytes (the
    GGUF header and metadata, and the last tensors), not its name: a file replaced under the same name, or
    another quantisation, is another identity. Costs two small reads, not a hash of the whole file."""
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(sample))
        if st.st_size > sample:
            f.seek(max(sample, st.st_size - sample))
            h.update(f.read(sample))
    return f"{st.st_size}:{st.st_mtime_ns}:{h.hexdigest()}"


@dataclass(frozen=True)
class BatchRecord:
    """How a saved prefix's cells were computed: ``starts`` the positions where the saving run's evaluation
    batches began (each ``llama_decode``'s start and its ``n_ubatch`` sub-batches'; every position of a decode
    step), sorted (``None``: that run did not know, its cells restored from an older file); ``n_ubatch`` its
    sub-batch; ``shifted_from`` the first cell whose keys a KV shift moved (``None``: none), ``shift_unknown``:
    that is not known either."""

    starts: list[int] | None
    n_ubatch: int
    shifted_from: int | None = None
    shift_unknown: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "starts": self.starts,
            "n_ubatch": self.n_ubatch,
            "shifted_from": self.shifted_from,
            "shift_unknown": self.shift_unknown,
        }

    @classmethod
    def from_json(cls, data: object) -> BatchRecord | None:
        """The record from a header's ``batches`` (``None``: absent or malformed, the batches unknown)."""
        if not isinstance(data, dict):
            return None
        starts, n_ubatch, shifted = data.get("starts"), data.get("n_ubatch"), data.get("shifted_from")
        if starts is not None and not (isinstance(starts, list) and all(isinstance(x, int) for x in starts)):
            return None
        if not isinstance(n_ubatch, int) or n_ubatch < 1 or not (shifted is None or isinstance(shifted, int)):
            return None
        return cls(None if starts is None else sorted(starts), n_ubatch, shifted, bool(data.get("shift_unknown")))


@dataclass
class Entry:
    """One stored prefix, as read from its file's header (the state itself is read by :func:`read_state`);
    ``batches``: how its cells were computed (``None``: a file written before that was recorded)."""

    path: Path
    key: str
    tokens: array[int]  # int32 token ids
    ntok: list[int]
    nbytes: list[int]
    text: bytes
    state_offset: int
    state_bytes: int
    state_crc32: int
    file_bytes: int
    mtime: float
    model: str
    created: float
    tokens_blob: bytes = field(repr=False, default=b"")  # ``tokens`` as bytes, for fast prefix comparison
    batches: BatchRecord | None = field(repr=False, default=None)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def _u32(data: bytes, off: int) -> int:
    return int(struct.unpack_from("<I", data, off)[0])


def read_entry(path: Path) -> Entry:
    """The header, tokens and text of the stored file ``path``.

    Raises:
        StoreRefused: not a store file, a format of another chatphase, a truncated or damaged header.
    """
    try:
        st = path.stat()
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[:8] != MAGIC:
                raise StoreRefused(f"{path.name}: not a chatphase prefix file")
            n = _u32(head, 8)
            header = json.loads(f.read(n).decode("utf-8"))
            if header.get("version") != FORMAT_VERSION:
                raise StoreRefused(
                    f"{path.name}: format {header.get('version')}, this chatphase reads {FORMAT_VERSION}"
                )
            n_tok, n_bounds, n_text = header["n_tokens"], header["n_bounds"], header["text_bytes"]
            meta = f.read(4 * n_tok + 8 * n_bounds + n_text)
            if len(meta) != 4 * n_tok + 8 * n_bounds + n_text or zlib.crc32(meta) != header["meta_crc32"]:
                raise StoreRefused(f"{path.name}: damaged or truncated (its tokens fail their check)")
            offset = f.tell()
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise StoreRefused(f"{path.name}: unreadable ({type(exc).__name__.lower()})") from None
    state_bytes = header["state_bytes"]
    if st.st_size != offset + state_bytes:
        raise StoreRefused(f"{path.name}: truncated ({st.st_size:,} of {offset + state_bytes:,} bytes)")
    tokens = array("i")
    tokens.frombytes(meta[: 4 * n_tok])
    bounds = array("i")
    bounds.frombytes(meta[4 * n_tok : 4 * n_tok + 8 * n_bounds])
    return Entry(
        path=path,
        key=header["key"],
        tokens=tokens,
        ntok=list(bounds[:n_bounds]),
        nbytes=list(bounds[n_bounds:]),
        text=meta[4 * n_tok + 8 * n_bounds :],
        state_offset=offset,
        state_bytes=state_bytes,
        state_crc32=header["state_crc32"],
        file_bytes=st.st_size,
        mtime=st.st_mtime,
        model=str(header.get("model", "")),
        created=float(header.get("created", 0.0)),
        tokens_blob=meta[: 4 * n_tok],
        batches=BatchRecord.from_json(header.get("batches")),
    )


def read_state(entry: Entry) -> bytearray:
    """A copy of the state bytes of ``entry``, checked (:func:`mapped_state`).

    Raises:
        StoreRefused: the file changed, is truncated or damaged.
    """
    with mapped_state(entry) as view:
        return bytearray(view)


@contextmanager
def mapped_state(entry: Entry) -> Iterator[memoryview]:
    """The state bytes of ``entry`` as a writable view of the file mapped copy-on-write, checked against its
    size and CRC; valid inside the ``with`` only.

    Why a mapping: a restore reads the state once for the CRC and llama.cpp copies it once into the KV cache;
    reading it into a fresh buffer first cost two more passes (zero-filling the buffer's new pages, then the
    copy), half of a restore's time. Copy-on-write, so that the view is writable (ctypes' ``from_buffer``
    needs that) while nothing is ever written to the file.

    Raises:
        StoreRefused: the file changed, is truncated or damaged.
    """
    try:
        with open(entry.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < entry.state_offset + entry.state_bytes:
                got = max(0, size - entry.state_offset)
                raise StoreRefused(f"{entry.path.name}: truncated ({got:,} of {entry.state_bytes:,} state bytes)")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise StoreRefused(f"{entry.path.name}: unreadable ({exc.strerror or exc})") from None
    view = memoryview(mapped)[entry.state_offset : entry.state_offset + entry.state_bytes]
    try:
        if zlib.crc32(view) != entry.state_crc32:
            raise StoreRefused(f"{entry.path.name}: damaged (its state fails its check)")
        yield view
    finally:
        view.release()
        mapped.close()


def write_entry(
    directory: Path,
    key: str,
    model: str,
    tokens: Iterable[int],
    ntok: list[int],
    nbytes: list[int],
    text: bytes,
    state: bytes | bytearray | memoryview,
    abort: Callable[[], bool] = lambda: False,
    batches: BatchRecord | None = None,
) -> Path | None:
    """Write one stored prefix atomically (a ``.part`` file, renamed when complete); ``batches`` how its cells
    were computed (``None``: unknown, as in a file written before it was recorded).

    ``abort`` is asked between :data:`WRITE_CHUNK` steps; when it says yes the ``.part`` is removed and
    ``None`` returned (a turn wants the machine). Returns the file's path.

    Raises:
        OSError: the disk refused the write (the ``.part`` is removed).
    """
    tok = array("i", tokens)
    bounds = array("i", ntok + nbytes)
    meta = tok.tobytes() + bounds.tobytes() + text
    fields = {
        "version": FORMAT_VERSION,
        "key": key,
        "model": model,
        "created": time.time(),
        "n_tokens": len(tok),
        "n_bounds": len(ntok),
        "text_bytes": len(text),
        "meta_crc32": zlib.crc32(meta),
        "state_bytes": len(state),
        "state_crc32": zlib.crc32(state),
    }
    if batches is not None:  # a reader that does not know the key ignores it (the format stays 1)
        fields["batches"] = batches.to_json()
    header = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{key[:16]}-{hashlib.sha256(tok.tobytes()).hexdigest()[:16]}{SUFFIX}"
    part = directory / f".{name}.{os.getpid()}{PART}"
    view = memoryview(state).cast("B")
    try:
        with open(part, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(header)) + header + meta)
            for start in range(0, len(view), WRITE_CHUNK):
                if abort():
                    raise InterruptedError
                f.write(view[start : start + WRITE_CHUNK])
        os.replace(part, directory / name)
    except InterruptedError:
        part.unlink(missing_ok=True)
        return None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return directory / name


def common_tokens(a: bytes | Sequence[int], b: bytes | Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (token id sequences, or their int32 bytes)."""
    from chatphase.engine.local.prefix import common_prefix_len

    a = a if isinstance(a, bytes) else array("i", a).tobytes()
    b = b if isinstance(b, bytes) else array("i", b).tobytes()
    return common_prefix_len(a, b) // 4


class PrefixStore:
    """The stored prefixes of one store key, in ``directory``, kept under ``cap_bytes`` (least recently
    used first out; a restore marks a file used by touching its mtime).

    Headers are read once per file and kept while the file's size and mtime stay the same, so a lookup
    costs a directory listing and a comparison of token bytes.
    """

    def __init__(self, directory: Path, key: str, cap_bytes: int) -> None:
        self.directory = directory
        self.key = key
        self.cap_bytes = cap_bytes
        self._seen: dict[str, tuple[int, float, Entry | None]] = {}
        self.refused: list[str] = []  # one line per file refused since the last look (for the engine log)
        _remove_stale_parts(directory)

    def entries(self) -> list[Entry]:
        """This key's readable entries (a file that fails its header check is removed, its line kept in
        :attr:`refused`)."""
        out = []
        prefix = self.key[:16]
        try:
            names = [p for p in self.directory.iterdir() if p.name.startswith(prefix) and p.suffix == SUFFIX]
        except OSError:
            return []
        for path in names:
            try:
                st = path.stat()
            except OSError:
                continue
            seen = self._seen.get(path.name)
            if seen is not None and seen[0] == st.st_size and seen[1] == st.st_mtime:
                entry = seen[2]
            else:
                try:
                    entry = read_entry(path)
                    if entry.key != self.key:
                        raise StoreRefused(f"{path.name}: saved for other settings")
                except StoreRefused as exc:
                    self.refuse(path, str(exc))
                    entry = None
                self._seen[path.name] = (st.st_size, st.st_mtime, entry)
            if entry is not None:
                out.append(entry)
        return out

    def refuse(self, path: Path, line: str) -> None:
        """Remove a file that must not be used and keep its one line."""
        self.refused.append(line)
        path.unlink(missing_ok=True)
        self._seen.pop(path.name, None)

    def longest(self, prompt: bytes, limit: int, whole_only: bool) -> tuple[Entry | None, int]:
        """The entry sharing the most leading tokens with ``prompt`` (int32 bytes), at most ``limit`` of them;
        with ``whole_only`` only entries that are wholly a prefix of it (a state that cannot be cut).
        Returns ``(entry, tokens shared)``; ``(None, 0)`` when none shares any."""
        best, best_n = None, 0
        for entry in self.entries():
            n = min(common_tokens(entry.tokens_blob, prompt), limit)
            if whole_only and n != entry.n_tokens:
                continue
            if n > best_n or (n == best_n and best is not None and entry.state_bytes < best.state_bytes):
                best, best_n = entry, n
        return best, best_n

    def touch(self, entry: Entry) -> None:
        """Mark ``entry`` just used (LRU)."""
        try:
            os.utime(entry.path)
            st = entry.path.stat()
            self._seen[entry.path.name] = (st.st_size, st.st_mtime, entry)
        except OSError:
            pass

    def added(self, path: Path, supersede: bool) -> None:
        """A file was written: with ``supersede``, remove this key's files whose tokens it extends (a cut of
        the new one restores them); then evict least recently used files beyond the cap."""
        try:
            new = read_entry(path)
        except StoreRefused:
            return
        if supersede:
            for entry in self.entries():
                if (
                    entry.path != path
                    and entry.n_tokens <= new.n_tokens
                    and new.tokens_blob.startswith(entry.tokens_blob)
                ):
                    entry.path.unlink(missing_ok=True)
        evict(self.directory, self.cap_bytes)


def _remove_stale_parts(directory: Path) -> None:
    now = time.time()
    try:
        for p in directory.glob(f".*{PART}"):
            try:
                if now - p.stat().st_mtime > STALE_PART_S:
                    p.unlink()
            except OSError:
                pass
    except OSError:
        pass


def list_files(directory: Path) -> list[tuple[Path, int, float, Entry | None, str | None]]:
    """Every stored file: ``(path, bytes, mtime, entry or None, why it is refused or None)``, newest use first."""
    out: list[tuple[Path, int, float, Entry | None, str | None]] = []
    if not directory.is_dir():
        return out
    for p in directory.glob(f"*{SUFFIX}"):
        try:
            st = p.stat()
        except OSError:
            continue
        try:
            out.append((p, st.st_size, st.st_mtime, read_entry(p), None))
        except StoreRefused as exc:
            out.append((p, st.st_size, st.st_mtime, None, str(exc)))
    return sorted(out, key=lambda row: -row[2])


def evict(directory: Path, cap_bytes: int) -> list[Path]:
    """Remove least recently used files until the store holds at most ``cap_bytes``. Returns what went."""
    files = []
    for p in directory.glob(f"*{SUFFIX}"):
        try:
            st = p.stat()
        except OSError:
            continue
        files.append((st.st_mtime, st.st_size, p))
    files.sort()
    total = sum(size for _, size, _ in files)
    gone = []
    for _, size, p in files:
        if total <= cap_bytes:
            break
        p.unlink(missing_ok=True)
        total -= size
        gone.append(p)
    return gone


def clear(directory: Path) -> tuple[int, int]:
    """Remove every stored file (and the measured rates). Returns ``(files, bytes)`` removed."""
    n = size = 0
    if not directory.is_dir():
        return 0, 0
    for p in [*directory.glob(f"*{SUFFIX}"), *directory.glob(f".*{PART}"), directory / RATES_FILE]:
        try:
            size += p.stat().st_size
            p.unlink()
            n += p.suffix == SUFFIX
        except OSError:
            pass
    return n, size


class Rates:
    """The rates the decision rule needs, measured and kept in ``<dir>/rates.json`` per store key: the
    restore rate (state bytes per second of a whole restore: read, check, hand to llama.cpp) and prefill
    samples ``(end depth, tokens, ms)``."""

    def __init__(self, directory: Path, key: str) -> None:
        self.path = directory / RATES_FILE
        self.key = key
        mine = self._all().get(key, {})
        self.restore_bytes_per_s: float | None = mine.get("restore_bytes_per_s")
        self.prefill: list[list[float]] = list(mine.get("prefill", []))

    def _all(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def prefill_tokens_per_s(self, depth: int) -> float | None:
        """Prefill rate of the sample whose end depth is nearest ``depth`` (``None``: no sample). Samples of a
        prefill after a cached prefix run deeper than a cold one's average, so they err towards restoring."""
        if not self.prefill:
            return None
        _, tokens, ms = min(self.prefill, key=lambda s: abs(s[0] - depth))
        return tokens / ms * 1000 if ms > 0 else None

    def add_prefill(self, depth: int, tokens: int, ms: float) -> None:
        self.prefill = [*self.prefill, [depth, tokens, ms]][-MAX_PREFILL_SAMPLES:]

    def add_restore(self, state_bytes: int, ms: float) -> None:
        if ms > 0:
            self.restore_bytes_per_s = state_bytes / ms * 1000

    def save(self) -> None:
        """Write the rates back (atomic; other keys' rates kept)."""
        data = self._all()
        data[self.key] = {"restore_bytes_per_s": self.restore_bytes_per_s, "prefill": self.prefill}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            part = self.path.with_name(f".{RATES_FILE}.{os.getpid()}{PART}")
            part.write_text(json.dumps(data))
            os.replace(part, self.path)
        except OSError:
            pass
