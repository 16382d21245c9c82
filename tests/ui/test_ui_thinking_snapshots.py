"""Snapshot tests of a reasoning model's thinking block (FakeEngine with ``<think>`` markers): streaming,
collapsed and expanded. The figures come from the engine's scripted clock, so they are fixed. Update with
``pytest tests/ui/test_ui_thinking_snapshots.py --snapshot-update`` and look at the SVGs before committing.
With ``CHATPHASE_SCREENSHOTS=1`` the streaming and collapsed states are also saved to ``screenshots/``."""

from __future__ import annotations

from ui_support import idle, make_app, send, settle, shot, wait_for, wait_thread

from chatphase.engine.prompting.thinking import FORMATS
from chatphase.settings.schema import Settings
from chatphase.ui.transcript.thinking_block import ThinkingBlock

THINK = next(f for f in FORMATS if f.name == "think")
THINKING_REPLY = (
    "<think>\nThe user asks what prefill and decode are.\n"
    "Prefill: the whole prompt in one parallel pass, compute bound.\n"
    "Decode: one token per step, each step re-reads the weights and the KV cache.\n"
    "So: two phases, two bottlenecks. Keep it short.\n</think>\n\n"
    "**Prefill** reads your whole prompt in one parallel pass; **decode** then writes the reply one token "
    "at a time, re-reading the weights for every token.\n"
)


async def answered(pilot) -> None:
    await settle(pilot)
    await send(pilot, "What are prefill and decode?")
    await wait_for(pilot, lambda: len(pilot.app.chat.conversation) == 2 and idle(pilot.app))
    await pilot.pause(0.3)


def test_thinking_streaming(snap_compare):
    """Mid-thinking after 30 tokens: the THINKING badge with '30 tok · 0.6 s · TTFT 37.0 ms'; above the
    (still empty) answer, the dimmed block 'Thinking… 30 tok · 0.6 s' over the last four lines of the
    thinking so far, with no <think> marker; the panel's thinking row '30 tok · 0.6 s'."""
    app, engines = make_app(replies=[THINKING_REPLY], thinking=THINK, hold="decode", hold_after_tokens=30)

    async def run_before(pilot):
        await settle(pilot)
        await send(pilot, "What are prefill and decode?")
        await wait_thread(pilot, engines[0].held)
        await wait_for(pilot, lambda: "30 tok" in str(pilot.app.query_one("#phase-stats").render()))
        await wait_for(pilot, lambda: "thinking" in pilot.app.panel.figures)
        await pilot.pause(0.5)
        shot(pilot.app, "thinking-streaming")

    assert snap_compare(app, terminal_size=(140, 40), run_before=run_before)
    engines[0].release()


def test_thinking_collapsed(snap_compare):
    """The finished turn: '▶ Thought for 0.8 s · 42 tok' on one dimmed line above the Markdown answer;
    DONE with TTFT and TTFA; the panel's thinking and answer rows; the history table's token column reads
    decode over think; the timeline splits decode into thinking and answer."""
    app, _ = make_app(replies=[THINKING_REPLY], thinking=THINK)

    async def run_before(pilot):
        await answered(pilot)
        shot(pilot.app, "thinking-collapsed")

    assert snap_compare(app, terminal_size=(140, 40), run_before=run_before)


def test_thinking_expanded(snap_compare):
    """thinking_open on: the block stays expanded ('▼ Thought for …'), the whole thinking text under it,
    dimmed behind a rule, then the answer."""
    app, _ = make_app(Settings(thinking_open=True), replies=[THINKING_REPLY], thinking=THINK)

    async def run_before(pilot):
        await answered(pilot)
        assert pilot.app.query_one(ThinkingBlock).expanded

    assert snap_compare(app, terminal_size=(140, 40), run_before=run_before)
