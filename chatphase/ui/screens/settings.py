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

from chatphase.errors import UsageError
from chatphase.settings.file import parse_env_value, save_settings
from chatphase.settings.schema import BY_KEY, FIELDS, SettingField, Settings, reload_keys, with_values
from chatphase.system.paths import config_file

#: the settings the screen shows (a ``label`` in their field's metadata), in declaration order; each is an
#: Input, a Select (a field with ``choices``, or the theme) or a Checkbox (a switch), and its id ``set-<key>``.
SHOWN: tuple[SettingField, ...] = tuple(f for f in FIELDS if "label" in f.metadata)


def _kind(f: SettingField) -> str:
    if f.type is bool:
        return "switch"
    return "select" if "choices" in f.metadata or f.key == "theme" else "input"


@dataclass(frozen=True)
class SettingsChange:
    """The screen's result: the new ``settings``, the changed keys that need a model reload
    (:func:`chatphase.settings.schema.reload_keys`), and the config file written (``None`` when not saved)."""

    settings: Settings
    reload_keys: tuple[str, ...]
    saved_path: Path | None = None

    @property
    def reload_needed(self) -> bool:
        """Whether the model must be loaded again for the change to take effect."""
        return bool(self.reload_keys)


def parse_form(values: dict[str, str], base: Settings) -> Settings:
    """Build settings from field texts over ``base`` (keys not in ``values`` keep ``base``'s value).

    Raises:
        UsageError: naming the field whose text is invalid or out of range.
    """
    parsed = {}
    for key, text in values.items():
        f = BY_KEY[key]
        label = f.metadata.get("label", key)
        try:
            value = parse_env_value(key, text)
        except ValueError as exc:
            raise UsageError(f"{label}: {exc}") from None
        if value is None and not f.optional:
            raise UsageError(f"{label}: needs a value")
        if f.type is str and f.optional and isinstance(value, str) and not value.strip():
            value = None
        parsed[key] = value
    return with_values(base, parsed).validate()


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
                for kind in ("input", "select", "switch"):
                    for f in (f for f in SHOWN if _kind(f) == kind):
                        with Horizontal(classes="settings-row"):
                            yield from self._row(f, kind)
            yield Static("", id="settings-reload", markup=False)
            yield Static("", id="settings-error", markup=False)  # errors quote the values typed
            yield Checkbox(f"Save as defaults in {config_file()}", id="settings-save", compact=True)
            with Horizontal(id="settings-buttons"):
                yield Button("Apply", variant="primary", id="settings-apply", compact=True)
                yield Button("Cancel", id="settings-cancel", compact=True)

    def _row(self, f: SettingField, kind: str) -> ComposeResult:
        label, hint, value = f.metadata["label"], f.metadata.get("hint"), f.get(self.settings)
        if kind == "switch":
            yield Label("", classes="settings-label")
            yield Checkbox(label, value, id=f"set-{f.key}", compact=True)
            return
        yield Label(label, classes="settings-label")
        if kind == "input":
            yield Input(
                _text(value),
                placeholder=hint or "",
                id=f"set-{f.key}",
                classes="settings-input",
                tooltip=hint,
                compact=True,
            )
            return
        choices = self.themes if f.key == "theme" else f.metadata["choices"]
        yield Select(
            [(v, v) for v in choices],
            value=value,
            allow_blank=False,
            id=f"set-{f.key}",
            classes="settings-input",
            tooltip=hint,
            compact=True,
        )

    def on_mount(self) -> None:
        self.query_one(f"#set-{SHOWN[0].key}", Input).focus()

    def form_values(self) -> dict[str, str]:
        """The texts of every field (Selects included), by setting key."""
        values = {}
        for f in SHOWN:
            kind, selector = _kind(f), f"#set-{f.key}"
            if kind == "switch":
                values[f.key] = "true" if self.query_one(selector, Checkbox).value else "false"
            elif kind == "select":
                values[f.key] = str(self.query_one(selector, Select).value)
            else:
                values[f.key] = self.query_one(selector, Input).value
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
