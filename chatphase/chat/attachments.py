"""Files in a message: read and check a text file, put it into the message the model sees, find it again.

Shared by ``ask -f`` and the prompt box (``/file PATH``, ``@path``). The block a file goes into the user
message in, after the user's own text, is :mod:`chatphase.sessions.message_files`' (``message_text`` and
``split_message`` are imported from there). The session and its export keep that message as the model saw
it (the file's text, not a path): a session must say what the model was given, and the file may change or
vanish later. The transcript shows each file as one line.

Only text files: each refusal is one line (:class:`AttachmentError`) and nothing is sent.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chatphase.engine.fit_hints import fit_hint
from chatphase.engine.text import inert
from chatphase.errors import UsageError
from chatphase.sessions.message_files import Attachment as Attachment
from chatphase.sessions.message_files import message_text as message_text
from chatphase.sessions.message_files import split_message as split_message
from chatphase.units import fmt_bytes, fmt_int

#: bytes read to decide that a file is binary (a NUL byte in them), as ``git`` and ``grep`` decide.
BINARY_SNIFF_BYTES = 8192
#: a file of more bytes than this many per token of the context is refused unread: no tokenizer packs that
#: much text into one token, so it cannot fit (and a huge file is not read into memory to find out).
MAX_BYTES_PER_TOKEN = 64


class AttachmentError(UsageError):
    """A file that cannot go into a message; ``str`` is one line naming it and why."""


def read_attachment(path: str, n_ctx: int | None = None, stdin_bytes: bytes | None = None) -> Attachment:
    """Read the text file at ``path`` (``-``: ``stdin_bytes``, named ``stdin``; a name with control characters
    may be given in their pictures, as Tab completes it: :func:`real_path`; the file is named as it is).

    Raises:
        AttachmentError: no such file, a directory, not a regular file (a FIFO, socket or device: refused
            from its ``stat``, never opened), unreadable, binary (a NUL byte), not UTF-8 (the offset
            of the first bad byte), or larger than ``n_ctx`` can hold (more than
            :data:`MAX_BYTES_PER_TOKEN` bytes a token; the exact check in tokens is the budget's).
    """
    limit = byte_limit(n_ctx)
    if path == "-":
        data = stdin_bytes if stdin_bytes is not None else b""
        _check_size("stdin", len(data), limit, n_ctx)
        return _decode("stdin", data)
    path = real_path(path)
    p = Path(path).expanduser()
    try:
        st = p.stat()  # follows a symlink: one to a regular file is read
        if stat.S_ISDIR(st.st_mode):
            raise AttachmentError(f"{path} is a directory: attach the files in it one by one")
        if not stat.S_ISREG(st.st_mode):  # never opened: opening a FIFO blocks until a writer comes
            raise AttachmentError(f"{path}: not a regular file ({_kind(st.st_mode)}): only text files go in")
        _check_size(path, st.st_size, limit, n_ctx)
        # Non-blocking, then checked again on the open file: a file swapped for a FIFO after the stat
        # must not block the open (a FIFO's open without O_NONBLOCK waits for a writer).
        with open(os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise AttachmentError(f"{path}: not a regular file ({_kind(mode)}): only text files go in")
            data = fh.read(-1 if limit is None else limit + 1)  # a /proc file says size 0: read no more
        _check_size(path, len(data), limit, n_ctx)
    except FileNotFoundError:
        raise AttachmentError(f"{path}: no such file") from None
    except PermissionError:
        raise AttachmentError(f"{path}: permission denied, cannot read it") from None
    except OSError as exc:
        raise AttachmentError(f"{path}: cannot read it ({exc.strerror or 'error'})") from None
    return _decode(path, data)


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, in words, from its ``st_mode``."""
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def byte_limit(n_ctx: int | None) -> int | None:
    """The most bytes a file for a context of ``n_ctx`` tokens may have (:data:`MAX_BYTES_PER_TOKEN` a token)."""
    return n_ctx * MAX_BYTES_PER_TOKEN if n_ctx else None


def _check_size(name: str, size: int, limit: int | None, n_ctx: int | None) -> None:
    if limit is not None and size > limit:
        raise AttachmentError(
            f"{name} is more than {fmt_bytes(limit)}: larger than the context of {fmt_int(n_ctx)} tokens can hold"
        )


def _decode(name: str, data: bytes) -> Attachment:
    nul = data.find(b"\0", 0, BINARY_SNIFF_BYTES)
    if nul >= 0:
        raise AttachmentError(f"{name} is a binary file (a NUL byte at offset {nul:,}): only text files go in")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AttachmentError(f"{name} is not UTF-8 text (a bad byte at offset {exc.start:,})") from None
    return Attachment(name, text, len(data))


def too_many_tokens(att: Attachment, n_ctx: int) -> str | None:
    """The refusal line of a file whose counted ``tokens`` alone exceed ``n_ctx``, else ``None``."""
    if att.tokens is not None and att.tokens > n_ctx:
        return (
            f"{att.name} is {fmt_int(att.tokens)} tokens: larger than the context of {fmt_int(n_ctx)} tokens "
            f"({fit_hint('file')})"
        )
    return None


#: ``@path`` in the prompt box: at the start or after white space; ``@"a b.txt"`` for names with spaces.
AT_PATH = re.compile(r'(?<!\S)@(?:"([^"]+)"|(\S+))')


@dataclass(frozen=True)
class AtPath:
    """An ``@path`` of the prompt box: the ``path`` and whether it was ``quoted`` (then it must exist)."""

    path: str
    quoted: bool


def _exists(path: str) -> bool:
    return os.path.lexists(real_path(path))


def at_paths(text: str, exists: Callable[[str], bool] = _exists) -> list[AtPath]:
    """The ``@path`` mentions in ``text`` that name files: a quoted one always, a bare one only where the
    path exists (``@someone`` in a sentence is text); each path once, in order."""
    out: list[AtPath] = []
    seen: set[str] = set()
    for m in AT_PATH.finditer(text):
        quoted = m.group(1) is not None
        path = m.group(1) if quoted else m.group(2).rstrip(".,;:!?)")
        if path in seen or not path:
            continue
        if quoted or exists(os.path.expanduser(path)):
            seen.add(path)
            out.append(AtPath(path, quoted))
    return out


def file_command(text: str) -> list[str] | None:
    """The paths of a ``/file PATH…`` line (shell-style quotes for spaces; ``[]`` for ``/file`` alone, which
    takes the attached files off), ``None`` when ``text`` is not one.

    Raises:
        AttachmentError: an unclosed quote.
    """
    stripped = text.strip()
    if not (stripped == "/file" or stripped.startswith(("/file ", "/file\t"))):
        return None
    try:
        return shlex.split(stripped[len("/file") :])
    except ValueError:
        raise AttachmentError("/file: a quote is not closed") from None


def completion_context(before_cursor: str) -> tuple[str, str] | None:
    """``(prefix, quote)`` of a path being typed at the end of ``before_cursor`` (the current line up to the
    cursor): after ``/file `` or an ``@``; ``quote`` is ``"`` when the path was opened with one. ``None``
    when no path is being typed there."""
    if re.match(r"/file\s", before_cursor):
        rest = before_cursor[len("/file") :]
        if rest.count('"') % 2:  # inside a quote: the path runs from it
            return rest[rest.rindex('"') + 1 :], '"'
        return ("" if rest[-1].isspace() else rest.split()[-1]), ""
    if (m := re.search(r'(?<!\S)@"([^"]*)$', before_cursor)) is not None:
        return m.group(1), '"'
    if (m := re.search(r'(?<!\S)@([^"\s]*)$', before_cursor)) is not None:
        return m.group(1), ""
    return None


def completed(prefix: str, quote: str, matches: list[str]) -> str | None:
    """What replaces ``prefix`` (and its opening ``quote``) after Tab: the one match (quoted when it holds
    a space, closed unless it is a directory), else the matches' longest common start; ``None`` when that
    adds nothing."""
    if not matches:
        return None
    if len(matches) == 1:
        whole = matches[0]
        if quote or " " in whole:
            return '"' + whole + ("" if whole.endswith("/") else '"')
        return whole
    common = os.path.commonprefix(matches)  # noqa: RUF071 - by character: a name typed in part is completed
    if len(common) <= len(prefix):
        return None
    return ('"' if quote or " " in common else "") + common


def complete_path(prefix: str) -> list[str]:
    """Paths that complete ``prefix`` (directories end with ``/``), sorted, each name as :func:`shown_name`
    shows it (what :func:`real_path` finds again); hidden entries only when the prefix's last part starts
    with a dot."""
    head, tail = os.path.split(os.path.expanduser(prefix))
    where = real_path(head) if head else "."  # a directory typed in pictures too
    try:
        names = sorted(os.listdir(where))
    except OSError:
        return []
    out = []
    for name in names:
        shown = shown_name(name)
        if not shown.startswith(tail) or (name.startswith(".") and not tail.startswith(".")):
            continue
        full = os.path.join(where, name)
        shown = prefix[: len(prefix) - len(tail)] + shown
        out.append(shown + "/" if os.path.isdir(full) else shown)
    return out


#: what :func:`shown_name` puts for a control character: its picture, or U+FFFD.
_PICTURE = re.compile("[\u2400-\u2421\ufffd]")
#: a line break and a tab in a file name, in pictures too (``inert`` keeps them: they are a text's layout,
#: but a name in the prompt box is on one line, and ``/file``'s words are split at white space).
_NAME_LAYOUT = {0x0A: 0x240A, 0x09: 0x2409}


def shown_name(name: str) -> str:
    """``name`` as the prompt box takes it: :func:`~chatphase.engine.text.inert`, a tab and a line break in
    pictures too."""
    return inert(name).translate(_NAME_LAYOUT)


def real_path(path: str) -> str:
    """The path on disk that ``path`` names: ``path`` itself when it exists, else the one path whose names,
    as :func:`shown_name` shows them, read as ``path``'s (a name with control characters, completed by Tab
    in their pictures: ``a␛b.txt`` for ``a\\x1bb.txt``), with ``~`` expanded; ``path`` when there is none
    or several."""
    expanded = os.path.expanduser(path)
    if os.path.lexists(expanded) or not _PICTURE.search(expanded):
        return path
    found = os.sep if expanded.startswith(os.sep) else ""
    for part in expanded.split(os.sep):
        if not part:
            continue
        candidate = os.path.join(found, part)
        if not os.path.lexists(candidate):
            try:
                same = [n for n in os.listdir(found or ".") if shown_name(n) == part]
            except OSError:
                return path
            if len(same) != 1:
                return path
            candidate = os.path.join(found, same[0])
        found = candidate
    return found
