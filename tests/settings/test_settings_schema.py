"""One definition per setting: the flags, config keys, environment names, settings screen and reload rules
all come from the dataclass fields (:data:`chatphase.settings.schema.FIELDS`)."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from chatphase.commands.options import add_model_options, add_sampling_options, settings_from_args
from chatphase.commands.server_options import add_server_options
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import SamplingParams
from chatphase.settings.file import load_settings
from chatphase.settings.schema import BY_KEY, FIELDS, Settings, model_change, reload_keys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_model_options(p)
    add_sampling_options(p)
    add_server_options(p)
    return p


def test_every_engine_and_sampling_setting_is_one_flat_key_with_its_own_default():
    engine = [f.name for f in fields(EngineConfig) if f.metadata.get("setting", True)]
    sampling = [f.name for f in fields(SamplingParams)]
    assert [f.key for f in FIELDS if f.part == "engine"] == engine
    assert [f.key for f in FIELDS if f.part == "sampling"] == sampling
    assert len(BY_KEY) == len(FIELDS)  # no key defined twice
    assert "n_seq_max" not in BY_KEY  # chosen by the code that needs it, never by the user
    assert all(f.get(Settings()) == f.default for f in FIELDS)
    assert BY_KEY["n_ctx"].env == "CHATPHASE_N_CTX" and BY_KEY["top_k"].table == "sampling"


def test_every_engine_setting_has_a_flag_whose_dest_is_its_key():
    """A new EngineConfig field without a flag (or with a flag that fills another name) fails here."""
    dests = {a.dest for a in parser()._actions}
    assert {f.key for f in FIELDS if f.part == "engine"} <= dests
    assert {f.key for f in FIELDS if f.cli_group in ("model", "sampling", "server")} <= dests


def test_a_flag_over_a_configured_value_for_every_kind_of_setting(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('flash_attn = "off"\nthinking = "off"\nspec = "lookup"\nn_threads = 3\nop_offload = false\n')
    base = load_settings(cfg, environ={})
    assert base.engine.op_offload is False
    argv = ["--no-kv-offload", "--n-ubatch", "64", "--cache-type-k", "q8_0", "--temp", "0", "--server", "h:1"]
    s = settings_from_args(parser().parse_args(argv), base=base)
    assert (s.engine.offload_kqv, s.engine.n_ubatch, s.engine.type_k) == (False, 64, "q8_0")
    assert settings_from_args(parser().parse_args(["--no-op-offload"])).engine.op_offload is False
    assert (s.sampling.temperature, s.server, s.engine.n_threads) == (0.0, "h:1", 3)


@pytest.mark.parametrize(
    "argv, key, value",
    [
        (["--flash-attn", "auto"], "flash_attn", "auto"),
        (["--spec", "auto"], "spec", "auto"),
        (["--thinking", "auto"], "thinking", "auto"),
        (["--threads", "auto"], "n_threads", None),
        (["-ngl", "auto"], "n_gpu_layers", None),
        (["--n-gpu-layers", "AUTO"], "n_gpu_layers", None),
        (["--gpu-margin-mib", "512"], "gpu_margin_mib", 512),
    ],
)
def test_auto_on_a_flag_is_the_value_auto_unless_the_setting_takes_auto_for_chatphase_chooses(
    tmp_path, argv, key, value
):
    """``--flash-attn auto`` over ``flash_attn = "off"`` is auto (it used to be refused as ``None``), and
    ``--spec auto`` is the auto decode mode (it used to be off); only ``--threads``/``--threads-batch`` and
    ``--n-gpu-layers`` take ``auto`` for "chatphase chooses" (``None``)."""
    cfg = tmp_path / "config.toml"
    cfg.write_text('flash_attn = "off"\nthinking = "off"\nspec = "lookup"\nn_threads = 3\nn_gpu_layers = 8\n')
    s = settings_from_args(parser().parse_args(argv), base=load_settings(cfg, environ={}))
    assert BY_KEY[key].get(s) == value


def test_reload_rules_come_from_where_a_setting_lives():
    base = Settings()
    engine_change = base.with_overrides(n_ctx=2048, n_ubatch=64, type_v="q8_0", temperature=0.1, theme="nord")
    assert reload_keys(base, engine_change) == ("n_ctx", "n_ubatch", "type_v")  # every engine setting, in order
    assert not model_change(reload_keys(base, engine_change))
    assert reload_keys(base, base.with_overrides(system_prompt="Hi", thinking="off", seed=3)) == ()
    moved = base.with_overrides(models_dir="/m", n_batch=16)
    assert reload_keys(base, moved) == ("models_dir", "n_batch") and model_change(reload_keys(base, moved))


def test_overrides_take_flat_keys_and_refuse_unknown_ones():
    s = Settings().with_overrides(n_ctx=512, top_k=5, theme="nord", seed=None)
    assert (s.engine.n_ctx, s.sampling.top_k, s.theme, s.sampling.seed) == (512, 5, "nord", None)
    with pytest.raises(TypeError, match="unknown setting 'n_ctxx'"):
        Settings().with_overrides(n_ctxx=1)


def test_the_recorded_settings_keep_their_flat_shape():
    """Session files hold ``Settings.to_dict()``: engine settings at the top level, sampling in a dict."""
    d = Settings().with_overrides(n_ctx=512, temperature=0.2).to_dict()
    assert d["n_ctx"] == 512 and d["sampling"]["temperature"] == 0.2 and d["keys"] == {}
    assert "engine" not in d and "n_seq_max" not in d
    assert set(d) == {f.key for f in FIELDS if f.part != "sampling"} | {"sampling", "keys"}
