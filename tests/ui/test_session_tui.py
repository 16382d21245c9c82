"""Sessions and settings in the TUI (FakeEngine + Pilot): recording, resume, export, sessions list,
settings screen. Screenshots of the three screens are saved under ``screenshots/`` when
``CHATPHASE_SCREENSHOTS=1``."""

from __future__ import annotations

from fake_engine import FakeEngine, fake_model_info
from session_support import FullDisk, record_turns
from textual.app import App
from textual.widgets import DataTable, Input, Label, Select
from ui_support import idle, notifications, record_notifications, send, shot, wait_for

from chatphase.chat.controller import COLD_PREFILL_NOTE
from chatphase.cli import main
from chatphase.commands import chat as chat_command
from chatphase.sessions import writer as session_writer
from chatphase.sessions.catalog import list_sessions, load_session
from chatphase.sessions.export import rows_from_csv
from chatphase.sessions.writer import SessionWriter
from chatphase.settings.file import load_settings
from chatphase.settings.schema import Settings
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.screens.sessions import ExportScreen, SessionsScreen
from chatphase.ui.screens.settings import SettingsScreen
from chatphase.ui.transcript.notice import Notice as ChatNotice
from chatphase.ui.transcript.reply_view import ReplyView
from chatphase.ui.transcript.user_message import UserMessage


def make(settings: Settings | None = None, **app_kwargs):
    settings = settings or Settings()
    engines: list[FakeEngine] = []

    def factory(info, current):
        engines.append(FakeEngine(info, current.engine))
        return engines[-1]

    app = ChatPhaseApp(settings, fake_model_info(), factory, **app_kwargs)
    record_notifications(app)
    return app, engines


def showing(app, cls, selector: str):
    """The condition "screen ``cls`` is up and has composed ``selector``"."""
    return lambda: isinstance(app.screen, cls) and bool(app.screen.query(selector))


async def chat(pilot, app, *texts: str) -> None:
    for text in texts:
        n = len(app.chat.conversation)
        await send(pilot, text)
        await wait_for(pilot, lambda n=n: len(app.chat.conversation) == n + 2 and idle(app))


async def test_turns_are_recorded_with_the_dashboards_metrics():
    app, _ = make()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await chat(pilot, app, "what is prefill", "and decode")
        s = load_session(app.recording.writer.id)
        assert [(t.user, t.status) for t in s.turns] == [("what is prefill", "complete"), ("and decode", "complete")]
        assert [t.reply for t in s.turns] == [m.content for m in app.chat.conversation if m.role == "assistant"]
        assert [t.metrics for t in s.turns] == [app.dashboard.turns[1], app.dashboard.turns[2]]
        assert s.model_name == "SmolLM2 135M Instruct" and s.settings["n_ctx"] == 4096
        app.action_new_chat()
        await chat(pilot, app, "a new topic")
        assert len(list_sessions()) == 2 and load_session(app.recording.writer.id).title == "a new topic"


async def test_resume_restores_history_and_says_the_next_prefill_is_cold():
    app0, _ = make()
    async with app0.run_test(size=(130, 40)) as pilot:  # record two turns for real
        await wait_for(pilot, lambda: idle(app0))
        await chat(pilot, app0, "first question", "second question")
        sid = app0.recording.writer.id
        before = app0.dashboard.turns.copy()
    app, engines = make(resume=load_session(sid))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app) and len(app.chat.conversation) == 4)
        assert [m.content for m in app.chat.conversation if m.role == "user"] == ["first question", "second question"]
        assert [u.text for u in app.query(UserMessage)] == ["first question", "second question"]
        assert len(app.query(ReplyView)) == 2 and app.dashboard.turns == before
        await chat(pilot, app, "third")
        request = engines[0].requests[0]
        assert [m.content for m in request.messages][:4] == [m.content for m in app.chat.conversation[:4]]
        assert app.dashboard.turns[3].cached_tokens == 0
        assert any(COLD_PREFILL_NOTE in n or "0 of" in n for n in notifications(app))
        shot(app, "session-resumed")
    s = load_session(sid)
    assert [t.index for t in s.turns] == [1, 2, 3] and s.turns[2].user == "third"


async def test_export_dialog_writes_the_chosen_format(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app, _ = make()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        app.action_export_session()
        await pilot.pause()
        assert "Nothing to export yet" in notifications(app)[-1]
        await chat(pilot, app, "hello")
        app.action_export_session()
        await wait_for(pilot, showing(app, ExportScreen, "#export-path"))
        assert app.screen.focused is app.screen.query_one("#export-format")  # as the hint says: format first
        await pilot.press("down", "down", "enter")  # Markdown → JSON → CSV, chosen
        path = app.screen.query_one("#export-path", Input)
        assert path.value.endswith(".csv")
        await pilot.press("tab")
        assert app.screen.focused is path
        shot(app, "session-export")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, ExportScreen))
        out = tmp_path / f"chatphase-{app.recording.writer.id}.csv"
        assert rows_from_csv(out.read_text())[0]["metrics"] == app.dashboard.turns[1]


