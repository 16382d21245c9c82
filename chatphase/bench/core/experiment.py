"""An experiment's record, and the one definition of each of its plan's knobs (as :mod:`chatphase.settings.schema`
does for settings).

**A plan's knob is a dataclass field** made with :func:`plan_field`; its ``metadata`` says: ``flag`` (the
``chatphase bench`` flag, shared by the experiments that take it: ``--reps``), ``metavar``, ``help``, ``parse``
(the flag's or the form's text -> value; ``ValueError``/``UsageError`` for bad text), ``label`` (the Experiments
screen's form field; no label: not in the form), ``form`` (the form's own default where it is not the plan's),
``width`` (the form field's CSS class), ``single`` (the flag's list must hold one value, the field takes it),
``local`` (why the flag does not apply over ``--server``). The field's default is the flag's and the form's
default. :func:`plan_fields` lists them; ``chatphase bench`` (:mod:`chatphase.commands.bench`) makes its flags
from them and the Experiments screen (:mod:`chatphase.ui.experiments.form`) its forms.

**An experiment** (:class:`Experiment`) is the record its own package defines once (``bench/<kind>/__init__.py``)
and the registry (:mod:`chatphase.bench.experiments`) lists in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from chatphase.bench.core.contract import FORMATS
from chatphase.errors import UsageError

#: the picking flag of an experiment chosen by comma lists in the model and engine flags (the lever grid).
LEVERS = "a comma list in a lever (a lever grid)"


def plan_field(
    default: Any = MISSING,
    *,
    flag: str | None = None,
    help: str = "",
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    label: str | None = None,
    form: Any = MISSING,
    width: str | None = None,
    single: bool = False,
    local: str | None = None,
    default_factory: Any = MISSING,
) -> Any:
    """A plan's dataclass field with its knob's metadata (see the module docstring)."""
    metadata = {"flag": flag, "help": help, "metavar": metavar, "parse": parse, "label": label, "form": form,
                "width": width, "single": single, "local": local}  # fmt: skip
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class PlanField:
    """One knob of a plan (:func:`plan_field`'s metadata with the field's ``name`` and ``default``; ``MISSING``:
    the plan has no default, the flag picks the experiment)."""

    name: str
    flag: str | None
    help: str
    metavar: str | None
    parse: Callable[[str], Any] | None
    label: str | None
    default: Any
    form_default: Any
    width: str | None
    single: bool
    local: str | None

    def value(self, parsed: Any) -> Any:
        """The field's value from its flag's parsed value (a ``single`` field takes the one item of a list).

        Raises:
            UsageError: a ``single`` field given more than one value.
        """
        if self.single and isinstance(parsed, tuple):
            if len(parsed) != 1:
                raise UsageError(f"give one {self.flag} value: {self.help or self.name}")
            return parsed[0]
        return parsed

    def from_text(self, text: str) -> Any:
        """The value of a form's text (the flag's parser, then :meth:`value`).

        Raises:
            UsageError: naming the field's label.
        """
        try:
            parsed = self.parse(text) if self.parse else text
        except (ValueError, UsageError) as exc:
            raise UsageError(f"{self.label}: {exc}") from None
        return self.value(parsed)


def plan_fields(plan_type: type) -> list[PlanField]:
    """The knobs of ``plan_type`` (its fields made by :func:`plan_field`), in the order declared."""
    out = []
    for f in fields(plan_type):
        if "flag" not in f.metadata:
            continue
        m = f.metadata
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else MISSING
        )  # fmt: skip
        form = m["form"] if m["form"] is not MISSING else default
        out.append(PlanField(f.name, m["flag"], m["help"], m["metavar"], m["parse"], m["label"], default, form,
                             m["width"], m["single"], m["local"]))  # fmt: skip
    return out


def form_fields(plan_type: type) -> list[PlanField]:
    """The knobs of ``plan_type`` that its form shows (those with a ``label``), in the plan's ``FORM`` order where
    it has one (names), else as declared."""
    shown = {f.name: f for f in plan_fields(plan_type) if f.label}
    order = getattr(plan_type, "FORM", None) or tuple(shown)
    return [shown[name] for name in order if name in shown]


def show(value: Any) -> str:
    """A knob's value as a form's text: a list comma-joined, ``None`` empty."""
    if value is None or value is MISSING:
        return ""
    if isinstance(value, tuple | list):
        return ",".join(map(str, value))
    return str(value)


def plan_from_dict(plan_type: type, data: dict) -> Any:
    """A plan from its :meth:`to_dict` (a saved result's ``plan``): lists back into tuples, a nested dataclass
    (its default's type) from its dict; keys the plan does not have are ignored.

    Raises:
        UsageError: a required field is missing or a value does not fit (one line).
    """
    kwargs = {}
    for f in fields(plan_type):
        if f.name not in data or not f.init:
            continue
        value = data[f.name]
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        elif isinstance(value, dict) and dataclasses.is_dataclass(default) and not isinstance(default, type):
            value = type(default)(**value)
        elif isinstance(value, dict):
            value = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
        kwargs[f.name] = value
    try:
        return plan_type(**kwargs)
    except TypeError as exc:
        raise UsageError(f"the saved plan does not make a {plan_type.__name__}: {exc}") from None


def csv_rows(result: Any) -> list[dict[str, Any]]:
    """A result's rows from its CSV form, numbers as floats (the default :attr:`Experiment.rows`)."""
    import csv
    import io

    rows = []
    for row in csv.DictReader(io.StringIO(result.to_csv())):
        rows.append({k: _number(v) for k, v in row.items()})
    return rows


def render_result(result: Any, fmt: str) -> str:
    """``result.render(fmt)`` (the default :attr:`Experiment.text`)."""
    return result.render(fmt)


def _number(text: str | None) -> Any:
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        return text


@dataclass(frozen=True)
class Experiment:
    """One experiment, everything the CLI, the Experiments screen and the loader need of it.

    - ``kind``: its name in saved results; ``title``: what it is, in words.
    - ``plan``: the plan's dataclass (its knobs: :func:`plan_field`; ``from_dict``: :func:`plan_from_dict`).
    - ``make_run(info, config, plan, roofline, log_path, **options)``: its run (a module-level function: a child
      process gets it by name); ``options`` are the run's own (``--server``'s engine factory and prompt builder).
    - ``read``: a saved JSON object back into its result; ``formats``: the text forms it renders, ``text(result,
      fmt)`` renders them (default: the result's own ``render``).
    - ``plot(results, path)``: draws ``--plot`` (``None``: none; ``plot_note`` says why).
    - ``pick``: the flag that picks it on the command line (``""``: the default experiment; :data:`LEVERS`: comma
      lists in the levers).
    - ``server``: ``"either"`` (local or over ``--server``), ``"local"`` or ``"only"``; ``server_note``: the line that
      refuses the other.
    - ``overlays``: results loaded from files are drawn over its plots; ``tab``: a tab in the Experiments screen.
    - ``knobs``: the dataclass whose fields are its knobs where they are not the plan's own (the lever grid's are
      its sweep's); ``build(values, levers, resolve)`` then makes the plan from the knobs' ``values``, the levers'
      lists and ``resolve(model spec) -> ModelInfo`` (default: ``plan(**values)``).
    - ``rows(result)``: its rows as ``{column: value}`` (default: its CSV), ``key``: the columns that name a row,
      ``figures``: the columns ``--rerun`` compares (default: every number that is not a key).
    """

    kind: str
    title: str
    plan: type
    make_run: Callable[..., Any]
    read: Callable[[dict], Any]
    formats: tuple[str, ...] = FORMATS
    plot: Callable[[list, Any], Any] | None = None
    plot_note: str = ""
    pick: str = ""
    server: str = "either"
    server_note: str = ""
    overlays: bool = False
    tab: bool = False
    knobs: type | None = None
    build: Callable[..., Any] | None = None
    rows: Callable[[Any], list[dict[str, Any]]] = csv_rows
    text: Callable[[Any, str], str] = render_result
    key: tuple[str, ...] = ()
    figures: tuple[str, ...] = ()

    def fields(self) -> list[PlanField]:
        """Its knobs (:func:`plan_fields` of :attr:`knobs`, else of :attr:`plan`)."""
        return plan_fields(self.knobs or self.plan)

    def form_fields(self) -> list[PlanField]:
        """The knobs its form shows (:func:`form_fields`)."""
        return form_fields(self.knobs or self.plan)

    def make_plan(self, values: dict[str, Any], levers: dict[str, tuple] | None = None, resolve: Any = None) -> Any:
        """The plan of the knobs' ``values`` (unvalidated; see :attr:`build`).

        Raises:
            UsageError: values that make no plan (one line).
        """
        if self.build is not None:
            return self.build(values, dict(levers or {}), resolve)
        return self.plan(**values)

    def plan_from_dict(self, data: dict) -> Any:
        """The plan of a saved result (:func:`plan_from_dict`, or the plan's own ``from_dict``).

        Raises:
            UsageError: a saved plan that makes no plan.
        """
        own = getattr(self.plan, "from_dict", None)
        return own(data) if own is not None else plan_from_dict(self.plan, data)

    @staticmethod
    def saved_plan(data: dict) -> dict | None:
        """A saved result's plan: its ``plan``, or its ``settings``' (``None``: saved without one)."""
        plan = data.get("plan")
        if not isinstance(plan, dict):
            settings = data.get("settings")
            plan = settings.get("plan") if isinstance(settings, dict) else None
        return plan if isinstance(plan, dict) and plan else None


def compare_rows(
    old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]], key: Sequence[str], figures: Sequence[str]
) -> list[dict[str, Any]]:
    """Two results' rows side by side: per row (matched by its ``key`` columns) and figure, the old value, the
    new and ``ratio`` = new / old (``None`` where either is missing or old is 0). Rows of one result only are
    listed with the other side ``None``."""

    def name(row: dict) -> str:
        return " ".join(f"{row.get(k)}" if not isinstance(row.get(k), float) else f"{row[k]:g}" for k in key)

    def numbers(row: dict) -> list[str]:
        if figures:
            return [f for f in figures if f in row]
        return [k for k, v in row.items() if k not in key and isinstance(v, int | float)]

    olds = {name(r): r for r in old}
    news = {name(r): r for r in new}
    out = []
    for row_name in dict.fromkeys([*olds, *news]):
        a, b = olds.get(row_name, {}), news.get(row_name, {})
        for figure in dict.fromkeys([*numbers(a), *numbers(b)]):
            x, y = a.get(figure), b.get(figure)
            ratio = y / x if isinstance(x, int | float) and isinstance(y, int | float) and x else None
            out.append({"row": row_name, "figure": figure, "old": x, "new": y, "ratio": ratio})
    return out


