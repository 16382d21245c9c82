"""Checking the config file's ``[keys]`` table before the app applies it with ``App.set_keymap``.

Each entry maps an action id of :data:`~chatphase.ui.actions.ACTIONS` to keys (``"ctrl+s"`` or
``"ctrl+s,f6"``). :func:`check_keymap` keeps what can work and says why it drops the rest, one notice
each: an id that names no action; a key that is not one of Textual's key names (its ``Keys`` and its
names for characters, :func:`~chatphase.ui.compat.textual_private.character_to_key`, with Textual's modifiers); a key the app
keeps for itself (:func:`reserved_keys`: Ctrl+Q quit, Ctrl+C, the command palette's Ctrl+P, and the
prompt box's Enter, new-line and editing keys, which it handles before any app binding); a key that
types a character in the prompt box; and a key another action already has (the other action's default or
remapped key), so that no action loses its key without a word. An action whose keys are all dropped keeps
its default. :func:`show_keymap_notices` says them all in one place once the screen is up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from textual.app import App
from textual.binding import Binding
from textual.keys import Keys, key_to_character

from chatphase.ui.actions import ACTIONS, key_display
from chatphase.ui.compat.textual_private import character_to_key
from chatphase.ui.prompt_input import PromptInput
from chatphase.ui.transcript.chat_log import ChatLog

#: the modifiers in Textual's key names (as its terminal parsers write them: ``ctrl+shift+left``).
MODIFIERS = frozenset({"ctrl", "shift", "alt", "meta", "super", "hyper"})


@dataclass(frozen=True)
class Owner:
    """Who holds a reserved key: ``id`` the binding's id (``None`` for most), ``what`` for the notice."""

    id: str | None
    what: str


@lru_cache(1)
def _named_keys() -> frozenset[str]:
    """Textual's names of keys that are not a letter or digit: ``escape``, ``f5``, ``pageup``, ``plus``…"""
    names = {key.value.rpartition("+")[2] for key in Keys if not key.value.startswith("<")}
    names |= {character_to_key(chr(code)) for code in range(0x20, 0x7F)}
    return frozenset(name for name in names if len(name) > 1)


def key_name(key: str) -> str | None:
    """``key`` as Textual names it (``Ctrl+?`` -> ``ctrl+question_mark``), or ``None`` if Textual has no
    such key (``notakey+++``, ``ctrl+``, ``hyperctrl+s``)."""
    *mods, base = key.split("+")
    if len(base) == 1:
        base = character_to_key(base.lower() if mods else base)
    else:
        base = base.lower()
    mods = [m.lower() for m in mods]
    if not base or len(set(mods)) != len(mods) or not MODIFIERS.issuperset(mods):
        return None
    if (len(base) == 1 and base.isalnum()) or base in _named_keys():
        return "+".join([*mods, base])
    return None


def _owners(bindings: list, owner: str, skip_ids: frozenset[str] = frozenset()) -> dict[str, Owner]:
    out: dict[str, Owner] = {}
    for b in Binding.make_bindings(bindings):
        if b.id in skip_ids:
            continue
        what = f"{owner}'s {b.description or b.action.replace('_', ' ')}"
        out.update({k: Owner(b.id, what) for k in b.key.split(",")})
    return out


def reserved_keys(app: type[App]) -> dict[str, Owner]:
    """Keys the ``[keys]`` table cannot take: ``app``'s bindings outside the action table (Textual's
    Ctrl+Q quit, the app's Ctrl+C), the command palette's key and the prompt box's keys (its own and its
    ``TextArea``'s; those with an action's id, Ctrl+U, stay that action's)."""
    ids = frozenset(a.id for a in ACTIONS)
    out: dict[str, Owner] = {}
    for cls in reversed(PromptInput.__mro__):  # the subclass's keys override its bases'
        out.update(_owners(cls.__dict__.get("BINDINGS", []), "the prompt box"))
    for cls in reversed(app.__mro__):
        out.update(_owners(cls.__dict__.get("BINDINGS", []), "the app", ids))
    out[app.COMMAND_PALETTE_BINDING] = Owner(None, "the command palette's")
    return out


def _title(action_id: str) -> str:
    return next(a.title for a in ACTIONS if a.id == action_id)


def check_keymap(keymap: Mapping[str, str], reserved: Mapping[str, Owner]) -> tuple[dict[str, str], list[str]]:
    """The part of ``keymap`` that can be applied, in Textual's key names, and a notice for each part
    that cannot (see the module docstring)."""
    ids = {a.id for a in ACTIONS}
    notices: list[str] = []
    wanted: dict[str, list[str]] = {}
    for action_id, keys in keymap.items():
        if action_id not in ids:
            notices.append(f"[keys] {action_id!r} is not an action id (F1 lists them); ignored.")
            continue
        for key in keys.split(","):
            name = key_name(key)
            owner = reserved.get(name) if name else None
            shown = key_display(name) if name else repr(key)
            if name is None:
                why = "is not a key name (e.g. ctrl+s, f6, escape)"
            elif owner is not None and owner.id != action_id:
                why = f"is {owner.what} key"
            elif owner is None and (key_to_character(name) or "\x00").isprintable():
                shown, why = repr(key), "types a character in the prompt box"
            else:
                if name not in wanted.setdefault(action_id, []):
                    wanted[action_id].append(name)
                continue
            notices.append(f"[keys] {action_id} = {key!r}: {shown} {why}; ignored.")
        if not wanted.get(action_id):
            wanted.pop(action_id, None)
    while clash := _clash(wanted):
        key, holders = clash
        for action_id in holders:
            if key in wanted.get(action_id, ()):
                others = " and ".join(_title(i) for i in holders if i != action_id)
                notices.append(f"[keys] {action_id} = {key!r}: {key_display(key)} is {others}'s key too; ignored.")
                wanted[action_id].remove(key)
                if not wanted[action_id]:
                    del wanted[action_id]  # back to its default, which the next round checks
    return {action_id: ",".join(keys) for action_id, keys in wanted.items()}, notices


def _clash(wanted: Mapping[str, list[str]]) -> tuple[str, list[str]] | None:
    """A key held by more than one action, one of them by a remapping (defaults never clash)."""
    held: dict[str, list[str]] = {}
    for a in ACTIONS:
        for key in wanted.get(a.id) or a.key.split(","):
            held.setdefault(key, []).append(a.id)
    for key, holders in held.items():
        if len(holders) > 1 and any(key in wanted.get(i, ()) for i in holders):
            return key, holders
    return None


def show_keymap_notices(app: App, notices: list[str] | tuple[str, ...]) -> None:
    """Say what :func:`check_keymap` dropped: one notice in a toast; several in the chat log, which
    scrolls, and one toast that counts them (a toast each stacked past the screen's edge, the last cut)."""
    if len(notices) == 1:
        app.notify(notices[0], title="Settings", severity="warning", timeout=15, markup=False)  # "[keys]": no tag
    elif notices:
        app.query_one(ChatLog).add_notice("\n".join(notices), "warning")
        app.notify(
            f"{len(notices)} [keys] entries ignored; the chat lists them.",
            title="Settings",
            severity="warning",
            timeout=15,
            markup=False,
        )