async def test_sessions_screen_renames_deletes_and_protects_the_open_one():
    other = SessionWriter.create(model={"name": "Other"}, settings={}, title="old chat")
    other.begin_turn("x")
    other.finish_turn("y", None, error="test")
    other.close()
    app, _ = make()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await chat(pilot, app, "current chat")
        app.action_sessions()
        await wait_for(pilot, showing(app, SessionsScreen, "#sessions-status"))
        screen = app.screen
        table = screen.query_one(DataTable)
        assert table.row_count == 2
        shot(app, "sessions-list")
        table.move_cursor(row=table.get_row_index(app.recording.writer.id))
        await pilot.press("d")
        assert "open chat" in str(screen.query_one("#sessions-status").render())
        table.move_cursor(row=table.get_row_index(other.id))
        await pilot.press("r")
        screen.query_one("#sessions-rename", Input).value = "renamed chat"
        await pilot.press("enter")
        await pilot.pause()
        assert load_session(other.id).title == "renamed chat"
        await pilot.press("d")
        assert other.path.exists()  # armed, not yet deleted
        await pilot.press("d")
        await pilot.pause()
        assert not other.path.exists() and table.row_count == 1
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, SessionsScreen))


async def test_settings_screen_applies_reloads_and_saves(tmp_path):
    app, engines = make()
    async with app.run_test(size=(130, 45)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        app.action_edit_settings()
        await wait_for(pilot, showing(app, SettingsScreen, "#settings-save"))
        screen = app.screen
        screen.query_one("#set-n_ctx", Input).value = "abc"
        await pilot.pause()
        assert "n_ctx: expected an integer" in str(screen.query_one("#settings-error").render())
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SettingsScreen)  # not applied while invalid
        screen.query_one("#set-n_ctx", Input).value = "2048"
        screen.query_one("#set-temperature", Input).value = "0"
        screen.query_one("#set-seed", Input).value = "7"
        screen.query_one("#set-flash_attn", Select).value = "off"
        await pilot.pause()
        assert "n_ctx, flash_attn reloads the model" in str(screen.query_one("#settings-reload").render())
        shot(app, "settings")
        screen.query_one("#settings-save").value = True
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        await wait_for(pilot, lambda: len(engines) == 2 and idle(app))
        assert (
            app.chat.settings.engine.n_ctx,
            app.chat.settings.sampling.temperature,
            app.chat.settings.sampling.seed,
        ) == (
            2048,
            0.0,
            7,
        )
        assert engines[-1].n_ctx == 2048
        saved = load_settings(environ={})
        assert (saved.engine.n_ctx, saved.engine.flash_attn, saved.sampling.seed) == (2048, "off", 7)
        # a sampling-only change applies without a reload
        app.action_edit_settings()
        await wait_for(pilot, showing(app, SettingsScreen, "#settings-save"))
        app.screen.query_one("#set-top_k", Input).value = "5"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.chat.settings.sampling.top_k == 5 and len(engines) == 2


async def test_regenerated_and_edited_turns_leave_the_resumed_conversation():
    app, _ = make()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await chat(pilot, app, "one", "two")
        app.action_regenerate()
        await wait_for(pilot, lambda: len(app.chat.conversation) == 4 and idle(app))
        app.action_edit_last()
        await chat(pilot, app, "two, edited")
        conversation = list(app.chat.conversation)
        sid = app.recording.writer.id
    s = load_session(sid)
    assert [(t.user, t.replaced) for t in s.turns] == [
        ("one", False),
        ("two", True),
        ("two", True),
        ("two, edited", False),
    ]
    assert [m for m in s.history() if m.role != "system"] == conversation
    resumed, _ = make(resume=s)
    async with resumed.run_test(size=(130, 40)) as pilot:  # the notice counts the turns it shows
        await wait_for(pilot, lambda: idle(resumed) and len(resumed.chat.conversation) == 4)
        (notice,) = [str(n.render()) for n in resumed.query(ChatNotice) if "Resumed session" in str(n.render())]
        assert "(2 turns; 2 more regenerated, edited or failed)" in notice and len(resumed.query(ReplyView)) == 2
        assert resumed.query_one(DataTable).row_count == 2


async def test_config_problems_found_at_start_are_shown(
    cfg_problem="config file c.toml, line 2, key 'n_ctx': n_ctx must be at least 16 (got 2); using built-in defaults",
):
    app, _ = make(startup_notices=(cfg_problem,))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: cfg_problem in notifications(app))


async def test_keys_and_palette_entries_open_the_screens():
    from chatphase.ui.actions import ACTIONS

    keys = {a.id: a.key for a in ACTIONS}
    app, _ = make()
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert {"Session: Export", "Settings: Edit", "Session: Open, rename, delete"} <= titles
        for action_id, screen, selector in (
            ("settings.edit", SettingsScreen, "#settings-save"),
            ("session.list", SessionsScreen, "#sessions-status"),
        ):
            await pilot.press(keys[action_id])  # with the prompt box focused, as a user would
            await wait_for(pilot, showing(app, screen, selector))
            await pilot.press("escape")
            await wait_for(pilot, lambda screen=screen: not isinstance(app.screen, screen))
        await pilot.press(keys["session.export"])
        await wait_for(pilot, lambda: any("Nothing to export yet" in n for n in notifications(app)))


