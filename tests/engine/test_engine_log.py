"""The engine log: llama.cpp's debug chatter left out by level (errors kept), a size cap with rotation,
and F3 opening at this engine's start. Engine starts are real child processes on the default model."""

from __future__ import annotations

import pytest
from textual.widgets import Log
from ui_support import make_app, wait_for

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import ModelLoaded
from chatphase.engine.llamalog import LEVELS, LlamaLogCapture
from chatphase.engine.logfile import LOG_CAP_BYTES, rotate_log
from chatphase.ui.screens.modals import CONTINUATION, LogScreen

#: what one engine start may add to the log (it was ~236 KB with ggml's graph debug lines).
START_BUDGET_BYTES = 32 * 1024


def start_engine(info, log) -> None:
    from chatphase.engine.process.host import EngineHost

    host = EngineHost(info, EngineConfig(n_ctx=256), log_path=str(log))
    try:
        assert isinstance(list(host.load())[-1], ModelLoaded)
    finally:
        host.close()


def test_engine_log_size_per_start(default_model_info, tmp_path):
    log = tmp_path / "engine.log"
    sizes = []
    for _ in range(2):
        start_engine(default_model_info, log)
        sizes.append(log.stat().st_size)
    per_start = [sizes[0], sizes[1] - sizes[0]]
    assert all(0 < n < START_BUDGET_BYTES for n in per_start), per_start
    text = log.read_text()
    assert "llama_graph_n_input_tensors" not in text  # ggml's debug level
    assert text.count("--- chatphase: loading") == 2 and "llama_kv_cache" in text and "print_info" in text


def test_levels_are_ggml_s_errors_kept_debug_and_its_continuations_dropped(tmp_path, monkeypatch):
    log = tmp_path / "engine.log"
    capture = LlamaLogCapture(log)
    try:
        for level, text in [
            (1, b"debug line"),
            (5, b" continued\n"),
            (4, b"error line\n"),
            (3, b"warn"),
            (5, b" more\n"),
        ]:
            capture.on_log(level, text, None)
        capture.on_log(2, b"load_tensors: offloaded 3/31 layers to GPU\n", None)
    finally:
        capture.close()
    assert log.read_text().splitlines() == ["error line", "warn more", "load_tensors: offloaded 3/31 layers to GPU"]
    assert capture.layers_offloaded == 3
    monkeypatch.setenv("CHATPHASE_LOG_LEVEL", "debug")
    capture = LlamaLogCapture(log)
    capture.on_log(1, b"debug line\n", None)
    capture.close()
    assert log.read_text().endswith("debug line\n") and capture.min_level == LEVELS["debug"]


def test_a_log_over_the_cap_is_rotated_when_the_next_engine_starts(default_model_info, tmp_path):
    log = tmp_path / "engine.log"
    for n in (2, 1):
        log.with_name(f"engine.log.{n}").write_text(f"old {n}\n")
    log.write_bytes(b"x" * (LOG_CAP_BYTES + 1))
    start_engine(default_model_info, log)
    assert log.stat().st_size < START_BUDGET_BYTES and log.read_text().startswith("--- chatphase: loading")
    assert log.with_name("engine.log.1").stat().st_size == LOG_CAP_BYTES + 1
    assert log.with_name("engine.log.2").read_text() == "old 1\n"  # the oldest ("old 2") dropped
    assert not log.with_name("engine.log.3").exists()
    assert rotate_log(log) is False  # under the cap: left alone


async def test_f3_opens_at_this_engine_s_start(tmp_path):
    log = tmp_path / "engine.log"
    lines = [f"earlier engine {i}" for i in range(400)]
    lines += ["--- chatphase: loading m.gguf (pid 4242)"] + [f"line {i}" for i in range(300)]
    log.write_text("\n".join(lines) + "\n")
    app, _ = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        app.push_screen(LogScreen(str(log), pid=4242))
        filled = lambda: isinstance(app.screen, LogScreen) and any(v.lines for v in app.screen.query(Log))  # noqa: E731
        await wait_for(pilot, filled)  # the log is filled after a refresh, when it has its width
        view = app.screen.query_one(Log)
        assert view.lines[0] == "--- chatphase: loading m.gguf (pid 4242)" and len(view.lines) == 301
        assert view.scroll_offset.y == 0 and view.max_scroll_y > 0  # the start in view, the rest below


async def test_f3_wraps_long_lines_at_80_columns(tmp_path):
    """A line wider than the screen (llama.cpp's metadata lines, a traceback's) wraps, its continuations
    indented; nothing is cut off at the right edge, and a resize wraps again."""
    log = tmp_path / "engine.log"
    long = "llama_model_loader: - kv  23: tokenizer.ggml.merges arr[str,48900] = " + " ".join(
        f"[m{i}]" for i in range(40)
    )
    log.write_text(f"--- chatphase: loading m.gguf (pid 7)\n{long}\nshort\n")
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        app.push_screen(LogScreen(str(log), pid=7))
        shown = lambda: isinstance(app.screen, LogScreen) and any(len(v.lines) > 3 for v in app.screen.query(Log))  # noqa: E731
        await wait_for(pilot, shown)
        view = app.screen.query_one(Log)
        width = view.scrollable_content_region.width
        assert all(len(line) <= width for line in view.lines) and view.max_scroll_x == 0
        assert view.lines[-1] == "short" and all(line.startswith(CONTINUATION) for line in view.lines[2:-1])
        assert "".join(line.removeprefix(CONTINUATION) for line in view.lines[1:-1]) == long
        await pilot.resize_terminal(120, 30)
        await wait_for(pilot, lambda: app.screen._width == view.scrollable_content_region.width > width)  # re-folded
        assert all(len(line) <= view.scrollable_content_region.width for line in view.lines)
        assert len(view.lines) < 2 + len(long) // width + 1


@pytest.mark.parametrize("level", ["warn", "error"])
def test_a_higher_level_leaves_out_info(tmp_path, monkeypatch, level):
    monkeypatch.setenv("CHATPHASE_LOG_LEVEL", level)
    capture = LlamaLogCapture(tmp_path / "engine.log")
    capture.on_log(2, b"info line\n", None)
    capture.on_log(4, b"error line\n", None)
    capture.close()
    assert (tmp_path / "engine.log").read_text() == "error line\n"
