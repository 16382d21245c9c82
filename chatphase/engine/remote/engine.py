"""RemoteEngine: the :class:`~chatphase.engine.base.Engine` contract over an OpenAI-compatible server.

llama.cpp's ``llama-server``, vLLM, llama-cpp-python's server and Ollama's ``/v1`` endpoint all stream
``POST /v1/chat/completions`` as server-sent events; this engine sends the conversation there with
``stream_options.include_usage`` and turns the stream into the same events and ``TurnMetrics`` as the local
engine (what is measured where: :mod:`chatphase.engine.remote.wire`). A token-id prompt (``bench``) goes
to ``POST /v1/completions`` instead (llama-server and vLLM accept token ids there). The server's own ``timings``
(llama-server) travel beside the client's view in ``TurnFinished.server_timings``. A stream that
carries no token count (llama-cpp-python's server) gets its reply counted by the server's tokenizer
endpoint afterwards (:mod:`chatphase.engine.remote.tokens`), labelled ``decode_tokens_source="tokenizer"``.

- ``load()`` lists ``GET /v1/models`` (an unknown ``remote_model`` fails here, naming what the server
  serves) and reads llama-server's ``GET /props`` for ``n_ctx`` where it exists; a server without it is
  treated as a plain OpenAI server (no llama-server-only request fields are sent to it).
- Errors (connection refused, timeouts, HTTP errors, a stream cut mid-reply, an error object in the
  stream) become one ``EngineFailed(fatal=False)``; when text had already arrived, a
  ``TurnFinished(stop_reason="error")`` with the partial reply follows. Nothing is retried.
- ``cancel()`` shuts the socket of the running stream down (a blocked read returns at once; closing the
  connection is how every one of these servers learns to stop generating).
- The API key is sent as ``Authorization: Bearer`` and is never part of a message, a repr or an event.
- A llama-server started with ``--slot-save-path`` keeps each chat's KV cache on its disk and restores it
  when a resumed chat's history was saved (:mod:`chatphase.engine.remote.slots`); ``prefix_restore=False``
  turns that off.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import PurePosixPath
from typing import Any

import httpx

from chatphase.engine.events import (
    EngineFailed,
    Event,
    LoadedModel,
    LoadedSettings,
    Message,
    ModelLoaded,
    TurnRequest,
)
from chatphase.engine.metrics import ns_to_ms
from chatphase.engine.remote.errors import http_error_message, transport_message
from chatphase.engine.remote.slots import SlotStore, model_key, probe
from chatphase.engine.remote.tokens import ServerTokenizer
from chatphase.engine.remote.url import ServerURL
from chatphase.models.gguf_meta import ModelInfo


class RemoteEngine:
    """Chat turns on an OpenAI-compatible server, measured with the client's clock and the server's counts.

    Args:
        server_url: see :class:`ServerURL`.
        api_key: bearer token, or ``None`` (most local servers need none). Never printed or stored.
        remote_model: the model name to ask for; ``None`` = the first one ``/v1/models`` lists.
        connect_timeout_s: limit to connect and to send the request.
        read_timeout_s: longest silence allowed between two bytes of the reply (covers a long prefill
            on servers that send nothing until the first token).
        prefix_restore: save and restore chat prefixes through llama-server's slot API where it allows it.

    Raises:
        UsageError: for a malformed ``server_url`` (at construction, before any network use).
    """

    def __init__(
        self,
        server_url: str,
        api_key: str | None = None,
        remote_model: str | None = None,
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 300.0,
        prefix_restore: bool = True,
    ):
        self.url = ServerURL(server_url)
        self.remote_model = remote_model
        self.loaded: LoadedModel | None = None
        self._timeout = httpx.Timeout(
            connect=connect_timeout_s, read=read_timeout_s, write=connect_timeout_s, pool=connect_timeout_s
        )
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = self._new_client()
        self._is_llama_server = False
        #: the server's completion counts include the token it stopped on (``ServerReport.counts_stop_token``)
        self.counts_stop_token = False
        self.tokenizer: ServerTokenizer | None = None
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._response: httpx.Response | None = None
        self.prefix_restore = prefix_restore
        #: the prefix store on llama-server's slots (``None``: off, or the server does not save slots)
        self.slots: SlotStore | None = None
        self._slots_probed = False
        self._slot_facts: tuple[dict[str, Any], dict[str, Any]] | None = None  # /props and the model's entry

    def __repr__(self) -> str:
        return f"RemoteEngine({self.url.display!r}, model={self.remote_model!r})"

    # -- Engine protocol -------------------------------------------------------------------------
    def load(self) -> Iterator[Event]:
        """Check the server and the model name; yields ``ModelLoaded`` or ``EngineFailed(fatal=True)``."""
        t0 = time.perf_counter_ns()
        try:
            models = self._get_json(f"{self.url.api}/models")
        except _RemoteError as exc:
            yield EngineFailed(str(exc), fatal=True)
            return
        served = [m for m in (models.get("data") or []) if isinstance(m, dict) and m.get("id")]
        ids = [str(m["id"]) for m in served]
        if self.remote_model and ids and self.remote_model not in ids:
            yield EngineFailed(
                f"the server at {self.url.display} does not serve model {self.remote_model!r}; "
                f"it serves: {', '.join(ids)}",
                fatal=True,
            )
            return
        if not self.remote_model and ids:
            self.remote_model = ids[0]
        props = self._props()
        self._is_llama_server = props is not None
        self.tokenizer = ServerTokenizer(self._post_json, str(self.url.root), self.remote_model, self._is_llama_server)
        entry = next((m for m in served if m["id"] == self.remote_model), {})
        self.counts_stop_token = self._is_llama_server or entry.get("owned_by") == "vllm"
        self.loaded = self._loaded_model(props or {}, entry, ns_to_ms(time.perf_counter_ns() - t0))
        self._slot_facts = (props, entry) if props is not None else None
        self._close_slots()
        yield ModelLoaded(self.loaded)

    def prefix_store(self) -> tuple[SlotStore | None, str | None]:
        """``(store, note)``: the prefix store on llama-server's slots, opened on the first chat turn (a bench's
        token-id prompts never touch the slots), ``None`` where it is off or the server does not save slots;
        ``note`` is the one line saying the server does not, given once."""
        if self._slots_probed or self._slot_facts is None or not self.prefix_restore:
            return self.slots, None
        self._slots_probed = True
        props, entry = self._slot_facts
        root = str(self.url.root).rstrip("/")
        slot, note = probe(self._client, root, self.url.display, props.get("total_slots"))
        if slot is not None:
            served = self.remote_model or ""
            key = model_key(served, props, entry.get("meta"))
            self.slots = SlotStore(
                root, self.url.display, self._headers, key, served, slot, trust_env=not self._loopback
            )
        return self.slots, note

    def _close_slots(self) -> None:
        if self.slots is not None:
            self.slots.close()
        self.slots, self._slots_probed = None, False

    def run_turn(self, request: TurnRequest) -> Iterator[Event]:
        """Stream one turn (event order as in :mod:`chatphase.engine.events`; errors as in the module doc)."""
        if self.loaded is None:
            yield EngineFailed("not connected to the server; load() first", request.turn_id, fatal=True)
            return
        self._cancel.clear()
        from chatphase.engine.remote.turn import StreamedTurn

        yield from StreamedTurn(self, request).run()

    def watch(self) -> Iterator[Event]:
        """Nothing to watch: a server that goes away fails the next request. Returns at once."""
        return iter(())

    def cancel(self) -> None:
        """Stop the running turn: the stream's socket is shut down (thread-safe; no-op when idle)."""
        self._cancel.set()
        with self._lock:
            response = self._response
        if response is not None:
            stream = response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        """Close the HTTP connections, after at most a bounded wait for a prefix save in flight. Idempotent."""
        self.cancel()
        self._close_slots()
        self._client.close()

    # -- what a streamed turn (chatphase.engine.remote.turn) uses ------------------------------------
    @property
    def cancelled(self) -> bool:
        """:meth:`cancel` was called since the running turn began."""
        return self._cancel.is_set()

    @contextmanager
    def open_stream(self, request: TurnRequest, body: dict[str, Any]) -> Iterator[httpx.Response]:
        """POST ``body`` (:meth:`request_body`) to :meth:`endpoint` and hold the streamed response open;
        :meth:`cancel` shuts its socket down while it is. Raises ``httpx.HTTPError`` on a transport failure."""
        try:
            with self._client.stream("POST", self.endpoint(request), json=body) as response:
                with self._lock:
                    self._response = response
                yield response
        finally:
            with self._lock:
                self._response = None

    def lost_connection(self, exc: httpx.HTTPError, mid_stream: bool) -> str:
        """After a transport error: the one-line message for it (``mid_stream``: text had arrived), and the
        pooled connections are forgotten (:meth:`_drop_connections`)."""
        message = transport_message(exc, self.url.display, self._timeout.read, mid_stream=mid_stream)
        self._drop_connections()
        return message

    # -- helpers ---------------------------------------------------------------------------------
    def _new_client(self) -> httpx.Client:
        return httpx.Client(
            headers=self._headers, timeout=self._timeout, follow_redirects=False, trust_env=not self._loopback
        )

    @property
    def _loopback(self) -> bool:
        """Proxies from the environment apply to real hosts, never to this machine's own loopback."""
        return self.url.api.host in ("127.0.0.1", "localhost", "::1")

    def _drop_connections(self) -> None:
        """After a transport error, forget pooled keep-alive connections: the next request opens a new
        one, so a server that went away reads as "connection refused", not as a stale socket's cut."""
        old, self._client = self._client, self._new_client()
        old.close()

    def endpoint(self, request: TurnRequest) -> str:
        """``…/v1/chat/completions``, or ``…/v1/completions`` for a token-id prompt (``bench``): llama-server
        and vLLM take ``prompt`` as a list of token ids there (llama-cpp-python's server does not)."""
        return f"{self.url.api}/{'completions' if request.prompt_token_ids is not None else 'chat/completions'}"

    def request_body(self, request: TurnRequest) -> dict[str, Any]:
        """The JSON body for :meth:`endpoint` (``messages``, or ``prompt`` token ids).

        Sampling fields beyond OpenAI's (``top_k``, ``min_p``, ``repeat_penalty``) are accepted by
        llama-server, vLLM, llama-cpp-python and Ollama; ``return_progress`` (prefill progress chunks),
        ``cache_prompt`` (``False`` for ``reset_cache``) and an assistant message's ``reasoning_content`` are
        sent to llama-server only. ``enable_thinking`` goes as ``chat_template_kwargs`` (llama-server, vLLM);
        a thinking budget is the server's own (llama-server's ``--reasoning-budget``).
        """
        sp = request.sampling
        body: dict[str, Any] = {
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": sp.max_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "top_k": sp.top_k,
            "min_p": sp.min_p,
            "repeat_penalty": sp.repeat_penalty,
        }
        if request.prompt_token_ids is not None:
            body["prompt"] = list(request.prompt_token_ids)
        else:
            body["messages"] = [self._message(m) for m in request.messages]
        if self.remote_model:
            body["model"] = self.remote_model
        if sp.seed is not None:
            body["seed"] = sp.seed
        if request.ignore_eos:
            body["ignore_eos"] = True
        if request.enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": request.enable_thinking}
        if self._is_llama_server:
            body["return_progress"] = True
            if request.reset_cache:
                body["cache_prompt"] = False
        if self.slots is not None and request.prompt_token_ids is None:
            body["id_slot"] = self.slots.slot  # the slot whose KV cache is saved and restored
        return body

    def _message(self, m: Message) -> dict[str, Any]:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.reasoning and self._is_llama_server:  # its templates take the thinking back where they were trained to
            d["reasoning_content"] = m.reasoning
        return d

    def _get_json(self, url: str, timeout: float | None = None) -> dict[str, Any]:
        """GET ``url`` and decode JSON; raises :class:`_RemoteError` with a one-line message."""
        try:
            response = self._client.get(url, timeout=timeout or self._timeout)
        except httpx.HTTPError as exc:
            raise _RemoteError(transport_message(exc, self.url.display, self._timeout.read)) from None
        if response.status_code >= 400:
            raise _RemoteError(http_error_message(response, self.url.display))
        try:
            data = response.json()
        except ValueError:
            raise _RemoteError(
                f"the server at {self.url.display} answered {url.rsplit('/', 1)[-1]} with non-JSON"
            ) from None
        return data if isinstance(data, dict) else {}

    def _post_json(self, url: str, body: dict[str, Any]) -> object:
        """POST ``body`` to ``url``; the decoded JSON, or ``None`` on any failure (for optional endpoints)."""
        try:
            response = self._client.post(url, json=body, timeout=self._timeout.connect)
            return response.json() if response.status_code < 400 else None
        except (httpx.HTTPError, ValueError):
            return None

    def _props(self) -> dict[str, Any] | None:
        """llama-server's ``/props`` (``None`` for servers without it)."""
        try:
            return self._get_json(f"{str(self.url.root).rstrip('/')}/props", timeout=self._timeout.connect)
        except _RemoteError:
            return None

    def _loaded_model(self, props: dict[str, Any], entry: dict[str, Any], load_ms: float) -> LoadedModel:
        """Describe the served model with what the server exposes; the rest is ``None`` (unknown).

        ``n_ctx``: llama-server's ``/props`` ``default_generation_settings.n_ctx`` (per slot), else vLLM's
        ``max_model_len`` in the ``/v1/models`` entry; ``entry["meta"]`` is llama-server's model facts.
        """
        gen = props.get("default_generation_settings") or {}
        n_ctx = gen.get("n_ctx") if isinstance(gen, dict) else None
        if n_ctx is None:
            n_ctx = entry.get("max_model_len")
        info = remote_model_info(self.url.display, self.remote_model, props.get("model_path"), entry.get("meta"))
        server = "llama-server" if props else "OpenAI-compatible server"
        return LoadedModel(
            info=info,
            settings=LoadedSettings(
                backend="remote",
                server=self.url.display,
                server_kind=server,
                remote_model=self.remote_model,
                n_ctx=n_ctx,
                total_slots=props.get("total_slots"),
            ),
            load_ms=load_ms,
            kv_bytes_per_token=None,
            kv_capacity_bytes=None,
            notes=(
                f"remote {server} at {self.url.display}: token counts come from the server; "
                "TTFT and ITL from this client's clock (network included); KV figures unavailable",
            ),
        )


