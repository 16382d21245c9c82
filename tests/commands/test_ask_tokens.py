"""``chatphase ask --tokens``: the token view in the terminal and in ``--json`` (a real process on the default
model), its text made inert and coloured only for a terminal (faked tokens), and one line where an engine has no
tokens to show (the fake engine, as a remote server)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest
from fake_engine import FakeEngine, fake_model_info

from chatphase.chat.token_view import as_json, file_at, file_runs
from chatphase.cli import main
from chatphase.commands import ask
from chatphase.commands.ask_tokens import colour_wanted, token_lines
from chatphase.engine.events import TurnFinished
from chatphase.engine.tokens import Piece, TurnTokens

SGR = re.compile(r"\x1b\[[0-9;]*m")


def tokens() -> TurnTokens:
    pieces = {1: Piece("<|im_start|>", True), 2: Piece("user\n", False), 3: Piece("hi\x1b]52;c;AAAA\x07", False)}
    pieces |= {4: Piece(" there", False), 5: Piece("old", False)}
    return TurnTokens(
        prompt_ids=(1, 2, 3, 1, 2, 4),
        restored=1,
        cached=3,
        prefilled=2,
        left_out_ids=(5, 5),
        left_out_how="dropped",
        reply_ids=(4, 3, 4),
        reply_t_ns=(100_000_000, 110_000_000, 150_000_000),
        reply_accepted=(2,),
        spec_steps=((1, 2, 1),),
        pieces=pieces,
    )


def test_the_view_says_the_counts_the_legend_and_every_source_run_inert():
    lines = token_lines(tokens(), 3, colour=False)
    text = "\n".join(lines)
    assert lines[0] == (
        "── turn 3 tokens ── prompt 6 tok: restored 1 · cached 2 · prefilled 2 · unevaluated 1 · dropped 2 · "
        "reply 3 tok (drafted 2, accepted 1)"
    )
    legend = [line.split(":")[0].strip() for line in lines[1:6]]
    assert legend == ["■ restored", "■ cached", "■ prefilled", "■ unevaluated", "■ dropped"]  # no shifted: none
    assert "▌dropped · left out (2 tok)" in text and "▌restored · prompt 0–0 (1 tok)" in text
    assert "▌unevaluated · prompt 5–5 (1 tok)" in text
    assert "\x1b" not in text and "\x07" not in text and "hi␛]52;c;AAAA␇" in text
    assert "user↵" in text  # a newline piece shown, and the line broken after it
    reply = [line for line in lines if line.startswith("  #")]
    assert len(reply) == 3 and "TTFT" in reply[0] and "100 ms" in reply[0]
    assert "40.0 ms" in reply[2] and reply[2].count("▇") == 20 and reply[1].count("▇") == 5  # gaps 10 and 40 ms
    assert reply[2].endswith("accepted draft") and not reply[1].endswith("accepted draft")


def test_colour_only_for_a_terminal_and_only_chatphase_s_own_escapes(monkeypatch):
    coloured = "\n".join(token_lines(tokens(), 1, colour=True))
    assert "\x1b[1;38;2;0;114;178m" in coloured  # bold, the restored (Okabe–Ito blue) special token
    assert "\x1b" not in SGR.sub("", coloured)  # the model's escape sequence stays inert

    class Stream:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert colour_wanted(Stream(True)) and not colour_wanted(Stream(False))  # type: ignore[arg-type]
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour_wanted(Stream(True))  # type: ignore[arg-type]


def test_the_json_has_one_object_per_token_with_its_source():
    doc = as_json(tokens())
    assert [p["source"] for p in doc["prompt"]] == [
        "restored",
        "cached",
        "cached",
        "prefilled",
        "prefilled",
        "unevaluated",
    ]
    assert doc["prompt"][0] == {"id": 1, "text": "<|im_start|>", "source": "restored", "special": True, "file": None}
    assert [p["source"] for p in doc["left_out"]] == ["dropped", "dropped"]
    assert [r["itl_ms"] for r in doc["reply"]] == [None, 10.0, 40.0]
    assert [r["accepted_draft"] for r in doc["reply"]] == [False, False, True]
    assert doc["counts"] == {
        "restored": 1,
        "cached": 2,
        "prefilled": 2,
        "unevaluated": 1,
        "dropped": 2,
        "shifted": 0,
        "prompt": 6,
        "reply": 3,
    }


class NoTokens(FakeEngine):
    """An engine that sends no tokens (as a remote server)."""

    def run_turn(self, request):
        for ev in super().run_turn(request):
            yield replace(ev, tokens=None) if isinstance(ev, TurnFinished) else ev


def test_an_engine_without_tokens_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(ask, "model_info_for", lambda settings, pull=False: fake_model_info())
    monkeypatch.setattr(ask, "engine_for", lambda s, info: NoTokens(info, s.engine, replies=["fine"], notes=()))
    assert main(["ask", "--no-save", "--tokens", "--json", "hello"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["turns"][0]["tokens"] is None
    assert "chatphase: turn 1: no token view (a remote server does not send its prompt's tokens)" in out.err


def test_an_attached_file_s_text_is_marked_with_its_name():
    """The block a message carries a file in (chatphase/sessions/message_files.py), cut into tokens as a tokenizer
    might: a token that holds the head's newline and the file's first letters is the file's; the end is not."""
    pieces = [
        "Hi",
        "\n\n",
        "<file",
        ' name="a &quot;b&quot;.txt"',
        ' bytes="9">',
        "\nhel",
        "lo ",
        "you",
        "\n</",
        "file>",
    ]
    pieces += ['\n\n<file name="c.md" bytes="2">\n', "ok", "\n</file>", "<|im_end|>"]
    t = TurnTokens(range(len(pieces)), 0, 0, len(pieces), pieces={i: Piece(p, False) for i, p in enumerate(pieces)})
    assert file_runs(t) == [(5, 8, 'a "b".txt'), (11, 12, "c.md")]
    assert [file_at(file_runs(t), i) for i in (4, 5, 7, 8, 11)] == [None, 'a "b".txt', 'a "b".txt', None, "c.md"]
    assert [p["file"] for p in as_json(t)["prompt"]][4:9] == [None, 'a "b".txt', 'a "b".txt', 'a "b".txt', None]
    lines = token_lines(t, 1, colour=False)
    assert '  file a "b".txt: prompt 5–7 (3 tok)' in lines and "  file c.md: prompt 11–11 (1 tok)" in lines
    assert file_runs(tokens()) == []  # no block, no file


