"""Test helpers for the bench tests: a scripted token-id engine with exactly known timings."""

from __future__ import annotations

from collections.abc import Iterator

from fake_engine import fake_model_info

from chatphase.engine.events import (
    EngineFailed,
    FirstToken,
    LoadedModel,
    LoadedSettings,
    ModelLoaded,
    PrefillStarted,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.metrics import compute_turn_metrics

MS = 1_000_000


class ScriptedTokenEngine:
    """An :class:`~chatphase.engine.base.Engine` for ``prompt_token_ids`` requests with scripted clocks.

    Costs (virtual ms): a turn spends ``fixed_ms`` before prefill, ``prefill_ms_per_token`` per evaluated
    token, and each later generated token ``decode_ms`` + ``decode_ms_per_depth`` × tokens in the cache.
    It keeps a pretend KV cache with longest-common-prefix reuse like the real engine, and records every
    request. ``cancel_after`` cancels itself after that many turns (to test a cancelled sweep).
    """

    def __init__(
        self,
        fixed_ms=5.0,
        prefill_ms_per_token=1.0,
        decode_ms=10.0,
        decode_ms_per_depth=0.01,
        kv_bytes_per_token=100,
        fail_on_turn=None,
        cancel_after=None,
        layers_offloaded=0,
    ):
        self.fixed_ms, self.prefill_ms, self.decode_ms, self.depth_ms = (
            fixed_ms,
            prefill_ms_per_token,
            decode_ms,
            decode_ms_per_depth,
        )
        self.kv = kv_bytes_per_token
        self.requests: list[TurnRequest] = []
        self.cache: list[int] = []
        self.cancelled = False
        self.closed = False
        self.fail_on_turn = fail_on_turn
        self.cancel_after = cancel_after
        self.layers_offloaded = layers_offloaded

    def load(self) -> Iterator:
        info = fake_model_info()
        yield ModelLoaded(
            LoadedModel(
                info=info,
                settings=LoadedSettings(n_ctx=4096, n_threads=2),
                load_ms=1.0,
                kv_bytes_per_token=self.kv,
                kv_capacity_bytes=self.kv * 4096,
                layers_offloaded=self.layers_offloaded,
            )
        )

    def run_turn(self, req: TurnRequest) -> Iterator:
        self.requests.append(req)
        if self.fail_on_turn is not None and len(self.requests) == self.fail_on_turn:
            yield EngineFailed("scripted failure", req.turn_id)
            return
        if self.cancel_after is not None and len(self.requests) > self.cancel_after:
            self.cancelled = True
        prompt = list(req.prompt_token_ids)
        keep = 0
        if not req.reset_cache:
            while keep < min(len(self.cache), len(prompt) - 1) and self.cache[keep] == prompt[keep]:
                keep += 1
        self.cache = prompt[:keep]
        t0 = len(self.requests) * 10**12
        t_pre = t0 + int(self.fixed_ms * MS)
        todo = len(prompt) - keep
        t_end = t_pre + int(todo * self.prefill_ms * MS)
        yield PrefillStarted(req.turn_id, len(prompt), keep, todo, 0, t_pre)
        self.cache = list(prompt)
        times = [t_end]
        stop = "length"
        if self.cancelled:
            stop = "cancelled"
        else:
            while len(times) < req.sampling.max_tokens:
                self.cache.append(7)
                times.append(times[-1] + int((self.decode_ms + self.depth_ms * len(self.cache)) * MS))
        yield FirstToken(req.turn_id, "x", (t_end - t0) / MS, t_end)
        if len(times) > 1:
            yield TokensDecoded(req.turn_id, "x" * (len(times) - 1), len(times) - 1, len(times), times[-1])
        m = compute_turn_metrics(
            t_submit_ns=t0,
            t_prefill_start_ns=t_pre,
            t_prefill_end_ns=t_end,
            token_times_ns=times,
            prompt_tokens=len(prompt),
            cached_tokens=keep,
            kv_cache_tokens=len(self.cache),
            kv_bytes_per_token=self.kv,
            kv_capacity_bytes=self.kv * 4096,
            stop_reason=stop,
        )
        yield TurnFinished(req.turn_id, "", m)

    def cancel(self) -> None:
        self.cancelled = True

    def close(self) -> None:
        self.closed = True


class CharTokenizer:
    """A byte-level toy tokenizer (one token per UTF-8 byte, id = byte + 10; BOS = 1)."""

    def __init__(self, bos: bool = True):
        self.bos = bos

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return ([1] if add_bos and self.bos else []) + [b + 10 for b in text]

    def detokenize(self, tokens, prev_tokens=None, special: bool = False) -> bytes:
        return bytes(t - 10 for t in tokens if t >= 10)


class ScriptedBatchEngine:
    """A batched engine (``run_batch``) with scripted clocks, for the parallel sweep's tests.

    A run of N sequences spends ``prefill_ms_per_token`` per prompt token (all prompts in one chunk), then
    each step ``step_ms + step_ms_per_seq × N`` (virtual ms). It records every request; ``cancel_after``
    cancels itself after that many runs; ``fail_on_run`` makes that run end with ``stop_reason="error"``;
    ``info`` the model it loads (default :func:`fake_model_info`, Q4_1 weights).
    """

    def __init__(
        self,
        prefill_ms_per_token=0.5,
        step_ms=10.0,
        step_ms_per_seq=1.0,
        kv_bytes_per_token=100,
        cancel_after=None,
        fail_on_run=None,
        info=None,
    ):
        self.prefill_ms, self.step_ms, self.step_ms_per_seq = prefill_ms_per_token, step_ms, step_ms_per_seq
        self.kv = kv_bytes_per_token
        self.requests: list = []
        self.cancelled = self.closed = False
        self.cancel_after, self.fail_on_run = cancel_after, fail_on_run
        self.info = info or fake_model_info()

    def load(self) -> Iterator:
        yield ModelLoaded(
            LoadedModel(
                info=self.info,
                settings=LoadedSettings(n_ctx=4096, n_threads=2, n_seq_max=16),
                load_ms=1.0,
                kv_bytes_per_token=self.kv,
                kv_capacity_bytes=self.kv * 4096,
                layers_offloaded=0,
            )
        )

    def run_batch(self, req):
        from chatphase.engine.batching import BatchOutcome

        self.requests.append(req)
        if self.cancel_after is not None and len(self.requests) > self.cancel_after:
            self.cancelled = True
        n, steps = len(req.prompts), req.gen_steps
        t0 = len(self.requests) * 10**12
        prompt = sum(len(p) for p in req.prompts)
        t_pre = t0 + int(prompt * self.prefill_ms * MS)
        step = int((self.step_ms + self.step_ms_per_seq * n) * MS)
        ends = () if self.cancelled else tuple(t_pre + step * (i + 1) for i in range(steps))
        stop = "cancelled" if self.cancelled else "error" if len(self.requests) == self.fail_on_run else "length"
        cells = prompt + n * len(ends)
        return BatchOutcome(
            n_seq=n,
            prompt_tokens=prompt,
            t_prefill_start_ns=t0,
            t_prefill_end_ns=t_pre,
            first_token_ns=(t_pre,) * n,
            t_decode_start_ns=t_pre,
            step_end_ns=ends,
            decode_batch_tokens=(n,) * len(ends),
            tokens=tuple((7,) * (len(ends) + 1) for _ in range(n)),
            texts=("x" * (len(ends) + 1),) * n,
            kv_cache_tokens=cells,
            kv_cache_bytes=cells * self.kv,
            stop_reason=stop,
            error="scripted failure" if stop == "error" else "",
        )

    def cancel(self) -> None:
        self.cancelled = True

    def close(self) -> None:
        self.closed = True
