"""The model picker as a user sees it: a tiny host app opens it, Enter returns the chosen ModelInfo,
unusable files cannot be chosen (a notice says why), Esc returns None."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Label
from ui_support import notifications, record_notifications

from chatphase.models.resolve import ModelEntry
from chatphase.ui.screens.model_picker import COLUMNS, ModelPickerScreen


class Host(App):
    """Opens the picker on mount and records what it returns."""

    def __init__(self, lister, current_path=None, planner=None):
        super().__init__()
        self.lister, self.current_path, self.planner = lister, current_path, planner
        self.results: list = []

    def compose(self) -> ComposeResult:
        yield Label("host")

    def on_mount(self) -> None:
        self.push_screen(
            ModelPickerScreen(n_ctx=2048, current_path=self.current_path, lister=self.lister, planner=self.planner),
            self.results.append,
        )


def entries(default_model_info, tmp_path: Path) -> list[ModelEntry]:
    broken = str(tmp_path / "page.gguf")
    return [
        ModelEntry("", default_model_info.path, "default", True, default_model_info),
        ModelEntry(
            "page.gguf",
            broken,
            "models-dir",
            False,
            None,
            f"not a GGUF file (it starts with '<!DO', not 'GGUF'): {broken}",
        ),
        ModelEntry("copy.gguf", str(tmp_path / "copy.gguf"), "models-dir", False, default_model_info),
    ]


async def wait_rows(pilot, n: int) -> DataTable:
    table = pilot.app.screen.query_one(DataTable)
    for _ in range(250):
        if table.row_count == n:
            return table
        await pilot.pause(0.02)
    raise AssertionError(f"picker never showed {n} rows")


async def test_enter_returns_the_chosen_model(default_model_info, tmp_path):
    app = Host(lambda: entries(default_model_info, tmp_path), current_path=default_model_info.path)
    async with app.run_test(size=(140, 30)) as pilot:
        table = await wait_rows(pilot, 3)
        assert table.cursor_row == 0  # the loaded model is highlighted
        assert "2 usable models" in str(app.screen.query_one("#picker-status", Label).render())
        row = [str(c) for c in table.get_row_at(0)]
        assert row[0] == "●" and row[2:5] == ["llama", "135M", "Q4_1"] and row[7] == "22.5 KiB"
        await pilot.press("down", "enter")  # the broken file sorts last: row 1 is copy.gguf
        await pilot.pause()
    assert app.results == [default_model_info]


async def test_unusable_file_shows_its_reason_and_is_not_chosen(default_model_info, tmp_path):
    app = Host(lambda: entries(default_model_info, tmp_path))
    record_notifications(app)
    async with app.run_test(size=(140, 30)) as pilot:
        table = await wait_rows(pilot, 3)
        assert str(table.get_row_at(2)[2]) == "unusable"
        await pilot.press("down", "down")
        await pilot.pause()
        assert "not a GGUF file" in str(app.screen.query_one("#picker-detail", Label).render())
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ModelPickerScreen) and app.results == []
        assert any("not a GGUF file" in n for n in notifications(app))
        await pilot.press("escape")
        await pilot.pause()
    assert app.results == [None]


async def test_picker_survives_a_failing_lister(tmp_path):
    def boom():
        raise PermissionError("models directory not readable")

    app = Host(boom)
    async with app.run_test(size=(120, 24)) as pilot:
        status = app.screen.query_one("#picker-status", Label)
        for _ in range(100):
            if "cannot list models" in str(status.render()):
                break
            await pilot.pause(0.02)
        assert "not readable" in str(status.render())


async def test_app_model_switch_loads_the_picked_model(default_model_info, tmp_path, monkeypatch):
    """Ctrl+G / "Model: Switch" in the chat app opens the picker; Enter switches to a fresh engine."""
    from ui_support import make_app, wait_for

    from chatphase.settings.schema import Settings
    from chatphase.ui.actions import ACTIONS

    assert any(a.title == "Model: Switch" and a.action == "switch_model_picker" for a in ACTIONS)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    app, engines = make_app(Settings().with_overrides(models_dir=str(tmp_path), n_ctx=1024))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelPickerScreen))
        assert app.screen.n_ctx == 1024
        await wait_rows(pilot, 1)  # the bundled default: the only model here
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(engines) == 2 and app.chat.model_info == default_model_info)
        assert not isinstance(app.screen, ModelPickerScreen)


async def test_the_memory_column_uses_the_users_n_ubatch_and_kv_cache_types(default_model_info, tmp_path, monkeypatch):
    """The picker opened from the app sizes each model's memory as the user's settings would load it:
    n_ctx, n_ubatch and the KV cache types (q8_0 halves the KV cache; n_ubatch 64 shrinks the compute
    buffers), not f16 at n_ubatch 256."""
    from ui_support import make_app, wait_for

    from chatphase.models.memory import estimate
    from chatphase.settings.schema import Settings
    from chatphase.units import fmt_bytes

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    settings = Settings().with_overrides(
        models_dir=str(tmp_path), n_ctx=8192, n_ubatch=64, type_k="q8_0", type_v="q8_0"
    )
    app, _ = make_app(settings)
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelPickerScreen))
        table = await wait_rows(pilot, 1)
        shown = str(table.get_row_at(0)[COLUMNS.index("Memory")])
        status = str(app.screen.query_one("#picker-status", Label).render())
    mine = estimate(default_model_info, 8192, 64, "q8_0", "q8_0")
    assert shown == fmt_bytes(mine.total_bytes) != fmt_bytes(estimate(default_model_info, 8192).total_bytes)
    assert "n_ctx 8192, n_ubatch 64, KV q8_0" in status


@pytest.mark.parametrize("size", [(120, 40), (100, 30)])
async def test_every_column_fits_and_a_long_spec_is_shortened(default_model_info, tmp_path, size):
    """The Source column is whole ("default", "models-dir", "hf-cache"); a long spec gives way with "…",
    and the line under the table names the whole file."""
    long_spec = "bartowski/SmolLM2-135M-Instruct-GGUF:SmolLM2-135M-Instruct-Q4_K_M-imatrix.gguf"
    listed = [
        ModelEntry("", default_model_info.path, "default", True, default_model_info),
        ModelEntry(long_spec, str(tmp_path / "long.gguf"), "hf-cache", False, default_model_info),
        ModelEntry("copy.gguf", str(tmp_path / "copy.gguf"), "models-dir", False, default_model_info),
    ]
    app = Host(lambda: listed)
    async with app.run_test(size=size) as pilot:
        table = await wait_rows(pilot, 3)
        await pilot.pause(0.1)
        assert table.virtual_size.width <= table.size.width  # nothing cut at the right edge
        assert [str(table.get_row_at(i)[-1]) for i in range(3)] == ["default", "hf-cache", "models-dir"]
        shown = str(table.get_row_at(1)[1])
        assert shown.endswith("…") and long_spec.startswith(shown[:-1])
        await pilot.press("down")
        await pilot.pause()
        assert str(tmp_path / "long.gguf") in str(app.screen.query_one("#picker-detail", Label).render())


async def test_the_settings_screen_shows_the_model_picked_from_the_models_directory(default_model_info, tmp_path):
    """After Ctrl+G loads a model of the models directory, F9's Model field names it (not empty, which
    means the bundled default), and a reload for another setting keeps it."""
    import shutil

    from textual.widgets import Input
    from ui_support import make_app, wait_for

    from chatphase.settings.schema import Settings
    from chatphase.ui.screens.settings import SettingsScreen

    copy = tmp_path / "mine.gguf"
    shutil.copyfile(default_model_info.path, copy)
    app, engines = make_app(Settings().with_overrides(models_dir=str(tmp_path), n_ctx=1024))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        await pilot.press("ctrl+g")
        table = await wait_rows(pilot, 2)
        row = next(i for i in range(2) if str(table.get_row_at(i)[-1]) == "models-dir")
        table.move_cursor(row=row)
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(engines) == 2 and app.chat.loaded is not None)
        assert app.chat.model_info.path == str(copy)
        await pilot.press("f9")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        assert app.screen.query_one("#set-model", Input).value == str(copy)
        app.screen.query_one("#set-n_ctx", Input).value = "2048"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: len(engines) == 3 and app.chat.loaded is not None)
        assert app.chat.model_info.path == str(copy) and engines[-1].info.path == str(copy)


def gpu_fit(path: str):
    """A plan of 12 layers on a 2 GiB device (the fit a GPU machine's child would print)."""
    from chatphase.engine.memory_plan import HOST, DevicePlan, FitResult, MemoryPlan

    gpu = DevicePlan("Vulkan0", "llvmpipe", "gpu", 1_200 * 2**20, 60 * 2**20, 80 * 2**20, layers=tuple(range(19, 30)),
                     output_layer=True, free_bytes=2**31, total_bytes=2**31, budget_bytes=2**31,
                     budget_note="free as the device reports it")  # fmt: skip
    host = DevicePlan(HOST, "host memory", HOST, 40 * 2**20, 0, 10 * 2**20, mapped_bytes=40 * 2**20)
    return FitResult(12, "auto: 12 …", MemoryPlan(Path(path).name, 30, 12, 2048, (gpu, host)))


async def wait_label(pilot, name: str, text: str) -> str:
    label = pilot.app.screen.query_one(name, Label)
    for _ in range(250):
        if text in str(label.render()):
            return str(label.render())
        await pilot.pause(0.02)
    raise AssertionError(f"{name} never said {text!r}: {label.render()}")


async def test_the_highlighted_models_fit_is_planned_off_the_ui_thread(default_model_info, tmp_path):
    """Issue 42: the highlighted model's memory plan (llama.cpp's, made in a child process: faked here) is asked
    for from a worker thread, once per file, and shown under the table: the layers that fit and each device's
    total; an unusable row shows none, and a plan that cannot be made says why in one line."""
    import threading

    from chatphase.errors import ModelError

    asked: list[tuple[str, bool]] = []
    release = threading.Event()

    def planner(path: str):
        asked.append((path, threading.current_thread() is threading.main_thread()))
        release.wait(10)  # the UI keeps running while the plan is made
        if path.endswith("copy.gguf"):
            raise ModelError("llama.cpp's memory plan failed (signal 11); see the engine log")
        return gpu_fit(path)

    app = Host(lambda: entries(default_model_info, tmp_path), planner=planner)
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_rows(pilot, 3)
        await wait_label(pilot, "#picker-plan", "memory plan: projecting…")
        release.set()
        shown = await wait_label(pilot, "#picker-plan", "fit: ")
        assert shown == (
            "fit: n_gpu_layers 12 (11/30 layers + output) · Vulkan0 1.3 GiB of 2.0 GiB, 708.0 MiB left · "
            "host 50.0 MiB (40.0 MiB mapped from the file)"
        )
        await pilot.press("down")  # copy.gguf: its child fails
        assert "no memory plan: llama.cpp's memory plan failed (signal 11)" in await wait_label(
            pilot, "#picker-plan", "no memory plan"
        )
        await pilot.press("down")  # the unusable file: no plan asked for
        await pilot.pause(0.5)
        assert str(app.screen.query_one("#picker-plan", Label).render()) == ""
        await pilot.press("up", "up")  # back to the first: the plan kept, not asked again
        await wait_label(pilot, "#picker-plan", "fit: n_gpu_layers 12")
        await pilot.pause(0.5)
    assert [path for path, _ in asked] == [default_model_info.path, str(tmp_path / "copy.gguf")]
    assert not any(on_main for _, on_main in asked)
