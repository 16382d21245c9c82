"""The settings screen: edit the model, engine, sampling, thinking and theme settings in a form.

Values are parsed the way ``CHATPHASE_<KEY>`` environment variables are (:mod:`chatphase.settings.file`):
an empty optional field or ``auto`` means "chatphase chooses" (threads, GPU layers) or "random" (seed).
The screen shows live which changes need a model reload (engine settings, the model itself). Apply
(Ctrl+S) dismisses with a :class:`SettingsChange`; with "Save as defaults" ticked it also writes the
config file. Esc dismisses with ``None``. Errors are shown in the form, naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from chatphase.engine.config import TRI_STATE
from chatphase.errors import UsageError
from chatphase.settings.file import config_path, parse_env_value, save_settings
from chatphase.settings.schema import Settings

#: settings whose change needs the model to be loaded again.
RELOAD_KEYS = (
    "model",
    "models_dir",
    "n_ctx",
    "n_batch",
    "n_threads",
    "n_gpu_layers",
    "flash_attn",
    "chat_template",
    "spec",
)

#: (key, label, hint) of the text fields, in form order; sampling keys are flat.
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("model", "Model", "GGUF path or file name in the models directory; empty = bundled default"),
    ("models_dir", "Models directory", "empty = default"),
    ("n_ctx", "n_ctx", "context size, tokens"),
    ("n_batch", "n_batch", "prompt tokens per prefill chunk"),
    ("n_threads", "Threads", "auto or empty = chosen each turn from the cores left free; a number pins it"),
    ("n_gpu_layers", "n_gpu_layers", "empty = all when the build supports GPU offload; -1 = all"),
    (
        "chat_template",
        "Chat template",
        "empty = the model's own, else one its vocabulary has; a llama.cpp name or a Jinja file",
    ),
    ("spec", "Decode mode", "off, lookup, auto, or draft:MODEL (speculative decoding)"),
    ("system_prompt", "System prompt", "empty = none"),
    ("temperature", "Temperature", "0 = greedy"),
    ("top_p", "top_p", "(0, 1]"),
    ("top_k", "top_k", "tokens"),
    ("seed", "Seed", "empty = random"),
    ("max_tokens", "Max tokens", "per reply"),
    ("think_budget", "Think budget", "reasoning models: thinking tokens before the block is closed; empty = none"),
)
#: (key, label, hint) of the choices among auto/on/off.
TRI_STATE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("flash_attn", "Flash attention", "auto = llama.cpp enables it where the backend supports it"),
    ("thinking", "Thinking", "reasoning models: on/off where the template can switch it; auto = its default"),
)
#: (key, label) of the switches (checkboxes).
SWITCHES: tuple[tuple[str, str], ...] = (("thinking_open", "Keep a reasoning model's thinking expanded"),)


@dataclass(frozen=True)
class SettingsChange:
    """The screen's result: the new ``settings``, the changed keys that need a model reload (in
    :data:`RELOAD_KEYS` order), and the config file written (``None`` when not saved)."""

    settings: Settings
    reload_keys: tuple[str, ...]
    saved_path: Path | None = None

    @property
    def reload_needed(self) -> bool:
        """Whether the model must be loaded again for the change to take effect."""
        return bool(self.reload_keys)


def get_value(settings: Settings, key: str):
    """A setting by its flat key (sampling keys included)."""
    return getattr(settings, key) if hasattr(settings, key) else getattr(settings.sampling, key)


def reload_keys(old: Settings, new: Settings) -> tuple[str, ...]:
    """Keys in :data:`RELOAD_KEYS` whose values differ between ``old`` and ``new``."""
    return tuple(k for k in RELOAD_KEYS if get_value(old, k) != get_value(new, k))


def parse_form(values: dict[str, str], base: Settings) -> Settings:
    """Build settings from field texts over ``base`` (keys not in ``values`` keep ``base``'s value).

    Raises:
        UsageError: naming the field whose text is invalid or out of range.
    """
    parsed = {}
    labels = {k: label for k, label, _ in FIELDS + TRI_STATE_FIELDS} | dict(SWITCHES)
    for key, text in values.items():
        try:
            value = parse_env_value(key, text)
        except ValueError as exc:
            raise UsageError(f"{labels.get(key, key)}: {exc}") from None
        if value is None and get_value(Settings(), key) is not None:
            raise UsageError(f"{labels.get(key, key)}: needs a value")
        if key in ("model", "models_dir", "system_prompt") and isinstance(value, str) and not value.strip():
            value = None
        parsed[key] = value
    from dataclasses import replace

    top = {k: v for k, v in parsed.items() if hasattr(base, k)}
    samp = {k: v for k, v in parsed.items() if not hasattr(base, k)}
    out = replace(base, **top)
    out = replace(out, sampling=replace(out.sampling, **samp))
    return out.validate()


def _text(value) -> str:
    return "" if value is None else str(value)


class SettingsScreen(ModalScreen[SettingsChange | None]):
    """Edit ``settings``; ``themes`` are the theme names offered (the app's available themes)."""

    CSS_PATH = "settings.tcss"
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="settings.cancel"),
        Binding("ctrl+s", "apply", "Apply", id="settings.apply"),
    ]

    def __init__(self, settings: Settings, themes: list[str] | tuple[str, ...] = ()) -> None:
        super().__init__()
        self.settings = settings
        self.themes = sorted(set(themes) | {settings.theme})

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-box", classes="modal-box"):
            yield Label("Settings  ·  Ctrl+S apply  ·  Esc cancel", classes="panel-title")
            with VerticalScroll(id="settings-form"):
                for key, label, hint in FIELDS:
                    with Horizontal(classes="settings-row"):
                        yield Label(label, classes="settings-label")
                        yield Input(
                            _text(get_value(self.settings, key)),
                            placeholder=hint,
                            id=f"set-{key}",
                            classes="settings-input",
                            tooltip=hint,
                            compact=True,
                        )
                for key, label, hint in TRI_STATE_FIELDS:
                    with Horizontal(classes="settings-row"):
                        yield Label(label, classes="settings-label")
                        yield Select(
                            [(v, v) for v in TRI_STATE],
                            value=get_value(self.settings, key),
                            allow_blank=False,
                            id=f"set-{key}",
                            classes="settings-input",
                            tooltip=hint,
                            compact=True,
                        )
                with Horizontal(classes="settings-row"):
                    yield Label("Theme", classes="settings-label")
                    yield Select(
                        [(t, t) for t in self.themes],
                        value=self.settings.theme,
                        allow_blank=False,
                        id="set-theme",
                        classes="settings-input",
                        compact=True,
                    )
                for key, label in SWITCHES:
                    with Horizontal(classes="settings-row"):
                        yield Label("", classes="settings-label")
                        yield Checkbox(label, get_value(self.settings, key), id=f"set-{key}", compact=True)
            yield Static("", id="settings-reload")
            yield Static("", id="settings-error")
            yield Checkbox(f"Save as defaults in {config_path()}", id="settings-save", compact=True)
            with Horizontal(id="settings-buttons"):
                yield Button("Apply", variant="primary", id="settings-apply", compact=True)
                yield Button("Cancel", id="settings-cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one(f"#set-{FIELDS[0][0]}", Input).focus()

    def form_values(self) -> dict[str, str]:
        """The texts of every field (Selects included), by setting key."""
        values = {key: self.query_one(f"#set-{key}", Input).value for key, _, _ in FIELDS}
        for key in [k for k, _, _ in TRI_STATE_FIELDS] + ["theme"]:
            values[key] = str(self.query_one(f"#set-{key}", Select).value)
        for key, _ in SWITCHES:
            values[key] = "true" if self.query_one(f"#set-{key}", Checkbox).value else "false"
        return values

    def _update_notes(self) -> Settings | None:
        error = self.query_one("#settings-error", Static)
        note = self.query_one("#settings-reload", Static)
        try:
            new = parse_form(self.form_values(), self.settings)
        except UsageError as exc:
            error.update(str(exc))
            return None
        error.update("")
        keys = reload_keys(self.settings, new)
        note.update(f"Changing {', '.join(keys)} reloads the model (the conversation is kept)." if keys else "")
        return new

    def on_input_changed(self, _event: Input.Changed) -> None:
        self._update_notes()

    def on_select_changed(self, _event: Select.Changed) -> None:
        self._update_notes()

    def on_checkbox_changed(self, _event: Checkbox.Changed) -> None:
        self._update_notes()

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self.action_apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "settings-apply":
            self.action_apply()
        elif event.button.id == "settings-cancel":
            self.action_cancel()

    def action_apply(self) -> None:
        """Validate; on success (and a successful save, if asked) dismiss with the change."""
        new = self._update_notes()
        if new is None:
            self.query_one("#settings-error", Static).focus()
            return
        saved = None
        if self.query_one("#settings-save", Checkbox).value:
            try:
                saved = save_settings(new)
            except UsageError as exc:
                self.query_one("#settings-error", Static).update(str(exc))
                return
        self.dismiss(SettingsChange(new, reload_keys(self.settings, new), saved))

    def action_cancel(self) -> None:
        self.dismiss(None)
