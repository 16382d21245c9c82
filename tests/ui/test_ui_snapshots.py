"""Snapshot tests (pytest-textual-snapshot) of the chat TUI's main states, driven by a FakeEngine.

Each FakeEngine turn has scripted timestamps, so every figure on screen is fixed. The dashboard's live
tokens/s sparkline is fed at wall-clock ticks, so these apps do not feed it (it stays empty) and the
prompt's cursor does not blink. Update with ``pytest tests/ui/test_ui_snapshots.py --snapshot-update`` and
look at the SVGs before committing them.
"""

from __future__ import annotations

from ui_support import idle, make_app, send, settle, wait_for, wait_thread

from chatphase.settings.schema import Settings

CODE_REPLY = (
    "Prefill reads the whole prompt in **one parallel pass**; decode then writes one token per step.\n\n"
    "```python\nfor token in stream:\n    print(token, end='')\n```\n\n"
    "1. prefill: compute bound\n2. decode: memory-bandwidth bound\n"
)
LONG_PROMPT = " ".join(f"word{i}" for i in range(60))


def snapshot_app(settings: Settings | None = None, **engine_kwargs):
    app, engines = make_app(settings, replies=[CODE_REPLY, "Short second answer."], **engine_kwargs)
    return app, engines


async def two_turns(pilot) -> None:
    await settle(pilot)
    await send(pilot, "What are prefill and decode?")
    await wait_for(pilot, lambda: len(pilot.app.chat.conversation) == 2 and idle(pilot.app))
    await send(pilot, "Thanks!")
    await wait_for(pilot, lambda: len(pilot.app.chat.conversation) == 4 and idle(pilot.app))
    await pilot.pause(0.3)


def test_idle(snap_compare):
    """Model loaded, nothing sent: READY badge with model name, n_ctx and load time; empty turn figures
    (dashes); KV gauge at 0 / 4,096 tok; model section (135M params, Q4_1, GPU offload off, note line);
    the footer lists Send, New line, Stop, New, Regen, Edit, Panel, Help."""
    app, _ = snapshot_app()
    assert snap_compare(app, terminal_size=(140, 40), run_before=settle)


def test_prefill_in_progress(snap_compare):
    """A 60-word message mid-prefill (n_batch 16): yellow PREFILL badge, a progress bar at 16 of 65
    prompt tokens with '16/65 tok · 32.0 ms · 500.0 tok/s', the user message and an empty reply
    marked 'prefill…'; the panel shows prompt 65 tok (0 cached) and the KV gauge at 16 tokens."""
    app, engines = snapshot_app(Settings().with_overrides(n_batch=16), hold="prefill")

    async def run_before(pilot):
        await settle(pilot)
        await send(pilot, LONG_PROMPT)
        await wait_thread(pilot, engines[0].held)
        await wait_for(pilot, lambda: "16/65" in str(pilot.app.query_one("#phase-stats").render()))
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(140, 40), run_before=run_before)
    engines[0].release()


def test_decoding(snap_compare):
    """Mid-decode after 12 tokens: green DECODE badge with '12 tok · 50.0 tok/s · TTFT 41.0 ms · Esc
    stop'; the reply's first sentence streamed as Markdown (bold 'one parallel pass') with 'decoding…'
    under it; the panel's TTFT 41.0 ms, prefill 10/10 tok and decode 12 tok · 50.0 tok/s."""
    app, engines = snapshot_app(hold="decode", hold_after_tokens=12)

    async def run_before(pilot):
        await settle(pilot)
        await send(pilot, "What are prefill and decode?")
        await wait_thread(pilot, engines[0].held)
        await wait_for(pilot, lambda: "12 tok" in str(pilot.app.query_one("#phase-stats").render()))
        reply = pilot.app.chat_log.active_reply
        await wait_for(pilot, lambda: not reply.pending)  # the redraw budget may space flushes out
        await pilot.pause(0.5)

    assert snap_compare(app, terminal_size=(140, 40), run_before=run_before)
    engines[0].release()


def test_finished_with_history(snap_compare):
    """Two finished turns: replies with a code block and a numbered list, each with its metrics line
    (turn 2 shows its cached tokens); DONE badge; the panel shows turn 2's final metrics (prompt with
    cached tokens, ITL p50/p95 20.0 ms); the dashboard's history table has rows 1 and 2; turn 2's detail ends with its predicted TTFT (TTFT pred. ms)."""
    app, _ = snapshot_app()
    assert snap_compare(app, terminal_size=(140, 40), run_before=two_turns)


def test_narrow_80x24(snap_compare):
    """The same two turns at 80×24: the side panel is hidden, the chat, phase line (DONE, TTFT,
    tokens, tok/s) and prompt stay readable; the footer fits the main keys."""
    app, _ = snapshot_app()
    assert snap_compare(app, terminal_size=(80, 24), run_before=two_turns)


def test_narrow_with_panel_light_theme(snap_compare):
    """80×24, light theme, Ctrl+B pressed: the phase panel and dashboard sit below the chat side by
    side (turn figures left, dashboard right), all legible on the light background."""
    app, _ = snapshot_app(Settings(theme="textual-light"))

    async def run_before(pilot):
        await two_turns(pilot)
        await pilot.press("ctrl+b")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
