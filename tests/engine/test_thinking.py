"""Thinking markers: finding a model's format, and splitting streamed text into thinking and answer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatphase.engine.prompting.thinking import FORMATS, ThinkingSplitter, detect_format, opened_by_prompt

THINK = next(f for f in FORMATS if f.name == "think")
GPT_OSS = next(f for f in FORMATS if f.name == "gpt-oss")
MISTRAL = next(f for f in FORMATS if f.name == "mistral")


def split(fmt, pieces, preopened=False):
    s = ThinkingSplitter(fmt, preopened)
    thinking, answer, closed = [], [], 0
    for p in pieces:
        out = s.feed(p)
        thinking.append(out.thinking)
        answer.append(out.answer)
        closed += out.closed
    tail = s.flush()
    return "".join(thinking) + tail.thinking, "".join(answer) + tail.answer, closed, s


def test_both_tags():
    assert split(THINK, ["<think>", "Let me see.", "</think>", "\n\n", "It is 4."])[:3] == (
        "Let me see.",
        "It is 4.",
        1,
    )


def test_a_block_the_template_opened_holds_only_the_closing_marker():
    thinking, answer, closed, _ = split(THINK, ["\nHmm, 2+2", " is 4.", "\n</think>\n\n", "Four."], preopened=True)
    assert (thinking, answer, closed) == ("\nHmm, 2+2 is 4.\n", "Four.", 1)


@pytest.mark.parametrize("cut", range(1, 9))
def test_a_marker_split_across_tokens_is_never_text(cut):
    text = "<think>plan</think>answer"
    pieces = [text[:cut], text[cut:12], text[12:]]
    thinking, answer, closed, _ = split(THINK, pieces)
    assert (thinking, answer, closed) == ("plan", "answer", 1)


def test_a_reply_that_ends_while_thinking_is_cut_short():
    thinking, answer, closed, s = split(THINK, ["<think>", "still going", " </thi"])
    assert (thinking, answer, closed) == ("still going </thi", "", 0)
    assert s.state == "thinking" and s.opened


def test_a_thinking_only_reply():
    thinking, answer, closed, _ = split(THINK, ["<think>all of it</think>"])
    assert (thinking, answer, closed) == ("all of it", "", 1)


def test_a_reply_without_markers_is_answer_unchanged():
    pieces = ["  Hello", " <think> is a tag", " people write."]
    assert split(THINK, pieces)[:3] == ("", "  Hello <think> is a tag people write.", 0)
    assert split(None, pieces)[:3] == ("", "".join(pieces), 0)


def test_gpt_oss_channels():
    pieces = [
        "<|channel|>",
        "analysis<|message|>",
        "User asks.",
        "<|end|>",
        "<|start|>assistant",
        "<|channel|>final<|message|>",
        "Hi!",
    ]
    assert split(GPT_OSS, pieces)[:3] == ("User asks.", "Hi!", 1)
    assert split(GPT_OSS, ["<|channel|>final<|message|>", "Direct."])[:3] == ("", "Direct.", 0)


@given(
    st.text(alphabet="ab <>/thinkTHINK[]\n", max_size=40),
    st.text(alphabet="ab <\n", max_size=30),
    st.lists(st.integers(0, 80), max_size=8),
)
def test_any_split_of_the_pieces_gives_the_one_shot_result(thought, reply, cuts):
    for fmt in (THINK, MISTRAL):
        text = f"{fmt.open}{thought.replace(fmt.close, '')}{fmt.close}{reply}"
        whole = split(fmt, [text])[:3]
        points = sorted({c % (len(text) + 1) for c in cuts})
        pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
        assert split(fmt, pieces)[:3] == whole


def test_the_format_comes_from_the_template_or_the_vocabulary():
    assert detect_format("{{ '<think>' }}{% if x %}</think>{% endif %}", lambda t: False) is THINK
    assert detect_format("chatml only", lambda t: t == "[THINK]") is MISTRAL
    assert detect_format("{{ '<|channel|>analysis<|message|>' }} ... <|end|>", lambda t: False) is GPT_OSS
    assert detect_format("<|im_start|>{{ m.content }}<|im_end|>", lambda t: False) is None
    assert detect_format(None, lambda t: False) is None


def test_opened_by_the_prompt():
    assert opened_by_prompt("<|im_start|>assistant\n<think>\n", THINK)
    assert not opened_by_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK)  # thinking off
    assert not opened_by_prompt("<|im_start|>assistant\n", THINK)
    assert not opened_by_prompt("<think>\n", None)


def test_the_tracker_counts_the_blocks_tokens_markers_included():
    from chatphase.engine.prompting.thinking import ThinkingTracker

    t = ThinkingTracker(THINK)
    pieces = ["<", "think", ">", "step", " one", "</think>", "\n\n", "Answer", "."]
    out = [t.token(p, 10 * (i + 1)) for i, p in enumerate(pieces)]
    assert t.thinking_tokens == 6 and t.t_end_ns == 60 and not t.open  # "<" … "</think>"
    assert "".join(o.thinking for o in out) == "step one" and "".join(o.answer for o in out) == "Answer."
    assert t.metrics_args() == {"thinking_tokens": 6, "t_thinking_end_ns": 60}


def test_the_tracker_without_a_block_and_with_a_budget():
    from chatphase.engine.prompting.thinking import ThinkingTracker

    plain = ThinkingTracker(THINK)
    for i, p in enumerate([" Just", " an answer"]):
        plain.token(p, i)
    assert plain.metrics_args() == {} and plain.thinking_tokens == 0
    budget = ThinkingTracker(THINK, preopened=True, budget=3)
    for i, p in enumerate(["a", "b", "c"]):
        assert not budget.over_budget()
        budget.token(p, i)
    assert budget.over_budget()
    assert budget.force_close(99).closed and budget.forced and budget.metrics_args()["t_thinking_end_ns"] == 99
    assert budget.token("Answer", 100).answer == "Answer"


def test_a_closing_marker_written_again_in_the_answer_is_dropped():
    thinking, answer, closed, _ = split(THINK, ["<think>a</think>", "I'm glad</th", "ink>\n\nyes"])
    assert (thinking, answer, closed) == ("a", "I'm glad\n\nyes", 1)


def test_a_template_that_only_opens_the_block_is_a_thinking_model():
    # the generation prompt ends with <think>; the model writes </think> itself
    template = "{% for m in messages %}{{ m.content }}{% endfor %}{{ '<|im_start|>assistant\\n<think>\\n' }}"
    assert detect_format(template, lambda t: False) is THINK