async def test_a_refused_message_is_not_recorded_and_the_next_turn_is():
    app, _ = make(Settings().with_overrides(n_ctx=40))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "word " * 60)  # cannot fit n_ctx: refused before prefill, the text goes back to the box
        await wait_for(pilot, lambda: idle(app) and any("fit" in n or "context" in n for n in notifications(app)))
        assert app.recording.writer is None and list_sessions() == []
        app.query_one("#prompt").set_text("")
        await chat(pilot, app, "hi")
        s = load_session(app.recording.writer.id)
    assert [(t.user, t.status) for t in s.turns] == [("hi", "complete")]
    assert [m.content for m in s.history()] == [m.content for m in app.chat.conversation]


async def test_an_unsaved_chat_exports_what_is_on_screen(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app, _ = make(save_sessions=False)
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await chat(pilot, app, "not saved")
        app.action_export_session()
        await wait_for(pilot, showing(app, ExportScreen, "#export-path"))
        session = app.screen.session
        assert [t.user for t in session.turns] == ["not saved"] and session.turns[0].metrics == app.dashboard.turns[1]
        assert session.id.startswith("unsaved-")  # an export of it never passes for a saved session
    assert list_sessions() == []  # nothing reached the disk


def test_a_full_disk_is_said_at_quit_in_one_line(monkeypatch, capsys):
    """Disk full: the TUI says "Session not saved" and goes on; Ctrl+Q then closes the session file, whose
    buffered text cannot be flushed either: the process exits 1 with one plain line, no traceback."""
    monkeypatch.setattr(session_writer, "open_append", lambda path: FullDisk())
    monkeypatch.setattr(chat_command, "model_info_for", lambda settings, **_: fake_model_info())
    monkeypatch.setattr(chat_command, "engine_for", lambda settings, info: FakeEngine(info, settings.engine))
    seen: list[str] = []

    async def chat_then_quit(pilot):
        app = pilot.app
        record_notifications(app)
        await wait_for(pilot, lambda: idle(app))
        await chat(pilot, app, "hello")
        seen.extend(notifications(app))
        await pilot.press("ctrl+q")

    monkeypatch.setattr(
        ChatPhaseApp, "run", lambda self: App.run(self, headless=True, size=(80, 24), auto_pilot=chat_then_quit)
    )
    assert main(["chat"]) == 1
    err = capsys.readouterr().err
    assert any("no longer being saved" in n for n in seen)
    assert err.splitlines() == [err.strip()] and "Traceback" not in err and "OSError" not in err
    assert "not saved in full" in err and "No space left on device" in err


def test_resume_runs_at_the_sessions_n_ctx_and_forecasts_from_the_conversations_turns(monkeypatch):
    """``chat --resume`` of a session made at n_ctx 512 reopens at 512 (not the default 4,096) and says so;
    ``--n-ctx`` overrides it and says that. The first turn's cold prefill holds the two earlier turns too:
    the forecast's growth per turn is its KV tokens over 3 turns, not all of them over 1."""
    made = SessionWriter.create(
        model=fake_model_info().to_dict(), settings=Settings().with_overrides(n_ctx=512).to_dict()
    )
    record_turns(made, [("first question", ["one ", "two"]), ("second question", ["three"])])
    made.close()
    engines: list[FakeEngine] = []
    monkeypatch.setattr(chat_command, "model_info_for", lambda settings, **_: fake_model_info())
    monkeypatch.setattr(
        chat_command,
        "engine_for",
        lambda settings, info: engines.append(FakeEngine(info, settings.engine)) or engines[-1],
    )
    seen: dict[str, object] = {}
    notices: list[str] = []
    notify = ChatPhaseApp.notify
    monkeypatch.setattr(
        ChatPhaseApp, "notify", lambda self, message, **kw: notices.append(message) or notify(self, message, **kw)
    )

    async def one_more_turn(pilot):
        app = pilot.app
        await wait_for(pilot, lambda: idle(app) and len(app.chat.conversation) >= 4)
        if "kv" not in seen:
            await chat(pilot, app, "third")
            seen["kv"] = str(app.dashboard.query_one("#kv-text", Label).render())
            seen["kv_tokens"] = app.dashboard.turns[3].kv_cache_tokens
        await pilot.press("ctrl+q")

    monkeypatch.setattr(
        ChatPhaseApp, "run", lambda self: App.run(self, headless=True, size=(130, 40), auto_pilot=one_more_turn)
    )
    assert main(["chat", "--resume"]) == 0
    assert engines[0].n_ctx == 512
    assert "Resumed at n_ctx 512, the session's." in notices
    growth = seen["kv_tokens"] / 3
    assert f"at +{growth:,.0f} tok/turn" in seen["kv"], seen["kv"]
    assert main(["chat", "--resume", "--n-ctx", "1024"]) == 0
    assert engines[1].n_ctx == 1024
    assert "Resumed at n_ctx 1,024 from --n-ctx; the session ran at 512." in notices
