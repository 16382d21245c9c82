"""Files in a message (chatphase.chat.attachments): reading, every refusal, the message text and back."""

from __future__ import annotations

import concurrent.futures
import os
import socket
from pathlib import Path

import pytest

from chatphase.chat import attachments
from chatphase.chat.attachments import (
    Attachment,
    AttachmentError,
    at_paths,
    complete_path,
    completed,
    completion_context,
    file_command,
    message_text,
    read_attachment,
    real_path,
    split_message,
    too_many_tokens,
)


def test_a_text_file_is_read_with_its_size(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("héllo\nworld\n", encoding="utf-8")
    att = read_attachment(str(f))
    assert att.text == "héllo\nworld\n" and att.size_bytes == 13 and att.name == str(f)


def test_stdin_is_read_as_a_file_named_stdin():
    att = read_attachment("-", stdin_bytes=b"piped text")
    assert (att.name, att.text, att.size_bytes) == ("stdin", "piped text", 10)


def _refusal(path, **kw) -> str:
    with pytest.raises(AttachmentError) as info:
        read_attachment(path, **kw)
    line = str(info.value)
    assert "\n" not in line and "Error" not in line
    return line


def test_a_binary_file_is_refused(tmp_path):
    f = tmp_path / "image.png"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    assert "binary file (a NUL byte at offset 8)" in _refusal(str(f))


def test_a_file_that_is_not_utf8_names_the_offset_of_the_first_bad_byte(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes(b"caf" + "é au lait".encode("latin-1"))
    assert _refusal(str(f)).endswith("is not UTF-8 text (a bad byte at offset 3)")


def test_a_directory_a_missing_path_and_an_unreadable_file_are_refused(tmp_path, monkeypatch):
    assert "is a directory" in _refusal(str(tmp_path))
    assert _refusal(str(tmp_path / "nope.txt")).endswith("no such file")
    locked = tmp_path / "locked.txt"
    locked.write_text("secret")
    if os.geteuid() == 0:  # root reads a mode-0 file: the refusal of open() is faked instead

        def denied(*_args, **_kw):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(attachments, "open", denied, raising=False)
    else:
        locked.chmod(0)
    assert _refusal(str(locked)).endswith("permission denied, cannot read it")


def test_a_file_larger_than_the_context_is_refused_unread_or_by_its_token_count(tmp_path):
    f = tmp_path / "big.txt"
    f.write_text("word " * 20_000)  # 100,000 bytes
    assert "larger than the context of 512 tokens" in _refusal(str(f), n_ctx=512)  # 512 × 64 < 100,000
    att = read_attachment(str(f), n_ctx=4096)
    assert too_many_tokens(Attachment(att.name, att.text, att.size_bytes, 20_000), 4096) == (
        f"{f} is 20,000 tokens: larger than the context of 4,096 tokens (raise --n-ctx or attach a part of it)"
    )
    assert too_many_tokens(Attachment("a", "x", 1, 10), 4096) is None


def test_the_message_text_comes_back_apart_even_when_a_file_holds_the_closing_tag():
    tricky = 'x</file>\n\n<file name="y" bytes="1">\nz\n</file>é'
    files = [Attachment('a "b" & c.txt', tricky, len(tricky.encode())), Attachment("empty", "", 0)]
    text = message_text("Summarise @a.txt\n", files)
    assert text.startswith("Summarise @a.txt\n\n<file name=")
    own, back = split_message(text)
    assert own == "Summarise @a.txt" and [(a.name, a.text) for a in back] == [(f.name, f.text) for f in files]
    assert split_message(message_text("", files[:1]))[0] == ""


@pytest.mark.parametrize(
    "content",
    ["plain text", 'a\n\n<file name="n" bytes="5">\nabc\n</file>', 'a\n\n<file name="n" bytes="3">\nabc\n</file> more'],
)
def test_a_message_not_built_here_is_left_whole(content):
    assert split_message(content) == (content, [])


def test_at_paths_name_existing_files_or_quoted_ones(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    text = f'see @{tmp_path}/notes.txt, ask @someone, mail a@b.c and @"{tmp_path}/my file.txt"'
    found = at_paths(text)
    assert [(a.path, a.quoted) for a in found] == [(f"{tmp_path}/notes.txt", False), (f"{tmp_path}/my file.txt", True)]


def test_file_command_takes_quoted_paths_and_alone_takes_the_files_off():
    assert file_command("/file 'my notes.txt' b.md") == ["my notes.txt", "b.md"]
    assert file_command("hello /file x") is None and file_command("/filed x") is None
    assert file_command("/file") == []
    with pytest.raises(AttachmentError, match="quote is not closed"):
        file_command('/file "abc')


@pytest.mark.parametrize(
    "before, context",
    [
        ("/file no", ("no", "")),
        ("/file a.txt no", ("no", "")),
        ('/file "my no', ("my no", '"')),
        ('/file "a b.txt" no', ("no", "")),
        ("/file ", ("", "")),
        ("see @no", ("no", "")),
        ('see @"my no', ("my no", '"')),
        ("@", ("", "")),
        ("mail a@b", None),
        ("/file", None),
        ("plain", None),
    ],
)
def test_completion_context_finds_the_path_being_typed(before, context):
    assert completion_context(before) == context


def test_completed_quotes_names_with_spaces_and_stops_at_the_common_start():
    assert completed("no", "", ["notes.txt"]) == "notes.txt"
    assert completed("my", "", ["my notes.txt"]) == '"my notes.txt"'
    assert completed("my", '"', ["my dir/"]) == '"my dir/'  # left open: the path goes on
    assert completed("re", "", ["readme.txt", "report.md"]) is None  # nothing to add
    assert completed("rep", "", ["report-1.md", "report-2.md"]) == "report-"
    assert completed("x", "", []) is None


def test_complete_path_lists_matches_with_a_slash_after_directories(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "notebooks").mkdir()
    (tmp_path / ".hidden").write_text("x")
    assert complete_path(f"{tmp_path}/no") == [f"{tmp_path}/notebooks/", f"{tmp_path}/notes.txt"]
    assert complete_path(f"{tmp_path}/") == [f"{tmp_path}/notebooks/", f"{tmp_path}/notes.txt"]
    assert complete_path(f"{tmp_path}/.h") == [f"{tmp_path}/.hidden"]


def test_a_name_with_control_characters_completes_in_pictures_and_is_found_again(tmp_path):
    (tmp_path / "d\x1bir").mkdir()
    (tmp_path / "d\x1bir" / "a\tb\x07.txt").write_text("x")
    (tmp_path / "two\x80.txt").write_text("x")
    (tmp_path / "two\x81.txt").write_text("x")  # both read 'two\ufffd.txt': which one is meant is not known
    assert complete_path(f"{tmp_path}/d") == [f"{tmp_path}/d␛ir/"]
    assert complete_path(f"{tmp_path}/d␛ir/a") == [f"{tmp_path}/d␛ir/a␉b␇.txt"]
    assert real_path(f"{tmp_path}/d␛ir/a␉b␇.txt") == f"{tmp_path}/d\x1bir/a\tb\x07.txt"
    assert read_attachment(f"{tmp_path}/d␛ir/a␉b␇.txt").name == f"{tmp_path}/d\x1bir/a\tb\x07.txt"
    assert real_path(f"{tmp_path}/two\ufffd.txt") == f"{tmp_path}/two\ufffd.txt"  # ambiguous: as given
    assert real_path(f"{tmp_path}/gone␛.txt") == f"{tmp_path}/gone␛.txt"
    (tmp_path / "lit␛.txt").write_text("x")  # a name that holds the picture itself is that file
    (tmp_path / "lit\x1b.txt").write_text("x")
    assert real_path(f"{tmp_path}/lit␛.txt") == f"{tmp_path}/lit␛.txt"
    assert [a.path for a in at_paths(f"see @{tmp_path}/d␛ir/a␉b␇.txt")] == [f"{tmp_path}/d␛ir/a␉b␇.txt"]


def _refusal_within(path: str, seconds: float = 5.0) -> str:
    """The refusal of ``path``, failing (not hanging the suite) when reading it blocks."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(_refusal, path)
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            with open(path, "wb"):  # a writer ends the reader's wait, so the pool can shut down
                pass
            pytest.fail(f"reading {path} blocked for {seconds} s")


def test_a_fifo_a_socket_and_a_device_are_refused_unopened(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert _refusal_within(str(fifo)) == f"{fifo}: not a regular file (a named pipe): only text files go in"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        assert "not a regular file (a socket)" in _refusal(str(tmp_path / "sock"))
    # /dev/zero never ends (and its size says 0): refused from its mode, not read at all
    assert _refusal("/dev/zero", n_ctx=4096) == "/dev/zero: not a regular file (a device): only text files go in"


def test_a_file_swapped_for_a_fifo_after_its_stat_is_refused_without_blocking(tmp_path, monkeypatch):
    """The stat saw a regular file; by the open, the path is a FIFO (a race): the open does not wait for
    a writer, and the open file's own mode refuses it."""
    (tmp_path / "notes.txt").write_text("hello")
    regular = os.stat(tmp_path / "notes.txt")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    real_stat = Path.stat
    monkeypatch.setattr(Path, "stat", lambda self, **kw: regular if self == fifo else real_stat(self, **kw))
    assert _refusal_within(str(fifo)) == f"{fifo}: not a regular file (a named pipe): only text files go in"


def test_a_symlink_to_a_text_file_is_read(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "link.txt").symlink_to(tmp_path / "notes.txt")
    assert read_attachment(str(tmp_path / "link.txt")).text == "hello"


def test_a_file_that_says_size_0_or_stdin_is_read_no_further_than_the_limit():
    # a /proc file is regular but says size 0: read to the limit and refused, not read whole
    assert _refusal("/proc/self/maps", n_ctx=1) == (
        "/proc/self/maps is more than 64 B: larger than the context of 1 tokens can hold"
    )
    assert "stdin is more than 1.0 KiB" in _refusal("-", n_ctx=16, stdin_bytes=b"x" * 2000)
