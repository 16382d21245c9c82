"""Hugging Face Hub access: which GGUF file of a repo to use, downloading it, and the offline cache.

Layout: ``chatphase pull OWNER/NAME`` puts files in ``<models dir>/OWNER/NAME/`` (huggingface-hub's
``local_dir`` download, so the bytes land where the user keeps models). When the file is already in the
Hugging Face cache (``HF_HUB_CACHE``) it is linked from there instead of downloaded again, which also works
offline. ``REPO[:FILE|:QUANT]`` model specs resolve from those two places only; nothing is downloaded
without ``pull`` (the ``pull`` command or ``--pull``).

Interrupted downloads: huggingface-hub writes to ``<models dir>/OWNER/NAME/.cache/huggingface/download/
*.incomplete`` and moves the file into place only once complete; a dropped connection is resumed within
the same run with an HTTP ``Range`` request (up to 5 tries), and a failed or interrupted (Ctrl-C) download
removes its partial file. A process killed outright leaves an ``.incomplete`` file, which never looks like
a model and which the next pull of that repo deletes (:func:`remove_stale_partials`).

Offline: ``HF_HUB_OFFLINE=1`` makes every lookup cache-only and fails at once with the cache path searched.
Unreachable Hub: one line naming the endpoint.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from chatphase.errors import ChatPhaseError, ModelError, UsageError
from chatphase.models.gguf_meta import SPLIT_RE
from chatphase.system.paths import hf_cache_dir

#: ``owner/name`` with an optional ``:FILE`` or ``:QUANT`` (the Hub's repo id characters).
REPO_SPEC_RE = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<sel>[^:]+))?$")
#: quantisation tags as llama.cpp's ``llama-quantize`` and common uploaders name them (``Q4_K_M``,
#: ``IQ2_XXS``, ``Q4_0_4_4``, ``TQ1_0``, ``F16``, ``BF16``, ``MXFP4``, Unsloth's ``UD-Q4_K_XL``).
_QUANT_RE = re.compile(
    r"(?:^|[-._])((?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|TQ\d+_\d+|BF16|F16|F32|MXFP4(?:_MOE)?))(?=$|[-._])",
    re.IGNORECASE,
)
#: seconds without a write after which an ``.incomplete`` download is treated as abandoned.
STALE_PARTIAL_S = 120


@dataclass(frozen=True)
class RepoSpec:
    """A parsed ``REPO[:FILE|:QUANT]`` spec: ``selector`` is a file name (ends in ``.gguf``) or a quant."""

    repo_id: str
    filename: str | None = None
    quant: str | None = None
    revision: str | None = None


@dataclass(frozen=True)
class GgufChoice:
    """One downloadable model in a repo: a single file, or all parts of a split GGUF (first part first)."""

    files: tuple[str, ...]
    quant: str | None
    size_bytes: int | None = None

    @property
    def name(self) -> str:
        """The file llama.cpp opens (the first part of a split model)."""
        return self.files[0]


@dataclass
class PullResult:
    """What :func:`pull` did: ``path`` is the file to open; ``source`` is ``downloaded``, ``hf-cache`` or ``present``."""

    path: Path
    source: str
    files: list[Path] = field(default_factory=list)


def parse_repo_spec(spec: str, revision: str | None = None) -> RepoSpec | None:
    """Parse ``OWNER/NAME[:FILE|:QUANT]``; ``None`` when ``spec`` does not have that shape."""
    m = REPO_SPEC_RE.match(spec.strip())
    if not m or m["repo"].lower().endswith(".gguf"):
        return None
    sel = m["sel"]
    if sel and sel.lower().endswith(".gguf"):
        return RepoSpec(m["repo"], filename=sel, revision=revision)
    return RepoSpec(m["repo"], quant=sel, revision=revision)


def quant_of(filename: str) -> str | None:
    """The quantisation tag in a GGUF file name, upper-cased (``model.Q4_K_M.gguf`` -> ``Q4_K_M``), or ``None``."""
    stem = Path(filename).name
    m = SPLIT_RE.match(stem)
    stem = m["prefix"] if m else re.sub(r"\.gguf$", "", stem, flags=re.IGNORECASE)
    found = _QUANT_RE.findall(stem)
    return found[-1].upper() if found else None


def gguf_choices(files: list[str], sizes: dict[str, int] | None = None) -> list[GgufChoice]:
    """Group a repo's file list into models: split parts together, projector (``mmproj``) files left out."""
    sizes = sizes or {}
    singles: list[GgufChoice] = []
    splits: dict[tuple[str, int], list[str]] = {}
    for f in sorted(files):
        name = Path(f).name
        if not name.lower().endswith(".gguf") or name.lower().startswith("mmproj"):
            continue
        m = SPLIT_RE.match(name)
        if m:
            splits.setdefault((str(Path(f).parent / m["prefix"]), int(m["count"])), []).append(f)
        else:
            singles.append(GgufChoice((f,), quant_of(f), sizes.get(f)))
    for (_prefix, count), parts in splits.items():
        parts.sort()
        if len(parts) == count:
            total = sum(sizes[p] for p in parts) if all(p in sizes for p in parts) else None
            singles.append(GgufChoice(tuple(parts), quant_of(parts[0]), total))
    return sorted(singles, key=lambda c: c.name)


