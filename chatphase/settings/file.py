"""The config file and environment layers of :class:`~chatphase.settings.schema.Settings`.

Precedence, highest first: CLI flag > environment > config file > built-in default.

- File: TOML at :func:`chatphase.system.paths.config_file` (``$CHATPHASE_CONFIG``, else the platform's).
  Keys are the settings' keys (:data:`chatphase.settings.schema.FIELDS`); the sampling ones go in a
  ``[sampling]`` table::

      model = "SmolLM2-135M-Instruct.Q4_1.gguf"
      n_ctx = 2048
      n_threads = "auto"          # optional numbers take "auto" (= chatphase chooses)
      system_prompt = "Be brief."
      [sampling]
      temperature = 0.2
      max_tokens = 256
      [keys]                      # the TUI's action ids (F1 lists them) -> keys
      "chat.stop" = "escape,ctrl+s"

  Read with :mod:`tomllib`, written with ``tomli_w``. A file that is not valid TOML, or has an unknown
  key, a value of the wrong type or out of range, is reported in one message naming the key and the
  line, and the *whole* file is ignored (built-in defaults are used), so a typo never half-applies.
- Environment: ``CHATPHASE_<KEY>`` with the key upper-cased, sampling keys included
  (``CHATPHASE_N_CTX=2048``, ``CHATPHASE_TEMPERATURE=0``, ``CHATPHASE_MODELS_DIR=~/gguf``).
  ``auto`` or empty sets an optional number back to automatic, empty an optional text (model, system
  prompt) back to none; a switch (``thinking_open``) takes ``1/true/yes/on`` or ``0/false/no/off``. A bad
  value raises :class:`UsageError`
  naming the variable, like a bad flag.
- CLI flags are applied on top by :func:`chatphase.commands.options.settings_from_args`.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import tempfile
import typing
from dataclasses import dataclass, field
from pathlib import Path

from chatphase.engine.text import inert
from chatphase.errors import UsageError
from chatphase.settings.schema import BY_KEY, FIELDS, SAMPLING_TABLE, SETTING_KEYS, Settings, with_values
from chatphase.system.paths import config_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as the tomli package
    import tomli as tomllib

KEYS_TABLE = "keys"
#: the keys allowed at the top level of the file and in its ``[sampling]`` table.
_TOP_KEYS = tuple(f.key for f in FIELDS if f.table is None)
_SAMPLING_KEYS = tuple(f.key for f in FIELDS if f.table == SAMPLING_TABLE)
_AUTO = ("", "auto", "none", "default")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ConfigProblem(ValueError):
    """One problem in the config file: ``key``, ``line`` and ``column`` (1-based) when known."""

    def __init__(self, message: str, key: str | None = None, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.key, self.line, self.column = key, line, column


def toml_error_place(exc: ValueError, text: str) -> tuple[str, int, int]:
    """``(reason, line, column)`` of a TOML syntax error (1-based). Python 3.14's ``TOMLDecodeError`` has
    ``msg``, ``lineno`` and ``colno``; before it, and in tomli (3.10), they are in the message:
    ``"Invalid value (at line 2, column 5)"``, or ``"(at end of document)"``, which is placed here after the
    last character."""
    message = str(exc)
    reason = getattr(exc, "msg", None) or re.sub(r" \(at (line \d+, column \d+|end of document)\)$", "", message)
    line, column = getattr(exc, "lineno", None), getattr(exc, "colno", None)
    if isinstance(line, int) and isinstance(column, int):
        return reason, line, column
    if m := re.search(r"\(at line (\d+), column (\d+)\)$", message):
        return reason, int(m.group(1)), int(m.group(2))
    return reason, text.count("\n") + 1, len(text) - text.rfind("\n")  # at the end (rfind: -1 on one line)


@dataclass
class ConfigReport:
    """What :func:`load_config` found: the settings, the file path, problems (one-line messages) and
    where each key's value came from (``"default"``, ``"file"`` or ``"env"``)."""

    settings: Settings
    path: Path
    problems: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)


def _is_auto(base: type, text: str) -> bool:
    """Whether ``text`` means "automatic" (``None``): empty for text settings (a model may be called
    "auto"), empty or one of :data:`_AUTO` for numbers."""
    return text == "" if base is str else text.strip().lower() in _AUTO


