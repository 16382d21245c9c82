"""Files in the prompt box (``/file PATH``, ``@path``, Tab) and the live budget line, with Pilot and FakeEngines:
every bad file is a notice and nothing is sent; a file is one line in the transcript, expanded by Enter."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import pytest
from ui_support import idle, make_app, notifications, send, wait_for

from chatphase.chat.attachments import split_message
from chatphase.settings.schema import Settings
from chatphase.ui.draft_budget import DraftBudget
from chatphase.ui.prompt_input import PromptInput
from chatphase.ui.transcript.user_message import UserMessage


def line(app) -> str:
    return str(app.query_one(DraftBudget).render())


async def test_file_command_attaches_and_the_next_message_carries_it_as_one_line(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("alpha beta gamma delta\n")
    app, engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, f"/file {f}")
        await wait_for(pilot, lambda: any("Attached" in n for n in notifications(app)))
        assert engines[0].requests == []  # /file sends nothing
        await wait_for(pilot, lambda: "📎 " in line(app) and "4 tok" in line(app))
        await send(pilot, "Summarise it.")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        sent = engines[0].requests[0].messages[-1].content
        own, files = split_message(sent)
        assert own == "Summarise it." and [(a.name, a.text) for a in files] == [(str(f), "alpha beta gamma delta\n")]
        assert app.query_one(DraftBudget).files == []  # taken with the message
        message = app.query_one(UserMessage)
        shown = str(message.render())
        assert shown.splitlines() == ["Summarise it.", f"▸ 📎 {f} · 23 B · 4 tok"]
        message.focus()
        await pilot.press("enter")
        assert "alpha beta gamma delta" in str(message.render()) and "▾ 📎" in str(message.render())


async def test_file_alone_takes_the_files_off_and_says_how_many_in_words(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("text\n")
    app, _engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, f"/file {tmp_path / 'a.txt'} {tmp_path / 'b.txt'}")
        await wait_for(pilot, lambda: len(app.query_one(DraftBudget).files) == 2)
        await send(pilot, "/file")
        await wait_for(pilot, lambda: any("Took off" in n for n in notifications(app)))
        assert "Took off 2 files" in notifications(app) and app.query_one(DraftBudget).files == []
        await send(pilot, f"/file {tmp_path / 'a.txt'}")
        await wait_for(pilot, lambda: len(app.query_one(DraftBudget).files) == 1)
        await send(pilot, "/file")
        await wait_for(pilot, lambda: "Took off 1 file" in notifications(app))


async def test_an_old_turn_with_files_keeps_its_message_a_widget_whose_files_still_open(tmp_path):
    """An old turn is drawn as one widget (its reply draws the message) unless its message has files: their
    lines stay a widget that opens and folds them."""
    from chatphase.ui.transcript.chat_log import ChatLog

    f = tmp_path / "notes.txt"
    f.write_text("alpha beta gamma delta\n")
    app, _engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, f"/file {f}")
        await wait_for(pilot, lambda: "📎 " in line(app))
        await send(pilot, "Summarise it.")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        for i, text in enumerate(("Thanks.", "Again.")):
            await send(pilot, text)
            await wait_for(pilot, lambda n=4 + 2 * i: len(app.chat.conversation) == n and idle(app))
        messages = list(app.query_one(ChatLog).query_children(UserMessage))
        assert [m.own for m in messages] == ["Summarise it.", "Again."]  # "Thanks." is drawn by its old turn
        messages[0].focus()
        await pilot.press("enter")
        assert "alpha beta gamma delta" in str(messages[0].render())


async def test_an_at_path_goes_with_the_message_and_a_bare_at_word_is_text(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    app, engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "Look at @data.csv please @someone")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        own, files = split_message(engines[0].requests[0].messages[-1].content)
        assert own == "Look at @data.csv please @someone" and [a.name for a in files] == ["data.csv"]


def _bad(tmp_path) -> dict[str, tuple[str, str]]:
    (tmp_path / "blob.bin").write_bytes(b"\x7fELF\x00\x00")
    (tmp_path / "old.txt").write_bytes(b"na\xefve")
    (tmp_path / "big.txt").write_text("word " * 300)  # 300 tokens to the fake, n_ctx 128 below
    return {
        "binary": ("@blob.bin", "binary file (a NUL byte at offset 4)"),
        "not utf-8": ("@old.txt", "not UTF-8 text (a bad byte at offset 2)"),
        "directory": (f'@"{tmp_path}"', "is a directory"),
        "missing": ('@"gone.txt"', "gone.txt: no such file"),
        "larger than the context": ("@big.txt", "big.txt is 300 tokens: larger than the context of 128 tokens"),
    }


@pytest.mark.parametrize("case", ["binary", "not utf-8", "directory", "missing", "larger than the context"])
async def test_a_bad_file_is_a_notice_and_nothing_is_sent(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mention, says = _bad(tmp_path)[case]
    app, engines = make_app(Settings().with_overrides(n_ctx=128))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        text = f"Read {mention} now"
        prompt = app.query_one(PromptInput)
        prompt.set_text(text)
        if case == "larger than the context":  # known once counted by the tokenizer
            await wait_for(pilot, lambda: "Does not fit" in line(app))
            assert f"Does not fit: {says}" in line(app) and "Not sent" not in line(app)  # nothing was sent yet
            assert "(raise n_ctx in F9 (Settings) or attach a part of it)" in line(app) and "--" not in line(app)
        await pilot.press("enter")
        await wait_for(pilot, lambda: any(says in n for n in notifications(app)))
        assert engines[0].requests == [] and app.chat.conversation == []
        assert prompt.text == text  # given back to fix


@contextlib.contextmanager
def _fifo_watched(path) -> Iterator[list[str]]:
    """A named pipe at ``path`` and a thread that lets any reader of it go (opening it for writing, which
    fails at once while no one reads): the list it yields gets an entry each time someone had opened the
    pipe, so a regression fails instead of freezing the app until a writer comes."""
    os.mkfifo(path)
    opened: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.05):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: no reader, as it must be
                continue
            opened.append(str(path))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield opened
    finally:
        stop.set()
        watcher.join()


async def test_a_named_pipe_is_a_notice_and_never_opened(tmp_path):
    fifo = tmp_path / "pipe"
    says = f"{fifo}: not a regular file (a named pipe)"
    with _fifo_watched(fifo) as opened:
        app, engines = make_app()
        async with app.run_test(size=(130, 40)) as pilot:
            await wait_for(pilot, lambda: idle(app))
            prompt = app.query_one(PromptInput)
            prompt.set_text(f"Look at @{fifo}")  # the budget line reads the draft's files
            await wait_for(pilot, lambda: says in line(app))
            await pilot.press("enter")
            await wait_for(pilot, lambda: any(says in n for n in notifications(app)))
            assert prompt.text == f"Look at @{fifo}" and engines[0].requests == []
            await send(pilot, f"/file {fifo}")
            await wait_for(pilot, lambda: sum(says in n for n in notifications(app)) == 2)
            assert app.query_one(DraftBudget).files == []
    assert opened == []


async def test_an_unreadable_file_command_is_a_notice(tmp_path, monkeypatch):
    from chatphase.chat import attachments

    def denied(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    f = tmp_path / "locked.txt"
    f.write_text("x")
    monkeypatch.setattr(attachments, "open", denied, raising=False)
    app, engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, f'/file "{f}"')
        await wait_for(pilot, lambda: any("permission denied" in n for n in notifications(app)))
        assert app.query_one(DraftBudget).files == [] and engines[0].requests == []


async def test_the_budget_line_counts_the_draft_live_and_predicts_ttft_after_two_turns():
    app, engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        app.query_one(PromptInput).set_text("one two three")
        # the fake's template: 3 + 3 words for the message, 2 for the assistant header
        await wait_for(pilot, lambda: line(app).startswith("+8 tok · context 0 % → 0 %"))
        assert "TTFT: not enough turns yet (0)" in line(app)
        await send(pilot, "one two three")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        app.query_one(PromptInput).set_text("four five six seven")
        await wait_for(pilot, lambda: "(not enough turns yet: 1)" in line(app))  # a bound from the one turn
        await send(pilot, "four five six seven")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 4 and idle(app))
        app.query_one(PromptInput).set_text("eight nine")
        await wait_for(pilot, lambda: "TTFT ≈" in line(app))
        assert "; this chat, 2 turns)" in line(app)
        assert engines[0].counts  # counted by the engine, not guessed


async def test_a_message_that_would_not_fit_is_refused_with_the_numbers():
    app, engines = make_app(Settings().with_overrides(n_ctx=64))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        text = "word " * 80
        app.query_one(PromptInput).set_text(text)
        await wait_for(pilot, lambda: line(app).startswith("Does not fit"))
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("Does not fit" in n for n in notifications(app)))
        assert engines[0].requests == []


async def test_tab_completes_a_path_after_file_and_at(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "report 2026.md").write_text("x")
    (tmp_path / "readme.txt").write_text("x")
    app, _engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        prompt = app.query_one(PromptInput)
        prompt.set_text("/file rep")
        await pilot.press("tab")
        assert prompt.text == '/file "report 2026.md"' and prompt.has_focus
        prompt.set_text("see @rea")
        await pilot.press("tab")
        assert prompt.text == "see @readme.txt"
        prompt.set_text("see @re")
        await pilot.press("tab")  # two matches: their common start, and a notice lists them
        assert prompt.text == "see @re"
        await wait_for(pilot, lambda: any("readme.txt" in n and "report 2026.md" in n for n in notifications(app)))
        (tmp_path / "ctl\x1b[31mred\x07.txt").write_text("x")
        prompt.set_text("/file ct")
        await pilot.press("tab")  # a name with controls goes in visible, never raw into the box
        assert prompt.text == "/file ctl␛[31mred␇.txt"
        prompt.set_text("no path here")
        await pilot.press("tab")
        assert not prompt.has_focus  # Tab moves the focus elsewhere, as before


async def test_a_file_line_being_typed_is_not_counted_as_a_message(tmp_path):
    app, engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        prompt = app.query_one(PromptInput)
        prompt.set_text("hello")
        await wait_for(pilot, lambda: line(app).startswith("+"))
        prompt.set_text(f"/file {tmp_path}/no")
        await wait_for(pilot, lambda: not app.query_one(DraftBudget).display)
        assert all(r.messages[-1].content != f"/file {tmp_path}/no" for r in engines[0].counts)


async def test_a_count_that_fails_leaves_the_app_running():
    app, engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))

        def broken(_request):
            raise RuntimeError("the pipe broke")

        engines[0].count_prompt = broken
        app.query_one(PromptInput).set_text("hello")
        await pilot.pause(0.6)
        assert app.is_running and app.query_one(DraftBudget).latest is None
        await send(pilot, "hello")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))


async def test_editing_a_message_puts_its_files_back_beside_the_box_and_resends_them_alike(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("alpha\n")
    app, engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "Read @a.txt")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        (tmp_path / "a.txt").write_text("changed since\n")  # the edit resends what was sent
        await pilot.press("ctrl+o")
        prompt = app.query_one(PromptInput)
        await wait_for(pilot, lambda: prompt.text == "Read @a.txt")
        assert [f.text for f in app.query_one(DraftBudget).files] == ["alpha\n"]
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(engines[0].requests) == 2 and idle(app))
        assert engines[0].requests[1].messages[-1] == engines[0].requests[0].messages[-1]


async def test_while_a_reply_runs_the_draft_waits_and_is_counted_after_it(tmp_path):
    app, engines = make_app(hold="prefill")
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "first message")
        await wait_for(pilot, lambda: engines[0].held.is_set())
        app.query_one(PromptInput).set_text("next one")
        await wait_for(pilot, lambda: "counted when the engine is free" in line(app))
        engines[0].release()
        await wait_for(pilot, lambda: line(app).startswith("+") and "(not enough turns yet: 1)" in line(app))


@pytest.mark.parametrize(
    ("name", "drawn"),
    [("evil\x1b]52;c;aGk=\x07.txt", "evil␛]52;c;aGk=␇.txt"), ("evil\u202etxt.exe", "evil\ufffdtxt.exe")],
    ids=["escape sequence", "bidi override"],
)
async def test_a_file_name_with_control_characters_reaches_the_screen_inert(tmp_path, monkeypatch, name, drawn):
    """An escape sequence is shown, not obeyed; a right-to-left override (U+202E) too: ``evil<U+202E>txt.exe``
    would be drawn ``evilexe.txt``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text("plain text\n")
    app, _engines = make_app()
    async with app.run_test(size=(130, 40), notifications=True) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, f'/file "{name}"')
        await wait_for(pilot, lambda: any("Attached evil" in str(t.render()) for t in app.screen.query("Toast")))
        toasts = [str(t.render()) for t in app.screen.query("Toast")]  # as drawn (app.notify makes them inert)
        await wait_for(pilot, lambda: "📎" in line(app))
        budget = line(app)
        await send(pilot, "What is in it?")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        shown = [str(app.query_one(UserMessage).render()), budget, *toasts]
        assert [s for s in shown if {"\x1b", "\x07", "\u202e"} & set(s)] == []
        assert drawn in shown[0] and drawn in budget and any(f"Attached {drawn}" in t for t in toasts)
        assert name in app.chat.conversation[0].content  # the model gets the name as it is


