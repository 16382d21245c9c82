"""Config file + environment layers: precedence CLI > env > file > default, and invalid files."""

from __future__ import annotations

import argparse
import os
import re

import pytest

from chatphase.commands.options import add_model_options, add_sampling_options, settings_from_args
from chatphase.engine.config import MAX_THREADS_PER_CPU
from chatphase.errors import UsageError
from chatphase.settings.file import (
    SETTING_KEYS,
    key_line,
    load_config,
    load_settings,
    save_settings,
    settings_to_toml,
    toml_error_place,
)
from chatphase.settings.schema import Settings
from chatphase.system.paths import config_file


def parse_cli(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_model_options(p)
    add_sampling_options(p)
    return p.parse_args(list(argv))


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "config.toml"
    os.environ["CHATPHASE_CONFIG"] = str(path)  # restored by conftest's monkeypatch
    return path


def effective(path, *argv: str, environ=None) -> Settings:
    return settings_from_args(parse_cli(*argv), base=load_settings(path, environ or {}))


def test_config_path_from_env(cfg):
    assert config_file() == cfg


def test_precedence_cli_over_env_over_file_over_default(cfg):
    cfg.write_text("n_ctx = 1024\nn_batch = 32\n[sampling]\ntemperature = 0.2\nmax_tokens = 100\n")
    env = {"CHATPHASE_N_CTX": "2048", "CHATPHASE_TEMPERATURE": "0.4"}
    s = effective(cfg, "--n-ctx", "512", environ=env)
    assert (s.engine.n_ctx, s.engine.n_batch, s.sampling.temperature, s.sampling.max_tokens, s.engine.n_ubatch) == (
        512,
        32,
        0.4,
        100,
        256,
    )
    s = effective(cfg, environ=env)
    assert (s.engine.n_ctx, s.sampling.temperature) == (2048, 0.4)
    s = effective(cfg)
    assert (s.engine.n_ctx, s.sampling.temperature) == (1024, 0.2)
    cfg.unlink()
    s = effective(cfg)
    assert s == Settings()
    report = load_config(cfg, {"CHATPHASE_TOP_K": "7"})
    assert report.sources["top_k"] == "env" and report.sources["n_ctx"] == "default"


def test_every_setting_key_has_an_environment_variable(cfg):
    env = {
        "CHATPHASE_MODEL": "tiny.gguf",
        "CHATPHASE_MODELS_DIR": "~/m",
        "CHATPHASE_N_THREADS": "3",
        "CHATPHASE_N_GPU_LAYERS": "-1",
        "CHATPHASE_SYSTEM_PROMPT": "Hi",
        "CHATPHASE_SEED": "42",
        "CHATPHASE_TOP_P": "0.5",
        "CHATPHASE_THEME": "gruvbox",
        "CHATPHASE_FLASH_ATTN": "off",
    }
    s = load_settings(cfg, environ=env)
    assert (
        s.model,
        s.models_dir,
        s.engine.n_threads,
        s.engine.n_gpu_layers,
        s.system_prompt,
        s.sampling.seed,
        s.sampling.top_p,
        s.theme,
        s.engine.flash_attn,
    ) == ("tiny.gguf", os.path.expanduser("~/m"), 3, -1, "Hi", 42, 0.5, "gruvbox", "off")
    assert {"model", "n_ctx", "temperature", "max_tokens", "seed", "models_dir", "theme"} <= set(SETTING_KEYS)


def test_auto_resets_optional_values(cfg):
    cfg.write_text("n_threads = 4\nn_gpu_layers = 0\n")
    s = load_settings(cfg, environ={"CHATPHASE_N_THREADS": "auto"})
    assert (s.engine.n_threads, s.engine.n_gpu_layers) == (None, 0)
    cfg.write_text('n_gpu_layers = "auto"\n')
    assert load_settings(cfg, environ={}).engine.n_gpu_layers is None
    cfg.write_text("n_gpu_layers = 12\ngpu_margin_mib = 256\n")
    s = load_settings(cfg, environ={"CHATPHASE_N_GPU_LAYERS": "auto"})
    assert (s.engine.n_gpu_layers, s.engine.gpu_margin_mib) == (None, 256)
    cfg.write_text('n_ctx = "auto"\n')  # n_ctx auto: the largest context that fits, chosen at the load
    s = load_settings(cfg, environ={})
    assert s.engine.n_ctx is None and s.engine.n_ctx_before_load == 4096
    assert load_settings(cfg, environ={"CHATPHASE_N_CTX": "2048"}).engine.n_ctx == 2048


@pytest.mark.parametrize(
    "text, line, key, words",
    [
        ("n_ctx = 1024\nn_batch = \n", 2, "n_batch", "invalid TOML"),
        ("n_ctx = 1024\n\nn_ctxx = 5\n", 3, "n_ctxx", "did you mean 'n_ctx'"),
        ("n_ctx = 8\n", 1, "n_ctx", "at least 16"),
        ('# c\nn_threads = "four"\n', 2, "n_threads", 'integer or "auto"'),
        ("theme = 'x'\n[sampling]\ntop_p = 2\n", 3, "sampling.top_p", "top_p must be in (0, 1]"),
        ("temperature = 0.1\n", 1, "temperature", "belongs in [sampling]"),
        ("[sampling]\nmax_tokens = true\n", 2, "sampling.max_tokens", "expected an integer"),
        ("n_ctx = 512\n[engine]\nn_ctx = 1\n", 2, "engine", "unknown table"),
        ('[keys]\n"chat.stop" = 3\n', 2, "keys.chat.stop", "expected keys as a string"),
    ],
)
def test_invalid_file_names_key_and_line_and_uses_defaults(cfg, capsys, text, line, key, words):
    cfg.write_text(text)
    s = load_settings(cfg, environ={"CHATPHASE_SEED": "9"})
    assert s == Settings().with_overrides(seed=9)  # the whole file ignored, the environment still applies
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("chatphase: config file")
    assert f"line {line}" in err and f"key {key!r}" in err and words in err and "using built-in defaults" in err


@pytest.mark.parametrize(
    "text, line, column",
    [
        ("n_ctx = 2048\n[sampling", 2, 10),  # the error is at the end of the document: tomllib gives no line
        ("n_ctx = 2048\ntemperature =", 2, 14),
        ('system_prompt = "abc', 1, 21),
        ("n_ctx = 1024\nn_batch = \n", 2, 11),
    ],
)
def test_a_toml_syntax_error_gives_its_line_and_column(cfg, capsys, text, line, column):
    cfg.write_text(text)
    assert load_settings(cfg, environ={}) == Settings()
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"chatphase: config file {cfg}, line {line}, column {column}") and "invalid TOML" in err


