"""The llama.cpp context of :class:`~chatphase.engine.local.llama.LlamaEngine` and the record of its KV cache.

One owner for what sequence 0 of the KV cache holds: the token ids (:attr:`KvContext.tokens`, one per cell,
in position order: their count is llama.cpp's ``n_past``) and the text they spell
(:attr:`KvContext.known`, :class:`~chatphase.engine.local.prefix.CacheText`). Every change to the cache goes
through here, so that llama.cpp's memory and the record never part: the turn's prefill and prefix reuse, the
overflow's cut and shift (:mod:`chatphase.engine.local.overflow_turn`), the decode loops
(:mod:`chatphase.engine.local.generation`, :mod:`chatphase.engine.local.speculative`) and the prefix store
(:mod:`chatphase.engine.local.prefix_keeper`) all talk to one :class:`KvContext`.

:meth:`KvContext.what_if` gives a copy of the record without llama.cpp: the prompt count cuts it as the turn would
cut the real one, and learns what the cache would hold, changing nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp as lc

from chatphase.engine.local import kv_shift
from chatphase.engine.local.prefix import CacheText, encode_prompt
from chatphase.engine.local.prefix_store import common_tokens
from chatphase.engine.prompting.vocab import Vocab

#: stored prefixes as ``(tokens, text record)`` (:meth:`~chatphase.engine.local.prefix_keeper.PrefixKeeper.
#: alternatives`), which a prompt's encoding may reuse instead of the cache's.
Alternatives = Sequence[tuple[Sequence[int], CacheText]]


class KvContext:
    """A llama.cpp context (``ptr``; ``None`` in a :meth:`what_if` copy) and the record of sequence 0.

    Args:
        ptr / mem / model / vocab: the context, its memory, the model and its vocabulary.
        n_ctx: the context's cells; n_batch: the most tokens one ``llama_decode`` takes.
        shift_refusal: why llama.cpp cannot shift this cache (:func:`~chatphase.engine.local.kv_shift.
            shift_refusal`), ``None`` when it can.
        tokens: the list that mirrors the cache (it is mutated in place, never replaced: the decode loops
            hold it).
    """

    def __init__(
        self,
        ptr: lc.llama_context_p | None,
        mem: lc.llama_memory_t | None,
        model: lc.llama_model_p | None,
        vocab: Vocab,
        n_ctx: int,
        n_batch: int,
        shift_refusal: str | None = None,
        tokens: list[int] | None = None,
    ) -> None:
        self.ptr, self.mem, self.model, self.vocab = ptr, mem, model, vocab
        self.n_ctx, self.n_batch, self.shift_refusal = n_ctx, n_batch, shift_refusal
        self.tokens: list[int] = [] if tokens is None else tokens
        self.known = CacheText()  # the text that prefixes of ``tokens`` stand for

    @classmethod
    def of(cls, ptr: lc.llama_context_p, model: lc.llama_model_p, vocab: Vocab) -> KvContext:
        """The context ``ptr`` of ``model`` (its sizes as llama.cpp set them), with an empty cache."""
        mem = lc.llama_get_memory(ptr)
        # the most tokens one llama_decode takes: n_batch, at most the n_ctx asked for (llama.cpp clamps it before it
        # pads n_ctx to 256): chunking by the setting instead made a prompt over a tiny n_ctx abort the process
        n_ctx, n_batch = lc.llama_n_ctx(ptr), lc.llama_n_batch(ptr)
        return cls(ptr, mem, model, vocab, n_ctx, n_batch, kv_shift.shift_refusal(model, mem))

    def what_if(self) -> KvContext:
        """A copy of the record without llama.cpp: cuts change the copy alone (the prompt count's view)."""
        out = KvContext(None, None, self.model, self.vocab, self.n_ctx, self.n_batch, self.shift_refusal)
        out.tokens[:] = self.tokens
        out.known = self.known.copy()
        return out

    def free(self) -> None:
        """Free the llama.cpp context (idempotent)."""
        if self.ptr is not None:
            lc.llama_free(self.ptr)
            self.ptr = self.mem = None

    # -- evaluation ------------------------------------------------------------------------------
    def decode(self, tokens: list[int]) -> bool:
        """Evaluate ``tokens`` after the cache (one ``llama_decode``, not synchronised); ``False`` on an error.
        The caller appends them to :attr:`tokens` once they count."""
        arr = (lc.llama_token * len(tokens))(*tokens)
        return int(lc.llama_decode(self.ptr, lc.llama_batch_get_one(arr, len(tokens)))) == 0

    def prefill_chunk(self, chunk: list[int]) -> bool:
        """Evaluate ``chunk`` after the cache and wait for it (``llama_synchronize``: the time is the chunk's);
        the record holds it after. ``False`` (nothing recorded) on an error."""
        if not self.decode(chunk):
            return False
        lc.llama_synchronize(self.ptr)
        self.tokens.extend(chunk)
        return True

    # -- cutting ---------------------------------------------------------------------------------
    def clear(self, data: bool = True) -> None:
        """Empty every sequence (``llama_memory_clear``; ``data`` also zeroes the buffers) and the record."""
        lc.llama_memory_clear(self.mem, data)
        self.tokens.clear()
        self.known.clear()

    def drop_after(self, start: int) -> bool:
        """Drop sequence 0's cells from position ``start`` on; ``False`` (nothing changed) when llama.cpp refuses
        (a recurrent memory cannot drop a tail). The text record is the caller's to truncate."""
        if self.mem is not None and not lc.llama_memory_seq_rm(self.mem, 0, start, -1):
            return False
        del self.tokens[start:]
        return True

    def shift_out(self, start: int, end: int) -> bool:
        """Remove cache tokens ``[start, end)`` and move the later ones down
        (:func:`~chatphase.engine.local.kv_shift.shift_out`; a :meth:`what_if` copy cuts its record only)."""
        return kv_shift.shift_out(self.mem, self.tokens, start, end)

    def reusable(self, prompt: Sequence[int]) -> int:
        """The longest common prefix of the cache and ``prompt``, leaving at least one token to evaluate."""
        cache = self.tokens
        keep, limit = 0, min(len(cache), len(prompt) - 1)
        while keep < limit and cache[keep] == prompt[keep]:
            keep += 1
        return keep

    def keep_prefix(self, prompt: Sequence[int], reset: bool) -> tuple[int, str | None]:
        """Keep the longest common prefix of the cache and ``prompt`` (at least one token left to evaluate; none
        with ``reset``) and drop the rest. Returns ``(tokens kept, why the cache could not be trimmed or None)``:
        ``"swa"`` or ``"recurrent"`` (a miss reason) when nothing could be kept."""
        keep, why = (0 if reset else self.reusable(prompt)), None
        if keep and (refused := self.swa_trim_refusal(keep)):
            keep, why = 0, refused  # the window before ``keep`` is gone: llama-server re-processes too
        if keep < len(self.tokens) and not self.drop_after(keep):
            lc.llama_memory_clear(self.mem, True)  # models whose memory cannot drop a tail (recurrent)
            keep, why = 0, "recurrent"
            del self.tokens[keep:]
        return keep, why

    def swa_trim_refusal(self, keep: int) -> str | None:
        """``"swa"`` when a sliding-window cache no longer holds the cells that tokens after ``keep`` would attend
        to (its oldest position is past ``keep - n_swa``, llama-server's test), else ``None``. With llama.cpp's
        default full-size SWA cache (``swa_full``) nothing is evicted and this never refuses."""
        n_swa = lc.llama_model_n_swa(self.model) if self.model else 0
        if n_swa <= 0:
            return None
        pos_min = lc.llama_memory_seq_pos_min(self.mem, 0)
        return "swa" if pos_min > max(0, keep - n_swa) else None

    def restored(self, tokens: Sequence[int], known: CacheText) -> None:
        """The prefix store put the KV state of ``tokens`` (spelling ``known``) into sequence 0."""
        self.tokens[:] = tokens
        self.known = known

    # -- encoding --------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool, alternatives: Alternatives = ()) -> list[int]:
        """The prompt ``text`` as tokens, reusing the cached tokens for the text the cache holds
        (:func:`~chatphase.engine.local.prefix.encode_prompt`) — or a stored prefix's tokens (``alternatives``)
        where one holds more of the text than the cache does."""
        tokenize, render = self.vocab.tokenize, self.vocab.render
        tokens = encode_prompt(text, add_special, self.tokens, self.known, tokenize, render)
        if not alternatives:
            return tokens
        data = text.encode("utf-8")
        alt_tokens, alt_known = max(alternatives, key=lambda alt: alt[1].split(data)[0])
        if alt_known.split(data)[0] <= self.known.split(data)[0]:
            return tokens
        alt = encode_prompt(text, add_special, alt_tokens, alt_known, tokenize, render)
        return alt if common_tokens(alt, alt_tokens) > common_tokens(tokens, self.tokens) else tokens
