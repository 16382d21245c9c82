"""A synthetic model (random weights) in the TUI: its replies are dimmed under the "synthetic: timings only"
label and the model panel says so; a real model's replies carry no label."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine, fake_model_info
from textual.geometry import Region
from textual.widgets import Static
from ui_support import idle, send, wait_for

from chatphase.models.gguf_meta import SYNTHETIC_LABEL
from chatphase.settings.schema import Settings
from chatphase.ui.app import ChatPhaseApp
from chatphase.ui.transcript.reply_view import ReplyView


@pytest.mark.parametrize("synthetic", [True, False])
async def test_synthetic_replies_are_labelled_and_dimmed(synthetic):
    app = ChatPhaseApp(Settings(), fake_model_info(synthetic=synthetic), lambda info, s: FakeEngine(info, s.engine))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        await send(pilot, "hello")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 2 and idle(app), timeout_s=20)
        view = app.query_one(ReplyView)
        labels = [str(w.render()) for w in view.query(".synthetic-label").results(Static)]
        figures = app.query_one("#model-figures")
        width, height = figures.size
        panel = " ".join(
            "".join(seg.text for seg in strip) for strip in figures.render_lines(Region(0, 0, width, height))
        )
        if synthetic:
            assert view.has_class("synthetic") and labels and labels[0].startswith(SYNTHETIC_LABEL)
            assert "synthetic: timings" in panel
        else:
            assert not view.has_class("synthetic") and not labels
            assert SYNTHETIC_LABEL not in panel


async def test_a_folded_synthetic_reply_keeps_its_label():
    """A finished reply is folded into one drawing when the next one starts (reply_view.ReplyView.fold); a
    synthetic model's label must survive that, above the dimmed text."""
    app = ChatPhaseApp(Settings(), fake_model_info(synthetic=True), lambda info, s: FakeEngine(info, s.engine))
    async with app.run_test(size=(130, 40)) as pilot:
        await wait_for(pilot, lambda: idle(app))
        for n, text in enumerate(("hello", "again"), 1):
            await send(pilot, text)
            await wait_for(pilot, lambda n=n: len(app.chat.conversation) == 2 * n and idle(app), timeout_s=20)
        first = app.query(ReplyView).first()
        await wait_for(pilot, lambda: first.folded and not first.query(".reply-md"))
        labels = [str(w.render()) for w in first.query(".synthetic-label").results(Static)]
        assert labels and labels[0].startswith(SYNTHETIC_LABEL)
        assert first.query(".reply-folded")  # the text drawn below the label, dimmed by .assistant.synthetic
