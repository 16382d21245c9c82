"""reply_markdown: fence languages looked up among built-in Pygments lexers only, and MarkdownSegment
drawing its Markdown source (and redrawing after an append) in a tiny host app."""

from __future__ import annotations

import pygments.lexers
import pygments.plugin
import pytest
from rich.console import Console
from textual.app import App, ComposeResult
from textual.geometry import Region

from chatphase.ui.transcript import reply_markdown
from chatphase.ui.transcript.md_blocks import top_level_blocks
from chatphase.ui.transcript.reply_markdown import PLAIN, MarkdownSegment, _Markdown, fence_language


@pytest.fixture(autouse=True)
def _fresh_lookup_caches():
    """Each test starts (and leaves) the lookups uncached, so a patched Pygments is really consulted."""
    _clear_caches()
    yield
    _clear_caches()


def _clear_caches() -> None:
    fence_language.cache_clear()
    aliases = getattr(reply_markdown, "_builtin_aliases", None)
    if aliases is not None and hasattr(aliases, "cache_clear"):
        aliases.cache_clear()


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ("python", "python"),
        ("Python", "python"),
        ("Py title=x.py", "py"),
        ("  rust  ", "rust"),
        ("", PLAIN),
        (None, PLAIN),
        ("   ", PLAIN),
        ("no-such-language-xyz", PLAIN),
    ],
)
def test_fence_language(info, expected):
    assert PLAIN == "text"
    assert fence_language(info) == expected


@pytest.fixture
def no_plugin_scan(monkeypatch):
    """Make Pygments' plugin scan fail loudly (and record that it was asked)."""
    calls: list[str] = []

    def boom(*_args, **_kwargs):
        calls.append("find_plugin_lexers")
        raise AssertionError("pygments plugin lexers were scanned")

    # pygments.lexers replaces itself in sys.modules by a lazy-loading module object, so its functions
    # look the name up in the *original* module's globals: patching the attribute alone changes nothing.
    monkeypatch.setitem(pygments.lexers.get_lexer_by_name.__globals__, "find_plugin_lexers", boom)
    monkeypatch.setattr(pygments.lexers, "find_plugin_lexers", boom)
    monkeypatch.setattr(pygments.plugin, "find_plugin_lexers", boom)
    return calls


def test_fence_language_never_scans_plugins(no_plugin_scan):
    # the patch is what the lookup would hit: an unknown alias makes Pygments scan plugins
    with pytest.raises(AssertionError, match="scanned"):
        pygments.lexers.get_lexer_by_name("no-such-language-xyz")
    no_plugin_scan.clear()

    assert fence_language("no-such-language-xyz") == PLAIN
    assert fence_language("another-unknown one=two") == PLAIN
    assert fence_language("python") == "python"
    assert no_plugin_scan == []


def test_fence_language_is_cached():
    fence_language("python")
    fence_language("python")
    info = fence_language.cache_info()
    assert info.hits >= 1 and info.misses == 1


class SegmentApp(App):
    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def compose(self) -> ComposeResult:
        yield MarkdownSegment(lambda: self.source, end=len(self.source))


def segment_lines(segment: MarkdownSegment) -> list[str]:
    """The segment's drawn lines as plain text (trailing spaces stripped)."""
    width, height = segment.size
    return [strip.text.rstrip() for strip in segment.render_lines(Region(0, 0, width, height))]


async def test_segment_draws_markdown_and_redraws_after_append():
    app = SegmentApp("# Title\n\nsome *text*\n")
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        segment = app.query_one(MarkdownSegment)
        lines = segment_lines(segment)
        assert any(line.strip() == "Title" for line in lines)  # the heading, without its '#'
        assert "some text" in lines  # emphasis drawn, not its '*' markers
        assert not any("*" in line or "#" in line for line in lines)
        height = segment.region.height

        app.source += "\n- item\n"
        segment.extend(len(app.source))
        assert segment.source == "# Title\n\nsome *text*\n\n- item\n"
        await pilot.pause()
        lines = segment_lines(segment)
        assert segment.region.height > height  # the append asked for a layout
        assert any(line.strip() == "• item" for line in lines)
        assert "some text" in lines

        segment.extend(len(app.source))  # nothing to add: unchanged
        assert segment.source.endswith("- item\n")

        app.source = "plain words only\n"
        segment.show_all()
        await pilot.pause()
        lines = segment_lines(segment)
        assert "plain words only" in lines and not any("item" in line for line in lines)


