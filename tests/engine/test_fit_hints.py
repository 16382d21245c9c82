"""The hint of a refusal that does not fit n_ctx: the command line's flags, the TUI's settings screen."""

from __future__ import annotations

import pytest

from chatphase.engine.events import Message
from chatphase.engine.fit_hints import HINTS, fit_hint, for_tui
from chatphase.engine.prompting.prompt import ChatTemplate, PromptTooLong


@pytest.mark.parametrize("what", list(HINTS))
def test_the_tui_says_its_settings_key_where_the_cli_says_flags(what):
    cli = f"x is 9 tokens ({fit_hint(what)})"
    assert "--n-ctx" in cli
    tui = for_tui(cli, "Ctrl+G")
    assert tui == f"x is 9 tokens ({fit_hint(what, 'tui', 'Ctrl+G')})" and "--" not in tui and "Ctrl+G" in tui


def test_text_without_a_hint_is_kept():
    assert for_tui("the engine stopped (SIGKILL)", "F9") == "the engine stopped (SIGKILL)"


def test_the_prompts_refusal_carries_the_hint_the_tui_swaps():
    """The refusal of :meth:`ChatTemplate.fit` ends with the command line's hint, word for word."""
    template = ChatTemplate(lambda messages, _prompt, _thinking: (" ".join(m.content for m in messages), True), None)
    with pytest.raises(PromptTooLong) as caught:
        template.fit([Message("user", "a " * 50)], 10, encode=lambda text, _special: text.split(), drop=False)
    assert str(caught.value).endswith(f"({fit_hint('message')})")
    assert for_tui(str(caught.value), "F9").endswith("(raise n_ctx in F9 (Settings) or shorten the message)")