def coerce_value(key: str, value):
    """Check a TOML value against the setting's type; returns the value to use.

    Raises:
        ValueError: wrong type (the message says what is expected).
    """
    base, optional = BY_KEY[key].type, BY_KEY[key].optional
    if optional and isinstance(value, str) and _is_auto(base, value):
        return None
    if base is bool and isinstance(value, bool):
        return value
    if base is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if base is str and isinstance(value, str):
        return value
    want = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[base]
    if optional and base is not str:
        want += ' or "auto"'
    raise ValueError(f"expected {want}, got {value!r}")


def parse_env_value(key: str, text: str):
    """Parse an environment variable's text for ``key`` (``auto``/empty -> ``None`` if optional).

    Raises:
        ValueError: not a number where one is needed.
    """
    base, optional = BY_KEY[key].type, BY_KEY[key].optional
    if optional and _is_auto(base, text):
        return None
    if base is str:
        return text
    if base is bool:
        word = text.strip().lower()
        if word in _TRUE + _FALSE:
            return word in _TRUE
        raise ValueError(f"expected one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}, got {text!r}")
    try:
        return base(text.strip())
    except ValueError:
        raise ValueError(f"expected {'an integer' if base is int else 'a number'}, got {text!r}") from None


def _check(key: str, value) -> None:
    """Validate one value the way :meth:`Settings.validate` does (raises ValueError with its message)."""
    try:
        Settings().with_overrides(**{key: value}).validate()
    except UsageError as exc:
        raise ValueError(str(exc)) from None


def key_line(text: str, key: str, table: str | None = None) -> int | None:
    """The 1-based line where ``key`` is assigned in TOML ``text`` (in ``[table]`` or at top level,
    dotted ``table.key`` included) or, at top level, opened as a ``[key]`` table; ``None`` if not found."""
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        head = re.match(r"\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$", line)
        if head:
            current = head.group(1).strip('"')
            if table is None and current == key:
                return n
            continue
        m = re.match(r"\s*([A-Za-z0-9_.\-\"' ]+?)\s*=", line)
        if not m:
            continue
        name = m.group(1).replace('"', "").replace("'", "").replace(" ", "")
        if (current == table and name == key) or (current is None and table and name == f"{table}.{key}"):
            return n
    return None


