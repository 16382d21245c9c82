"""An experiment is one record and one line: a tiny experiment of the test's own (no model), registered once, shows
in ``chatphase bench --help``, runs from its flags, saves a result that carries its kind and plan and loads back,
reruns from that file with the two side by side, and has its tab (form made from its plan) in the Experiments
screen, where it runs in a child process like every experiment."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

import pytest
from fake_engine import fake_model_info

from chatphase.bench.core.contract import Done, stamp
from chatphase.bench.core.experiment import (
    Experiment,
    compare_rows,
    number,
    plan_field,
    plan_from_dict,
    reps_field,
    whole_number,
)
from chatphase.bench.experiments import EXPERIMENTS, load_result
from chatphase.cli import main
from chatphase.errors import UsageError

#: what each echo measures, per step_ms: the test changes it between a run and its rerun.
SCALE = {"factor": 1.0}


@dataclass(frozen=True)
class EchoPlan:
    """``count`` echoes of ``step_ms`` each, ``reps`` times."""

    count: int = plan_field(3, flag="--echo", metavar="N", parse=whole_number, label="Echoes",
                            help="instead: the test's echo experiment, N echoes")  # fmt: skip
    step_ms: float = plan_field(2.0, flag="--echo-step", metavar="MS", parse=number, label="Step ms",
                                help="with --echo: milliseconds per echo")  # fmt: skip
    reps: int = reps_field(1)
    warmup: int = 0

    @property
    def total_runs(self) -> int:
        return self.count * self.reps

    def validate(self, n_ctx: int | None, n_batch: int | None = None) -> EchoPlan:
        if self.count < 1:
            raise UsageError(f"--echo: at least 1 echo (got {self.count})")
        return self

    def to_dict(self) -> dict:
        return {"count": self.count, "step_ms": self.step_ms, "reps": self.reps}


@dataclass(frozen=True)
class EchoProgress:
    done_runs: int
    total_runs: int
    value: float
    counted = True

    def line(self) -> tuple[str, str]:
        return f"echo {self.done_runs}", f"{self.value:g} ms"


@dataclass
class EchoResult:
    rows: list[dict] = field(default_factory=list)
    plan: dict = field(default_factory=dict)
    cancelled: bool = False
    kind = "echo"

    def to_json(self) -> str:
        return json.dumps(stamp("echo", {"plan": self.plan, "rows": self.rows, "cancelled": self.cancelled})) + "\n"

    def to_csv(self) -> str:
        return "i,echo_ms\n" + "".join(f"{r['i']},{r['echo_ms']}\n" for r in self.rows)

    def render(self, fmt: str) -> str:
        return {"json": self.to_json, "csv": self.to_csv}.get(fmt, self.to_csv)()

    @classmethod
    def from_dict(cls, data: dict) -> EchoResult:
        return cls(list(data["rows"]), dict(data["plan"]), bool(data.get("cancelled")))


@dataclass(frozen=True)
class EchoDone(Done):
    result: EchoResult


class EchoRun:
    def __init__(self, plan: EchoPlan) -> None:
        self.plan, self.rows = plan, []
        self._cancel = threading.Event()

    def __iter__(self):
        for i in range(self.plan.count):
            if self._cancel.is_set():
                break
            value = (i + 1) * self.plan.step_ms * SCALE["factor"]
            self.rows.append({"i": i, "echo_ms": value})
            yield EchoProgress(i + 1, self.plan.total_runs, value)
        yield EchoDone(self._result())

    def _result(self) -> EchoResult:
        return EchoResult(list(self.rows), self.plan.to_dict(), self._cancel.is_set())

    def cancel(self) -> None:
        self._cancel.set()

    def partial_done(self) -> EchoDone:
        return EchoDone(self._result())


def make_run(info, config, plan: EchoPlan, roofline: bool, log_path, **options) -> EchoRun:
    return EchoRun(plan)


ECHO = Experiment("echo", "echo test", EchoPlan, make_run, EchoResult.from_dict, pick="--echo", tab=True,
                  key=("i",), figures=("echo_ms",))  # fmt: skip


@pytest.fixture
def echo(monkeypatch):
    """The echo experiment registered (one line, as the real ones), the model lookups faked (no model needed)."""
    monkeypatch.setitem(EXPERIMENTS, "echo", ECHO)
    monkeypatch.setattr("chatphase.models.resolve.resolve_model", lambda model, models_dir=None: model)
    monkeypatch.setattr("chatphase.models.gguf_meta.read_model_info", lambda path: fake_model_info())
    SCALE["factor"] = 1.0
    yield ECHO


def test_its_flags_are_in_bench_help(echo, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--echo N instead: the test's echo experiment, N echoes" in out
    assert "--echo-step MS with --echo: milliseconds per echo (default 2.0)" in out


def test_its_flags_are_refused_elsewhere_and_its_plan_checked(echo, capsys):
    assert main(["bench", "--echo-step", "3"]) == 2
    assert capsys.readouterr().err.strip() == "chatphase: --echo-step applies to --echo"
    assert main(["bench", "--echo", "2", "--depths", "0"]) == 2
    assert capsys.readouterr().err.strip() == "chatphase: --depths does not apply to --echo"
    assert main(["bench", "--echo", "0"]) == 2
    assert "at least 1 echo" in capsys.readouterr().err


def test_a_saved_result_carries_kind_and_plan_loads_back_and_reruns_side_by_side(echo, tmp_path, capsys):
    saved = tmp_path / "echo.json"
    argv = ["bench", "--echo", "3", "--echo-step", "5", "--model", "/fake.gguf", "--format", "json"]
    assert main([*argv, "--output", str(saved)]) == 0
    data = json.loads(saved.read_text())
    assert data["kind"] == "echo" and data["plan"] == {"count": 3, "step_ms": 5.0, "reps": 1}
    back = load_result(saved)
    assert isinstance(back, EchoResult) and [r["echo_ms"] for r in back.rows] == [5.0, 10.0, 15.0]
    assert EXPERIMENTS["echo"].plan_from_dict(data["plan"]) == EchoPlan(3, 5.0, 1)
    capsys.readouterr()

    SCALE["factor"] = 2.0  # the machine got twice as slow
    assert main(["bench", "--rerun", str(saved), "--model", "/fake.gguf", "--format", "json"]) == 0
    compared = json.loads(capsys.readouterr().out)
    assert compared["kind"] == "echo" and compared["plan"] == data["plan"]
    assert [(r["row"], r["old"], r["new"], r["ratio"]) for r in compared["compare"]] == [
        ("0", 5.0, 10.0, 2.0),
        ("1", 10.0, 20.0, 2.0),
        ("2", 15.0, 30.0, 2.0),
    ]
    assert main(["bench", "--rerun", str(saved), "--model", "/fake.gguf"]) == 0
    table = capsys.readouterr().out
    assert "echo test: echo.json (old) against this run (new)" in table and "2.00x" in table
    assert main(["bench", "--rerun", str(saved), "--echo", "4"]) == 2
    assert "--echo does not apply to --rerun: the plan is the file's" in capsys.readouterr().err


def test_a_file_saved_without_its_plan_cannot_rerun(echo, tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"kind": "echo", "version": 1, "rows": [], "plan": {}}))
    assert main(["bench", "--rerun", str(path)]) == 2
    assert "old.json was saved without its plan" in capsys.readouterr().err


def test_plans_come_back_from_their_dicts():
    from chatphase.bench.rates.accounting import Slo
    from chatphase.bench.rates.run import RatePlan
    from chatphase.bench.sweep.loop import SweepPlan

    rates = RatePlan((1.0, 2.0), slo=Slo(ttft_ms=500.0))
    assert plan_from_dict(RatePlan, rates.to_dict()) == rates
    assert plan_from_dict(SweepPlan, SweepPlan(depths=()).to_dict()) == SweepPlan(depths=())
    for experiment in EXPERIMENTS.values():
        assert experiment.fields(), experiment.kind  # every experiment's knobs are its plan's fields


def test_compare_rows_sets_rows_side_by_side():
    old = [{"i": 0.0, "ms": 2.0}, {"i": 1.0, "ms": 4.0}]
    new = [{"i": 0.0, "ms": 3.0}, {"i": 2.0, "ms": 1.0}]
    assert compare_rows(old, new, ("i",), ()) == [
        {"row": "0", "figure": "ms", "old": 2.0, "new": 3.0, "ratio": 1.5},
        {"row": "1", "figure": "ms", "old": 4.0, "new": None, "ratio": None},
        {"row": "2", "figure": "ms", "old": None, "new": 1.0, "ratio": None},
    ]


async def test_its_tab_has_the_form_of_its_plan_and_runs_in_a_child_process(echo, tmp_path):
    """The tab and its form come from the record alone; Run goes through the registry's job (a child process)."""
    from multiprocessing import resource_tracker

    from textual.app import App
    from textual.widgets import DataTable, Input, Static
    from ui_support import wait_for

    from chatphase.settings.schema import Settings
    from chatphase.ui.experiments.screen import ExperimentsScreen

    class EchoApp(App):
        def __init__(self):
            super().__init__()
            self.screen_obj = ExperimentsScreen(fake_model_info(), Settings())

        def on_mount(self):
            self.push_screen(self.screen_obj)

    resource_tracker.ensure_running()  # before Textual takes the fds (as the other child-process tests)
    app = EchoApp()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen_obj
        await pilot.click("#exp-tabs Tab#--content-tab-exp-tab-echo")
        await pilot.pause()
        assert screen.pane.kind == "echo"
        assert screen.query_one("#exp-echo-count", Input).value == "3"  # the plan's default
        assert screen.query_one("#exp-echo-step_ms", Input).value == "2.0"
        screen.query_one("#exp-echo-count", Input).value = "x"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert screen.job is None and "Echoes: expected a whole number" in str(
            screen.query_one("#exp-status", Static).render()
        )
        screen.query_one("#exp-echo-count", Input).value = "4"
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.job is None, timeout_s=60)
        assert str(screen.query_one("#exp-status", Static).render()) == "Done."
        assert screen.query_one("#exp-table", DataTable).row_count == 4
        path = tmp_path / "tab.json"
        screen.query_one("#exp-path", Input).value = str(path)
        await pilot.press("ctrl+s")
        await pilot.pause()
    back = load_result(path)
    assert isinstance(back, EchoResult) and back.plan["count"] == 4 and len(back.rows) == 4