async def test_segment_with_unknown_fence_language_renders_without_plugin_scan(no_plugin_scan):
    app = SegmentApp("```no-such-language-xyz\nx = 1\n```\n\n```python\ny = 2\n```\n")
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        lines = segment_lines(app.query_one(MarkdownSegment))
        assert any("x = 1" in line for line in lines)
        assert any("y = 2" in line for line in lines)
        assert no_plugin_scan == []


def test_angle_brackets_in_a_reply_are_text_not_html_that_vanishes():
    """A reply's ``<The majestic mountains>`` parsed as an HTML tag was dropped from the screen."""
    console = Console(width=60, color_system=None)
    reply = "<<The majestic mountains of my homeland>>\n\nA <b>bold</b> claim, then <div>\nx\n</div>\n\n**bold**"
    with console.capture() as out:
        console.print(_Markdown(reply))
    text = " ".join(out.get().split())
    assert "<<The majestic mountains of my homeland>>" in text and "<b>bold</b>" in text and "<div> x </div>" in text
    assert "**" not in text  # Markdown itself still renders
    blocks = [t.type for t in top_level_blocks(reply)]
    assert "html_block" not in blocks and blocks.count("paragraph_open") == 3  # the block finder parses alike


def test_numbered_items_keep_their_period_and_wrap_under_their_text():
    """Seen: the model wrote ``32. Grape``; the screen showed ``32 Grape`` (Rich draws the number alone)."""
    console = Console(width=30, color_system=None)
    with console.capture() as out:
        console.print(_Markdown("32. Grape\n33. Kiwi, a fruit with a long name to wrap"))
    lines = [line.rstrip() for line in out.get().splitlines()]
    assert lines[1:] == [" 32. Grape", " 33. Kiwi, a fruit with a long", "     name to wrap"]  # after a blank line


#: a code reply without fences, as a small model writes one: its lines would be joined into one paragraph.
UNFENCED_CODE = "def area(r):\n    pi = 3.14159\n    return pi * r * r\n\nprint(area(2))"


def test_line_breaks_the_model_wrote_are_kept_with_their_indentation():
    console = Console(width=60, color_system=None)
    with console.capture() as out:
        console.print(_Markdown(UNFENCED_CODE))
    lines = [line.rstrip() for line in out.get().splitlines()]
    assert lines[:5] == ["def area(r):", "    pi = 3.14159", "    return pi * r * r", "", "print(area(2))"]


def test_kept_line_breaks_leave_fences_lists_tables_and_trailing_spaces_as_markdown_reads_them():
    console = Console(width=60, color_system=None)
    reply = (
        "Steps:\n- one\n  still one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\nx = 1\n\n"
        "y = 2\n```\n\nend of line  \nnext *line*"
    )
    with console.capture() as out:
        console.print(_Markdown(reply))
    lines = [line.strip() for line in out.get().splitlines()]
    assert lines[0] == "Steps:"
    one = lines.index("• one")  # the item's continuation line keeps its break; the items stay items
    assert lines[one + 1 : one + 3] == ["still one", "• two"]
    assert "a  b" in lines and "1  2" in lines and not any("|" in line or "---" in line for line in lines)
    assert any(line.strip() == "x = 1" for line in lines) and any(line.strip() == "y = 2" for line in lines)
    assert "```" not in out.get()
    assert lines[-2:] == ["end of line", "next line"]
