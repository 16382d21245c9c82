"""What the interference experiment measures (:class:`InterferencePlan`), checked once before any work."""

from __future__ import annotations

from dataclasses import dataclass

from chatphase.bench.core.contract import check_repetitions
from chatphase.bench.core.experiment import count_list, gen_field, plan_field, reps_field, warmup_field, whole_number
from chatphase.engine.config import MAX_SEQUENCES
from chatphase.errors import UsageError

DEFAULT_CHUNKS = (16, 64, 128)
DEFAULT_NEWCOMER_TOKENS = 512
#: tokens of each running stream's own prompt (short: the streams are mid-reply when the newcomer arrives).
RUNNING_PROMPT_TOKENS = 64


def policy_name(chunk: int | None) -> str:
    """``"whole"`` (the whole prompt first), ``"server"`` (0: a server's own batching, over ``--server``) or
    ``"chunk C"``."""
    return "whole" if chunk is None else "server" if chunk == 0 else f"chunk {chunk}"


@dataclass(frozen=True)
class InterferencePlan:
    """``n_running`` streams decode ``gen_tokens`` steps, then a newcomer's prompt of ``newcomer_tokens`` arrives and
    runs by each policy: the whole prompt first, and chunked-mixed with each chunk size of ``chunks``; after its first
    token, ``gen_tokens`` steps of all. ``reps`` counted and ``warmup`` uncounted runs of every policy, interleaved."""

    n_running: int = plan_field(
        4, flag="--interference", metavar="N", parse=whole_number, label="Streams (N)",
        help="instead: N streams decode in one context while a new prompt (--prompt-lengths P) arrives, run whole "
        "first and chunked with each of --chunks",
    )  # fmt: skip
    newcomer_tokens: int = plan_field(
        DEFAULT_NEWCOMER_TOKENS, flag="--prompt-lengths", metavar="N,N,...", parse=count_list, single=True,
        label="Newcomer tokens", help="the newcomer's prompt tokens",
    )  # fmt: skip
    chunks: tuple[int, ...] = plan_field(
        DEFAULT_CHUNKS, flag="--chunks", metavar="C,C,...", parse=count_list, label="Chunks",
        help="with --interference: prompt tokens per mixed step",
        local="the server's own batching (its -b) sets the chunk",
    )  # fmt: skip
    gen_tokens: int = gen_field(32, label="Gen steps", form=16, width="exp-w10")
    reps: int = reps_field(3, form=2, width="exp-w6")
    warmup: int = warmup_field()
    running_prompt_tokens: int = RUNNING_PROMPT_TOKENS

    def policies(self) -> list[int | None]:
        """``None`` (the whole prompt first), then each chunk size, largest first, duplicates dropped."""
        return [None, *sorted(set(self.chunks), reverse=True)]

    @property
    def total_runs(self) -> int:
        """Runs, warm-ups included."""
        return len(self.policies()) * (self.reps + self.warmup)

    def kv_cells(self) -> int:
        """KV cells a run uses: every stream's prompt and tokens, the newcomer's prompt and tokens."""
        per_stream = self.running_prompt_tokens + 2 * self.gen_tokens + 2
        return self.n_running * per_stream + self.newcomer_tokens + self.gen_tokens + 2

    def validate(self, n_ctx: int | None, n_batch: int | None = None) -> InterferencePlan:
        """``self`` when it can run in a context of ``n_ctx`` tokens and ``n_batch`` tokens a step.

        Raises:
            UsageError: one line naming the flag: reps, warm-up or steps out of range, N under 1 or N + 1 over
                llama.cpp's sequences, a chunk under 1, a prompt under 2 tokens, N + C over ``n_batch``, or the
                run over ``n_ctx``.
        """
        check_repetitions(self.reps, self.warmup, self.gen_tokens, "step")
        if not 1 <= self.n_running < MAX_SEQUENCES:
            raise UsageError(
                f"--interference: N must be 1 to {MAX_SEQUENCES - 1} running streams (got {self.n_running})"
            )
        if self.newcomer_tokens < 2:
            raise UsageError(
                f"--prompt-lengths: the newcomer's prompt needs 2 tokens or more (got {self.newcomer_tokens})"
            )
        if any(c < 1 for c in self.chunks):
            raise UsageError(f"--chunks: a chunk is 1 token or more (got {min(self.chunks)})")
        if n_batch is not None and self.n_running + 1 > n_batch:
            raise UsageError(
                f"--interference {self.n_running}: a step after the arrival decodes {self.n_running + 1} tokens, over "
                f"n_batch {n_batch} (raise --n-batch)"
            )
        if n_batch is not None and self.chunks and self.n_running + max(self.chunks) > n_batch:
            most = max(self.chunks)
            raise UsageError(
                f"--chunks {most}: a step holds {self.n_running} decode tokens + {most} prompt tokens = "
                f"{self.n_running + most}, over n_batch {n_batch} (raise --n-batch or lower the chunk)"
            )
        if n_ctx is not None and self.kv_cells() > n_ctx:
            raise UsageError(
                f"--interference {self.n_running}: the run needs {self.kv_cells():,} KV cells (streams' prompts and "
                f"tokens + the newcomer's {self.newcomer_tokens:,}), over n_ctx {n_ctx:,} — raise --n-ctx"
            )
        return self

    def to_dict(self) -> dict:
        return {
            "n_running": self.n_running,
            "newcomer_tokens": self.newcomer_tokens,
            "chunks": list(self.chunks),
            "gen_tokens": self.gen_tokens,
            "reps": self.reps,
            "warmup": self.warmup,
            "running_prompt_tokens": self.running_prompt_tokens,
        }

    @classmethod
    def from_dict(cls, data: dict) -> InterferencePlan:
        return cls(
            n_running=int(data["n_running"]),
            newcomer_tokens=int(data["newcomer_tokens"]),
            chunks=tuple(int(c) for c in data["chunks"]),
            gen_tokens=int(data["gen_tokens"]),
            reps=int(data["reps"]),
            warmup=int(data["warmup"]),
            running_prompt_tokens=int(data.get("running_prompt_tokens", RUNNING_PROMPT_TOKENS)),
        )
