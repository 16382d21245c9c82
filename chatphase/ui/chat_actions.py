"""The user actions of :class:`~chatphase.ui.app.ChatPhaseApp` (a mixin), one per entry of
:data:`~chatphase.ui.actions.ACTIONS`, plus their command-palette entries.

Regenerate and edit-and-resend change only the end of the conversation, so the engine finds the rest
in its KV cache; the app reports how many prompt tokens were reused when the turn's prefill starts.
The mixin relies on the app's state (``conversation``, ``engine``, ``busy``, ``active_turn``, ``loaded``)
and widgets (``chat_log``, ``panel``, ``indicator``, ``prompt``, ``dashboard``).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from textual.app import SystemCommand
from textual.screen import Screen

from chatphase.ui.actions import ACTIONS
from chatphase.ui.chat_log import ReplyView, UserMessage
from chatphase.ui.experiments import ExperimentsScreen
from chatphase.ui.screens import HelpScreen, LogScreen


class ChatActions:
    """``action_*`` methods and palette commands for the chat app (mixed into a Textual ``App``)."""

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for a in ACTIONS:
            yield SystemCommand(a.title, f"{a.help} ({a.key_display})", partial(self.run_action, a.action))

    def action_stop(self) -> None:
        """Cancel the running turn; it finishes with its partial reply and ``stop_reason="cancelled"``."""
        if self.active_turn is not None and self.engine is not None:
            self.engine.cancel()

    async def action_new_chat(self) -> None:
        """Forget the conversation and the figures (a running turn is cancelled)."""
        if self.active_turn is not None and self.engine is not None:
            self.engine.cancel()
        self.active_turn, self.decoding = None, False
        self.conversation.clear()
        await self.chat_log.clear_log()
        self.panel.reset()
        self.dashboard.reset()
        if self.loaded is not None:
            self.indicator.show_ready(self.loaded)

    def _idle_or_say(self, what: str) -> bool:
        if self.busy or self.loaded is None:
            self.notify(f"Cannot {what} now: wait for the reply (Esc stops it) or the engine.", severity="warning")
            return False
        return True

    async def action_regenerate(self) -> None:
        """Drop the last reply and generate it again (the prompt is the same, so the KV cache is reused)."""
        if not self._idle_or_say("regenerate"):
            return
        if not self.conversation or self.conversation[-1].role != "assistant":
            self.notify("There is no reply to regenerate.", severity="warning")
            return
        self.conversation.pop()
        await self.chat_log.remove_last(ReplyView)
        self._reuse_note = "Regenerate"
        self._start_turn()

    async def action_edit_last(self) -> None:
        """Take back the last user message (and its reply) into the prompt box for editing."""
        if not self._idle_or_say("edit"):
            return
        if not any(m.role == "user" for m in self.conversation):
            self.notify("There is no message to edit.", severity="warning")
            return
        log = self.chat_log
        if self.conversation[-1].role == "assistant":
            self.conversation.pop()
            await log.remove_last(ReplyView)
        text = self.conversation.pop().content
        await log.remove_last(UserMessage)
        prompt = self.prompt
        prompt.set_text(text)
        prompt.focus()
        self._reuse_note = "Edit and resend"
        self.notify("Editing your last message: Enter resends it.")

    async def action_clear(self) -> None:
        """Clear the screen; the conversation (context) is kept."""
        await self.chat_log.clear_log()
        self.notify("Screen cleared; the model keeps the conversation (Ctrl+N starts a new one).")

    def action_copy_reply(self) -> None:
        """Copy the last reply to the clipboard."""
        reply = next((m.content for m in reversed(self.conversation) if m.role == "assistant"), "")
        if not reply:
            self.notify("There is no reply to copy.", severity="warning")
            return
        self.copy_to_clipboard(reply)
        self.notify(f"Copied the last reply ({len(reply):,} characters).")

    def action_toggle_dashboard(self) -> None:
        """Show or hide the side panel (beside the chat when wide, below it when narrow)."""
        narrow = self.screen.has_class("-narrow")
        cls = "-show-side" if narrow else "-hide-side"
        self.screen.toggle_class(cls)

    def action_show_log(self) -> None:
        """Open the engine's log file in a scrollable screen."""
        self.push_screen(LogScreen(self.loaded.log_path, self.loaded.pid) if self.loaded else LogScreen(""))

    def action_restart_engine(self) -> None:
        """Replace the engine with a fresh one (after a crash); the conversation is kept."""
        self._retire_engine()
        self.busy = False
        self.chat_log.add_notice("Restarting the engine…")
        self.start_engine()

    def action_open_experiments(self) -> None:
        """Open the Experiments screen for this model and these engine settings (a sweep runs in its own process)."""
        self.push_screen(ExperimentsScreen(self.model_info, self.settings))

    def action_help(self) -> None:
        """Show keys and metric definitions."""
        self.push_screen(HelpScreen())