def choose(
    choices: list[GgufChoice], repo_id: str, quant: str | None = None, filename: str | None = None
) -> GgufChoice:
    """Pick the model to use from a repo's choices by file name, by quant, or the only one.

    Raises:
        ModelError: when nothing or more than one matches, listing what the repo offers.
    """
    if filename:
        hits = [c for c in choices if filename in c.files or Path(c.name).name == filename]
        if hits:
            return hits[0]
        raise ModelError(f"{repo_id} has no GGUF file {filename}; {_describe(choices)}")
    if quant:
        hits = [c for c in choices if c.quant and c.quant.upper() == quant.upper()]
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise ModelError(f"{repo_id} has no {quant.upper()} GGUF; {_describe(choices)}")
        raise ModelError(
            f"{repo_id} has {len(hits)} {quant.upper()} files ({', '.join(c.name for c in hits)}); pick one with --file"
        )
    if len(choices) == 1:
        return choices[0]
    if not choices:
        raise ModelError(f"{repo_id} has no GGUF model files")
    raise ModelError(f"{repo_id} has {len(choices)} GGUF models; choose with --quant or --file: {_describe(choices)}")


def _describe(choices: list[GgufChoice]) -> str:
    if not choices:
        return "it has no GGUF model files"
    quants = sorted({c.quant for c in choices if c.quant})
    names = ", ".join(c.name for c in choices[:8]) + (", ..." if len(choices) > 8 else "")
    return f"quants: {', '.join(quants) or 'none recognised'}; files: {names}"


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set to a true value, read now (not at import)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def endpoint() -> str:
    """The Hub endpoint: ``HF_ENDPOINT`` or ``https://huggingface.co``."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def cached_files(repo_id: str, revision: str | None = None, cache_dir: Path | None = None) -> dict[str, Path]:
    """Files of ``repo_id`` present in the Hugging Face cache at ``revision`` (default ``main``): repo path -> local path.

    Reads the cache layout (``models--OWNER--NAME/refs/REV`` -> ``snapshots/COMMIT/...``) without network.
    """
    root = (cache_dir or hf_cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    rev = revision or "main"
    ref = root / "refs" / rev
    commit = ref.read_text().strip() if ref.is_file() else rev
    snap = root / "snapshots" / commit
    if not snap.is_dir():
        return {}
    return {p.relative_to(snap).as_posix(): p for p in snap.rglob("*") if p.is_file()}


def repo_dir(models_dir: Path, repo_id: str) -> Path:
    """Where ``pull`` puts ``repo_id``'s files: ``<models dir>/OWNER/NAME``."""
    return Path(models_dir) / repo_id


