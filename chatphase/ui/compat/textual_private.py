"""Every use of Textual's private API, in one place; each because Textual 8 has no public way to do it.

- :func:`free_drawn_lines`: ``Widget._render_cache`` (the lines a widget last rendered). The chat log lets go of
  those of the entries out of view once a turn; ``Widget.refresh`` frees only the styles cache's lines.
- :func:`clear_arrangement_cache`: ``Widget._clear_arrangement_cache``. A reply that removed its children lets
  go of their placements, which a leaf never arranges again to push out (``refresh(layout=True)`` clears the
  caches of a widget's ancestors, not its own).
- :func:`release_removed_styles_caches`: ``textual._styles_cache.StylesCache.get_inner_outer``, an
  ``lru_cache(1024)`` on a method, whose keys keep each removed widget's styles cache (and its drawn lines)
  alive until 1,024 newer calls push them out; emptied once a turn (it maps two colours to two styles, and is
  refilled at the next draw).
- :func:`character_to_key`: ``textual.keys._character_to_key``, the key names Textual's input parser gives a
  character (``?`` -> ``question_mark``), which the ``[keys]`` check must match.
- The input parser (``textual._parser``, ``textual._xterm_parser``) and the name ``XTermParser`` in
  ``textual.drivers.linux_driver``, from which ``LinuxDriver.run_input_thread`` makes its parser (no hook):
  :mod:`chatphase.ui.paste_input` keeps a bracketed paste whole with them.

Guarded: a memory helper whose name is gone does nothing (``tests/ui/test_ui_memory.py`` sees the effect), the
keymap check then knows a character only by itself, and the app keeps Textual's own driver when the parser's
names are gone (:func:`input_parser_ok`). ``tests/ui/test_textual_private.py`` fails with a sentence naming the
Textual version and the missing name when a release changes one (:func:`missing`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from textual import keys
from textual.widget import Widget

try:  # the input parser's private names (PARSER_NAMES), for chatphase.ui.paste_input
    from textual._parser import ParseEOF, ParseError, Peek1, Read1, TokenCallback
    from textual._xterm_parser import BRACKETED_PASTE_END, BRACKETED_PASTE_START, XTermParser
except ImportError:  # input_parser_ok() is then False and the app keeps Textual's own driver
    pass

__all__ = [
    "BRACKETED_PASTE_END",
    "BRACKETED_PASTE_START",
    "ParseEOF",
    "ParseError",
    "Peek1",
    "Read1",
    "TokenCallback",
    "XTermParser",
    "character_to_key",
    "clear_arrangement_cache",
    "free_drawn_lines",
    "input_parser_ok",
    "linux_driver_parser",
    "missing",
    "release_removed_styles_caches",
    "textual_version",
]

#: the input parser's private names :mod:`chatphase.ui.paste_input` uses: module -> names.
PARSER_NAMES: dict[str, tuple[str, ...]] = {
    "textual._parser": ("ParseEOF", "ParseError", "Peek1", "Read1", "TokenCallback"),
    "textual._xterm_parser": ("XTermParser", "BRACKETED_PASTE_START", "BRACKETED_PASTE_END"),
    "textual.drivers.linux_driver": ("XTermParser",),
}


def textual_version() -> str:
    """The installed Textual's version."""
    return importlib.metadata.version("textual")


def _lookup(module: str, dotted: str) -> Any:
    """``module``'s ``dotted`` attribute (``A.b.c``), or ``None`` when the module or a step is gone."""
    try:
        value: Any = importlib.import_module(module)
    except ImportError:
        return None
    for part in dotted.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def missing() -> list[str]:
    """The private names above that this Textual lacks, as ``module.name`` (empty when all are there)."""
    probe = Widget()
    gone = []
    if not isinstance(getattr(getattr(probe, "_render_cache", None), "lines", None), list):
        gone.append("textual.widget.Widget._render_cache.lines")
    if not callable(getattr(probe, "_clear_arrangement_cache", None)):
        gone.append("textual.widget.Widget._clear_arrangement_cache")
    wanted = {
        "textual._styles_cache": ("StylesCache.get_inner_outer.cache_clear",),
        "textual.keys": ("_character_to_key",),
        **PARSER_NAMES,
    }
    gone += [f"{module}.{name}" for module, names in wanted.items() for name in names if _lookup(module, name) is None]
    return gone


def free_drawn_lines(widget: Widget) -> bool:
    """Empty ``widget``'s last rendered lines in place; returns whether there were any (then the caller
    refreshes it, so it renders again when next drawn)."""
    lines = getattr(getattr(widget, "_render_cache", None), "lines", None)
    if not lines:
        return False
    lines.clear()
    return True


def clear_arrangement_cache(widget: Widget) -> None:
    """Forget ``widget``'s cached placements of its children (nothing if Textual has no such cache)."""
    clear: Callable[[], None] | None = getattr(widget, "_clear_arrangement_cache", None)
    if clear is not None:
        clear()


def release_removed_styles_caches() -> None:
    """Empty ``StylesCache.get_inner_outer``'s cache (see the module docstring); nothing if it has none."""
    clear = _lookup("textual._styles_cache", "StylesCache.get_inner_outer.cache_clear")
    if clear is not None:
        clear()


def character_to_key(character: str) -> str:
    """The key name Textual's parser gives ``character`` (``?`` -> ``question_mark``); the character itself
    when this Textual has no such function."""
    convert = getattr(keys, "_character_to_key", None)
    return convert(character) if convert is not None else character


def input_parser_ok() -> bool:
    """Whether the input parser's private names are all there (else the app keeps Textual's own driver)."""
    return all(_lookup(module, name) is not None for module, names in PARSER_NAMES.items() for name in names)


@contextmanager
def linux_driver_parser(parser: type[XTermParser]) -> Iterator[None]:
    """``LinuxDriver`` makes its input parser from ``parser`` while inside (it reads its module's name
    ``XTermParser`` when its input thread starts, and Textual has no hook for it)."""
    from textual.drivers import linux_driver

    textual_parser, linux_driver.XTermParser = linux_driver.XTermParser, parser  # type: ignore[misc]
    try:
        yield
    finally:
        linux_driver.XTermParser = textual_parser  # type: ignore[misc]
