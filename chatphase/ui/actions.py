"""The app's user actions in one table: key binding, footer label, command-palette title and help.

The same table builds the app's ``BINDINGS`` (each with an ``id``), the command-palette entries
(``"Chat: Stop"``, ...) and the help screen, so the three can never disagree. Users remap keys by id in
the config file's ``[keys]`` table (``"chat.stop" = "ctrl+s"``); the app applies it with Textual's keymap
(``App.set_keymap``) once :mod:`chatphase.ui.keymap` has checked it, and the help screen and palette show
the keys in use (:func:`key_labels`). Default
keys avoid those the prompt's :class:`~textual.widgets.TextArea` uses for editing (Ctrl+A/E/K/U/W/Y/Z...,
F6 and F7), and keys that do not reach the app from some terminals: xterm-style terminals and tmux send
Ctrl+F3 as ``ESC[1;5R``, which Textual reads as a cursor-position report (so do Shift+F3 and the other
``ESC[1;<modifier>R`` keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class ChatAction:
    """One user action: ``action`` is the app's ``action_*`` name (with arguments in Textual's action
    syntax, ``copy_reply(True)``); ``show`` puts it in the footer."""

    id: str
    key: str
    action: str
    label: str
    title: str
    help: str
    show: bool = True

    @property
    def key_display(self) -> str:
        """The default key as people write it (``Esc``, ``Ctrl+N``, ``F1``)."""
        return key_display(self.key)


ACTIONS: tuple[ChatAction, ...] = (
    ChatAction(
        "chat.stop",
        "escape",
        "stop",
        "Stop",
        "Chat: Stop",
        "Stop generating; the partial reply and its metrics are kept (stop reason: cancelled)",
    ),
    ChatAction(
        "chat.new",
        "ctrl+n",
        "new_chat",
        "New",
        "Chat: New",
        "Start a new conversation (clears the context, the turn figures and the dashboard)",
    ),
    ChatAction(
        "chat.regenerate",
        "ctrl+r",
        "regenerate",
        "Regen",
        "Chat: Regenerate",
        "Generate the last reply again; the KV cache is reused up to it",
    ),
    ChatAction(
        "chat.edit",
        "ctrl+o",
        "edit_last",
        "Edit",
        "Chat: Edit last message",
        "Put your last message back in the box to edit and resend; the KV cache is reused up to it",
    ),
    ChatAction(
        "chat.clear",
        "ctrl+l",
        "clear",
        "Clear",
        "Chat: Clear",
        "Clear the screen; the model keeps the conversation (Chat: New forgets it)",
        show=False,
    ),
    ChatAction(
        "prompt.clear",
        "ctrl+u",
        "clear_prompt",
        "Clear box",
        "Prompt: Clear",
        "Empty the prompt box (Ctrl+Z brings the text back)",
        show=False,
    ),
    ChatAction(
        "chat.copy",
        "f2",
        "copy_reply",
        "Copy",
        "Chat: Copy last reply",
        "Copy the last reply to the clipboard",
        show=False,
    ),
    ChatAction(
        "chat.copy_thinking",
        "ctrl+f2",
        "copy_reply(True)",
        "Copy+thinking",
        "Chat: Copy with thinking",
        "Copy the last reply with a reasoning model's thinking before it (in <think>…</think>)",
        show=False,
    ),
    ChatAction(
        "thinking.cycle",
        "ctrl+f9",
        "cycle_thinking",
        "Thinking",
        "Thinking: On/Off/Auto",
        "Reasoning models: switch thinking auto → on → off for the next turns, where the template can "
        "(Settings: thinking)",
        show=False,
    ),
    ChatAction(
        "view.draft_tint",
        "ctrl+f6",
        "toggle_draft_tint",
        "Drafts",
        "View: Tint draft tokens",
        "Speculative decoding: tint the streaming reply's text that came from accepted draft tokens, or stop",
        show=False,
    ),
    ChatAction(
        "view.dashboard",
        "ctrl+b",
        "toggle_dashboard",
        "Panel",
        "View: Toggle dashboard",
        "Show or hide the phase panel and dashboard (below the chat on narrow terminals)",
    ),
    ChatAction(
        "view.tokens",
        "f12",
        "show_tokens",
        "Tokens",
        "View: Turn tokens",
        "The selected (or last) turn's tokens: the prompt by where each came from (restored, cached, prefilled, "
        "dropped), the reply on a time strip",
        show=False,
    ),
    ChatAction(
        "engine.log",
        "f3",
        "show_log",
        "Log",
        "Engine: Show log",
        "Show llama.cpp's log of this engine (engine.log in chatphase's log directory)",
        show=False,
    ),
    ChatAction(
        "engine.restart",
        "f5",
        "restart_engine",
        "Restart",
        "Engine: Restart",
        "Start a fresh engine process (after a crash); the conversation is kept",
        show=False,
    ),
    ChatAction(
        "session.list",
        "f4",
        "sessions",
        "Sessions",
        "Session: Open, rename, delete",
        "Saved sessions: open one (resume it here), rename, delete or export",
        show=False,
    ),
    ChatAction(
        "session.export",
        "f8",
        "export_session",
        "Export",
        "Session: Export",
        "Export this chat's transcript and per-turn metrics as Markdown, JSON or CSV",
        show=False,
    ),
    ChatAction(
        "settings.edit",
        "f9",
        "edit_settings",
        "Settings",
        "Settings: Edit",
        "Edit model, engine, sampling and theme settings; engine changes reload the model",
        show=False,
    ),
    ChatAction(
        "experiments.open",
        "ctrl+t",
        "open_experiments",
        "Experiments",
        "Experiments: Open",
        "Prompt-length and depth sweeps with live plots, save/load and overlays (as chatphase bench)",
        show=False,
    ),
    ChatAction(
        "model.switch",
        "ctrl+g",
        "switch_model_picker",
        "Model",
        "Model: Switch",
        "Pick another model (models directory, Hugging Face cache, bundled default); it loads in a fresh engine process and the conversation is kept",
        show=False,
    ),
    ChatAction(
        "app.help",
        "f1",
        "help",
        "Help",
        "Help: Keys and metrics",
        "What the keys do and what each measured figure means",
    ),
)


def key_display(keys: str) -> str:
    """Textual key names as people write them: ``"ctrl+n,f6"`` -> ``"Ctrl+N / F6"``."""

    def one(key: str) -> str:
        return "+".join(
            "Esc" if part == "escape" else part.capitalize() if len(part) > 1 else part.upper()
            for part in key.split("+")
        )

    return " / ".join(one(k) for k in keys.split(",") if k)


def key_labels(keymap: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{action id: the keys that run it, as people write them}`` with ``keymap``'s remappings."""
    keymap = keymap or {}
    return {a.id: key_display(keymap.get(a.id, a.key)) for a in ACTIONS}


def help_rows(keys: Mapping[str, str]) -> list[tuple[str, str, str, str]]:
    """The help screen's rows: ``(keys, title, action id, help)`` per action, ``keys`` from :func:`key_labels`."""
    return [(keys[a.id], a.title, a.id, a.help) for a in ACTIONS]


def action_bindings() -> list[Binding]:
    """``Binding`` objects for :data:`ACTIONS` (ids as in the table)."""
    return [Binding(a.key, a.action, a.label, show=a.show, id=a.id, tooltip=a.help) for a in ACTIONS]
