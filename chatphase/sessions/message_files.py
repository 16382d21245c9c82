"""The files in a user message: the blocks a message carries them in, found again, and its one-line preview.

A file goes into the user message as

    <file name="notes.txt" bytes="1234">
    …its text…
    </file>

after the user's own text, one block per file (:func:`message_text`; reading and checking a file is
:mod:`chatphase.chat.attachments`'). The session keeps that message as the model saw it; :func:`split_message`
finds the blocks again (by the byte count, so a file that itself holds ``</file>`` is read back whole), and
:func:`message_preview` is the one line that names a message (a session's title, ``chatphase logs``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from chatphase.units import fmt_bytes, fmt_int


@dataclass(frozen=True)
class Attachment:
    """A text file read for a message: its ``name`` as given (shown and sent), its ``text``, ``size_bytes``
    (UTF-8) and, once counted by the model's tokenizer, ``tokens``."""

    name: str
    text: str
    size_bytes: int
    tokens: int | None = None

    def line(self) -> str:
        """``notes.txt · 1.2 KiB · 312 tok``: the one line the transcript shows (the name not yet inert)."""
        tok = "" if self.tokens is None else f" · {fmt_int(self.tokens)} tok"
        return f"{self.name} · {fmt_bytes(self.size_bytes)}{tok}"


def _block(att: Attachment) -> str:
    return f'<file name="{_attr(att.name)}" bytes="{att.size_bytes}">\n{att.text}{FILE_END}'


def _attr(name: str) -> str:
    return name.replace("&", "&amp;").replace('"', "&quot;")


def message_text(text: str, attachments: list[Attachment] | tuple[Attachment, ...]) -> str:
    """The user message the model sees: ``text``, then one block per file (module docstring)."""
    parts = [text.rstrip()] if text.strip() else []
    parts += [_block(a) for a in attachments]
    return "\n\n".join(parts)


#: a file block's head (its name escaped as :func:`_attr` writes it, its size in UTF-8 bytes) and its end.
FILE_HEAD = re.compile(r'<file name="((?:[^"&]|&amp;|&quot;)*)" bytes="(\d+)">\n')
FILE_END = "\n</file>"


def file_name(escaped: str) -> str:
    """A block head's name as the user gave it (the escapes of :func:`_attr` undone)."""
    return escaped.replace("&quot;", '"').replace("&amp;", "&")


def split_message(content: str) -> tuple[str, list[Attachment]]:
    """``(the user's own text, the files)`` of a message built by :func:`message_text`; a message without
    well-formed blocks to its end comes back whole with no files."""
    m = FILE_HEAD.search(content)
    if m is None or not (m.start() == 0 or content.startswith("\n\n", m.start() - 2)):
        return content, []
    own = content[: m.start()].removesuffix("\n\n")
    found: list[Attachment] = []
    pos = m.start()
    while True:
        m = FILE_HEAD.match(content, pos)
        if m is None:
            return content, []
        size = int(m.group(2))
        try:
            text = content[m.end() :].encode("utf-8")[:size].decode("utf-8")
        except UnicodeDecodeError:  # the count ends inside a character: not a block written here
            return content, []
        end = m.end() + len(text)
        if not content.startswith(FILE_END, end):
            return content, []
        found.append(Attachment(file_name(m.group(1)), text, size))
        pos = end + len(FILE_END)
        if pos == len(content):
            return own, found
        if not content.startswith("\n\n", pos):
            return content, []
        pos += 2


#: the head of a block cut off (a title saved before :func:`message_preview` was the title's, cut at 60 chars)
_CUT_HEAD = re.compile(r'(?:^|\s)<file name="')


def message_preview(content: str, chars: int | None = None) -> str:
    """One line for a user message: the user's own words (white space collapsed) with each file short, an
    ``@path`` mention as ``@name`` (its base name) and a file attached with ``/file`` as ``[file name]``;
    cut to ``chars`` with ``…``. A line with the start of a block and no end (an old title) stops before it."""
    own, files = split_message(content)
    if not files and (m := _CUT_HEAD.search(own)) is not None:
        own = own[: m.start()]
    tail = []
    for f in files:
        short = os.path.basename(f.name.rstrip("/")) or f.name
        short_at = f'@"{short}"' if " " in short else f"@{short}"
        mentions = [f'@"{f.name}"', f"@{f.name}"]
        if any(mention in own for mention in mentions):
            for mention in mentions:
                own = own.replace(mention, short_at)
        else:
            tail.append(f"[file {short}]")
    flat = " ".join(" ".join([own, *tail]).split())
    return flat if chars is None or len(flat) <= chars else flat[: chars - 1] + "…"


def title_before_block(title: str) -> str:
    """A title saved before titles were :func:`message_preview`'s (cut at 60 chars inside a file's block,
    ``Summarise: @a.txt <file name="/t…``) up to that block; any other title as it is."""
    return message_preview(title) if _CUT_HEAD.search(title) else title