class _Py314Error(ValueError):
    """TOMLDecodeError as Python 3.14 makes it: the place in attributes as well as in the message."""

    msg, lineno, colno = "Invalid value", 3, 7


def test_toml_error_place_from_attributes_or_from_the_message():
    assert toml_error_place(_Py314Error("Invalid value (at line 3, column 7)"), "") == ("Invalid value", 3, 7)
    assert toml_error_place(ValueError("Invalid value (at line 2, column 5)"), "a\nb") == ("Invalid value", 2, 5)
    place = toml_error_place(ValueError("Unterminated string (at end of document)"), 'a = 1\nb = "x')
    assert place == ("Unterminated string", 2, 7)  # after the last character of 'b = "x'


def test_keys_table_is_read_and_saved(cfg):
    cfg.write_text('n_ctx = 1024\n[keys]\n"chat.stop" = "ctrl+s, escape"\n"app.help" = "f1"\n')
    s = load_settings(cfg, environ={})
    assert s.keys == {"chat.stop": "ctrl+s,escape", "app.help": "f1"} and s.engine.n_ctx == 1024
    save_settings(s, cfg)
    assert load_settings(cfg, environ={}) == s


def test_unreadable_file_is_a_notice_not_a_crash(cfg):
    cfg.mkdir()
    report = load_config(cfg, {})
    assert report.settings == Settings() and "cannot read" in report.problems[0]
    problems = []
    load_settings(cfg, {}, on_problem=problems.append)
    assert problems == report.problems


def test_bad_environment_value_is_a_usage_error(cfg):
    with pytest.raises(UsageError, match="CHATPHASE_N_CTX: expected an integer, got 'lots'"):
        load_settings(cfg, environ={"CHATPHASE_N_CTX": "lots"})
    with pytest.raises(UsageError, match="CHATPHASE_TEMPERATURE: temperature must be a number >= 0"):
        load_settings(cfg, environ={"CHATPHASE_TEMPERATURE": "-1"})


def test_save_and_load_round_trip(cfg):
    s = Settings().with_overrides(
        model="m.gguf",
        n_ctx=2048,
        n_threads=2,
        system_prompt='Say "hi"\nthen stop',
        temperature=0.0,
        seed=7,
        theme="nord",
    )
    save_settings(s)
    assert load_settings(cfg, environ={}) == s
    text = cfg.read_text()
    assert "[sampling]" in text and "n_batch" not in text  # only what differs from the defaults
    assert key_line(text, "seed", "sampling") is not None
    assert settings_to_toml(Settings()) == ""