def remote_model_info(
    server: str, remote_model: str | None, model_path: str | None = None, meta: dict[str, Any] | None = None
) -> ModelInfo:
    """A :class:`ModelInfo` for a served model from what the server exposes (llama-server's
    ``/v1/models`` ``meta``: ``n_params, size, n_ctx_train``; ``/props`` ``model_path``); everything else
    is ``None`` or ``"unknown"``. With no ``meta`` it is the placeholder a UI shows before ``load()``.

    The name is the served id, or its file name when the id is a file's path (llama-server serves a model
    by its path unless given ``--alias``); the quantisation is read from that file name (``…Q4_K_M.gguf``),
    as neither endpoint reports it, and stays ``"unknown"`` when the name has none."""
    from chatphase.models.hub import quant_of

    meta = meta or {}
    quant = next((q for f in (model_path, remote_model) if f and (q := quant_of(_base_name(f)))), None)
    return ModelInfo(
        path=model_path or f"{server} ({remote_model or 'default model'})",
        name=_base_name(remote_model) if remote_model else f"model at {server}",
        architecture="unknown",
        n_params=meta.get("n_params"),
        size_bytes=meta.get("size"),
        n_layer=None,
        quantization=quant or "unknown",
        n_ctx_train=meta.get("n_ctx_train"),
        kv_bytes_per_token=None,
        has_chat_template=True,
    )


def _base_name(served: str) -> str:
    """A served id as a name: the last part of a path (``/srv/models/x.Q4_K_M.gguf`` -> ``x.Q4_K_M.gguf``,
    ``C:\\models\\x.gguf`` -> ``x.gguf``), else the id as it is (``Qwen/Qwen3-0.6B``, ``smol``)."""
    path = served.replace("\\", "/")
    windows = len(served) > 2 and served[1:3] == ":\\"  # a drive's path, not any backslash (ESC \\ ends an OSC)
    if path.startswith(("/", "~", "./", "../")) or path.lower().endswith(".gguf") or windows:
        return PurePosixPath(path).name or served
    return served


class _RemoteError(Exception):
    """Internal: a one-line, secret-free failure message."""
