"""Textual's private API that chatphase uses (chatphase/ui/compat/textual_private.py): still there and still doing what
chatphase relies on, else a sentence naming the Textual version and the missing name; and the only place using it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import textual.keys
from textual.drivers.linux_driver import LinuxDriver
from textual.widget import Widget

from chatphase.ui.compat import textual_private as tp

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "chatphase" / "ui" / "compat" / "textual_private.py"


def _changed(what: str) -> str:
    return (
        f"Textual {tp.textual_version()} changed the private API chatphase uses: {what}; "
        "chatphase/ui/compat/textual_private.py needs another way"
    )


def test_every_private_name_chatphase_uses_is_there():
    gone = tp.missing()
    assert not gone, _changed(f"{', '.join(gone)} {'is' if len(gone) == 1 else 'are'} gone")


def test_a_name_gone_is_found_and_said(monkeypatch):
    monkeypatch.delattr(textual.keys, "_character_to_key")
    assert tp.missing() == ["textual.keys._character_to_key"]
    assert "Textual 8." in _changed("x") and "textual_private.py" in _changed("x")
    assert tp.character_to_key("?") == "?"  # the keymap check degrades, nothing raises


def test_the_private_names_still_do_what_chatphase_relies_on():
    assert tp.character_to_key("?") == "question_mark", _changed("_character_to_key('?') is no longer question_mark")
    assert "XTermParser(" in inspect.getsource(LinuxDriver.run_input_thread), _changed(
        "LinuxDriver.run_input_thread no longer makes its parser from the module's name XTermParser"
    )
    assert tp.input_parser_ok()
    widget = Widget()
    widget._render_cache.lines.append("a line")  # type: ignore[arg-type]
    assert tp.free_drawn_lines(widget) and widget._render_cache.lines == [], _changed("Widget._render_cache.lines")
    assert not tp.free_drawn_lines(widget)


def test_the_app_keeps_textuals_driver_where_the_parser_names_are_gone(monkeypatch):
    from chatphase.ui.app import ChatPhaseApp
    from chatphase.ui.paste_input import PasteKeepingDriver

    monkeypatch.setattr("textual.app.App.get_driver_class", lambda self: LinuxDriver)  # as on Linux and macOS
    app = ChatPhaseApp.__new__(ChatPhaseApp)  # the method reads nothing of the instance
    assert app.get_driver_class() is PasteKeepingDriver
    monkeypatch.setattr(tp, "PARSER_NAMES", {"textual._xterm_parser": ("NoSuchParser",)})
    assert app.get_driver_class() is LinuxDriver


def test_no_other_module_touches_textuals_private_api():
    offenders = {}
    for f in sorted((ROOT / "chatphase").rglob("*.py")):
        if f == OWNER:
            continue
        found = []
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("textual"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if any(part.startswith("_") for part in node.module.split(".")) or private:
                    found.append(f"imports from {node.module}")
            elif isinstance(node, ast.Attribute) and node.attr in (
                "_render_cache",
                "_clear_arrangement_cache",
                "_character_to_key",
                "XTermParser",
            ):
                found.append(f"uses .{node.attr}")
        if found:
            offenders[str(f.relative_to(ROOT))] = found
    assert not offenders, f"Textual's private API outside chatphase/ui/compat/textual_private.py: {offenders}"