def test_save_refuses_invalid_settings(cfg):
    with pytest.raises(UsageError):
        save_settings(Settings().with_overrides(n_ctx=1))
    assert not cfg.exists()


from hypothesis import given  # noqa: E402
from hypothesis import settings as hsettings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=30)


@hsettings(max_examples=60, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "model": text,
            "models_dir": st.just("/models"),
            "n_ctx": st.none() | st.integers(16, 1 << 20),
            "n_batch": st.integers(1, 4096),
            "n_threads": st.none() | st.integers(1, MAX_THREADS_PER_CPU * (os.cpu_count() or 1)),
            "n_gpu_layers": st.none() | st.integers(-1, 200),
            "flash_attn": st.sampled_from(["auto", "on", "off"]),
            "system_prompt": text,
            "theme": text,
            "temperature": st.floats(0, 5),
            "top_p": st.floats(0.01, 1),
            "top_k": st.integers(0, 500),
            "seed": st.none() | st.integers(0, 2**32),
            "max_tokens": st.integers(1, 100_000),
        },
    )
)
def test_any_valid_settings_survive_save_and_load(tmp_path_factory, values):
    path = tmp_path_factory.mktemp("cfg") / "config.toml"
    s = Settings().with_overrides(**values)
    save_settings(s, path)
    report = load_config(path, {})
    assert report.problems == [] and report.settings == s


def test_threads_auto_flag_overrides_a_configured_count(cfg):
    cfg.write_text("n_threads = 4\nn_threads_batch = 2\n")
    assert (effective(cfg).engine.n_threads, effective(cfg).engine.n_threads_batch) == (4, 2)
    s = effective(cfg, "--threads", "auto", "--threads-batch", "AUTO")
    assert (s.engine.n_threads, s.engine.n_threads_batch) == (None, None)
    assert s.engine.threads_policy() == "auto"
    s = effective(cfg, "--threads", "3", environ={"CHATPHASE_N_THREADS": "auto"})
    assert s.engine.n_threads == 3 and s.engine.threads_policy() == "fixed"
    assert Settings().engine.threads_policy() == "auto"  # the default


def test_threads_flag_refuses_words_other_than_auto(cfg, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_cli("--threads", "many")
    assert exc.value.code == 2
    assert "expected a number or auto, got 'many'" in capsys.readouterr().err
    with pytest.raises(UsageError, match="n_threads must be positive"):
        effective(cfg, "--threads", "0")
    with pytest.raises(UsageError, match=r"n_threads 999 is far more than this machine's \d+ CPUs"):
        effective(cfg, "--threads", "999")


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--temperature", "nan", "temperature must be a number >= 0 (got nan)"),
        ("--temperature", "inf", "temperature must be a number >= 0 (got inf)"),
        ("--min-p", "3", "min_p must be in [0, 1]"),
        ("--top-p", "nan", "top_p must be in (0, 1]"),
    ],
)
def test_sampling_values_that_are_not_numbers_in_range_are_refused(cfg, flag, value, words):
    with pytest.raises(UsageError, match=re.escape(words)):
        effective(cfg, flag, value)


def test_thinking_open_is_a_switch_in_the_file_the_environment_and_the_saved_file(cfg):
    assert Settings().thinking_open is False
    cfg.write_text("thinking_open = true\n")
    assert load_settings(cfg, environ={}).thinking_open is True
    assert load_settings(cfg, environ={"CHATPHASE_THINKING_OPEN": "no"}).thinking_open is False
    cfg.unlink()
    assert load_settings(cfg, environ={"CHATPHASE_THINKING_OPEN": "Yes"}).thinking_open is True
    with pytest.raises(UsageError, match="CHATPHASE_THINKING_OPEN"):
        load_settings(cfg, environ={"CHATPHASE_THINKING_OPEN": "maybe"})
    cfg.write_text('thinking_open = "yes"\n')
    report = load_config(cfg, {})
    assert report.settings.thinking_open is False and "thinking_open" in report.problems[0]
    assert "true or false" in report.problems[0]
    save_settings(Settings(thinking_open=True, thinking="off"), cfg)
    assert "thinking_open = true" in cfg.read_text() and load_settings(cfg, environ={}).thinking_open is True


def test_key_names_are_the_tuis_to_check_so_a_bad_one_does_not_spoil_the_file(cfg):
    """``chatphase ask`` loads the same file: a key Textual does not know is no config-file problem."""
    cfg.write_text('n_ctx = 1024\n[keys]\n"chat.new" = "notakey+++"\n')
    report = load_config(cfg, {})
    assert report.problems == [] and report.settings.engine.n_ctx == 1024