@pytest.mark.model
def test_ask_tokens_json_counts_are_the_metrics_and_the_text_view_prints(tmp_path):
    argv = [sys.executable, "-m", "chatphase", "ask", "--no-save", "--tokens", "--temperature", "0"]
    argv += ["--max-tokens", "16", "--n-ctx", "1024", "--prefix-cache", "off"]
    notes = tmp_path / "notes.txt"
    notes.write_text("Apples are red. Pears are green.\n", encoding="utf-8")
    done = subprocess.run(
        [*argv, "--json", "-f", str(notes), "Name a fruit.", "Name a vegetable."],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for turn in json.loads(done.stdout)["turns"]:
        m, t = turn["metrics"], turn["tokens"]
        c = t["counts"]
        assert c["prompt"] == len(t["prompt"]) == m["prompt_tokens"]
        assert c["cached"] + c["restored"] == m["cached_tokens"] and c["prefilled"] == m["prefill_tokens"]
        assert c["reply"] == len(t["reply"]) == m["decode_tokens"]
        assert sum(p["source"] == "prefilled" for p in t["prompt"]) == m["prefill_tokens"]
        assert t["prompt"][0] == {
            "id": t["prompt"][0]["id"],
            "text": "<|im_start|>",
            "source": t["prompt"][0]["source"],
            "special": True,
            "file": None,
        }
        # the attached file's text is the tokens marked with its name (in both turns: it stays in the prompt)
        from_file = "".join(p["text"] for p in t["prompt"] if p["file"] == str(notes))
        assert "Apples are red. Pears are green." in from_file and "</file>" not in from_file
        assert t["reply"][0]["t_ms"] == pytest.approx(m["ttft_ms"], abs=1e-3)
    text = subprocess.run([*argv, "Name a fruit."], capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert "── turn 1 tokens ── prompt" in text.stdout and "▌prefilled · prompt 0–" in text.stdout
    assert "\x1b" not in text.stdout  # a pipe: no colour
