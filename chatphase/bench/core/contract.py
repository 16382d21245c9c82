"""The experiment contract: what every registered experiment (:mod:`chatphase.bench.experiments`) is made of.

- a **plan** (:class:`Plan`): what to measure, validated once, the same way for every experiment
  (:func:`validate_plan`, before any work);
- a **run** (:class:`Run`): iterate it for typed events (status, notices, progress, then one :class:`Done`),
  :meth:`~Run.cancel` it from any thread (it still ends with a partial :class:`Done`);
- a **result** (:class:`Result`): renders as ``table``/``md``/``csv``/``json`` (:data:`FORMATS`), records its
  ``kind`` and the schema ``version`` of its saved form (:func:`stamp`, :func:`saved_version`).

Each experiment's record (:mod:`chatphase.bench.core.experiment`) names these types, its plan's knobs (the CLI's flags
and the Experiments screen's form) and its tab; :mod:`chatphase.bench.core.job` runs any plan in a child process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from chatphase.errors import UsageError

#: the text forms every result renders (``--format``).
FORMATS: tuple[str, ...] = ("table", "csv", "json", "md")

#: the schema version of a saved result this chatphase writes and the newest it reads. Files written before
#: results carried a ``version`` are version 1.
SCHEMA_VERSION = 1


class Done:
    """Base of an experiment's last event; each experiment's subclass holds its ``result``."""

    if TYPE_CHECKING:

        @property
        def result(self) -> Any: ...


@runtime_checkable
class Result(Protocol):
    """What an experiment measured. ``cancelled``: stopped early (partial)."""

    cancelled: bool

    def render(self, fmt: str) -> str:
        """Text in ``fmt`` (one of :data:`FORMATS`). Raises UsageError for another format."""
        ...

    def to_json(self) -> str: ...

    def to_csv(self) -> str: ...


@runtime_checkable
class Progress(Protocol):
    """A run ended: the ``done_runs``-th of ``total_runs``; ``line()`` says it as ``(label, figures)``;
    ``counted``: not a warm-up."""

    @property
    def done_runs(self) -> int: ...

    @property
    def total_runs(self) -> int: ...

    @property
    def counted(self) -> bool: ...

    def line(self) -> tuple[str, str]: ...


class Run(Protocol):
    """One experiment running: iterate for its events (blocking); :meth:`cancel` from any thread."""

    def __iter__(self) -> Iterator[object]: ...

    def cancel(self) -> None: ...


P = TypeVar("P", bound="Plan")


class Plan(Protocol):
    """What to measure. ``validate`` checks it against the context (``n_ctx``) and batch (``n_batch``) sizes,
    ``None`` when a server's are checked after connecting; it returns the plan to run."""

    @property
    def total_runs(self) -> int: ...

    def validate(self: P, n_ctx: int | None, n_batch: int | None = None) -> P: ...

    def to_dict(self) -> dict: ...


def validate_plan(plan: P, n_ctx: int | None, n_batch: int | None = None) -> P:
    """The one way a plan is checked before any work: ``plan.validate(n_ctx, n_batch)``.

    Raises:
        UsageError: the plan's one-line reason.
    """
    return plan.validate(n_ctx, n_batch)


def check_repetitions(reps: int, warmup: int, gen_tokens: int, gen_unit: str = "token") -> None:
    """The counts every sweep's plan shares: ``reps`` ≥ 1, ``warmup`` ≥ 0, ``gen_tokens`` ≥ 1 (``gen_unit``: what
    ``--gen`` counts, a token or a decode step).

    Raises:
        UsageError: one line naming the flag.
    """
    if reps < 1:
        raise UsageError(f"--reps must be at least 1 (got {reps})")
    if warmup < 0:
        raise UsageError(f"--warmup must be 0 or more (got {warmup})")
    if gen_tokens < 1:
        raise UsageError(f"--gen must be at least 1 {gen_unit} (got {gen_tokens})")


def check_format(fmt: str, formats: tuple[str, ...] = FORMATS) -> str:
    """``fmt`` when a result can render it.

    Raises:
        UsageError: one line naming the choices.
    """
    if fmt not in formats:
        raise UsageError(f"unknown --format {fmt!r}: choose one of {', '.join(formats)}")
    return fmt


def stamp(kind: str, data: dict) -> dict:
    """``data`` with ``kind`` and ``version`` first: the head of every saved result."""
    return {"kind": kind, "version": SCHEMA_VERSION, **{k: v for k, v in data.items() if k not in ("kind", "version")}}


def saved_version(data: dict) -> int:
    """The schema version of a saved result (1 when it has none: written before results carried one).

    Raises:
        UsageError: a version newer than :data:`SCHEMA_VERSION`, or not a whole number.
    """
    version = data.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UsageError(f"malformed bench result: version {version!r} is not a whole number")
    if version > SCHEMA_VERSION:
        raise UsageError(
            f"this result is schema version {version}; this chatphase reads up to version {SCHEMA_VERSION}: upgrade it"
        )
    return version
