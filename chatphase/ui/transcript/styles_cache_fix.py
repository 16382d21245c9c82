"""Let go of what Textual's styles caches keep of removed widgets (a Textual 8 bug worked around).

``textual._styles_cache.StylesCache.get_inner_outer`` is an ``lru_cache(1024)`` on a plain method, so its
keys hold the ``StylesCache`` it was called on: each widget's, with the drawn lines it caches (``Strip``
objects, seven small caches each). A removed widget's then stay alive until 1,024 newer calls push them
out: every widget a chat's turns mount and remove (a reply's streaming widgets, an old turn's user
message) kept its last drawing, some 30 KiB a turn. :func:`release_removed_styles_caches` empties that
cache (it only maps two colours to two styles, and is refilled at the next draw of each widget).

Private Textual API, used because there is no public one: the chat log calls it once a turn; if a
Textual version drops the cache, it does nothing (``tests/test_ui_memory.py`` checks the effect).
"""

from __future__ import annotations

from textual._styles_cache import StylesCache


def release_removed_styles_caches() -> None:
    """Empty ``StylesCache.get_inner_outer``'s cache (see the module docstring); nothing if it has none."""
    clear = getattr(getattr(StylesCache, "get_inner_outer", None), "cache_clear", None)
    if clear is not None:
        clear()
