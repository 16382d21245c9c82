"""The comparison's plan: the user turns, the two sides' settings and the reply length.

A side is the run's settings (its model and engine flags) with ``KEY=VALUE`` overrides on top, by the settings'
own keys as the config file and the environment name them (``type_k=q8_0``, ``model=gemma-3-270m``,
``spec=lookup``, ``n_gpu_layers=0``): :func:`parse_side`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatphase.bench.core.contract import check_repetitions
from chatphase.bench.core.experiment import gen_field, plan_field
from chatphase.errors import UsageError

#: the most user turns one comparison sends.
MAX_TURNS = 32
#: settings a side may not change: the comparison's own (greedy replies of ``--gen`` tokens at most) and the view's.
FIXED_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "theme", "thinking_open", "keys")


def parse_side(text: str) -> dict[str, Any]:
    """``"type_k=q8_0,model=gemma"`` -> ``{"type_k": "q8_0", "model": "gemma"}``, each value read as the
    environment variable of its setting reads it (``auto`` for automatic).

    Raises:
        ValueError: not ``KEY=VALUE``, an unknown key, one the comparison fixes, or a value the setting does not
            take (its message says which).
    """
    from chatphase.settings.file import parse_env_value
    from chatphase.settings.schema import BY_KEY, Settings

    out: dict[str, Any] = {}
    for item in (i.strip() for i in text.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key:
            raise ValueError(f"expected KEY=VALUE pairs, comma-separated, like type_k=q8_0 (got {item!r})")
        if key not in BY_KEY:
            raise ValueError(f"no setting is called {key!r} (the keys are the config file's: chatphase config)")
        if key in FIXED_KEYS:
            raise ValueError(f"{key} is the comparison's own: both sides reply greedily, --gen tokens at most")
        out[key] = parse_env_value(key, value.strip())
    try:
        Settings().with_overrides(**{k: v for k, v in out.items() if k != "model"}).validate()
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    return out


def split_turns(text: str) -> tuple[str, ...]:
    """The paragraphs of ``text`` (separated by blank lines), each on one line."""
    return tuple(" ".join(p.split()) for p in text.replace("\r\n", "\n").split("\n\n") if p.strip())


def read_turns(path: str) -> tuple[str, ...]:
    """The user turns of a text file: paragraphs separated by blank lines (``-``: standard input).

    Raises:
        ValueError: an unreadable file, not UTF-8, or no turn in it.
    """
    import sys

    try:
        text = sys.stdin.read() if path == "-" else Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the turns of {path}: {getattr(exc, 'strerror', None) or exc}") from None
    turns = split_turns(text)
    if not turns:
        raise ValueError(f"{path} holds no turn (paragraphs separated by blank lines)")
    return turns


@dataclass(frozen=True)
class ComparePlan:
    """``turns`` sent in order to side A (the run's settings with ``a`` on top) and side B (A's with ``b`` on
    top), greedy replies of ``gen_tokens`` tokens at most; the sides take turns, never at once, the first
    alternating."""

    #: the Experiments tab's form (its turns are a text area of their own)
    FORM = ("b", "gen_tokens")

    turns: tuple[str, ...] = plan_field(
        flag="--compare", metavar="FILE", parse=read_turns,
        help="instead: compare two sides (--compare-b) on the user turns of FILE (paragraphs separated by blank "
        "lines), turn by turn; chatphase compare takes the turns as arguments",
    )  # fmt: skip
    b: dict = plan_field(  # noqa: RUF009  # a default_factory field
        default_factory=dict, flag="--compare-b", metavar="KEY=VALUE,...", parse=parse_side, label="Side B",
        help="with --compare: side B's settings on top of side A's, by config keys (type_k=q8_0, model=NAME)",
    )  # fmt: skip
    a: dict = plan_field(  # noqa: RUF009
        default_factory=dict, flag="--compare-a", metavar="KEY=VALUE,...", parse=parse_side,
        help="with --compare: side A's settings on top of the flags",
    )  # fmt: skip
    gen_tokens: int = gen_field(64, label="Max tokens")

    @property
    def total_runs(self) -> int:
        return 2 * len(self.turns)

    def validate(self, n_ctx: int | None, n_batch: int | None = None) -> ComparePlan:
        """Raises UsageError (one line naming the flag); returns ``self``."""
        check_repetitions(1, 0, self.gen_tokens)
        if not self.turns or any(not t.strip() for t in self.turns):
            raise UsageError("give the user turns to send (a turn is not empty)")
        if len(self.turns) > MAX_TURNS:
            raise UsageError(f"at most {MAX_TURNS} turns per comparison (got {len(self.turns)})")
        if not self.b:
            raise UsageError("give side B's settings: --compare-b KEY=VALUE (chatphase compare: --b)")
        return self

    def to_dict(self) -> dict:
        return {"turns": list(self.turns), "a": dict(self.a), "b": dict(self.b), "gen_tokens": self.gen_tokens}
