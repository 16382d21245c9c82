"""ChatPhaseApp: the chat TUI, a view of the chat controller that shows prefill and decode as they happen.

The turn belongs to :class:`~chatphase.chat.controller.ChatController` (plain Python): the conversation,
the engine's life, regenerate and edit, what a late event means. The app composes the widgets, hands
the controller's updates to :class:`~chatphase.ui.chat_view.ChatView`, runs the engine's blocking calls
in thread workers (:class:`~chatphase.ui.engine_link.TextualDispatcher`) and maps keys and palette
commands onto controller calls. The chat is recorded by
:class:`~chatphase.chat.recording.SessionRecording` (in memory with ``save_sessions=False``).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path

from textual import events, on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver
from textual.filter import LineFilter
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import Footer, TextArea

from chatphase.chat.attachments import AttachmentError, file_command, message_text, read_attachment, split_message
from chatphase.chat.controller import ChatController, NotNow
from chatphase.chat.recording import SessionRecording
from chatphase.engine.base import Engine
from chatphase.engine.text import inert
from chatphase.models.gguf_meta import ModelInfo
from chatphase.sessions.store import Session
from chatphase.settings.schema import Settings
from chatphase.ui import idle_gc
from chatphase.ui import messages as msg
from chatphase.ui.actions import ACTIONS, action_bindings, help_rows, key_display, key_labels
from chatphase.ui.chat_view import ChatView
from chatphase.ui.compat.textual_private import input_parser_ok
from chatphase.ui.dashboard.dashboard import Dashboard
from chatphase.ui.draft_budget import DraftBudget, RecountAfterTurns
from chatphase.ui.engine_link import TextualDispatcher
from chatphase.ui.history_source import EarlierTurns
from chatphase.ui.inert_lines import InertLines
from chatphase.ui.keymap import check_keymap, reserved_keys, show_keymap_notices
from chatphase.ui.phases.indicator import PhaseIndicator
from chatphase.ui.phases.panel import PhasePanel
from chatphase.ui.prompt_input import PromptInput
from chatphase.ui.session_actions import SessionCommands
from chatphase.ui.signals import exit_within, quit_on_signals
from chatphase.ui.transcript.chat_log import ChatLog
from chatphase.ui.transcript.thinking_view import copy_reply, cycle_thinking
from chatphase.units import fmt_count

#: terminal width (columns) from which the side panel sits beside the chat instead of below it.
WIDE_COLUMNS = 120
#: below the chat, narrower than this (columns) the phase panel and the dashboard (whose turn history needs 50) do
#: not both fit side by side: the phase panel takes the side alone.
CRAMPED_COLUMNS = 80


class ChatPhaseApp(App[None]):
    """The chat TUI.

    Args:
        settings: the user's settings (sampling, system prompt, theme, keys; the engine's part goes to
            the factory).
        model_info: the validated model to start with.
        engine_factory: ``(ModelInfo, Settings) -> Engine``; called to start, restart or switch engines.
        save_sessions: record the chat in a session file (else in memory only: it can still be exported).
        startup_notices: warnings to show once the screen is up (e.g. config-file problems).
        resume: a saved session to continue.
    """

    # absolute: subclasses elsewhere work. The token view's sheet is read with the app's: a screen's own sheet is read
    # when the screen is first pushed, and Textual then parses every sheet again and restyles every widget (~50 ms
    # blocked on the token view's first open, benchmarks/token_view.py); the screen finds it read already.
    CSS_PATH = [Path(__file__).with_name("app.tcss"), Path(__file__).parent / "screens" / "tokens.tcss"]
    TITLE = "chatphase"
    BINDINGS = [*action_bindings(), Binding("ctrl+c", "interrupt", "Interrupt", show=False, priority=True)]
    # From the screen's width, not the side panel's own Resize: under load the panel, shown by Ctrl+B after the
    # first frame had laid it out beside the chat, sometimes got no Resize at its new width and kept a stale class.
    HORIZONTAL_BREAKPOINTS = [(0, "-cramped"), (CRAMPED_COLUMNS, "-narrow"), (WIDE_COLUMNS, "-wide")]

    def __init__(
        self,
        settings: Settings,
        model_info: ModelInfo,
        engine_factory: Callable[[ModelInfo, Settings], Engine],
        *,
        save_sessions: bool = True,
        startup_notices: Iterable[str] = (),
        resume: Session | None = None,
        exit_grace_s: float | None = None,
    ) -> None:
        """``exit_grace_s``: once unmounted in a terminal, the process ends at once after this long unless
        :attr:`exit_timer` is cancelled first (the command line's app, which cancels it when ``run()``
        returns: only Textual's putting back the terminal is left, which can hang; :func:`exit_within`)."""
        super().__init__()
        self.exit_grace_s = exit_grace_s
        self.exit_timer: threading.Timer | None = None  # armed on unmount; the caller cancels it once run() returns
        self.dispatcher = TextualDispatcher(self)
        self.chat = ChatController(settings, model_info, engine_factory, self.dispatcher)
        self.recording = SessionRecording(self.chat, on_error=self._save_failed, in_memory=not save_sessions)
        self.chat.add_listener(self.recording)
        self.startup_notices = tuple(startup_notices)
        self._resume = resume
        # the [keys] table as far as it can work; the rest is said in notices once the screen is up
        self.keymap, self._keymap_notices = check_keymap(settings.keys, reserved_keys(type(self)))
        self.keys = key_labels(self.keymap)
        self.view: ChatView  # the controller's listener, made on mount (it needs the mounted widgets)
        self.idle_gc = idle_gc.IdleCollector()

    # -- the terminal --------------------------------------------------------------------------------
    def get_driver_class(self) -> type[Driver]:
        """Textual's driver for this platform; on Linux and macOS its input parser keeps a bracketed paste whole
        (:mod:`chatphase.ui.paste_input`: Textual's own splits one that holds an ESC into key presses), where this
        Textual still has the parser's private names it needs."""
        driver = super().get_driver_class()
        if driver is not LinuxDriver or not input_parser_ok():
            return driver
        from chatphase.ui.paste_input import PasteKeepingDriver  # imports those names

        return PasteKeepingDriver

    _inert_lines = InertLines()

    def get_line_filters(self) -> Sequence[LineFilter]:
        """Textual's filters, then :class:`InertLines`: no control character in a drawn line's text."""
        return [*super().get_line_filters(), self._inert_lines]

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Textual's toast, its text inert and not read as markup by default: notices carry server errors,
        model and file names (``[link=…]`` in one would be a live link)."""
        super().notify(inert(message), title=inert(title), severity=severity, timeout=timeout, markup=markup)

    # -- layout ------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield ChatLog(id="chat-log")
                yield PhaseIndicator(id="phase")
                with Vertical(id="prompt-box"):  # a frame box of its own (app.tcss)
                    yield PromptInput(id="prompt")
                    yield DraftBudget(self.chat, self.keys["settings.edit"], id="draft-budget")
            with Vertical(id="side"):
                yield PhasePanel(id="phase-panel")
                earlier = None if self.recording.in_memory else EarlierTurns(self.recording)
                yield Dashboard(  # the panel shows the KV gauge
                    kv_usage=False,
                    history_source=earlier,
                    overflow_policy=lambda: self.chat.settings.overflow,
                    id="dashboard",
                )
        with Horizontal(id="footer-box"):  # a frame box of its own (app.tcss)
            yield Footer(compact=True)

    def on_mount(self) -> None:
        settings = self.chat.settings
        if settings.theme in self.available_themes:
            self.theme = settings.theme
        else:
            self.notify(f"Unknown theme {settings.theme!r}; using {self.theme}", severity="warning")
        self.set_keymap(self.keymap)
        self._restore_signals = quit_on_signals(self.chat.close, self.exit)  # SIGTERM/SIGHUP quit as Ctrl+Q does
        show_keymap_notices(self, self._keymap_notices)
        self.view = ChatView(self, self.chat, self.dispatcher, self.keys)
        self.chat.add_listener(self.view)
        self.chat.add_listener(RecountAfterTurns(self.draft))
        self.sessions = SessionCommands(self, self.chat, self.recording)
        for notice in self.startup_notices:
            self.notify(notice, title="Start-up", severity="warning", timeout=15)
        self.chat.start_engine()
        if self._resume is not None:
            self.chat.restore(self._resume)
        self.screen.set_focus(self.prompt)  # now: keys that arrived while starting are handled next
        # The start-up's objects (Textual's DOM, styles, the widgets) live as long as the app; a full collection
        # that walked them all paused the UI ~120 ms, at any prompt size (benchmarks/token_view.py). Frozen once
        # the first screen is drawn, later collections walk only what came after (Python's gc.freeze, made for
        # a long-lived process's start-up objects).
        self.call_after_refresh(gc.freeze)
        # and what comes after is walked by a full collection in the user's pauses, not in a key's frame
        self.idle_gc.start()
        self.set_interval(idle_gc.CHECK_S, self.idle_gc.check, name="idle gc")

    @property
    def dashboard(self) -> Dashboard:
        return self.query_one(Dashboard)

    @property
    def panel(self) -> PhasePanel:
        return self.query_one(PhasePanel)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def draft(self) -> DraftBudget:
        return self.query_one(DraftBudget)

    @property
    def chat_log(self) -> ChatLog:
        return self.query_one(ChatLog)

    # -- engine jobs come back here (TextualDispatcher) --------------------------------------------
    def on_engine_event_arrived(self, message: msg.EngineEventArrived) -> None:
        message.job.deliver(message.event)

    def on_engine_job_ended(self, message: msg.EngineJobEnded) -> None:
        message.job.end()

    # -- the user ----------------------------------------------------------------------------------
    def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        """Send the message with its files (``/file`` ones and ``@path`` ones), or take a ``/file`` line;
        a file that cannot go in, or a message that would not fit, is a notice and nothing is sent."""
        text = message.text
        try:
            paths = file_command(text)
            if paths is not None:
                self._attach_files(paths)
                return
            files = self.draft.files_for(text)
        except AttachmentError as exc:
            self._give_back(text)
            self.notify(str(exc), title="Not sent", severity="error")
            return
        if (refusal := self.draft.refusal(text)) is not None:
            self._give_back(text)
            self.notify(refusal, title="Not sent", severity="error", timeout=10)
            return
        self.chat_log.file_tokens.update(self.draft.counted_tokens())
        try:
            self.chat.send(message_text(text, files) if files else text)
        except NotNow as exc:
            self._give_back(text)
            self._not_now(exc)
            return
        if self.draft.files:
            self.draft.take_files()

    def _give_back(self, text: str) -> None:
        prompt = self.prompt
        if not prompt.text.strip():
            prompt.set_text(text)

    def _attach_files(self, paths: list[str]) -> None:
        """``/file PATH…``: attach each readable text file to the next message (the draft says so once it is
        counted, or why not); ``/file`` alone takes them off."""
        if not paths:
            taken = self.draft.take_files()
            self.notify(f"Took off {fmt_count(len(taken), 'file')}" if taken else "No file is attached", title="Files")
            return
        for path in paths:
            try:
                att = read_attachment(path, self.draft.n_ctx())
            except AttachmentError as exc:
                self.notify(str(exc), title="Not attached", severity="error")
                continue
            self.draft.attach(att)

    @on(TextArea.Changed, "#prompt")
    def _draft_changed(self, event: TextArea.Changed) -> None:
        self.draft.draft_changed(event.text_area.text)

    @on(events.Key)
    @on(events.Paste)
    def _stray_typing(self, event: events.Key | events.Paste) -> None:
        self.prompt.catch(event)  # typing while a tab or the table has focus goes to the prompt, not nowhere

    def _not_now(self, exc: NotNow) -> None:
        hint = f" (press {self.keys[exc.action]})." if exc.action else ""
        self.notify(f"{exc}{hint}", severity="warning")

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for a in ACTIONS:
            yield SystemCommand(a.title, f"{a.help} ({self.keys[a.id]})", partial(self.run_action, a.action))

    def _chat_call(self, call: Callable[[], object]) -> object:
        """Call the controller; a :class:`NotNow` is a warning notice."""
        try:
            return call()
        except NotNow as exc:
            self._not_now(exc)
            return None

    def action_stop(self) -> None:
        """Cancel the running turn; it finishes with its partial reply and ``stop_reason="cancelled"``."""
        self.chat.stop()

    def action_interrupt(self) -> None:
        """Ctrl+C: stop a running turn, as llama-cli and Ollama do; else copy the prompt's selection, if
        any; else say how to quit."""
        if self.chat.stop():
            return
        prompt = self.prompt
        if prompt.has_focus and prompt.selected_text:
            prompt.action_copy()
        else:
            self.action_help_quit()

    def action_help_quit(self) -> None:
        """Say the key that quits: the active binding of ``quit``, as people write it (``Ctrl+Q``). Textual's
        own notice carries ``[b]`` markup, which :meth:`notify` keeps inert."""
        keys = [key for key, b in self.active_bindings.items() if b.binding.action in ("quit", "app.quit")]
        if keys:
            self.notify(f"Press {key_display(','.join(keys))} to quit.", title="Quit?")

    def action_new_chat(self) -> None:
        """Forget the conversation and the figures (not while a reply runs: a notice says so)."""
        self._chat_call(self.chat.new_chat)

    def action_regenerate(self) -> None:
        """Drop the last reply and generate it again (the KV cache is reused up to it)."""
        self._chat_call(self.chat.regenerate)

    def action_edit_last(self) -> None:
        """Take the last user message (and its reply) back into the prompt box to edit and resend."""
        text = self._chat_call(self.chat.take_back_last)
        if isinstance(text, str):
            own, files = split_message(text)  # its files go back beside the box, as if attached again
            self.draft.take_files()
            self.draft.put_back(files)
            self.prompt.edit_message(own)  # said on the box's border: a toast would cover it at 80×24

    async def action_clear(self) -> None:
        """Clear the screen; the conversation (context) is kept."""
        await self.chat_log.clear_log()
        self.notify(f"Screen cleared; the model keeps the conversation ({self.keys['chat.new']} starts a new one).")

    def action_clear_prompt(self) -> None:
        """Empty the prompt box (one edit: Ctrl+Z brings the text back)."""
        self.prompt.action_clear_prompt()

    def action_copy_reply(self, with_thinking: bool = False) -> None:
        """Copy the last reply (the answer only; ``with_thinking``: its thinking before it) to the clipboard."""
        copy_reply(self, self.chat, with_thinking, self.keys["chat.copy_thinking"])

    def action_cycle_thinking(self) -> None:
        """Thinking auto → on → off for the next turns (where the model's template can switch it)."""
        cycle_thinking(self, self.chat)

    def action_toggle_dashboard(self) -> None:
        """Show or hide the side panel (beside the chat when wide, below it when narrow)."""
        self.screen.toggle_class("-hide-side" if self.screen.has_class("-wide") else "-show-side")

    def action_toggle_draft_tint(self) -> None:
        """Tint accepted draft tokens in the streaming reply (speculative decoding), or stop."""
        self.view.toggle_draft_tint()

    def action_show_tokens(self) -> None:
        """Open the token view of the turn the dashboard shows, else of the last turn."""
        from chatphase.ui.screens.tokens import TokenScreen  # screens load when first opened (startup)

        tokens = self.view.turn_tokens
        number = self.dashboard.selected_turn
        if number not in tokens:
            number = max(tokens, default=None)
        if number is None:
            why = (
                "no turn has finished yet"
                if not self.dashboard.turns
                else "no turn here carries its tokens (a remote server sends none; a resumed session's are not kept)"
            )
            self.notify(f"No token view: {why}", severity="warning")
            return
        self.push_screen(TokenScreen(number, tokens[number]))

    def action_show_log(self) -> None:
        """Open the engine's log file in a scrollable screen."""
        from chatphase.ui.screens.modals import LogScreen  # screens load when first opened (startup)

        loaded = self.chat.loaded
        self.push_screen(LogScreen(loaded.log_path, loaded.pid) if loaded else LogScreen(""))

    def action_restart_engine(self) -> None:
        """Replace the engine with a fresh one (after a crash); the conversation is kept."""
        self.chat_log.add_notice("Restarting the engine…")
        self._chat_call(self.chat.restart_engine)

    def switch_model(self, info: ModelInfo) -> None:
        """Load ``info`` in a fresh engine; the conversation is kept."""
        self.chat.switch_model(info)

    def action_switch_model_picker(self) -> None:
        """Pick another model (models directory, Hugging Face cache, bundled default)."""
        from chatphase.ui.screens.model_picker import pick_model

        pick_model(self, self.chat, self.switch_model)

    def action_open_experiments(self) -> None:
        """Open the Experiments screen for this model and these engine settings (a sweep runs in its own
        process). There is one at most: on it, Ctrl+T (or the palette's command) does nothing."""
        from chatphase.ui.experiments.screen import ExperimentsScreen

        if any(isinstance(s, ExperimentsScreen) for s in self.screen_stack):
            return  # a second one would run a second sweep beside the first's
        replying = lambda: self.chat.turn is not None  # noqa: E731 -- a sweep beside a reply skews both
        self.push_screen(ExperimentsScreen(self.chat.model_info, self.chat.settings, is_busy=replying))

    def action_help(self) -> None:
        """Show keys and metric definitions."""
        from chatphase.ui.screens.modals import HelpScreen

        self.push_screen(HelpScreen(help_rows(self.keys)))

    def action_sessions(self) -> None:
        """List saved sessions; choosing one resumes it here."""
        self.sessions.open_list()

    def action_export_session(self) -> None:
        """Export this chat's transcript and per-turn metrics."""
        self.sessions.export()

    def action_edit_settings(self) -> None:
        """Edit settings; engine changes reload the model."""
        self.sessions.edit_settings()

    def _save_failed(self, message: str) -> None:
        self.notify(f"{message}. This chat is no longer being saved.", title="Session not saved", severity="error")

    # -- leaving -----------------------------------------------------------------------------------
    async def action_quit(self) -> None:
        """Quit at once, also mid-generation: cancel and close the engine, then exit."""
        self.chat.close()
        self.exit()

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, (events.Key, events.MouseEvent)):
            self.idle_gc.input()  # the user is there: no full collection until they pause
        await super().on_event(event)

    def on_unmount(self) -> None:
        self.idle_gc.stop()
        self.chat.close()
        self.recording.on_error = None  # no screen left to notify: a failure at close stays in .failed
        self.recording.close()
        getattr(self, "_restore_signals", lambda: None)()
        if self.exit_grace_s is not None and not self.is_headless:
            self.exit_timer = exit_within(self.exit_grace_s, lambda: self.return_code or 0)
