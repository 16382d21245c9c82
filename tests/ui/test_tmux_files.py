"""``/file`` and ``@path`` as a user types them, in a real terminal (tmux) on the default model: Tab completes
the path, the budget line counts the draft, the files go with the message and show as one line each, a
binary file is refused with one line, and the session on disk holds the message as the model saw it."""

from __future__ import annotations

import shlex
import sys
import time

import test_ui_signals
from test_ui_signals import Tmux, records, wait_until

pytestmark = test_ui_signals.pytestmark  # the model and tmux, as there


def test_file_and_at_path_as_a_user_types_them(tmp_path):
    (tmp_path / "capitals.txt").write_text("The capital of France is Paris.\n")
    (tmp_path / "my notes.txt").write_text("Berlin is in Germany.\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01binary")
    app = [sys.executable, "-m", "chatphase", "--max-tokens", "8", "--temperature", "0", "--n-ctx", "1024"]
    term = Tmux(["sh", "-c", f"cd {shlex.quote(str(tmp_path))} && {shlex.join(app)}"])

    def screen() -> str:
        return term.tmux("capture-pane", "-p")

    def keys(*k: str, literal: bool = False) -> None:
        term.tmux("send-keys", "-t", "0", *(["-l"] if literal else []), *k)

    try:
        wait_until(lambda: "READY" in screen(), 90, "the model did not load")
        time.sleep(0.5)
        keys("/file my", literal=True)
        keys("Tab")
        wait_until(lambda: '/file "my notes.txt"' in screen(), 10, "Tab did not complete the quoted path")
        keys("Enter")
        wait_until(lambda: "Attached my notes.txt" in screen(), 10, "/file did not attach")
        keys("Where is Berlin? Read @cap", literal=True)
        keys("Tab")
        wait_until(lambda: "@capitals.txt" in screen(), 10, "Tab did not complete after @")
        wait_until(lambda: "capitals.txt · 32 B ·" in screen() and "context 0 %" in screen(), 30, "no budget line")
        keys("Enter")
        wait_until(lambda: "DONE" in screen(), 120, "the turn did not finish")
        shown = screen()
        assert "▸ 📎 my notes.txt · 22 B ·" in shown and "▸ 📎 capitals.txt · 32 B ·" in shown
        assert "▾ 📎" not in shown  # folded: one line each
        keys("Now @blob.bin", literal=True)
        keys("Enter")
        wait_until(lambda: "binary file" in screen(), 10, "the binary file was not refused")
        starts = [r for r in records() if r["type"] == "turn_start"]
        assert len(starts) == 1  # the refused message was not sent
        assert starts[0]["user"].startswith('Where is Berlin? Read @capitals.txt\n\n<file name="my notes.txt" bytes=')
        assert '<file name="capitals.txt" bytes="32">\nThe capital of France is Paris.\n\n</file>' in starts[0]["user"]
    finally:
        term.close()
