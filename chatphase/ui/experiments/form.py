"""An experiment's form in the Experiments screen, made from its plan's knobs
(:meth:`~chatphase.bench.core.experiment.Experiment.form_fields`): one labelled input per knob, its default the knob's
(or its ``form`` default), its text read back by the knob's parser.

Input ids are ``exp-<kind>-<field>`` (``#exp-sweep-prompt_lengths``); the form is ``#exp-form-<kind>``.
"""

from __future__ import annotations

from typing import Any

from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label

from chatphase.bench.core.experiment import Experiment, PlanField, show


def form_field(label: str, id_: str, value: str) -> Vertical:
    """A labelled input (``exp-field``)."""
    return Vertical(Label(label), Input(value=value, id=id_), classes="exp-field")


def input_id(experiment: Experiment, knob: PlanField) -> str:
    """The id of ``knob``'s input in ``experiment``'s form."""
    return f"exp-{experiment.kind}-{knob.name}"


class PlanForm(Horizontal):
    """The form of ``experiment``'s knobs; ``defaults`` (by field name) and ``widths`` (CSS classes) override the
    knobs' own where a tab wants another (the Levers tab's smaller cells); ``before``: widgets ahead of the knobs."""

    def __init__(
        self,
        experiment: Experiment,
        defaults: dict[str, Any] | None = None,
        widths: dict[str, str] | None = None,
        before: tuple = (),
    ) -> None:
        self.experiment = experiment
        defaults, widths = defaults or {}, widths or {}
        children = list(before)
        for knob in experiment.form_fields():
            box = form_field(knob.label or knob.name, input_id(experiment, knob),
                             show(defaults.get(knob.name, knob.form_default)))  # fmt: skip
            if width := widths.get(knob.name, knob.width):
                box.add_class(width)
            children.append(box)
        super().__init__(*children, id=f"exp-form-{experiment.kind}", classes="exp-form")

    def values(self) -> dict[str, Any]:
        """Each knob's value from its input's text.

        Raises:
            UsageError: a field's text its parser refuses (one line naming the field).
        """
        return {
            knob.name: knob.from_text(self.query_one(f"#{input_id(self.experiment, knob)}", Input).value)
            for knob in self.experiment.form_fields()
        }
