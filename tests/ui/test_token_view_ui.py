"""The token view screen: F12 (and the palette's "View: Turn tokens") opens it on the last turn, or the turn the
dashboard shows; arrows move the selection through the prompt and the reply's time strip, the detail line says the
token; Esc closes it; a turn-less chat says why nothing opens. A snapshot at 80x24. The grid draws only the lines
in view (a 20,000-token prompt renders a screen's worth of lines, not 20,000 widgets)."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import Static
from ui_support import idle, make_app, notifications, screen_lines, send, settle, wait_for

from chatphase.engine.tokens import Piece, TurnTokens
from chatphase.ui.screens.token_grid import GapStrip, TokenGrid, TokenRef
from chatphase.ui.screens.tokens import TokenScreen


async def one_turn(pilot, text: str = "Hello there") -> None:
    await settle(pilot)
    await send(pilot, text)
    await wait_for(pilot, lambda: len(pilot.app.chat.conversation) == 2 and idle(pilot.app))


def detail(app) -> str:
    widget = app.screen.query_one("#tokens-detail", Static)
    content = widget.content if hasattr(widget, "content") else widget.renderable
    return str(content.plain if isinstance(content, Text) else content)


async def test_f12_opens_the_last_turn_moves_the_selection_and_esc_closes(tmp_path):
    app, _ = make_app(replies=["Fine thanks"])
    async with app.run_test(size=(100, 30)) as pilot:
        await one_turn(pilot)
        await pilot.press("f12")
        await wait_for(pilot, lambda: isinstance(app.screen, TokenScreen))
        screen = app.screen
        t = app.view.turn_tokens[1]
        assert screen.number == 1 and screen.tokens is t
        assert "prompt 7 tok: prefilled 7 · reply 2 tok" in "\n".join(screen_lines(app))
        assert detail(app) == f"prompt position 0 · id {t.prompt_ids[0]} · prefilled · special · «<|im_start|>»"
        await pilot.press("right")
        assert detail(app) == f"prompt position 1 · id {t.prompt_ids[1]} · prefilled · «user↵»"
        await pilot.press("down")  # the token under it on the next line: "Hello " and "there " are 12 cells
        assert screen.query_one(TokenGrid).selected == TokenRef("prompt", 4)
        await pilot.press("left")
        assert detail(app) == f"prompt position 3 · id {t.prompt_ids[3]} · prefilled · «there »"
        await pilot.press("end")  # the reply's last token: the strip follows
        assert screen.query_one(TokenGrid).selected == TokenRef("reply", 1)
        assert screen.query_one(GapStrip).cursor == 1
        assert detail(app).startswith(f"reply #1 · id {t.reply_ids[1]} · t ") and "gap " in detail(app)
        await pilot.press("tab")  # the strip
        assert screen.query_one(GapStrip).has_focus
        await pilot.press("left")
        assert screen.query_one(TokenGrid).selected == TokenRef("reply", 0) and "TTFT" in detail(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, TokenScreen))


async def test_the_palette_opens_it_for_the_turn_the_dashboard_shows(tmp_path):
    app, _ = make_app(replies=["One", "Two words"])
    async with app.run_test(size=(120, 36)) as pilot:
        await one_turn(pilot, "First")
        await send(pilot, "Second")
        await wait_for(pilot, lambda: len(app.chat.conversation) == 4 and idle(app))
        app.dashboard.show_turn(1)
        app.action_command_palette()
        await pilot.pause(0.2)
        await pilot.press(*"Turn tokens")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, TokenScreen))
        assert app.screen.number == 1
        assert app.screen.tokens.view_counts() == TurnTokens.metric_counts(app.dashboard.turns[1])


async def test_before_any_turn_it_says_why_nothing_opens():
    app, _ = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("f12")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, TokenScreen)
        assert "No token view: no turn has finished yet" in notifications(app)


async def test_an_engine_that_sends_no_tokens_says_so(monkeypatch):
    import fake_engine

    monkeypatch.setattr(fake_engine, "fake_tokens", lambda *args: None)  # as a remote server: no tokens
    app, _ = make_app(replies=["Fine"])
    async with app.run_test(size=(100, 30)) as pilot:
        await one_turn(pilot)
        await pilot.press("f12")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, TokenScreen)
        assert "No token view: no turn here carries its tokens (a remote server sends none" in notifications(app)[-1]


def big_tokens(n: int) -> TurnTokens:
    pieces = {i: Piece(f"w{i} ", False) for i in range(1000)}
    return TurnTokens(tuple(i % 1000 for i in range(n)), 0, n // 2, n - n // 2, pieces=pieces)


class GridApp(App[None]):
    def __init__(self, tokens: TurnTokens) -> None:
        super().__init__()
        self.tokens = tokens

    def compose(self) -> ComposeResult:
        yield TokenGrid(self.tokens)


async def test_a_20000_token_prompt_draws_only_the_lines_in_view(monkeypatch):
    drawn: list[int] = []
    original = TokenGrid.render_line

    def spy(self, y):
        drawn.append(y)
        return original(self, y)

    monkeypatch.setattr(TokenGrid, "render_line", spy)
    app = GridApp(big_tokens(20_000))
    async with app.run_test(size=(80, 24)) as pilot:
        grid = app.query_one(TokenGrid)
        await pilot.pause()
        assert grid.virtual_size.height > 1000  # every token laid out (about 16 a line)
        assert drawn and max(drawn) < 24
        drawn.clear()
        grid.focus()
        await pilot.press("pagedown", "pagedown", "end")
        await pilot.pause()
        assert grid.selected == TokenRef("prompt", 19_999) and grid.scroll_offset.y > 1000
        assert drawn and max(drawn) < 24 and len(drawn) < 24 * 6


async def test_a_long_prompt_s_pieces_are_measured_once_each_not_once_per_token(monkeypatch):
    """Opening and scrolling a 20,000-token prompt of 1,000 distinct pieces works out each piece's text once:
    the wrap looks widths up (it once measured every token on every resize, ~60 ms at 20,000 tokens)."""
    from chatphase.ui.screens import token_grid

    seen: list[str] = []
    original = token_grid.shown

    def counted(piece: str) -> str:
        seen.append(piece)
        return original(piece)

    monkeypatch.setattr(token_grid, "shown", counted)
    app = GridApp(big_tokens(20_000))
    async with app.run_test(size=(80, 24)) as pilot:
        grid = app.query_one(TokenGrid)
        grid.focus()
        await pilot.press("pagedown", "end")
        await pilot.resize_terminal(60, 24)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert grid.selected == TokenRef("prompt", 19_999)
    assert 0 < len(seen) <= 1000


async def test_page_down_skips_the_part_headers():
    """PageDown from the left-out tokens goes ten token lines down, the prompt's header line not counted."""
    pieces = {i: Piece(f"w{i:02d} ", False) for i in range(100)}
    tokens = TurnTokens(tuple(range(60, 100)), 0, 0, 40, left_out_ids=tuple(range(60)), pieces=pieces)
    app = GridApp(tokens)
    async with app.run_test(size=(30, 24)) as pilot:  # 7 tokens a line: 9 lines left out, 6 of the prompt
        grid = app.query_one(TokenGrid)
        grid.focus()
        await pilot.pause()
        await pilot.press("pagedown")
        assert grid.selected == TokenRef("prompt", 7)  # line 11 of tokens: the prompt's second
        await pilot.press("pagedown", "pageup")
        assert grid.selected == TokenRef("left_out", 7 * 4)  # from the last prompt line: 5 prompt, 5 left out