async def test_a_file_larger_than_the_context_is_not_attached_and_the_notice_says_why(tmp_path):
    (tmp_path / "big.txt").write_text("word " * 300)  # 300 tokens to the fake: fewer bytes than the byte check stops
    app, engines = make_app(Settings().with_overrides(n_ctx=128))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, f"/file {tmp_path / 'big.txt'}")
        await wait_for(pilot, lambda: any("larger than the context" in n for n in notifications(app)))
        says = (
            f"{tmp_path / 'big.txt'} is 300 tokens: larger than the context of 128 tokens "
            "(raise n_ctx in F9 (Settings) or attach a part of it)"
        )
        assert says in notifications(app)
        assert not any("Attached" in n for n in notifications(app))  # never said to be attached
        assert app.query_one(DraftBudget).files == []
        await wait_for(pilot, lambda: not app.query_one(DraftBudget).display)  # no chip, no 'Does not fit' left
        assert engines[0].requests == []


async def test_a_message_the_engine_refuses_comes_back_with_its_files_beside_the_box(tmp_path, monkeypatch):
    """Sent before the draft was counted (Enter at once), refused by the engine: the box gets the user's own
    text back and the files are attached again, not their text inline."""
    from chatphase.ui import draft_budget

    f = tmp_path / "long.txt"
    f.write_text("word " * 120)  # fits the context alone, not with the template and the reply's room
    app, engines = make_app(Settings().with_overrides(n_ctx=128))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, f"/file {f}")
        await wait_for(pilot, lambda: any("Attached" in n for n in notifications(app)))
        monkeypatch.setattr(draft_budget, "DEBOUNCE_S", 60.0)  # the draft below is not counted before Enter
        await send(pilot, "Summarise it.")
        await wait_for(pilot, lambda: len(engines[0].requests) == 1 and idle(app))
        prompt = app.query_one(PromptInput)
        await wait_for(pilot, lambda: prompt.text != "")
        assert prompt.text == "Summarise it."
        assert [(a.name, a.text) for a in app.query_one(DraftBudget).files] == [(str(f), "word " * 120)]
        assert app.chat.conversation == []


async def test_tab_completes_a_name_with_control_characters_to_a_form_that_attaches_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("bell\x07.txt", "esc\x1b[1m.txt"):
        (tmp_path / name).write_text(f"text of {name}\n")
    app, engines = make_app()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        prompt = app.query_one(PromptInput)
        prompt.set_text(f"/file {tmp_path}/be")
        await pilot.press("tab")
        assert prompt.text == f"/file {tmp_path}/bell␇.txt"  # shown, not obeyed
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("Attached" in n for n in notifications(app)))
        assert not any("no such file" in n for n in notifications(app))
        prompt.set_text("Compare with @es")
        await pilot.press("tab")
        assert prompt.text == "Compare with @esc␛[1m.txt"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app))
        _own, files = split_message(engines[0].requests[0].messages[-1].content)
        assert [(a.name, a.text) for a in files] == [
            (f"{tmp_path}/bell\x07.txt", "text of bell\x07.txt\n"),
            ("esc\x1b[1m.txt", "text of esc\x1b[1m.txt\n"),
        ]
