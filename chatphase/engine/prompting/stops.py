"""End-of-turn markers written as text: stop there, and keep them out of the reply.

A format's end-of-turn marker (``<end_of_turn>``, ``<|im_end|>``, ``\\nUser:``) is usually one
end-of-generation token, which the engine's EOG check stops on. A model prompted in a format whose
markers are not tokens of its vocabulary writes them as several ordinary tokens instead, and the EOG
check never fires. :class:`StopText` watches the streamed text: text that could be the start of a
marker is held back until it is known not to be one, and the first whole marker ends the reply before it
(as ``stop`` strings do in llama.cpp's server and llama-cpp-python).
"""

from __future__ import annotations

from collections.abc import Sequence


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker`` (the text to hold
    back: the next piece may complete the marker)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class StopText:
    """Filter streamed text for the markers ``stops`` (non-empty strings)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add newly decoded text; returns the text that can be shown now. After a marker is seen,
        :attr:`stopped` is true and the text before the marker was the last returned."""
        if not self.stops or self.stopped:
            return "" if self.stopped else text
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return buf[:cut]
        keep = max(partial_suffix(buf, s) for s in self.stops)  # the longest end of buf a marker starts with
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The reply ended without a marker: the text held back is part of it."""
        out, self._held = self._held, ""
        return out