def test_the_token_view_at_80x24(snap_compare):
    """Turn 2 of a two-turn chat: the counts (cached and prefilled), the legend with their swatches, the prompt's
    cached tokens in sky blue and the new ones in orange, special tokens bold, the reply's two tokens and the
    time strip, the first prompt token selected."""
    app, _ = make_app(replies=["One", "Two words"])

    async def run_before(pilot):
        await one_turn(pilot, "First")
        await send(pilot, "Second")
        await wait_for(pilot, lambda: len(pilot.app.chat.conversation) == 4 and idle(pilot.app))
        await pilot.press("f12")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, TokenScreen))
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


class ScreenApp(App[None]):
    def __init__(self, tokens: TurnTokens) -> None:
        super().__init__()
        self.tokens = tokens

    def on_mount(self) -> None:
        self.push_screen(TokenScreen(3, self.tokens))


async def test_a_piece_that_holds_escape_sequences_is_drawn_inert():
    """A token's text comes from the model's vocabulary (a GGUF from anywhere): its controls are pictures and its
    brackets never markup, in the grid and in the detail line."""
    hostile = "\x1b]52;c;QUFB\x07[bold]x[/bold]\u202e"
    pieces = {1: Piece(hostile, False), 2: Piece("<|im_start|>", True)}
    tokens = TurnTokens((2, 1), 0, 0, 2, reply_ids=(1,), reply_t_ns=(5_000_000,), pieces=pieces)
    app = ScreenApp(tokens)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, TokenScreen))
        await pilot.press("right")
        text = "\n".join(screen_lines(app))
        assert "␛]52;c;QUFB␇[bold]x[/bold]�" in text and "\x1b" not in text and "\u202e" not in text
        assert detail(app) == "prompt position 1 · id 1 · prefilled · «␛]52;c;QUFB␇[bold]x[/bold]�»"


