"""Settings changed while a chat runs (the settings screen): what they take, and how."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from chatphase.chat.controller import ChatController
from chatphase.errors import ChatPhaseError
from chatphase.models.gguf_meta import ModelInfo
from chatphase.settings.schema import Settings, model_change


def apply_settings(chat: ChatController, settings: Settings, reload_keys: Iterable[str] = ()) -> str:
    """Use new ``settings`` in ``chat``: sampling and the system prompt from the next turn; a new model (or
    models directory) or new engine settings (``reload_keys``, :func:`chatphase.settings.schema.reload_keys`)
    through a new engine, the conversation kept.
    Returns what was done, in words.

    Raises:
        ChatPhaseError: the new model cannot be used (the chat's settings stay as they were).
    """
    reload_keys = list(reload_keys)
    if model_change(reload_keys):
        from chatphase.models.gguf_meta import read_model_info
        from chatphase.models.resolve import resolve_model

        info = read_model_info(resolve_model(settings.model, settings.models_dir))
        chat.settings = settings
        chat.switch_model(info)
        return f"Loading {info.name}"
    chat.settings = settings
    if reload_keys:
        chat.restart_engine()
        return f"Reloading the model for {', '.join(reload_keys)}"
    return "Settings applied"


def naming_model(settings: Settings, info: ModelInfo) -> Settings:
    """``settings`` whose ``model`` names ``info`` (a model picked from a list, not by the ``model``
    setting): kept when it already resolves to that file (the bundled default stays unset), else the
    file's path. So the settings screen shows the model that is loaded, and a reload for another
    setting loads it again, not the model the chat started with."""
    from chatphase.models.resolve import resolve_model

    try:
        if Path(resolve_model(settings.model, settings.models_dir)).resolve() == Path(info.path).resolve():
            return settings
    except ChatPhaseError:  # the old setting names nothing that exists now
        pass
    return replace(settings, model=str(info.path))
