"""Text that is not valid Unicode, in plain words: replaced with U+FFFD and said once, or refused with its place.

Python hands bytes that are not UTF-8 over as lone surrogates (``U+DC80``–``U+DCFF``: argv and the
environment are decoded with ``surrogateescape``), and a terminal paste can carry a lone surrogate too.
Such a string cannot be encoded as UTF-8, so it must not reach the tokeniser, a session file or a
server. :func:`clean_text` replaces each surrogate with U+FFFD (what a UTF-8 decoder does with bad
bytes); :func:`replaced_note` is the one line that says so; :func:`read_utf8` refuses a file that is not
UTF-8 with the byte offset of the first bad byte.
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