def whole_number(text: str) -> int:
    """``"32"`` -> 32.

    Raises:
        ValueError: anything but a whole number (its message says so).
    """
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"expected a whole number (got {text.strip()!r})") from None


def number(text: str) -> float:
    """``"0.5"`` -> 0.5.

    Raises:
        ValueError: anything but a number (its message says so).
    """
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number (got {text.strip()!r})") from None


def count_list(text: str) -> tuple[int, ...]:
    """:func:`chatphase.units.parse_counts` (``"none"``: an empty list). Raises ValueError, saying why."""
    from chatphase.units import parse_counts

    return parse_counts(text)


# the knobs most plans share: the same flag, parser and words in each
def reps_field(default: int = 3, form: Any = MISSING, width: str | None = None) -> Any:
    return plan_field(default, flag="--reps", metavar="R", parse=whole_number, label="Reps", form=form,
                      help="counted repetitions per cell", width=width)  # fmt: skip


def warmup_field(default: int = 1) -> Any:
    return plan_field(default, flag="--warmup", metavar="W", parse=whole_number,
                      help="uncounted warm-up runs per cell")  # fmt: skip


def gen_field(default: int = 32, label: str = "Gen tokens", form: Any = MISSING, width: str | None = None) -> Any:
    return plan_field(default, flag="--gen", metavar="N", parse=whole_number, label=label, form=form,
                      help="tokens decoded per run (decode steps where N sequences decode together)",
                      width=width)  # fmt: skip
