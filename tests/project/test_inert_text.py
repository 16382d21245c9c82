"""Text from outside the program never drives the terminal (:func:`chatphase.engine.text.inert`).

A model (or a server, a GGUF file, a file name, a session title) can carry escape sequences: OSC 52 writes
the clipboard, ``ESC[2J`` clears the screen, OSC 0 retitles the window, OSC 8 makes a link, and a
bidirectional control (U+202E) reorders what is drawn. Each path that shows such text, on a terminal or
in a file for people, is fed these payloads here and fails on any raw control character (C0 but newline
and tab, DEL, C1, the bidirectional controls) in what it writes.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from fake_engine import FakeEngine, fake_model_info
from hypothesis import given
from hypothesis import strategies as st
from remote_support import ScriptedServer, content_chunk, sse
from textual.widgets import DataTable, Static
from thinking_support import THINK
from ui_support import idle, record_notifications, send, wait_for

from chatphase.cli import main
from chatphase.engine.events import EngineFailed
from chatphase.engine.text import BIDI_CONTROLS, INERT_TABLE, inert, json_inert
from chatphase.sessions.catalog import load_session
from chatphase.sessions.export import to_csv, to_json, to_markdown
from chatphase.sessions.writer import SessionWriter
from chatphase.settings.schema import Settings
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.inert_lines import InertLines
from chatphase.ui.screens.modals import LogScreen
from chatphase.ui.screens.model_picker import ModelPickerScreen
from chatphase.ui.screens.sessions import ExportScreen, SessionsScreen

pytestmark = pytest.mark.timeout(90)

#: what the issue's fake server streamed: OSC 52 (BEL- and ST-terminated), a clear screen, an OSC 8 link,
#: a window title; then an 8-bit CSI (C1), DEL and a carriage return (which can overwrite a line); then
#: each bidirectional control (an override first: what follows it is drawn right to left).
BIDI = "\u202etxt.exe\u202c\u202a\u202b\u202d\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
PAYLOADS = (
    "\x1b]52;c;aGFja2Vk\x07",
    "\x1b]52;c;aGFja2Vk\x1b\\",
    "\x1b[2J",
    "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\",
    "\x1b]0;pwned-title\x07",
    "\x9b31m",
    "\x7f",
    "\r",
    BIDI,
)
PAYLOAD = "".join(PAYLOADS)
EVIL = f"evil{PAYLOAD}name"
#: what a file name can hold (no "/"): OSC 52, a clear screen, a title, the bidirectional controls.
NAME_PAYLOAD = f"\x1b]52;c;aGFja2Vk\x07\x1b[2J\x1b]0;pwned\x07{BIDI}"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def raw_controls(text: str) -> list[str]:
    """The control characters (other than newline and tab) in ``text``, as hex: what must never be written."""
    return sorted({hex(ord(c)) for c in CONTROL.findall(text)})


# ------------------------------------------------------------------ the function


@given(st.text())
def test_inert_leaves_no_control_but_newline_and_tab(text):
    out = inert(text)
    assert raw_controls(out) == []
    assert len(out) == len(text)  # one for one: offsets into the text hold
    assert inert(out) == out


@given(st.text(), st.text())
def test_inert_is_per_character(a, b):
    """So streamed chunks can be made inert one by one, wherever a sequence is cut."""
    assert inert(a + b) == inert(a) + inert(b)


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc",), blacklist_characters=BIDI_CONTROLS)))
def test_text_without_controls_is_kept_as_is(text):
    assert inert(text) is text


def test_inert_shows_the_controls_as_pictures():
    assert inert("a\x1b[2Jb\r\n\tc\x00\x7f\x9b") == "a␛[2Jb␍\n\tc␀␡\ufffd"
    assert set(INERT_TABLE) == {*range(0x20), *range(0x7F, 0xA0), *map(ord, BIDI_CONTROLS)} - {0x09, 0x0A}


def test_a_bidirectional_control_is_shown_not_obeyed():
    """``bidi<U+202E>txt.exe`` is drawn ``bidiexe.txt``: each bidi control shows as U+FFFD, one for one."""
    assert inert("bidi\u202etxt.exe") == "bidi\ufffdtxt.exe"
    assert inert(BIDI) == "\ufffdtxt.exe" + "\ufffd" * 11
    assert raw_controls(json_inert(json.dumps({"name": BIDI}, ensure_ascii=False))) == []


@given(st.recursive(st.text() | st.integers(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)))
def test_json_inert_is_the_same_json_without_controls(value):
    text = json_inert(json.dumps(value, ensure_ascii=False))
    assert raw_controls(text) == [] and json.loads(text) == value


# ------------------------------------------------------------------ the TUI


class EvilEngine(FakeEngine):
    """A FakeEngine whose fatal failure quotes the server's text."""

    def _die(self, request):
        self.dead = True
        self._gone.set()
        yield EngineFailed(f"the server said: {EVIL}", turn_id=request.turn_id, fatal=True)