async def test_an_attached_file_s_tokens_are_italic_and_the_detail_names_the_file():
    pieces = [
        "<|im_start|>",
        "user\n",
        "Sum it\n\n",
        '<file name="notes.txt" bytes="6">\n',
        "cats",
        " fly",
        "\n</file>",
    ]
    tokens = TurnTokens(range(len(pieces)), 0, 0, len(pieces),
                        pieces={i: Piece(p, i == 0) for i, p in enumerate(pieces)})  # fmt: skip
    app = ScreenApp(tokens)
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, TokenScreen))
        assert "italic a file's text" in "\n".join(screen_lines(app))
        await pilot.press("right", "right", "right", "right")
        assert detail(app) == "prompt position 4 · id 4 · prefilled · from notes.txt · «cats»"
        await pilot.press("right", "right")
        assert detail(app) == "prompt position 6 · id 6 · prefilled · «↵</file>»"
        grid = app.screen.query_one(TokenGrid)
        assert [bool(grid._style(i).italic) for i in range(len(pieces))] == [False] * 4 + [True, True] + [False]


async def test_a_reasoning_model_s_thinking_has_its_own_colour_on_the_strip_and_in_the_detail():
    pieces = {1: Piece("hm", False), 2: Piece("so", False), 3: Piece("Paris", False)}
    tokens = TurnTokens((1,), 0, 0, 1, reply_ids=(1, 2, 3), reply_t_ns=(10**7, 2 * 10**7, 3 * 10**7), pieces=pieces,
                        thinking_tokens=2)  # fmt: skip
    app = ScreenApp(tokens)
    async with app.run_test(size=(100, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, TokenScreen))
        lines = "\n".join(screen_lines(app))
        assert "thinking" in lines and "reply 3 tok (thinking 2)" in lines
        strip = app.screen.query_one(GapStrip)
        assert [s.color.triplet.hex for s in strip._styles] == ["#f0e442", "#f0e442", "#e69f00"]
        await pilot.press("end")
        assert "thinking" not in detail(app)
        await pilot.press("left")
        assert detail(app).startswith("reply #1 · id 2 · ") and " · thinking · " in detail(app)


def reference_wrap(grid: TokenGrid, width: int) -> tuple[list[int], list[int], list[int]]:
    """The wrap token by token (what the grid did before it wrapped per line): each line's first entry (-1 - part
    for a header), each entry's line and column."""
    width = max(width, 8)
    first: list[int] = []
    lines: list[int] = []
    xs: list[int] = []
    for p, (_, start, count, _) in enumerate(grid.entries.parts):
        first.append(-1 - p)
        line, x = len(first) - 1, width
        for e in range(start, start + count):
            _, cells, ends = grid._piece(grid._ids[e])
            w = min(cells, width)
            if x + w > width:
                first.append(e)
                line, x = line + 1, 0
            lines.append(line)
            xs.append(x)
            x = width if ends else x + w
    return first, lines, xs


def test_the_wrap_per_line_puts_every_token_where_the_wrap_token_by_token_did():
    """Newlines, a piece wider than the line, wide characters, specials, three parts: the same lines and columns
    at every width from 8 (the least) to 60."""
    texts = ["<|im_start|>", "user", "\n", " the", " cache", "缓存", "x" * 25, ".\n", " ", "\\xe2", "\n\n", "é"]
    pieces = {i: Piece(text, i == 0) for i, text in enumerate(texts)}
    ids = [(i * 7 + i // 5) % len(texts) for i in range(400)]
    tokens = TurnTokens(ids[:300], 40, 100, 200, left_out_ids=ids[300:340], reply_ids=ids[340:],
                        reply_t_ns=range(0, 60_000_000, 1_000_000), pieces=pieces)  # fmt: skip
    grid = TokenGrid(tokens)
    for width in range(8, 61):
        first, lines, xs = reference_wrap(grid, width)
        grid._layout(width)
        assert grid._line_first == first, width
        assert [grid._entry_line[e] for e in range(grid.entries.n)] == lines, width
        assert [grid._x(e) for e in range(grid.entries.n)] == xs, width


async def test_a_selection_move_repaints_two_lines_and_an_unchanged_line_is_the_same_strip(monkeypatch):
    """A line that did not change is handed to Textual as the very strip it had (what Textual derives from it is
    kept in it), and a move along a line repaints that line only, not the whole view."""
    app = GridApp(big_tokens(2_000))
    async with app.run_test(size=(80, 24)) as pilot:
        grid = app.query_one(TokenGrid)
        grid.focus()
        await pilot.pause()
        line3 = grid.render_line(3)
        assert grid.render_line(3) is line3
        asked: list[int] = []
        drawn: list[int] = []
        render_line, draw_line = TokenGrid.render_line, TokenGrid._draw_line

        def spy_render(self, y):
            asked.append(y)
            return render_line(self, y)

        def spy_draw(self, line, width, base):
            drawn.append(line)
            return draw_line(self, line, width, base)

        monkeypatch.setattr(TokenGrid, "render_line", spy_render)
        monkeypatch.setattr(TokenGrid, "_draw_line", spy_draw)
        await pilot.press("right")  # along the first token line (line 1: line 0 is the prompt's header)
        await pilot.pause()
        assert grid.selected == TokenRef("prompt", 1) and asked == [1] and drawn == [1]
        assert grid.render_line(3) is line3
