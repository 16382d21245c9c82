"""LoadedSettings: what a loaded model runs with, typed, and the JSON it keeps in results."""

from __future__ import annotations

import pickle
from dataclasses import fields

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import REMOTE_SETTING_KEYS, LoadedSettings, TurnRequest
from chatphase.engine.process.host import Close, RunTurn, TurnDone


def test_every_resolved_engine_setting_has_a_field():
    """The local engine builds its LoadedSettings from EngineConfig.resolved(): a key without a field
    would fail every load."""
    names = {f.name for f in fields(LoadedSettings)}
    assert set(EngineConfig().resolved()) <= names
    assert set(REMOTE_SETTING_KEYS) <= names


def test_to_dict_keeps_the_keys_results_had():
    local = LoadedSettings(**EngineConfig(n_ctx=1024).resolved(), gpu_offload_supported=True)
    assert set(local.to_dict()) == set(EngineConfig().resolved()) | {
        "n_gpu_layers_why",
        "n_ctx_why",
        "use_extra_bufts",
        "gpu_offload_supported",
        "amx_detected",
        "flash_attn_enabled",
    }
    assert local.to_dict()["n_ctx"] == 1024 and not local.remote
    remote = LoadedSettings(backend="remote", server="http://h:8080", n_ctx=None, total_slots=4)
    assert remote.remote and list(remote.to_dict()) == list(REMOTE_SETTING_KEYS)
    assert remote.to_dict()["n_ctx"] is None and remote.n_batch is None


def test_pipe_messages_pickle_round_trip():
    for message in (RunTurn(TurnRequest(3), 7), Close(), TurnDone(3)):
        assert pickle.loads(pickle.dumps(message)) == message
