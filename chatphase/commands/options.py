"""Command-line options shared by the commands that run a model (chat, ask, bench, info)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from chatphase.errors import UsageError
from chatphase.settings.schema import BY_KEY, FIELDS, Settings, with_values

#: the value of an optional count flag that sets it back to automatic, over a config file or environment.
AUTO = "auto"


def count_or_auto(text: str) -> int | str:
    """An integer, or :data:`AUTO` (any case) for "chatphase chooses" (``--threads auto``).

    Raises:
        argparse.ArgumentTypeError: for anything else (argparse prints it as a usage error, exit 2).
    """
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or {AUTO}, got {text!r}") from None


#: appended to the help of a flag that takes a comma list (``bench``'s levers).
_MANY = " (a comma list: every combination is measured)"


def add_setting_flag(g, key: str, listed: bool = False, dest: str | None = None, **words: str) -> None:
    """Add the flag of setting ``key`` to ``g`` (a parser or argument group) as its field defines it
    (:mod:`chatphase.settings.schema`): default ``None`` (= the configured value), ``dest`` the key unless
    given; ``listed``: it takes a comma list, kept as text; ``words`` fill the help's other ``{names}``."""
    f = BY_KEY[key]
    meta = f.metadata
    text = meta.get("help")
    if text is not None:
        text = text.format(default=f.default, choices="|".join(meta.get("choices", ())), **words)
        text += _MANY if listed else ""
    if "const" in meta:
        g.add_argument(*meta["flags"], dest=dest or key, action="store_const", const=meta["const"], help=text)
        return
    kind = str if listed or f.type is str else count_or_auto if meta.get("auto") else f.type
    choices = None if listed else meta.get("choices")
    g.add_argument(*meta["flags"], dest=dest or key, type=kind, choices=choices, metavar=meta.get("metavar"), help=text)


def add_setting_flags(g, group: str, lists: tuple[str, ...] = (), **words: str) -> None:
    """Add the flags of the settings in ``group`` (their :attr:`~chatphase.settings.schema.SettingField.cli_group`),
    in declaration order, to ``g``; the keys in ``lists`` take comma lists (:func:`add_setting_flag`)."""
    for f in FIELDS:
        if f.cli_group == group:
            add_setting_flag(g, f.key, listed=f.key in lists, **words)
            if f.key == "model":
                g.add_argument(
                    "--pull", action="store_true", help="download an OWNER/NAME[:QUANT] model that is not local yet"
                )


def add_model_options(p: argparse.ArgumentParser, lists: bool = False) -> None:
    """``--model`` and the engine settings (all default to ``None`` = take the configured value).

    ``lists``: the levers of ``bench``'s grid (:data:`chatphase.bench.grid.levers.LEVERS`: ``--model``,
    ``--n-ubatch``, ``--threads``, ``--flash-attn`` and ``--cache-type-k/-v``) take comma lists, kept as
    text for the caller to split.
    """
    levers: tuple[str, ...] = ()
    if lists:
        from chatphase.bench.grid.levers import LEVERS

        levers = tuple(LEVERS)
    add_setting_flags(p.add_argument_group("model and engine"), "model", levers)


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """Sampling and conversation options."""
    add_setting_flags(p.add_argument_group("sampling"), "sampling")


def settings_from_args(args: argparse.Namespace, base: Settings | None = None) -> Settings:
    """Apply the flags the user gave (non-``None``) over ``base`` (default: the configured settings,
    :func:`chatphase.settings.file.load_settings`: config file < environment) and validate. ``auto`` sets
    a setting that takes it (``--threads auto``) back to automatic, over a configured number.

    Raises:
        UsageError: when a value is out of range, or a ``CHATPHASE_<KEY>`` variable is invalid.
    """
    if base is None:
        from chatphase.settings.file import load_settings

        base = load_settings()
    given = [(f, getattr(args, f.key)) for f in FIELDS if f.cli_group and getattr(args, f.key, None) is not None]
    values = {f.key: None if v == AUTO and f.metadata.get("auto") else v for f, v in given}
    return with_values(base, values).validate()


def refuse_flags(given: Iterable[tuple[str, object]], why: str) -> None:
    """Refuse the first flag of ``given`` (``(flag, value)`` pairs) whose value is true: ``{flag} {why}``.

    Raises:
        UsageError: that one line.
    """
    for flag, value in given:
        if value:
            raise UsageError(f"{flag} {why}")
