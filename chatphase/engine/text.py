"""Text that is not valid Unicode, in plain words: replaced with U+FFFD and said once, or refused with its place.

Python hands bytes that are not UTF-8 over as lone surrogates (``U+DC80``–``U+DCFF``: argv and the
environment are decoded with ``surrogateescape``), and a terminal paste can carry a lone surrogate too.
Such a string cannot be encoded as UTF-8, so it must not reach the tokeniser, a session file or a
server. :func:`clean_text` replaces each surrogate with U+FFFD (what a UTF-8 decoder does with bad
bytes); :func:`replaced_note` is the one line that says so; :func:`read_utf8` refuses a file that is not
UTF-8 with the byte offset of the first bad byte.

:func:`inert` makes text from outside the program (a model's reply, a server's error, a GGUF's name, a
file name) safe to show on a terminal or in a file for people: its control characters are shown, not
obeyed, so an escape sequence cannot write the clipboard, clear the screen or retitle the window, and a
bidirectional control cannot reorder what is drawn (``bidi\u202etxt.exe`` would read ``bidiexe.txt``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from chatphase.errors import UsageError

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> tuple[str, int | None]:
    """``(text with every lone surrogate replaced by U+FFFD, index of the first one or None)``."""
    m = _SURROGATE.search(text)
    if m is None:
        return text, None
    return _SURROGATE.sub(REPLACEMENT, text), m.start()


#: the bidirectional controls: the embeddings and overrides (U+202A–U+202E), the isolates (U+2066–U+2069)
#: and the marks (LRM U+200E, RLM U+200F, ALM U+061C). Drawn, they reorder the text around them.
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"

#: what :func:`inert` shows for each control character: a C0 control (U+0000–U+001F, except newline
#: and tab) as its Unicode Control Picture (ESC as ␛ U+241B, CR as ␍), DEL as ␡ (U+2421); a C1 control
#: (U+0080–U+009F) and a bidirectional control (:data:`BIDI_CONTROLS`), which have no picture, as U+FFFD
#: (�). One character for one, so offsets into a text hold for its inert form (the transcript's
#: streaming offsets), and ``inert(a + b) == inert(a) + inert(b)``.
INERT_TABLE = {
    **{c: 0x2400 + c for c in range(0x20) if chr(c) not in "\n\t"},
    0x7F: 0x2421,
    **dict.fromkeys(range(0x80, 0xA0), ord(REPLACEMENT)),
    **dict.fromkeys(map(ord, BIDI_CONTROLS), ord(REPLACEMENT)),
}
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{BIDI_CONTROLS}]")


def inert(text: str) -> str:
    """``text`` with every control character but newline and tab, and every bidirectional control, shown
    visibly (:data:`INERT_TABLE`).

    The one rule for text from outside the program (model output, server replies, GGUF metadata, file
    names, session titles, log lines) on its way to a terminal or a file for people. Text without a
    control character (nearly all) is returned as is after one regex scan (~2 µs per KiB);
    ``str.translate`` runs only when there is one."""
    return text.translate(INERT_TABLE) if _CONTROL.search(text) else text


#: JSON's own escapes for the controls ``json.dumps(..., ensure_ascii=False)`` leaves raw: DEL, C1 and the
#: bidirectional controls.
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in (*range(0x7F, 0xA0), *map(ord, BIDI_CONTROLS))}
_JSON_RAW = re.compile(f"[\x7f-\x9f{BIDI_CONTROLS}]")


def json_inert(json_text: str) -> str:
    """``json.dumps(..., ensure_ascii=False)`` output with DEL, the C1 controls and the bidirectional controls
    escaped (``\\u009b``, ``\\u202e``), as it already escapes C0: the same JSON value, and no control
    character for a terminal that shows the file. (These characters can only be inside strings, where the
    escape means the same.)"""
    return json_text.translate(_JSON_ESCAPES) if _JSON_RAW.search(json_text) else json_text


def replaced_note(what: str, first: int) -> str:
    """One line: ``what`` held text that is not valid UTF-8 from character ``first`` (0-based) on."""
    return f"{what} held bytes that are not valid UTF-8 (first at character {first + 1:,}); they were replaced with U+FFFD (\ufffd)"


def read_utf8(path: str | os.PathLike[str], what: str = "file") -> str:
    """The text of a UTF-8 file.

    Raises:
        UsageError: unreadable (the OS's reason), or not UTF-8 (the byte offset of the first bad byte).
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read the {what} {p}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"the {what} {p} is not UTF-8 text (bad byte at offset {exc.start:,}); save it as UTF-8"
        ) from None
