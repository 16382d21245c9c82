"""Chat formats: a fallback that fits the model's vocabulary, end-of-turn markers written as text, and
templates checked before any turn (one plain line, exit 2).

Pure parts run without a model (``choose_format`` with a scripted vocabulary, ``StopText``, the probe);
the CLI runs as a real process on tiny GGUFs whose template is broken; the engine runs on the default
model and on Gemma 3 270M (no template in the file, ``<start_of_turn>`` in its vocabulary).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import (
    EngineFailed,
    FirstToken,
    Message,
    ModelLoaded,
    SamplingParams,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.prompting.chat_format import (
    ChatFormat,
    TemplateError,
    choose_format,
    end_of_turn,
    probe,
    renderer,
    resolve_override,
)
from chatphase.engine.prompting.stops import StopText
from chatphase.errors import UsageError
from tests.models.test_models_validation import write_tiny_gguf

MARKERS = ("<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>")
#: templates that must be refused at load, each with a word of the reason the line gives.
BAD_TEMPLATES = {
    "sandbox escape": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "sandbox"),
    "type internals": ("{{ cycler.__init__.__globals__.os }}", "sandbox"),
    "raises": ("{{ raise_exception('Conversation roles must alternate') }}", "Conversation roles must alternate"),
    "syntax error": ("{% for m in messages %}{{ m.content }", "cannot be read"),
    "renders nothing": ("{% for m in messages %}{% endfor %}", "renders nothing"),
    "ignores the messages": ("<s>assistant:", "none of the conversation"),
}


def tokens_of(*present: str):
    return lambda text: text in present


# -- choosing ----------------------------------------------------------------------------------------
def test_a_gemma_vocabulary_without_a_template_gets_gemma_never_chatml():
    fmt = choose_format("gemma3", None, tokens_of("<start_of_turn>", "<end_of_turn>"))
    assert (fmt.kind, fmt.name) == ("builtin", "gemma") and "no chat template" in fmt.why


def test_the_architecture_picks_among_formats_whose_tokens_exist():
    llama3 = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
    assert choose_format("llama", None, tokens_of(*llama3)).name == "llama3"
    # ChatML tokens alone: chatml whatever the architecture
    assert choose_format("starcoder2", None, tokens_of("<|im_start|>", "<|im_end|>")).name == "chatml"
    # both sets: the architecture's own wins
    assert choose_format("llama", None, tokens_of(*llama3, "<|im_start|>", "<|im_end|>")).name == "llama3"
    # no chat tokens at all: a plain completion prompt that stops at the next "User:" line
    plain = choose_format("gemma3", None, tokens_of())
    assert plain.kind == "completion" and plain.stops == ("\nUser:",)
    assert choose_format("llama", None, tokens_of("<|im_start|>")).kind == "completion"  # half a set is not one


def test_the_model_template_wins_and_an_override_wins_over_it(tmp_path):
    assert choose_format("llama", "{{ x }}", tokens_of()).kind == "model"
    assert choose_format("llama", "{{ x }}", tokens_of(), override="gemma").name == "gemma"
    assert choose_format("llama", "{{ x }}", tokens_of(), override="completion").kind == "completion"
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    fmt = choose_format("llama", None, tokens_of(), override=str(jinja))
    assert fmt.kind == "file" and fmt.template == jinja.read_text()
    assert resolve_override("auto") is None and resolve_override("") is None


def test_an_unknown_or_unreadable_override_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="no such file and no built-in format") as err:
        resolve_override("gemmma")
    assert "chatml" in str(err.value) and "\n" not in str(err.value)
    latin1 = tmp_path / "latin1.jinja"
    latin1.write_bytes("{{ 'caf\xe9' }}".encode("latin-1"))
    with pytest.raises(UsageError, match=r"not UTF-8 text \(bad byte at offset 7\)"):
        resolve_override(str(latin1))


# -- rendering and end-of-turn markers ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "marker"), [("gemma", "<end_of_turn>"), ("chatml", "<|im_end|>"), ("llama3", "<|eot_id|>")]
)
def test_builtin_formats_render_and_know_their_end_of_turn(name, marker):
    fmt = probe(ChatFormat("builtin", name), renderer(ChatFormat("builtin", name)))
    assert fmt.stops == (marker,)
    text, add_special = renderer(fmt)([Message("user", "Hi")], True)
    assert "Hi" in text and add_special  # llama.cpp's formats leave BOS to the tokeniser


def test_the_completion_prompt_has_no_markup():
    fmt = ChatFormat("completion", "completion", stops=("\nUser:",))
    text, _ = renderer(fmt)([Message("system", "Be brief."), Message("user", "Hi")], True)
    assert text == "System: Be brief.\n\nUser: Hi\n\nAssistant:"
    assert probe(fmt, renderer(fmt)).stops == ("\nUser:",)


def test_end_of_turn_is_the_first_word_after_the_reply():
    assert end_of_turn("<|im_start|>assistant\nOK<|im_end|>\n", "OK") == ("<|im_end|>",)
    assert end_of_turn("User: a\n\nAssistant: OK\n\n", "OK") == ()


@pytest.mark.parametrize("case", sorted(BAD_TEMPLATES))
def test_a_bad_template_is_one_plain_line_naming_the_override(case):
    source, reason = BAD_TEMPLATES[case]
    fmt = ChatFormat("model", "tiny.gguf", template=source)
    with pytest.raises(TemplateError) as err:
        probe(fmt, renderer(fmt))
    line = str(err.value)
    assert reason in line and "--chat-template NAME|FILE" in line and "tiny.gguf" in line
    assert "\n" not in line and "Error" not in line and "__" not in line


# -- text markers ---------------------------------------------------------------------------------------
def test_a_marker_split_across_pieces_stops_and_never_shows():
    stop = StopText(["<|im_end|>"])
    shown = [stop.feed(p) for p in ["Hello", " world", "<", "|im", "_end", "|>", "more"]]
    assert "".join(shown) == "Hello world" and stop.stopped
    assert shown[2:] == ["", "", "", "", ""]


def test_text_that_only_looks_like_a_marker_comes_out_whole():
    stop = StopText(["<|im_end|>", "\nUser:"])
    out = stop.feed("a <|im") + stop.feed("_start|> b\nUs") + stop.feed("ed")
    assert out == "a <|im_start|> b\nUsed" and not stop.stopped
    tail = StopText(["<|im_end|>"])
    assert tail.feed("end <|im_") == "end " and tail.flush() == "<|im_"  # the reply ended on a prefix


def test_the_first_of_two_markers_cuts_the_reply():
    stop = StopText(["<end_of_turn>", "\nUser:"])
    assert stop.feed("4.\nUser: and <end_of_turn>") == "4." and stop.stopped


# -- checked before any turn: real processes ---------------------------------------------------------------
def chatphase(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "chatphase", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", ["ask", "chat"])
def test_a_template_refused_by_the_sandbox_exits_2_with_one_line_before_any_turn(tmp_path, command):
    bad = write_tiny_gguf(tmp_path / "escape.gguf", chat_template=BAD_TEMPLATES["type internals"][0])
    args = [command, "--model", str(bad), "--no-save"] + (["hello"] if command == "ask" else [])
    result = chatphase(*args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("chatphase: the chat template of escape"), lines
    assert "sandbox" in lines[0] and "--chat-template" in lines[0] and "SecurityError" not in lines[0]
    # the override is the way out: the same file with a built-in format passes the check
    fixed = chatphase("info", "--model", str(bad), "--chat-template", "chatml", "--json")
    assert '"label": "chatml (llama.cpp built-in)"' in fixed.stdout, fixed.stderr


def test_info_says_which_format_is_in_use(default_model_path):
    result = chatphase("info", "--model", default_model_path)
    assert result.returncode == 0, result.stderr
    assert "chat format    the model's own template · stops at '<|im_end|>'" in result.stdout


def test_an_override_template_that_fails_stops_the_engine_load_with_one_line(default_model_info, tmp_path):
    from chatphase.engine.local.llama import LlamaEngine

    bad = tmp_path / "bad.jinja"
    bad.write_text(BAD_TEMPLATES["sandbox escape"][0])
    engine = LlamaEngine(
        default_model_info, EngineConfig(n_ctx=256, chat_template=str(bad)), log_path=tmp_path / "e.log"
    )
    try:
        events = list(engine.load())
    finally:
        engine.close()
    assert len(events) == 1 and isinstance(events[0], EngineFailed) and events[0].fatal
    assert events[0].message.startswith(f"the chat template {bad} was refused") and "\n" not in events[0].message


# -- Gemma 3 270M: no template in the file -------------------------------------------------------------------
GREEDY = SamplingParams(max_tokens=40, temperature=0)


def gemma_engine(info, tmp_path, **config):
    from chatphase.engine.local.llama import LlamaEngine

    engine = LlamaEngine(info, EngineConfig(n_ctx=512, **config), log_path=tmp_path / "engine.log")
    events = list(engine.load())
    assert isinstance(events[-1], ModelLoaded), events
    return engine, events[-1].model


def turn(engine, turn_id, messages):
    events = list(engine.run_turn(TurnRequest(turn_id, tuple(messages), GREEDY)))
    finished = next(e for e in events if isinstance(e, TurnFinished))
    streamed = "".join(e.text for e in events if isinstance(e, (FirstToken, TokensDecoded)))
    return finished, streamed


def test_gemma_gets_its_own_format_no_markers_and_the_cache_is_reused(gemma_model_info, tmp_path):
    engine, loaded = gemma_engine(gemma_model_info, tmp_path)
    try:
        assert loaded.chat_format == "gemma (llama.cpp built-in)"
        assert any(n.startswith("chat format: gemma") for n in loaded.notes)
        conv = [Message("user", "What is the capital of France?")]
        t1, streamed = turn(engine, 1, conv)
        assert streamed == t1.reply and not any(m in t1.reply for m in MARKERS)
        conv += [Message("assistant", t1.reply), Message("user", "And of Italy?")]
        t2, _ = turn(engine, 2, conv)
        assert not any(m in t2.reply for m in MARKERS)
        assert t2.metrics.cached_tokens >= t1.metrics.prompt_tokens  # KV reuse by text still works
    finally:
        engine.close()


def test_chatml_forced_on_gemma_stops_at_the_text_marker(gemma_model_info, tmp_path):
    """Gemma has no ChatML tokens, so it writes ``<|im_end|>`` as text: that ends the reply, unseen."""
    engine, loaded = gemma_engine(gemma_model_info, tmp_path, chat_template="chatml")
    try:
        assert loaded.chat_format == "chatml (llama.cpp built-in)"
        finished, streamed = turn(engine, 1, [Message("user", "Name three colours.")])
        assert finished.metrics.stop_reason == "stop" and finished.metrics.decode_tokens < GREEDY.max_tokens
        assert streamed == finished.reply and "<|im" not in finished.reply
    finally:
        engine.close()


def test_ask_on_gemma_names_the_format_on_stderr(gemma_model_info):
    result = chatphase(
        "ask",
        "--model",
        gemma_model_info.path,
        "--no-save",
        "--temperature",
        "0",
        "--max-tokens",
        "24",
        "Hi!",
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert "chatphase: chat format: gemma (llama.cpp built-in)" in result.stderr
    assert not any(m in result.stdout for m in MARKERS)


async def test_the_model_panel_shows_the_chat_format_at_80_columns():
    from dataclasses import replace

    from textual.widgets import Static
    from ui_support import make_app, wait_for

    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded is not None)
        app.panel.set_model(replace(app.chat.loaded, chat_format="gemma (llama.cpp built-in)"))
        await pilot.press("ctrl+b")  # the panel below the chat at 80 columns
        await pilot.pause(0.2)
        figures = app.panel.query_one("#model-figures", Static)
        text = " ".join(line.text for line in figures.render_lines(figures.region.reset_offset))
        assert "format gemma (llama.cpp built-in)" in " ".join(text.split())  # wrapped, all on screen