def evil_app(
    settings: Settings | None = None, name: str = EVIL, **engine_kwargs
) -> tuple[ChatPhaseApp, list[FakeEngine]]:
    """The app on a model named ``name`` whose notes carry it too."""
    engines: list[FakeEngine] = []

    def factory(info, current):
        engines.append(EvilEngine(info, current.engine, notes=(f"chat format: {name}", name), **engine_kwargs))
        return engines[-1]

    app = ChatPhaseApp(settings or Settings(), fake_model_info(name=name, path=f"/models/{name}.gguf"), factory)
    record_notifications(app)
    return app, engines


def screen_text(app) -> str:
    """What Textual draws of the screen: modal screens, and toasts where the test runs with ``notifications=True``."""
    return app.export_screenshot()


def assert_inert(app) -> None:
    text = screen_text(app)
    assert raw_controls(text) == []
    assert "␛" in text  # the payload is on screen, shown


def rows_shown(app, screen_type) -> int:
    """The rows of the table of screen ``screen_type`` once it is up (0 before)."""
    tables = app.screen.query(DataTable) if isinstance(app.screen, screen_type) else ()
    return tables.first().row_count if tables else 0


@pytest.fixture
def no_backstop(monkeypatch):
    """Without the app's :class:`InertLines` filter: each widget's own text must be inert (so that it is
    measured and wrapped as drawn); the filter only catches what a widget missed."""
    monkeypatch.setattr(InertLines, "apply", lambda self, segments, background: segments)


@pytest.mark.parametrize("hold_after_tokens", [2, 5], ids=["thinking streams", "answer streams"])
async def test_the_transcript_panel_and_notices_are_inert(no_backstop, hold_after_tokens):
    pieces = ["<think>", f"plan {PAYLOAD}", "</think>", "\n\n", f"Answer {PAYLOAD}", f"\n\n- item {PAYLOAD}\n"]
    settings = Settings(thinking_open=True)  # the finished thinking block shows its text
    app, engines = evil_app(
        settings, replies=[pieces], thinking=THINK, hold="decode", hold_after_tokens=hold_after_tokens
    )
    async with app.run_test(size=(130, 45)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        assert_inert(app)  # the model's name and notes: side panel, phase line, chat log
        await send(pilot, f"pasted {PAYLOAD}")
        await wait_for(pilot, lambda: engines[0].held.is_set())
        await pilot.pause(0.5)  # a few redraw ticks: the streaming tail
        assert_inert(app)
        engines[0].release()
        await wait_for(pilot, lambda: idle(app) and len(app.chat.conversation) == 2)
        await pilot.pause(0.2)
        assert_inert(app)  # the finished reply (Markdown) and thinking block


async def test_an_engine_failure_and_toasts_are_inert(no_backstop):
    app, _ = evil_app(crash_at="decode")
    async with app.run_test(size=(130, 40), notifications=True) as pilot:  # toasts drawn
        await wait_for(pilot, lambda: idle(app))
        app.notify(EVIL, title=EVIL)
        await send(pilot, "hello")
        await wait_for(pilot, lambda: not app.chat.busy and app.chat.loaded is None)
        await pilot.pause(0.2)
        text = screen_text(app)
        assert raw_controls(text) == [] and "said:" in text and text.count("␛") >= 4  # toasts, phase line, log


async def test_the_engine_log_screen_is_inert(no_backstop, tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(f"llama_model_loader: general.name str = {EVIL}\nserver: {PAYLOAD}\n")
    app, _ = evil_app(log_path=str(log))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        app.action_show_log()
        await wait_for(pilot, lambda: isinstance(app.screen, LogScreen) and bool(app.screen.lines))
        await pilot.pause(0.2)
        assert_inert(app)


async def test_the_sessions_and_export_screens_are_inert(no_backstop):
    other = SessionWriter.create(model={"name": EVIL}, settings={}, title=EVIL)
    other.begin_turn(f"user {PAYLOAD}")
    other.finish_turn(f"reply {PAYLOAD}", None, error=EVIL)
    other.close()
    app, _ = evil_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        app.action_sessions()
        await wait_for(pilot, lambda: rows_shown(app, SessionsScreen) >= 1)
        await pilot.pause(0.1)
        assert_inert(app)  # titles and model names in the table
        await pilot.press("r")  # the rename box holds the title
        await pilot.pause(0.1)
        assert_inert(app)
        await pilot.press("escape", "e")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen))
        await pilot.pause(0.1)
        assert_inert(app)  # the dialog's title


