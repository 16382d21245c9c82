"""The one line that names a user message (chatphase.sessions.message_files.message_preview): a session's title
(the F4 list, the resume notice) and ``chatphase logs``' MESSAGE show the user's words, each file short."""

from __future__ import annotations

import json

from session_support import MODEL, SETTINGS, record_turns

from chatphase.commands.logs import format_table
from chatphase.sessions.catalog import load_session
from chatphase.sessions.message_files import Attachment, message_preview, message_text
from chatphase.sessions.store import session_from_records
from chatphase.sessions.writer import SessionWriter

BIG = Attachment("/tmp/nu-big.txt", "word " * 500 + "\n", 2501)
NOTES = Attachment("/home/me/my notes.txt", "alpha\n", 6)


def test_a_mention_shows_the_file_by_its_name_and_a_file_attached_apart_in_brackets():
    sent = message_text("Summarise this document: @/tmp/nu-big.txt", [BIG])
    assert message_preview(sent) == "Summarise this document: @nu-big.txt"
    sent = message_text('Compare @"/home/me/my notes.txt" with', [NOTES, BIG])
    assert message_preview(sent) == 'Compare @"my notes.txt" with [file nu-big.txt]'
    assert message_preview(message_text("", [BIG])) == "[file nu-big.txt]"
    assert message_preview("plain  words\nhere", 8) == "plain w…"


def test_a_session_title_is_the_preview_and_the_file_keeps_the_message_whole():
    rec = SessionWriter.create(model=MODEL, settings=SETTINGS)
    sent = message_text("Summarise this document: @/tmp/nu-big.txt", [BIG])
    record_turns(rec, [(sent, ["Done."])])
    rec.close()
    s = load_session(rec.id)
    assert s.title == "Summarise this document: @nu-big.txt"
    assert s.turns[0].user == sent  # what the model was given, unchanged
    with open(rec.path, encoding="utf-8") as fh:
        assert json.loads(fh.readline())["title"] == "Summarise this document: @nu-big.txt"


def test_an_older_title_cut_inside_a_file_block_loses_the_block():
    header = {"type": "session", "id": "x", "title": 'Summarise: @/tmp/nu-big.txt <file name="/t…', "created": ""}
    assert session_from_records([header]).title == "Summarise: @/tmp/nu-big.txt"


def test_logs_message_column_is_the_preview():
    row = dict.fromkeys(
        ("started", "model_name", "prompt_tokens", "cached_tokens", "ttft_ms", "prefill_tokens_per_s"), None
    )
    row |= {"decode_tokens_per_s": None, "decode_tokens": None, "session_id": "s", "turn": 1, "status": "complete"}
    row["user"] = message_text("Look at @/tmp/nu-fifo", [Attachment("/tmp/nu-fifo", "x\n", 2)])
    assert format_table([row]).splitlines()[1].endswith("Look at @nu-fifo")
