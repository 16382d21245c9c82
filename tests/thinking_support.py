"""The thinking scripts the controller and TUI tests share: each reply thinks "I add them." and answers
"It is 4.", token by token (a FakeEngine plays the pieces as tokens)."""

from __future__ import annotations

from chatphase.engine.prompting.thinking import FORMATS

THINK = next(f for f in FORMATS if f.name == "think")
GPT_OSS = next(f for f in FORMATS if f.name == "gpt-oss")

#: name: (pieces, format, whether the template opened the block, the block's tokens markers included)
CASES = {
    "both tags": (["<think>", "I", " add", " them.", "</think>", "\n\n", "It", " is", " 4."], THINK, False, 5),
    "pre-opened": (["I", " add", " them.", "</think>", "\n\n", "It", " is", " 4."], THINK, True, 4),
    "split markers": (["<th", "ink>I", " add", " them.</", "thi", "nk>\n\n", "It", " is", " 4."], THINK, False, 6),
    "gpt-oss": (
        [
            "<|channel|>",
            "analysis<|message|>",
            "I add them.",
            "<|end|>",
            "<|start|>assistant",
            "<|channel|>final<|message|>",
            "It is 4.",
        ],
        GPT_OSS,
        False,
        6,
    ),
}
