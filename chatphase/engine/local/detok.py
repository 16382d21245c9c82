"""Incremental detokenisation: token byte pieces in, whole characters out.

A multi-byte UTF-8 character (emoji, CJK) is often split across tokens; decoding each piece on its own
gives U+FFFD. :class:`IncrementalDetokenizer` keeps the incomplete tail of a character until the next
piece completes it (Python's incremental UTF-8 decoder), so text comes out whole and in order.
"""

from __future__ import annotations

import codecs


class IncrementalDetokenizer:
    """Feed ``bytes`` pieces with :meth:`feed`; get the newly completed text back (maybe ``""``)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; returns the text that is now complete."""
        return self._decoder.decode(piece)

    def flush(self) -> str:
        """End of stream: returns what is left (an unfinished character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)