MARKUP = "[red]MARK[/red]"


async def test_outside_text_is_not_read_as_markup():
    """``[link=…]`` in a model or session name would be a live link, ``[@click=…]`` an action: shown as typed."""
    SessionWriter.create(model={"name": MARKUP}, settings={}, title=MARKUP).begin_turn("x")
    app, _ = evil_app(name=MARKUP)
    async with app.run_test(size=(130, 40), notifications=True) as pilot:
        await wait_for(pilot, lambda: idle(app))
        app.notify(MARKUP)
        await pilot.pause(0.2)
        assert screen_text(app).count(MARKUP) >= 3  # the side panel, the phase line, the toast
        app.action_sessions()
        await wait_for(pilot, lambda: rows_shown(app, SessionsScreen) >= 1)
        await pilot.pause(0.1)
        assert screen_text(app).count(MARKUP) >= 2  # title and model in the table


async def test_a_settings_error_quotes_the_value_as_typed(no_backstop):
    from textual.widgets import Input

    from chatphase.ui.screens.settings import SettingsScreen

    app, _ = evil_app(name="m")
    async with app.run_test(size=(130, 45)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        app.action_edit_settings()
        await wait_for(
            pilot, lambda: isinstance(app.screen, SettingsScreen) and bool(app.screen.query("#settings-save"))
        )
        app.screen.query_one("#set-n_ctx", Input).value = f"x{MARKUP}"
        await pilot.pause(0.1)
        error = str(app.screen.query_one("#settings-error").render())
        assert "expected an integer" in error and MARKUP in error


async def test_the_experiments_status_and_table_are_inert_and_not_markup(no_backstop):
    from chatphase.ui.experiments.screen import ExperimentsScreen

    app, _ = evil_app(name="m")
    async with app.run_test(size=(150, 48)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        app.action_open_experiments()
        await wait_for(
            pilot, lambda: isinstance(app.screen, ExperimentsScreen) and bool(app.screen.query("#exp-status"))
        )
        screen = app.screen
        screen._status(f"{MARKUP} cannot run {EVIL}", "-error")  # as a failed job's message reads
        screen.pane.rows = lambda result: [(EVIL, MARKUP)]  # a result's cells: a model's name among them
        screen.results[screen.pane.kind] = object()
        screen.pane.summary = lambda result: EVIL
        screen._fill_table()
        await pilot.pause(0.2)
        assert_inert(app)
        assert screen_text(app).count(MARKUP) == 2


def write_gguf(path: Path, name: str, chat_template: str | None = None) -> Path:
    """A small GGUF (as tests/models/test_models_validation.py writes them) whose ``general.name`` is ``name``."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(256)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0))
    w.add_token_list([f"t{i}".encode() for i in range(300)])
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", np.arange(256, dtype=np.float32).reshape(4, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def evil_models_dir(tmp_path) -> Path:
    """A models directory with a usable GGUF and a broken one, both with escape sequences in their names."""
    folder = tmp_path / "models"
    folder.mkdir()
    write_gguf(folder / f"tiny{NAME_PAYLOAD}.gguf", EVIL)
    (folder / f"page{NAME_PAYLOAD}.gguf").write_text("<html>not a model</html>")
    return folder


async def test_the_model_picker_is_inert(no_backstop, evil_models_dir):
    app, _ = evil_app(Settings(models_dir=str(evil_models_dir)))
    async with app.run_test(size=(150, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        app.action_switch_model_picker()
        await wait_for(pilot, lambda: rows_shown(app, ModelPickerScreen) >= 3)  # the two files and the default
        table = app.screen.query_one(DataTable)
        for row in range(table.row_count):  # each row's detail line: its name and path, or why it is unusable
            table.move_cursor(row=row)
            await pilot.pause(0.1)
            assert_inert(app)


async def test_the_experiments_screen_and_its_plots_are_inert(no_backstop):
    """The title, and a plot's legend: plotext's output is read as ANSI, where an OSC 8 would be a live link."""
    from textual.geometry import Region

    from chatphase.bench.core.results import Sample
    from chatphase.ui.experiments.plot import BenchPlot
    from chatphase.ui.experiments.screen import ExperimentsScreen

    app, _ = evil_app()
    async with app.run_test(size=(150, 48)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        app.action_open_experiments()
        await wait_for(pilot, lambda: isinstance(app.screen, ExperimentsScreen) and bool(app.screen.query(BenchPlot)))
        plot = app.screen.query_one("#exp-plot-ttft", BenchPlot)
        plot.start_live(
            "m\x1b]8;;http://e\x1b\\x\x1b]8;;\x1b\\\x1b[2J"
        )  # short: a legend wider than the plot is left out
        plot.add_sample(Sample("prompt", 16, 0, 0, False, 21.0, 1.0, 2.0, 3.0, 16, 0, 8, 0, "length"))
        await pilot.pause(0.2)
        assert_inert(app)
        width, height = plot.outer_size
        segments = [seg for strip in plot.render_lines(Region(0, 0, width, height)) for seg in strip]
        assert "␛" in "".join(seg.text for seg in segments)  # the legend names the running model, shown
        assert not [seg.style.link for seg in segments if seg.style is not None and seg.style.link]


async def test_the_app_filter_catches_what_a_widget_missed():
    app, _ = evil_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await app.screen.mount(Static(f"raw {PAYLOAD}", markup=False))
        await pilot.pause(0.1)
        assert_inert(app)


async def test_without_the_filter_a_raw_widget_is_caught_by_this_check(no_backstop):
    """The check above can fail: a plain Static of raw text puts ESC on the screen."""
    app, _ = evil_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await app.screen.mount(Static(f"raw {PAYLOAD}", markup=False))
        await pilot.pause(0.1)
        assert "0x1b" in raw_controls(screen_text(app))


# ------------------------------------------------------------------ ask against a server


def _server_routes(stream: bool = True) -> dict:
    chunks = [content_chunk(piece) for piece in ("Hi ", *PAYLOADS, " bye")]
    thinking = {"choices": [{"index": 0, "delta": {"reasoning_content": f"think {PAYLOAD}"}, "finish_reason": None}]}
    done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    completions = (200, sse(thinking, *chunks, done, "[DONE]")) if stream else (500, {"error": {"message": EVIL}})
    return {
        "GET /v1/models": (200, {"data": [{"id": EVIL, "object": "model"}]}),
        "GET /props": (200, {"default_generation_settings": {"n_ctx": 1024}, "total_slots": 1}),
        "POST /v1/chat/completions": completions,
    }


def ask(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "chatphase", "ask", "--server", url, "--no-save", "--show-thinking", *extra, "hi"],
        capture_output=True,
        timeout=60,
    )


def test_ask_to_a_pipe_is_inert_unless_raw():
    with ScriptedServer(_server_routes()) as srv:
        inert_run = ask(srv.url)
        raw_run = ask(srv.url, "--raw")
    assert inert_run.returncode == 0, inert_run.stderr
    out, err = inert_run.stdout.decode(), inert_run.stderr.decode()
    assert raw_controls(out) == [] and raw_controls(err) == []
    assert out == f"Hi {inert(PAYLOAD)} bye\n" and f"think {inert(PAYLOAD)}" in err
    assert raw_run.returncode == 0, raw_run.stderr
    assert raw_run.stdout.decode() == f"Hi {PAYLOAD} bye\n"  # byte for byte, for a pipe that wants them
    assert f"think {PAYLOAD}" in raw_run.stderr.decode()


def read_terminal(argv: list[str]) -> str:
    """What ``argv`` writes to a terminal (a pty as its stdout and stderr), newlines as ``\n``."""
    main_fd, term_fd = pty.openpty()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=term_fd, stderr=term_fd)
        os.close(term_fd)
        written = b""
        while True:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # the terminal's other end closed (Linux: EIO)
                break
            if not chunk:
                break
            written += chunk
        assert proc.wait(timeout=60) == 0, written
    finally:
        os.close(main_fd)
    return written.decode().replace("\r\n", "\n")  # the terminal's own newline translation


def test_ask_to_a_terminal_is_inert():
    with ScriptedServer(_server_routes()) as srv:
        text = read_terminal(
            [sys.executable, "-m", "chatphase", "ask", "--server", srv.url, "--no-save", "--show-thinking", "hi"]
        )
    assert raw_controls(text) == []
    assert f"{inert(PAYLOAD)} bye" in text and f"think {inert(PAYLOAD)}" in text  # stdout and stderr interleave


def test_ask_json_escapes_every_control_and_keeps_the_text(capsys):
    with ScriptedServer(_server_routes()) as srv:
        rc = main(["ask", "--server", srv.url, "--no-save", "--json", "hi"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert raw_controls(out) == [] and raw_controls(err) == []
    doc = json.loads(out)
    assert doc["turns"][0]["reply"] == f"Hi {PAYLOAD} bye" and doc["model"]["name"] == EVIL


def test_a_servers_error_text_is_inert_on_stderr(capsys):
    with ScriptedServer(_server_routes(stream=False)) as srv:
        rc = main(["ask", "--server", srv.url, "--no-save", "hi"])
    out, err = capsys.readouterr()
    assert rc != 0 and raw_controls(out + err) == [] and inert(EVIL) in err


# ------------------------------------------------------------------ files and listings


@pytest.fixture
def evil_session() -> str:
    """A saved session whose title, model, messages, thinking and error carry the payloads; its id."""
    w = SessionWriter.create(model={"name": EVIL, "architecture": "llama"}, settings={}, title=EVIL)
    w.begin_turn(f"user {PAYLOAD}")
    w.finish_turn(f"reply {PAYLOAD}", None, thinking=f"thinking {PAYLOAD}")
    w.begin_turn("again")
    w.finish_turn("", None, error=EVIL)
    w.close()
    return w.id


def test_the_exports_are_inert(evil_session):
    session = load_session(evil_session)
    md, csv_text, json_text = to_markdown(session), to_csv(session), to_json(session)
    assert raw_controls(md) == [] and f"reply {inert(PAYLOAD)}" in md and f"# {inert(EVIL)}" in md
    assert raw_controls(csv_text) == [] and inert(EVIL) in csv_text
    assert raw_controls(json_text) == [] and json.loads(json_text)["turns"][0]["reply"] == f"reply {PAYLOAD}"


@pytest.mark.parametrize("fmt", ["md", "csv", "json"])
def test_export_to_stdout_is_inert(capsys, evil_session, fmt):
    assert main(["export", evil_session, "--format", fmt]) == 0
    out, err = capsys.readouterr()
    assert raw_controls(out + err) == [] and out


def test_the_session_file_escapes_every_control(evil_session):
    text = Path(load_session(evil_session).path).read_text()
    assert raw_controls(text) == [] and load_session(evil_session).title == EVIL


@pytest.mark.parametrize("argv", [["sessions"], ["sessions", "--json"]])
def test_the_sessions_listing_is_inert(capsys, evil_session, argv):
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert raw_controls(out + err) == [] and evil_session in out


def test_info_shows_the_models_name_inert(capsys, tmp_path):
    """A model's name is its file's (general.name is often a training-run label), and info quotes the path."""
    path = write_gguf(tmp_path / f"m{NAME_PAYLOAD}.gguf", EVIL)
    main(["info", "--model", str(path)])  # its vocabulary is not llama.cpp's: refused after the report
    out, err = capsys.readouterr()
    assert raw_controls(out + err) == [] and f"m{inert(NAME_PAYLOAD)}" in out and inert(NAME_PAYLOAD) in err


@pytest.mark.parametrize("argv", [["models"], ["models", "--json"]])
def test_the_models_listing_is_inert(capsys, evil_models_dir, argv):
    assert main([*argv, "--models-dir", str(evil_models_dir)]) == 0
    out, err = capsys.readouterr()
    assert raw_controls(out + err) == [] and "tiny" in out and "page" in out


def test_a_model_not_found_line_is_inert(capsys, evil_models_dir):
    """The name typed and the models the line offers instead: ``bidi<U+202E>txt.exe`` is not drawn ``bidiexe.txt``."""
    assert main(["info", "--model", "bidi\u202etxt.exe", "--models-dir", str(evil_models_dir)]) != 0
    out, err = capsys.readouterr()
    assert raw_controls(out + err) == [] and "model not found: bidi\ufffdtxt.exe" in err
    assert f"tiny{inert(NAME_PAYLOAD)}.gguf" in err  # the models it lists
