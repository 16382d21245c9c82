"""The [keys] table's check (chatphase.ui.keymap): Textual's key names, the app's reserved keys, clashes."""

from __future__ import annotations

import pytest

from chatphase.ui.actions import ACTIONS
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.keymap import check_keymap, key_name, reserved_keys

RESERVED = reserved_keys(ChatPhaseApp)


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("ctrl+s", "ctrl+s"),
        ("Ctrl+S", "ctrl+s"),
        ("ctrl+?", "ctrl+question_mark"),
        ("f24", "f24"),
        ("escape", "escape"),
        ("ctrl+shift+left", "ctrl+shift+left"),
        ("alt+plus", "alt+plus"),
        ("notakey+++", None),
        ("notakey", None),
        ("ctrl+", None),
        ("ctrl+ctrl+s", None),
        ("hyperctrl+s", None),
        ("", None),
    ],
)
def test_key_names_are_textuals(key, name):
    assert key_name(key) == name


def test_the_defaults_pass_the_check_and_do_not_clash():
    defaults = {a.id: a.key for a in ACTIONS}
    assert check_keymap(defaults, RESERVED) == (defaults, [])
    keys = [k for a in ACTIONS for k in a.key.split(",")]
    assert len(keys) == len(set(keys))


def test_reserved_keys_cover_quit_interrupt_palette_and_the_prompt_box():
    assert {"ctrl+q", "ctrl+c", "ctrl+p", "enter", "ctrl+j", "alt+enter", "ctrl+a"} <= set(RESERVED)
    assert RESERVED["ctrl+u"].id == "prompt.clear"  # the prompt's Ctrl+U is that action's own binding


@pytest.mark.parametrize(
    ("keymap", "applied", "words"),
    [
        ({"chat.new": "notakey+++"}, {}, "'notakey+++' is not a key name"),
        ({"chat.clear": "ctrl+q"}, {}, "Ctrl+Q is the app's Quit key"),
        ({"chat.stop": "ctrl+c"}, {}, "Ctrl+C is the app's Interrupt key"),
        ({"chat.new": "ctrl+p"}, {}, "command palette"),
        ({"chat.new": "enter"}, {}, "the prompt box's Send key"),
        ({"chat.new": "ctrl+u"}, {}, "the prompt box's Clear box key"),
        ({"chat.new": "a"}, {}, "'a' types a character"),
        ({"chat.clear": "ctrl+n"}, {}, "Ctrl+N is Chat: New's key too"),
        ({"chat.stop": "ctrl+s,ctrl+q"}, {"chat.stop": "ctrl+s"}, "Ctrl+Q is the app's Quit key"),
        ({"no.such": "f7"}, {}, "'no.such' is not an action id"),
    ],
)
def test_bad_entries_are_dropped_with_a_notice(keymap, applied, words):
    kept, notices = check_keymap(keymap, RESERVED)
    assert kept == applied and len(notices) == 1 and words in notices[0] and notices[0].endswith("ignored.")


def test_swapped_keys_are_fine_and_shared_ones_are_dropped_until_nothing_clashes():
    swap = {"chat.new": "ctrl+r", "chat.regenerate": "ctrl+n"}
    assert check_keymap(swap, RESERVED) == (swap, [])
    # both want F10: both dropped, so chat.new is back on Ctrl+N, which chat.regenerate then cannot take
    kept, notices = check_keymap({"chat.new": "f10", "chat.clear": "f10", "chat.regenerate": "ctrl+n"}, RESERVED)
    assert kept == {} and len(notices) == 3
    assert "Ctrl+N is Chat: New's key too" in notices[2]


def _terminal_sequences(key: str) -> list[str]:
    """Every byte sequence Textual knows a terminal to send for ``key`` (its own table: xterm, rxvt, the
    Linux console...), and for Ctrl+letter the control character."""
    from textual._ansi_sequences import ANSI_SEQUENCES_KEYS

    found = [seq for seq, keys in ANSI_SEQUENCES_KEYS.items() if isinstance(keys, tuple) and keys == (key,)]
    mods, _, base = key.rpartition("+")
    if mods == "ctrl" and len(base) == 1 and base.isalpha():
        found.append(chr(ord(base) - ord("a") + 1))
    return found


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.id)
def test_each_default_key_arrives_as_itself_from_every_terminal(action):
    """A default key must reach the app from every terminal that sends it: xterm-style terminals and tmux
    send Ctrl+F3 as ``ESC[1;5R``, which Textual reads as a cursor-position report, so that key never
    arrives there (nor any ``ESC[1;<mod>R`` key). Feeding ``""`` ends the input (a lone Esc is a key then)."""
    from textual import events
    from textual._xterm_parser import XTermParser

    for key in action.key.split(","):
        sequences = _terminal_sequences(key)
        assert sequences, f"no terminal sequence known for {key}"
        for seq in sequences:
            parser = XTermParser(False)
            tokens = [token for data in (seq, "") for token in parser.feed(data)]
            keys = [t.key for t in tokens if isinstance(t, events.Key)]
            assert keys and set(keys) == {key}, (key, seq, tokens)  # ESC ESC: two Esc keys
