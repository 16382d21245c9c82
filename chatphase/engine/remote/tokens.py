"""Counting a reply's tokens with the server's own tokenizer, where the stream did not count them.

llama-cpp-python's server ignores ``stream_options.include_usage`` and sends no timings, so a streamed
reply arrives without a token count; chunks are not tokens (``docs/architecture.md``), so they are never
counted. Where the server offers a tokenizer endpoint, the reply's text is tokenised there once the
stream has ended:

- llama-server: ``POST /tokenize {"content": text, "add_special": false}`` -> ``{"tokens": [...]}``;
- llama-cpp-python's server: ``POST /extras/tokenize {"input": text, "model": name}`` -> ``{"tokens": [...]}``
  (it adds BOS where the vocabulary does, with no way to ask otherwise: the count of the empty text,
  measured once, is taken off).

The count is labelled ``decode_tokens_source="tokenizer"`` in the metrics: the server's tokenizer over
the reply's *text*, which can differ from the ids the model sampled by a token or so (re-tokenising
merges pieces differently; ``chatphase/engine/local/prefix.py``). The endpoint is found on first use and
remembered; a server without one is asked once per engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

#: ``(path, body, adds special tokens)`` of each known endpoint, tried in this order (llama-server's
#: first on llama-server).
_ENDPOINTS: tuple[tuple[str, Callable[[str, str | None], dict[str, Any]], bool], ...] = (
    ("/tokenize", lambda text, _model: {"content": text, "add_special": False}, False),
    ("/extras/tokenize", lambda text, model: {"input": text, **({"model": model} if model else {})}, True),
)

#: ``(path, body, adds special tokens)``: a tokenize endpoint.
Endpoint: TypeAlias = tuple[str, Callable[[str, str | None], dict[str, Any]], bool]

Post = Callable[[str, dict[str, Any]], object]
"""``(url, json body) -> decoded JSON`` or ``None`` on any failure (transport, HTTP error, not JSON)."""


class ServerTokenizer:
    """The reply counter of one :class:`~chatphase.engine.remote.engine.RemoteEngine`.

    Args:
        post: see :data:`Post`.
        root: the server's base URL (no ``/v1``).
        model: the served model's name (llama-cpp-python's server can serve several).
        llama_server: whether ``/props`` said it is llama-server (its endpoint is tried first).
    """

    def __init__(self, post: Post, root: str, model: str | None, llama_server: bool) -> None:
        self._post, self._root, self._model = post, root.rstrip("/"), model
        order = list(_ENDPOINTS) if llama_server else list(reversed(_ENDPOINTS))
        self._candidates = order
        self._endpoint: Endpoint | None = None
        self._baseline = 0
        self._searched = False

    @property
    def endpoint(self) -> str | None:
        """The path in use (``/tokenize``, ``/extras/tokenize``), ``None`` when none was found (yet)."""
        return self._endpoint[0] if self._endpoint else None

    def _tokens(self, endpoint: Endpoint, text: str) -> list[Any] | None:
        path, body, _adds = endpoint
        data = self._post(f"{self._root}{path}", body(text, self._model))
        tokens = data.get("tokens") if isinstance(data, dict) else None
        return tokens if isinstance(tokens, list) else None

    def count(self, text: str) -> int | None:
        """Tokens of ``text`` by the server's tokenizer (special tokens added by the endpoint itself
        taken off), or ``None`` when the server has no tokenizer endpoint or it failed."""
        if self._endpoint is None:
            if self._searched:
                return None
            self._searched = True
            for endpoint in self._candidates:
                empty = self._tokens(endpoint, "")
                if empty is not None:
                    self._endpoint, self._baseline = endpoint, len(empty) if endpoint[2] else 0
                    break
            else:
                return None
        tokens = self._tokens(self._endpoint, text)
        return None if tokens is None else max(0, len(tokens) - self._baseline)
