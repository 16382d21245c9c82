"""The listener interface is checked, not trusted: every override in the product's listeners is a
:class:`~chatphase.chat.listener.ChatListener` method with the interface's parameters and the
``@override`` marker, so a misspelt or wrongly-signed override (which the controller would never call,
or call with the wrong arguments) fails here, and a rename on either side does too."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from typing_extensions import override

import chatphase
from chatphase.chat.listener import ChatListener
from chatphase.chat.turn import Turn
from chatphase.engine.events import TurnFinished

#: each product listener -> its public methods that are its own API, not listener calls.
OWN_METHODS = {
    "chatphase.ui.chat_view.ChatView": {"tick", "toggle_draft_tint"},
    "chatphase.chat.recording.SessionRecording": {"adopt", "session", "close"},
    "chatphase.commands.ask._Printer": {"emit_json"},
    "chatphase.ui.draft_budget.RecountAfterTurns": set(),
    "chatphase.bench.compare.run._Side": {"rss_bytes", "record"},
}

INTERFACE = {name: fn for name, fn in vars(ChatListener).items() if inspect.isfunction(fn) and not name.startswith("_")}


def problems(cls: type, own: set[str]) -> list[str]:
    """What is wrong with ``cls`` as a listener: a public method that is neither an interface method
    nor one of ``own``; an override without ``@override``, with other parameters than the interface's,
    or ``async`` (never awaited by the controller)."""
    out = []
    for name, fn in vars(cls).items():
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        where = f"{cls.__name__}.{name}"
        base = INTERFACE.get(name)
        if base is None:
            if name not in own:
                out.append(f"{where} is no ChatListener method: misspelt, or its own API (add it to OWN_METHODS)")
            elif getattr(fn, "__override__", False):
                out.append(f"{where} is marked @override but overrides nothing")
            continue
        if not getattr(fn, "__override__", False):
            out.append(f"{where} overrides ChatListener.{name} without @override")
        if inspect.signature(fn) != inspect.signature(base):
            out.append(f"{where}{inspect.signature(fn)} differs from ChatListener.{name}{inspect.signature(base)}")
        if inspect.iscoroutinefunction(fn):
            out.append(f"{where} is async: the controller calls it and never awaits it")
    return out


def product_listeners() -> dict[str, type]:
    """Every subclass of ChatListener in the package: found in the source (``class X(ChatListener)``), then
    imported with their own subclasses."""
    root = Path(chatphase.__file__).parent
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("ChatListener") for b in node.bases):
                importlib.import_module(".".join(path.relative_to(root.parent).with_suffix("").parts))
    found, todo = {}, [ChatListener]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("chatphase."):
                found[f"{sub.__module__}.{sub.__qualname__}"] = sub
            todo.append(sub)
    return found


def test_every_product_listener_overrides_only_interface_methods_with_their_parameters():
    listeners = product_listeners()
    assert set(listeners) == set(OWN_METHODS)  # a new listener is checked too: add it above
    for name, cls in listeners.items():
        assert problems(cls, OWN_METHODS[name]) == [], name


def test_the_check_catches_a_misspelt_a_wrongly_signed_an_unmarked_and_an_async_override():
    class Bad(ChatListener):
        @override
        def turn_finshed(self, turn: Turn, event: TurnFinished) -> None:  # misspelt: never called
            pass

        @override
        def turn_failed(self, turn: Turn) -> None:  # type: ignore[override]  # a parameter short
            pass

        def turn_abandoned(self, turn: Turn, why: str) -> None:  # no @override
            pass

        @override
        async def notice(self, notice) -> None:  # never awaited (and its annotation is gone)
            pass

    found = problems(Bad, set())
    assert len(found) == 5, found
    assert found[0].startswith("Bad.turn_finshed is no ChatListener method")
    assert "Bad.turn_failed(self, turn: 'Turn') -> 'None' differs" in found[1]
    assert found[2] == "Bad.turn_abandoned overrides ChatListener.turn_abandoned without @override"
    assert found[3].startswith("Bad.notice(self, notice) -> 'None' differs") and "async" in found[4]
    assert problems(Bad, {"turn_finshed"}) == ["Bad.turn_finshed is marked @override but overrides nothing"] + found[1:]


def test_the_controller_calls_every_listener_method_directly_by_name():
    """No listener is called through a string: each interface method is called as ``to.<name>(`` in the
    controller's source, so a rename of the interface breaks the call where a type checker sees it."""
    source = Path(importlib.import_module("chatphase.chat.controller").__file__).read_text(encoding="utf-8")
    assert "getattr(listener" not in source
    assert [name for name in INTERFACE if f"to.{name}(" not in source] == []