def _suggest(key: str, choices) -> str:
    close = difflib.get_close_matches(key, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_config_text(text: str) -> dict:
    """Parse and check config TOML; returns ``{key: value}`` with sampling keys flat.

    Raises:
        ConfigProblem: invalid TOML, unknown key or table, wrong type or out-of-range value; it names the
            key and line.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        reason, at_line, column = toml_error_place(exc, text)
        key = None
        if at_line <= len(text.splitlines()):
            km = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*=", text.splitlines()[at_line - 1])
            key = km.group(1) if km else None
        raise ConfigProblem(f"invalid TOML: {reason}", key, at_line, column) from None
    out: dict = {}
    if KEYS_TABLE in doc:
        out[KEYS_TABLE] = _keys_table(doc[KEYS_TABLE], text)
    items: list[tuple[str, typing.Any, str | None]] = [
        (k, v, None) for k, v in doc.items() if k not in (SAMPLING_TABLE, KEYS_TABLE)
    ]
    samp = doc.get(SAMPLING_TABLE, {})
    if not isinstance(samp, dict):
        raise ConfigProblem("must be a table ([sampling])", SAMPLING_TABLE, key_line(text, SAMPLING_TABLE))
    items += [(k, v, SAMPLING_TABLE) for k, v in samp.items()]
    for key, value, table in items:
        allowed = _SAMPLING_KEYS if table else _TOP_KEYS
        line = key_line(text, key, table)
        name = f"{table}.{key}" if table else key
        if key not in allowed:
            where = "table" if isinstance(value, dict) else "sampling key" if table else "key"
            hint = _suggest(key, allowed) or (" (it belongs in [sampling])" if key in _SAMPLING_KEYS else "")
            raise ConfigProblem(f"unknown {where}{hint}", name, line)
        try:
            value = coerce_value(key, value)
            _check(key, value)
        except ValueError as exc:
            raise ConfigProblem(str(exc), name, line) from None
        out[key] = value
    return out


def _keys_table(value, text: str) -> dict[str, str]:
    """The ``[keys]`` table: action id -> key string (which ids exist is the TUI's to check).

    Raises:
        ConfigProblem: not a table, or a value that is not a non-empty string.
    """
    if not isinstance(value, dict):
        raise ConfigProblem("must be a table ([keys])", KEYS_TABLE, key_line(text, KEYS_TABLE))
    for action, keys in value.items():
        if not isinstance(keys, str) or not keys.strip():
            line = key_line(text, action, KEYS_TABLE)
            raise ConfigProblem(f'expected keys as a string, e.g. "ctrl+s", got {keys!r}', f"keys.{action}", line)
    return {action: keys.replace(" ", "") for action, keys in value.items()}


def env_overrides(environ: typing.Mapping[str, str] | None = None) -> dict:
    """``{key: value}`` from ``CHATPHASE_<KEY>`` variables.

    Raises:
        UsageError: a variable with a bad value (the message names the variable).
    """
    env = os.environ if environ is None else environ
    out = {}
    for f in FIELDS:
        key, var = f.key, f.env
        if var not in env:
            continue
        try:
            value = parse_env_value(key, env[var])
            if value is not None:
                _check(key, value)
        except ValueError as exc:
            raise UsageError(f"environment variable {var}: {exc}") from None
        out[key] = value
    return out


def _apply(settings: Settings, values: dict) -> Settings:
    """Like :meth:`Settings.with_overrides` but ``None`` values are applied too (``auto``), and a
    ``models_dir`` starting with ``~`` is expanded."""
    if values.get("models_dir"):
        values = values | {"models_dir": str(Path(values["models_dir"]).expanduser())}
    return with_values(settings, values)


def load_config(path: Path | None = None, environ: typing.Mapping[str, str] | None = None) -> ConfigReport:
    """Built-in defaults, then the config file (if valid), then the environment.

    ``path`` defaults to :func:`~chatphase.system.paths.config_file` (``$CHATPHASE_CONFIG`` of the process);
    ``environ`` (default ``os.environ``) supplies the ``CHATPHASE_<KEY>`` values. A missing file is fine; an unreadable or
    invalid one adds a problem message and is ignored.

    Raises:
        UsageError: a bad ``CHATPHASE_<KEY>`` environment value.
    """
    path = path or config_file()
    report = ConfigReport(Settings(), path, sources={k: "default" for k in SETTING_KEYS})
    file_values: dict = {}
    if path.exists():
        try:
            file_values = parse_config_text(path.read_text(encoding="utf-8"))
        except OSError as exc:
            report.problems.append(f"config file {path}: cannot read ({exc.strerror or exc}); using built-in defaults")
        except UnicodeDecodeError:
            report.problems.append(f"config file {path}: not UTF-8 text; using built-in defaults")
        except ConfigProblem as exc:
            where = f", line {exc.line}" if exc.line else ""
            where += f", column {exc.column}" if exc.column else ""
            key = f", key {exc.key!r}" if exc.key else ""
            report.problems.append(f"config file {path}{where}{key}: {exc}; using built-in defaults")
    env_values = env_overrides(environ)
    report.settings = _apply(_apply(report.settings, file_values), env_values)
    report.sources.update({k: "file" for k in file_values})
    report.sources.update({k: "env" for k in env_values})
    report.settings.validate()
    return report


def _stderr(message: str) -> None:
    print(inert(f"chatphase: {message}"), file=sys.stderr)  # it may quote the file's text


def load_settings(
    path: Path | None = None,
    environ: typing.Mapping[str, str] | None = None,
    on_problem: typing.Callable[[str], None] | None = _stderr,
) -> Settings:
    """The configured settings (defaults < file < environment), for the commands to start from.

    Config-file problems go to ``on_problem`` (default: one line on stderr each); the TUI passes its
    own to show a notice.

    Raises:
        UsageError: a bad ``CHATPHASE_<KEY>`` environment value.
    """
    report = load_config(path, environ)
    for message in report.problems:
        if on_problem:
            on_problem(message)
    return report.settings


def settings_to_toml(settings: Settings) -> str:
    """TOML text of the settings that differ from the built-in defaults (``None`` written as ``"auto"``)."""
    import tomli_w

    default = Settings()
    top: dict = {}
    samp: dict = {}
    for f in FIELDS:
        v = f.get(settings)
        if v != f.get(default):
            (samp if f.table == SAMPLING_TABLE else top)[f.key] = "auto" if v is None else v
    if samp:
        top[SAMPLING_TABLE] = samp
    if settings.keys:
        top[KEYS_TABLE] = dict(settings.keys)
    return tomli_w.dumps(top)


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write the settings to the config file atomically (temp file + rename); returns the path.

    Raises:
        UsageError: the settings are invalid or the file cannot be written.
    """
    settings.validate()
    path = path or config_file()
    text = "# chatphase settings ; only values that differ from the defaults\n"
    text += settings_to_toml(settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".toml", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot write config file {path}: {exc.strerror or exc}") from None
    return path