def local_files(repo_id: str, models_dir: Path) -> dict[str, Path]:
    """Files of ``repo_id`` already pulled into the models directory: repo path -> local path."""
    base = repo_dir(models_dir, repo_id)
    if not base.is_dir():
        return {}
    return {
        p.relative_to(base).as_posix(): p
        for p in base.rglob("*.gguf")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(base).parts)
    }


def find_local(spec: RepoSpec, models_dir: Path, cache_dir: Path | None = None) -> Path | None:
    """The local path of ``spec``'s model (pulled into ``models_dir`` or in the HF cache), or ``None``.

    Raises:
        ModelError: when local files exist but the selector is ambiguous or matches none of them.
    """
    for files in (local_files(spec.repo_id, models_dir), cached_files(spec.repo_id, spec.revision, cache_dir)):
        choices = gguf_choices(list(files))
        if choices:
            try:
                picked = choose(choices, spec.repo_id, spec.quant, spec.filename)
            except ModelError:
                continue
            return files[picked.name]
    return None


def list_repo_ggufs(spec: RepoSpec) -> list[GgufChoice]:
    """The GGUF models a repo offers, from the Hub (file sizes included).

    Raises:
        ModelError: repo or revision not found, offline, or the Hub unreachable.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    if is_offline():
        raise ModelError(f"offline (HF_HUB_OFFLINE is set) and {spec.repo_id} is not in {hf_cache_dir()}")
    check_reachable()
    try:
        entries = list(HfApi(endpoint=endpoint()).list_repo_tree(spec.repo_id, recursive=True, revision=spec.revision))
    except Exception as exc:
        raise _hub_error(exc, spec.repo_id) from None
    files = {e.path: e.size for e in entries if isinstance(e, RepoFile)}
    return gguf_choices(list(files), files)


def check_reachable(timeout_s: float = 5.0) -> None:
    """One quick request to the endpoint (proxies honoured), so an unreachable Hub fails in seconds rather
    than after huggingface-hub's retries with exponential backoff (~25 s).

    Raises:
        ChatPhaseError: when no HTTP answer comes back within ``timeout_s``.
    """
    import httpx

    try:
        httpx.head(endpoint(), timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ChatPhaseError(
            f"cannot reach {endpoint()} ({_network_reason(exc)}); set HF_HUB_OFFLINE=1 to use cached models only"
        ) from None


def _hub_error(exc: Exception, repo_id: str) -> ChatPhaseError:
    from huggingface_hub import errors as hf_errors

    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return ModelError(
            f"repository not found on {endpoint()}: {repo_id} (private or gated repos need `hf auth login`)"
        )
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return ModelError(f"revision not found in {repo_id} (check --revision)")
    if isinstance(exc, (hf_errors.EntryNotFoundError, hf_errors.RemoteEntryNotFoundError)):
        return ModelError(f"file not found in {repo_id}")
    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return ModelError(f"offline (HF_HUB_OFFLINE is set) and {repo_id} is not in {hf_cache_dir()}")
    if isinstance(exc, hf_errors.LocalEntryNotFoundError):
        return ChatPhaseError(f"cannot reach {endpoint()} to download from {repo_id} and it is not in {hf_cache_dir()}")
    if isinstance(exc, hf_errors.HfHubHTTPError):
        return ChatPhaseError(f"the Hub answered with an error for {repo_id}: {str(exc).splitlines()[0]}")
    if "httpx" in type(exc).__module__ or isinstance(exc, ConnectionError):
        return ChatPhaseError(
            f"cannot reach {endpoint()} ({_network_reason(exc)}); set HF_HUB_OFFLINE=1 to use cached models only"
        )
    if isinstance(exc, OSError):
        return ChatPhaseError(f"download from {repo_id} failed: {str(exc).splitlines()[0]}")
    logging.getLogger(__name__).debug("download from %s", repo_id, exc_info=exc)
    return ChatPhaseError(f"download from {repo_id} failed ({_network_reason(exc)}); run it again to resume")


def _network_reason(exc: BaseException) -> str:
    """A network failure in words (the exception's class is for --verbose, not for the user)."""
    name = type(exc).__name__.lower()
    if "timeout" in name:
        return "timed out"
    if "refused" in str(exc).lower():
        return "connection refused"
    if "connect" in name or isinstance(exc, ConnectionError):
        return "no connection"
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "no reason given"


def remove_stale_partials(base: Path, older_than_s: float = STALE_PARTIAL_S) -> list[Path]:
    """Delete ``*.incomplete`` downloads under ``base/.cache`` not written to for ``older_than_s`` seconds.

    Returns the removed paths (a fresher one may belong to a download running in another process).
    """
    removed = []
    now = time.time()
    for p in (base / ".cache").rglob("*.incomplete") if (base / ".cache").is_dir() else []:
        try:
            if now - p.stat().st_mtime >= older_than_s:
                p.unlink()
                removed.append(p)
        except OSError:
            continue
    return removed


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".link-tmp")
    tmp.unlink(missing_ok=True)
    try:
        tmp.symlink_to(src.resolve())
    except OSError:  # no symlinks (some Windows setups): a copy
        import shutil

        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def pull(spec: RepoSpec, models_dir: Path, cache_dir: Path | None = None) -> PullResult:
    """Make ``spec``'s model (all parts of a split GGUF) available under ``<models dir>/OWNER/NAME``.

    Order: already pulled -> ``present``; in the HF cache -> symlinked (``hf-cache``, works offline);
    else downloaded from ``HF_ENDPOINT`` with huggingface-hub's progress bar (``downloaded``).

    Raises:
        ModelError: bad spec, no such repo/file/quant, or offline without a cached copy (exit 2).
        ChatPhaseError: the Hub unreachable or a download that failed (exit 1).
    """
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(spec.repo_id)
    except Exception as exc:
        raise UsageError(f"not a Hugging Face repo id: {spec.repo_id} ({exc})") from None
    models_dir = Path(models_dir)
    base = repo_dir(models_dir, spec.repo_id)
    remove_stale_partials(base)
    present = local_files(spec.repo_id, models_dir)
    cached = cached_files(spec.repo_id, spec.revision, cache_dir)
    choice = _choose_offline(spec, {**cached, **present})
    if choice is None:
        if spec.filename and not SPLIT_RE.match(Path(spec.filename).name):
            choice = GgufChoice((spec.filename,), quant_of(spec.filename))
        else:
            choice = choose(list_repo_ggufs(spec), spec.repo_id, spec.quant, spec.filename)
    targets = [base / f for f in choice.files]
    if all(f in present for f in choice.files):
        return PullResult(targets[0], "present", targets)
    if all(f in cached for f in choice.files):
        for f, dst in zip(choice.files, targets, strict=True):
            if f not in present:
                _link_or_copy(cached[f], dst)
        return PullResult(targets[0], "hf-cache", targets)
    if is_offline():
        raise ModelError(f"offline (HF_HUB_OFFLINE is set) and {spec.repo_id}/{choice.name} is not in {hf_cache_dir()}")
    _download(spec, choice, base, cache_dir)
    return PullResult(targets[0], "downloaded", targets)


def _choose_offline(spec: RepoSpec, files: dict[str, Path]) -> GgufChoice | None:
    choices = gguf_choices(list(files))
    if not choices or not (spec.quant or spec.filename or is_offline()):
        return None  # without a selector, the Hub's full list decides (unless offline)
    try:
        return choose(choices, spec.repo_id, spec.quant, spec.filename)
    except ModelError as exc:
        if is_offline():
            raise ModelError(f"offline (HF_HUB_OFFLINE is set), and in the local copies: {exc}") from None
        return None


def _download(spec: RepoSpec, choice: GgufChoice, base: Path, cache_dir: Path | None) -> None:
    from huggingface_hub import hf_hub_download

    check_reachable()
    for f in choice.files:
        try:
            hf_hub_download(
                spec.repo_id,
                f,
                revision=spec.revision,
                local_dir=base,
                cache_dir=cache_dir or hf_cache_dir(),
                endpoint=endpoint(),
            )
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            raise _hub_error(exc, spec.repo_id) from None
