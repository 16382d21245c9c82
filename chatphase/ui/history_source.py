"""The dashboard's *every session* plots read the history database: this model's turns from the other sessions."""

from __future__ import annotations

from chatphase.chat.recording import SessionRecording
from chatphase.history.db import connect
from chatphase.history.index import catch_up
from chatphase.history.query import model_points

#: at most this many earlier turns are drawn (the latest ones): a terminal plot shows no more.
MAX_POINTS = 5000


class EarlierTurns:
    """``history_source`` of :class:`~chatphase.ui.dashboard.dashboard.Dashboard`: called in a worker thread, it
    catches the history up with the session files and returns the model's turns outside the chat's own session
    (which the plots show already).

    Raises (when called):
        HistoryError: the database cannot be opened or written (its message is the notice).
    """

    def __init__(self, recording: SessionRecording) -> None:
        self.recording = recording

    def __call__(self, model_name: str) -> list[dict]:
        writer = self.recording.writer
        own = writer.id if writer is not None else None
        conn = connect()
        try:
            catch_up(conn)
            return model_points(conn, model_name, exclude_session=own, limit=MAX_POINTS)
        finally:
            conn.close()
