"""The llama.cpp context of :class:`~chatphase.engine.local.llama.LlamaEngine` and the record of its KV cache.

One owner for what sequence 0 of the KV cache holds: the token ids (:attr:`KvContext.tokens`, one per cell,
in position order: their count is llama.cpp's ``n_past``), the text they spell
(:attr:`KvContext.known`, :class:`~chatphase.engine.local.prefix.CacheText`) and how they were computed: the
positions where each evaluation batch began (:attr:`KvContext.batch_starts`; with flash attention on, a cell's
values depend on the batch that computed it, :mod:`chatphase.engine.exactness`). Every change to the cache goes
through here, so that llama.cpp's memory and the record never part: the turn's prefill and prefix reuse, the
overflow's cut and shift (:mod:`chatphase.engine.local.overflow_turn`), the decode loops
(:mod:`chatphase.engine.local.generation`, :mod:`chatphase.engine.local.speculative`) and the prefix store
(:mod:`chatphase.engine.local.prefix_keeper`) all talk to one :class:`KvContext`.

:meth:`KvContext.what_if` gives a copy of the record without llama.cpp: the prompt count cuts it as the turn would
cut the real one, and learns what the cache would hold, changing nothing.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import llama_cpp as lc

from chatphase.engine.exactness import last_batch_start
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
        n_ctx: the context's cells; n_batch: the most tokens one ``llama_decode`` takes; n_ubatch: the sub-batch
            llama.cpp splits it into (at most ``n_batch``).
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
        n_ubatch: int | None = None,
    ) -> None:
        self.ptr, self.mem, self.model, self.vocab = ptr, mem, model, vocab
        self.n_ctx, self.n_batch, self.shift_refusal = n_ctx, n_batch, shift_refusal
        self.n_ubatch = min(n_ubatch or n_batch, n_batch)
        self.tokens: list[int] = [] if tokens is None else tokens
        self.known = CacheText()  # the text that prefixes of ``tokens`` stand for
        # where evaluation batches began, explicit below ``_starts_end``; every cell from there to the end of
        # ``tokens`` was a one-token decode step (the decode loops append to ``tokens`` alone, at no cost here).
        # ``None``: unknown (cells restored from a prefix saved without the record)
        self._starts: list[int] | None = []
        self._starts_end = 0
        # the first cell whose keys a KV shift moved rather than computed at their position (None: none);
        # ``shift_unknown``: not known (a prefix restored from a file that does not say)
        self.shifted_from: int | None = None
        self.shift_unknown = False

    @classmethod
    def of(cls, ptr: lc.llama_context_p, model: lc.llama_model_p, vocab: Vocab) -> KvContext:
        """The context ``ptr`` of ``model`` (its sizes as llama.cpp set them), with an empty cache."""
        mem = lc.llama_get_memory(ptr)
        # the most tokens one llama_decode takes: n_batch, at most the n_ctx asked for (llama.cpp clamps it before it
        # pads n_ctx to 256): chunking by the setting instead made a prompt over a tiny n_ctx abort the process
        n_ctx, n_batch = lc.llama_n_ctx(ptr), lc.llama_n_batch(ptr)
        n_ubatch = lc.llama_n_ubatch(ptr)
        return cls(ptr, mem, model, vocab, n_ctx, n_batch, kv_shift.shift_refusal(model, mem), n_ubatch=n_ubatch)

    def what_if(self) -> KvContext:
        """A copy of the record without llama.cpp: cuts change the copy alone (the prompt count's view)."""
        out = KvContext(
            None, None, self.model, self.vocab, self.n_ctx, self.n_batch, self.shift_refusal, n_ubatch=self.n_ubatch
        )
        out.tokens[:] = self.tokens
        out.known = self.known.copy()
        out._starts = None if self._starts is None else list(self._starts)
        out._starts_end = self._starts_end
        out.shifted_from, out.shift_unknown = self.shifted_from, self.shift_unknown
        return out

    def free(self) -> None:
        """Free the llama.cpp context (idempotent)."""
        if self.ptr is not None:
            lc.llama_free(self.ptr)
            self.ptr = self.mem = None

    # -- how the cells were computed -------------------------------------------------------------
    @property
    def batch_starts(self) -> list[int] | None:
        """Every position of the cache where an evaluation batch began (an ``n_ubatch`` sub-batch of a
        ``llama_decode``; each decode step is one), sorted; ``None`` when unknown. A copy."""
        if self._starts is None:
            return None
        return [*self._starts, *range(self._starts_end, len(self.tokens))]

    def starts_below(self, n: int) -> list[int] | None:
        """:attr:`batch_starts` below position ``n`` (``None``: unknown)."""
        if self._starts is None:
            return None
        head = self._starts[: bisect_left(self._starts, n)]
        return [*head, *range(self._starts_end, min(n, len(self.tokens)))]

    def shifted_below(self, n: int) -> bool | None:
        """Whether a cell below position ``n`` holds keys moved by a shift (``None``: unknown, a restored prefix
        saved without the record)."""
        if self.shift_unknown:
            return None
        return self.shifted_from is not None and self.shifted_from < n

    def batch_evaluated(self, start: int, n_tokens: int) -> None:
        """``n_tokens`` were evaluated from position ``start`` in one ``llama_decode`` (llama.cpp cut it into
        ``n_ubatch`` sub-batches): their starts join the record. The decode loops' one-token steps need no call."""
        if self._starts is None:
            return
        if self._starts_end < start:  # the one-token steps since the last record
            self._starts.extend(range(self._starts_end, start))
        else:
            del self._starts[bisect_left(self._starts, start) :]
        self._starts.extend(range(start, start + n_tokens, self.n_ubatch))
        self._starts_end = start + n_tokens

    def exact_keep(self, keep: int) -> int:
        """The most of the first ``keep`` cells that can be kept so that evaluating the rest again in the same
        batches computes them as the run that made them did: ``keep`` itself at the end of the cache (any later
        evaluation starts a batch there), else the last batch start at or before it; ``keep`` when the record
        is unknown."""
        starts = self.batch_starts
        return keep if starts is None else last_batch_start(starts, keep, len(self.tokens))

    def _cut_record(self, start: int) -> None:
        """The cells from position ``start`` on are gone: so are their batch starts."""
        if self._starts is not None:
            del self._starts[bisect_left(self._starts, start) :]
            self._starts_end = min(self._starts_end, start)
        if self.shifted_from is not None and self.shifted_from >= start:
            self.shifted_from = None
        if start == 0:
            self._starts, self._starts_end, self.shift_unknown = [], 0, False

    # -- evaluation ------------------------------------------------------------------------------
    def decode(self, tokens: list[int]) -> bool:
        """Evaluate ``tokens`` after the cache (one ``llama_decode``, not synchronised); ``False`` on an error.
        The caller appends them to :attr:`tokens` once they count."""
        arr = (lc.llama_token * len(tokens))(*tokens)
        ok = int(lc.llama_decode(self.ptr, lc.llama_batch_get_one(arr, len(tokens)))) == 0
        if ok:
            self.batch_evaluated(len(self.tokens), len(tokens))
        return ok

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
        self._cut_record(0)

    def drop_after(self, start: int) -> bool:
        """Drop sequence 0's cells from position ``start`` on; ``False`` (nothing changed) when llama.cpp refuses
        (a recurrent memory cannot drop a tail). The text record is the caller's to truncate."""
        if self.mem is not None and not lc.llama_memory_seq_rm(self.mem, 0, start, -1):
            return False
        del self.tokens[start:]
        self._cut_record(start)
        return True

    def shift_out(self, start: int, end: int) -> bool:
        """Remove cache tokens ``[start, end)`` and move the later ones down
        (:func:`~chatphase.engine.local.kv_shift.shift_out`; a :meth:`what_if` copy cuts its record only)."""
        n = len(self.tokens)
        if not kv_shift.shift_out(self.mem, self.tokens, start, end):
            return False
        if end <= start:
            return True
        if self._starts is not None:  # the moved cells keep their batches, at their new positions
            starts = self.batch_starts or []
            gone = end - start
            self._starts = [s for s in starts if s < start] + [s - gone for s in starts if s >= end]
            self._starts_end = n - gone
        if end < n:
            self.shifted_from = start if self.shifted_from is None else min(self.shifted_from, start)
        return True

    def reusable(self, prompt: Sequence[int]) -> int:
        """The longest common prefix of the cache and ``prompt``, leaving at least one token to evaluate."""
        cache = self.tokens
        keep, limit = 0, min(len(cache), len(prompt) - 1)
        while keep < limit and cache[keep] == prompt[keep]:
            keep += 1
        return keep

    def keep_prefix(self, prompt: Sequence[int], reset: bool, exact: bool = False) -> tuple[int, str | None]:
        """Keep the longest common prefix of the cache and ``prompt`` (at least one token left to evaluate; none
        with ``reset``; with ``exact`` only up to a batch start, :meth:`exact_keep`) and drop the rest. Returns
        ``(tokens kept, why the cache could not be trimmed or None)``: ``"swa"`` or ``"recurrent"`` (a miss
        reason) when nothing could be kept."""
        keep, why = (0 if reset else self.reusable(prompt)), None
        if exact:
            keep = self.exact_keep(keep)
        if keep and (refused := self.swa_trim_refusal(keep)):
            keep, why = 0, refused  # the window before ``keep`` is gone: llama-server re-processes too
        if keep < len(self.tokens) and not self.drop_after(keep):
            lc.llama_memory_clear(self.mem, True)  # models whose memory cannot drop a tail (recurrent)
            keep, why = 0, "recurrent"
            del self.tokens[keep:]
            self._cut_record(0)
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

    def restored(
        self,
        tokens: Sequence[int],
        known: CacheText,
        starts: Sequence[int] | None = None,
        shifted_from: int | None = None,
        shift_unknown: bool = False,
    ) -> None:
        """The prefix store put the KV state of ``tokens`` (spelling ``known``) into sequence 0; ``starts`` the
        batch starts of the run that computed them (``None``: not recorded), ``shifted_from`` its first shifted
        cell (``shift_unknown``: not recorded)."""
        self.tokens[:] = tokens
        self.known = known
        n = len(self.tokens)
        if n == 0:
            self._cut_record(0)
            return
        self._starts = None if starts is None else [s for s in starts if s < n]
        self._starts_end = n
        self.shifted_from = shifted_from if shifted_from is not None and shifted_from < n else None
        self.shift_unknown = shift_unknown

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
