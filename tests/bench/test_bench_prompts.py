"""Prompt builder: exact token counts on token boundaries, valid UTF-8, for any length and any text."""

from __future__ import annotations

import pytest
from bench_support import CharTokenizer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chatphase.bench.core.prompts import (
    EngineTokenizer,
    PromptBuilder,
    _last_complete_utf8_boundary,
)
from chatphase.engine.config import EngineConfig


@pytest.fixture(scope="module")
def vocab(default_model_info):
    """The bundled model's vocabulary, through the engine that bench uses."""
    from chatphase.engine.local.llama import LlamaEngine

    engine = LlamaEngine(default_model_info, EngineConfig(n_ctx=64))
    list(engine.load())
    yield EngineTokenizer(engine)
    engine.close()


@pytest.mark.parametrize("n", [1, 2, 3, 7, 32, 255, 256, 257, 1000, 4095])
def test_exact_counts_on_the_real_vocabulary(vocab, n):
    b = PromptBuilder(vocab)
    toks = b.tokens(n)
    assert len(toks) == n
    assert all(isinstance(t, int) for t in toks)
    b.text(toks)  # decodes as strict UTF-8


def test_prompt_is_a_prefix_of_the_tokenised_source(vocab):
    b = PromptBuilder(vocab, source_text="The quick brown fox jumps over the lazy dog. ")
    body = vocab.tokenize(b"The quick brown fox jumps over the lazy dog. ", add_bos=False)
    toks = b.tokens(len(body) * 3 + 2)
    assert list(toks[: len(body) * 3]) == body * 3  # repeated whole, cut only at token boundaries


def test_multibyte_cut_is_topped_up_with_filler_not_split():
    # one token per byte: "é" is 2 tokens, so a cut after 1 would split the character
    b = PromptBuilder(CharTokenizer(bos=True), source_text="é")
    toks = b.tokens(4)  # BOS + é (2) + one more: the next é cannot fit whole
    assert len(toks) == 4
    assert toks[0] == 1
    assert b.text(toks) == "é" + b.text((b.filler,))


def test_utf8_boundary_helper():
    assert _last_complete_utf8_boundary([b"a", b"\xc3", b"\xa9", b"\xe6"]) == 3
    assert _last_complete_utf8_boundary([b"\xf0\x9f", b"\x99"]) == 0
    assert _last_complete_utf8_boundary([]) == 0


def test_bad_inputs(vocab):
    with pytest.raises(ValueError):
        PromptBuilder(vocab, source_text="")
    with pytest.raises(ValueError):
        PromptBuilder(vocab).tokens(0)


def test_extend_keeps_the_prefix(vocab):
    b = PromptBuilder(vocab)
    base = b.tokens(100)
    ext = b.extend(base, 4)
    assert ext[:100] == base and len(ext) == 104


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=1, max_size=60).filter(lambda s: s.strip() != ""), n=st.integers(1, 700))
@example(text="\x16", n=1)  # a control character the tokenizer drops: no tokens at all
def test_property_exact_length_and_valid_utf8_for_any_text(vocab, text, n):
    """Any Unicode source (non-ASCII, emoji, combining marks) gives exactly n tokens that decode as UTF-8;
    a source the tokenizer turns into nothing is refused with ValueError."""
    if not vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False):
        with pytest.raises(ValueError, match="no tokens"):
            PromptBuilder(vocab, source_text=text)
        return
    b = PromptBuilder(vocab, source_text=text)
    toks = b.tokens(n)
    assert len(toks) == n
    decoded = b.text(toks)  # strict: raises on a split character
    assert isinstance(decoded, str)


@settings(max_examples=40, deadline=None)
@given(
    text=st.text(alphabet=st.characters(min_codepoint=0x80, blacklist_categories=("Cs",)), min_size=1, max_size=20),
    n=st.integers(1, 200),
    variant=st.integers(0, 50),
)
def test_property_byte_level_tokenizer_never_splits_characters(text, n, variant):
    """With one token per byte every non-ASCII character spans several tokens: cuts (and the start of a
    variant) must avoid them."""
    b = PromptBuilder(CharTokenizer(bos=False), source_text=text)
    toks = b.tokens(n, variant=variant)
    assert len(toks) == n
    b.text(toks)


def test_variants_are_distinct_prompts_of_the_same_length(vocab):
    b = PromptBuilder(vocab)
    prompts = [b.tokens(64, variant=j) for j in range(8)]
    assert all(len(p) == 64 for p in prompts) and len(set(prompts)) == 8
    assert prompts[0] == b.tokens(64) and all(p[: len(b.prefix)] == b.prefix for p in prompts)
    for p in prompts:
        b.text(p)
