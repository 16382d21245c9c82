"""KV-cache reuse by text (chatphase.engine.local.prefix) with a toy tokenizer, no model.

``Toy`` tokenises greedily by longest match, so re-tokenising a reply can give other ids than the
ones "generated" (``"abc"`` -> ``[abc]`` where the model sampled ``[ab, c]``), as real BPE does.
``Sim`` replays what LlamaEngine does with its cache around one turn.
"""

from __future__ import annotations

import pytest

from chatphase.engine.events import Message
from chatphase.engine.local.prefix import CacheText, common_prefix_len, encode_prompt
from chatphase.engine.prompting.chat_format import ChatFormat, renderer
from chatphase.engine.prompting.prompt import ChatTemplate

SPECIALS = {"<s>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
WORDS = ["abc", "ab", "hello", " world", "user", "assistant", "\n", "caf", "é", "Q1", "Q2"]


class Toy:
    """Greedy longest-match tokenizer: specials 0-2, words 10+, single bytes 1000+byte."""

    def __init__(self, space_prefix: bool = False):
        self.vocab = {
            **{s.encode(): i for s, i in SPECIALS.items()},
            **{w.encode(): 10 + i for i, w in enumerate(WORDS)},
            **{bytes([b]): 1000 + b for b in range(256)},
        }
        self.pieces = {i: s for s, i in self.vocab.items()}
        self.space_prefix = space_prefix  # SPM-like: a space before the first text of each call

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        data = (" " if self.space_prefix else "").encode() + text.encode()
        out = [0] if add_special else []
        i = 0
        while i < len(data):
            n = max(n for n in range(1, min(len(data) - i, 16) + 1) if data[i : i + n] in self.vocab)
            out.append(self.vocab[data[i : i + n]])
            i += n
        return out

    def render(self, token: int) -> bytes:
        return self.pieces[token]

    def ids(self, *pieces: str | bytes) -> list[int]:
        """Ids of exactly these pieces (what a model might sample)."""
        return [self.vocab[p.encode() if isinstance(p, str) else p] for p in pieces]


def chatml(messages) -> str:
    return "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in messages) + "<|im_start|>assistant\n"


class Sim:
    """The engine's cache bookkeeping for one turn: encode, keep the common token prefix, evaluate,
    generate (the last sampled token is not evaluated into the cache)."""

    def __init__(self, toy: Toy, add_special: bool = False):
        self.toy, self.add_special = toy, add_special
        self.cache: list[int] = []
        self.known = CacheText()

    def encode(self, text: str) -> list[int]:
        return encode_prompt(text, self.add_special, self.cache, self.known, self.toy.tokenize, self.toy.render)

    def turn(self, messages, generated: list[int] = ()) -> tuple[list[int], int]:
        """Returns (prompt tokens, cached tokens)."""
        text = chatml(messages)
        prompt = self.encode(text)
        keep = 0
        while keep < min(len(self.cache), len(prompt) - 1) and self.cache[keep] == prompt[keep]:
            keep += 1
        del self.cache[keep:]
        self.known.truncate(keep, text.encode())
        self.cache.extend(prompt[keep:])
        self.known.add_prompt(len(prompt), text.encode())
        evaluated = list(generated[:-1])
        self.cache.extend(evaluated)
        self.known.add_pieces(self.toy.render(t) for t in evaluated)
        return prompt, keep


def reply_text(toy: Toy, generated: list[int]) -> str:
    return b"".join(toy.render(t) for t in generated if t >= 10).decode()


def lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_common_prefix_len():
    assert common_prefix_len(b"", b"abc") == 0
    assert common_prefix_len(b"abc", b"abc") == 3
    assert common_prefix_len(b"abd", b"abc") == 2
    long = bytes(range(256)) * 40
    assert common_prefix_len(long, long + b"x") == len(long)
    assert common_prefix_len(long, long[:5000] + b"!" + long[5001:]) == 5000


def test_follow_up_reuses_the_whole_previous_turn_when_the_reply_retokenises_differently():
    toy = Toy()
    sim = Sim(toy)
    conv = [("user", "Q1")]
    # the model sampled "ab" "c" "ab" "c" " world" "hello" (the last one is sampled, not evaluated)
    gen = toy.ids("ab", "c", "ab", "c", " world", "hello")
    prompt1, keep1 = sim.turn(conv, gen)
    assert keep1 == 0 and prompt1 == toy.tokenize(chatml(conv), False)
    assert toy.tokenize(reply_text(toy, gen), False) != gen  # re-tokenising gives [abc, abc, ...]
    conv2 = conv + [("assistant", reply_text(toy, gen)), ("user", "Q2")]
    in_cache = list(sim.cache)
    # the old rule (whole prompt re-tokenised, longest common token prefix) stops at the reply's start
    assert lcp(in_cache, toy.tokenize(chatml(conv2), False)) == len(prompt1)
    prompt2, keep2 = sim.turn(conv2)
    assert prompt2[: len(in_cache)] == in_cache and keep2 == len(in_cache) == len(prompt1) + len(gen) - 1
    # the rest is the new text, tokenised on its own: "hello" + "<|im_end|>\n<|im_start|>user\nQ2..."
    assert prompt2[keep2:] == toy.tokenize(
        "hello<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n", False
    )
    assert b"".join(map(toy.render, prompt2)) == chatml(conv2).encode()


def test_regenerate_reuses_the_whole_prompt():
    toy = Toy()
    sim = Sim(toy)
    conv = [("user", "Q1"), ("assistant", "abc"), ("user", "Q2")]
    prompt1, _ = sim.turn(conv, toy.ids("ab", "c", "hello"))
    prompt2, keep = sim.turn(conv, toy.ids("hello"))  # the same conversation again
    assert prompt2 == prompt1 and keep == len(prompt1) - 1  # one token re-evaluated for the logits


def test_edited_last_user_message_reuses_up_to_the_edit():
    toy = Toy()
    sim = Sim(toy)
    gen = toy.ids("ab", "c", "hello")
    conv = [("user", "Q1"), ("assistant", "x")]
    sim.turn(conv[:1], toy.ids("x", "ab"))
    conv2 = [("user", "Q1"), ("assistant", "x"), ("user", "hello world hello world")]
    prompt2, _ = sim.turn(conv2, gen)
    conv3 = conv2[:2] + [("user", "hello world hello there")]
    prompt3, keep3 = sim.turn(conv3, gen)
    edit = chatml(conv3).index("there")
    # every token that ends before the edit is kept; the first one that reaches it is not
    ends = [len(b"".join(map(toy.render, prompt2[: i + 1]))) for i in range(len(prompt2))]
    assert keep3 == sum(1 for e in ends if e <= edit)
    assert b"".join(map(toy.render, prompt3)) == chatml(conv3).encode()


def test_special_tokens_in_the_template_and_in_a_reply():
    toy = Toy()
    sim = Sim(toy)
    conv = [("user", "Q1")]
    # with ignore_eos the model may sample <|im_end|> mid-reply: the reply's text does not show it,
    # so the cache is kept only up to it
    gen = toy.ids("ab", "<|im_end|>", "hello", "c")
    prompt1, _ = sim.turn(conv, gen)
    assert sim.known.text.endswith(b"ab<|im_end|>hello")
    conv2 = conv + [("assistant", reply_text(toy, gen)), ("user", "Q2")]
    prompt2, keep = sim.turn(conv2)
    assert keep == len(prompt1) + 1
    # the text after "ab" is tokenised on its own with the template's special tokens parsed; they
    # render as their text, so the spliced prompt is accepted (not the whole-prompt fallback)
    assert prompt2[keep : keep + 3] == toy.ids("hello", "c", "<|im_end|>") and prompt2[:keep] == toy.tokenize(
        chatml(conv), False
    ) + toy.ids("ab")


def test_multibyte_character_split_across_generated_tokens():
    toy = Toy()
    sim = Sim(toy)
    conv = [("user", "Q1")]
    e_bytes = "é".encode()
    gen = toy.ids("caf", e_bytes[:1], e_bytes[1:], " world", "c")  # "café world", é as two byte tokens
    prompt1, _ = sim.turn(conv, gen)
    assert toy.tokenize("café world", False) != gen[:-1]  # re-tokenised, é is one token
    conv2 = conv + [("assistant", reply_text(toy, gen)), ("user", "Q2")]
    _, keep = sim.turn(conv2)
    assert keep == len(prompt1) + 4  # the whole reply as sampled
    # a reply edited inside the character (è shares é's first byte): the text is split before the
    # character, never inside it; the tail's tokens then match the cache for the shared byte
    sim2 = Sim(toy)
    sim2.turn(conv, gen)
    edited = chatml(conv + [("assistant", "cafè world"), ("user", "Q2")]).encode()
    assert sim2.known.split(edited) == (len(prompt1) + 1, edited.index("è".encode()))
    prompt, keep = sim2.turn(conv + [("assistant", "cafè world"), ("user", "Q2")])
    assert keep == len(prompt1) + 2
    assert b"".join(map(toy.render, prompt)) == chatml(conv + [("assistant", "cafè world"), ("user", "Q2")]).encode()


def test_bos_stays_at_the_start_and_is_not_added_again():
    toy = Toy()
    sim = Sim(toy, add_special=True)
    conv = [("user", "Q1")]
    gen = toy.ids("ab", "c", "hello")
    prompt1, _ = sim.turn(conv, gen)
    assert prompt1[0] == 0 and prompt1.count(0) == 1
    prompt2, keep = sim.turn(conv + [("assistant", "abchello"), ("user", "Q2")])
    assert prompt2.count(0) == 1 and keep == len(prompt1) + 2


def test_falls_back_to_whole_prompt_when_nothing_matches_or_the_tail_would_change_the_text():
    toy = Toy()
    sim = Sim(toy)
    conv = [("user", "Q1")]
    sim.turn(conv, toy.ids("ab", "c", "hello"))
    other = chatml([("user", "Q2")])
    assert sim.encode(other) == toy.tokenize(other, False)
    # a tokenizer that puts a space before the text (SPM-like) would change the text at the seam
    spm = Toy(space_prefix=True)
    text = chatml(conv + [("assistant", "abchello"), ("user", "Q2")])
    assert encode_prompt(text, False, sim.cache, sim.known, spm.tokenize, spm.render) == spm.tokenize(text, False)


def test_a_cache_cut_short_keeps_only_the_boundaries_it_still_holds():
    toy = Toy()
    sim = Sim(toy)
    conv = [("user", "Q1")]
    prompt1, _ = sim.turn(conv, toy.ids("ab", "c", "hello"))
    n = len(sim.cache)
    sim.known.truncate(n - 1)  # e.g. a prefill cancelled after this many tokens
    del sim.cache[n - 1 :]
    assert sim.known.n_tokens == n - 1 and sim.known.text.endswith(b"assistant\nab")
    sim.known.truncate(len(prompt1) - 1)  # inside the prompt: its text is not recorded there
    assert sim.known.n_tokens == 0 and sim.known.text == b""
    assert sim.known.split(chatml(conv).encode()) == (0, 0)


def test_add_prompt_must_extend_the_record():
    known = CacheText()
    known.add_prompt(3, b"abc")
    with pytest.raises(ValueError):
        known.add_prompt(4, b"xyz")
    with pytest.raises(ValueError):
        known.add_prompt(3, b"abcd")
    known.add_pieces([b"d", b""])
    assert known.split(b"abcdX") == (4, 4)  # of two boundaries at the same text, the one with fewer tokens


def test_fit_counts_the_tokens_encode_gives():
    toy = Toy()
    template = ChatTemplate(renderer(ChatFormat("builtin", "chatml")), tokenize=toy.tokenize)
    messages = [Message("user", "hello"), Message("assistant", "abc"), Message("user", "Q2")]
    whole = template.fit(messages, 100)
    assert whole.tokens == toy.tokenize(whole.text, True) and whole.text == chatml(  # llama.cpp formats add BOS
        [(m.role, m.content) for m in messages]
    )
    fitted = template.fit(messages, 100, encode=lambda text, add: [7] * 5)
    assert fitted.tokens == [7] * 5 and fitted.dropped_messages == 0
    # budgets are checked against encode's tokens: 5 fit, 4 do not until messages are dropped
    calls = []
    fitted = template.fit(
        messages, 4, encode=lambda text, add: calls.append(text) or [7] * (3 if "hello" not in text else 5)
    )
    assert fitted.dropped_messages == 2 and len(fitted.tokens) == 3 and len(calls) == 2
