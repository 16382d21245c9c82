"""Prefix save and restore on llama-server through its slot API, so a resumed remote chat skips its prefill.

llama-server started with ``--slot-save-path DIR`` saves a slot's KV cache and its tokens to a file in ``DIR``
(``POST /slots/{id}?action=save {"filename": …}`` -> ``n_saved`` tokens, ``n_written`` bytes,
``timings.save_ms``) and loads one back into a slot (``action=restore`` -> ``n_restored``, ``n_read``,
``timings.restore_ms``); both are ``llama_state_seq_save_file`` / ``_load_file`` on the server. Without the
flag every slot action answers HTTP 501; an unknown action answers 400 "Invalid action" when it is there, which
is how :func:`probe` tells the two apart without touching a slot (``/props`` does not say).

- **Which slot**: a chat's requests carry ``id_slot`` (the slot :func:`probe` found idle), so the turn's
  KV cache is in the slot that is saved and restored. Token-id prompts (``bench``) are never pinned.
- **When it saves**: after each finished turn whose tokens would take at least :data:`MIN_SAVE_RECOMPUTE_S`
  to prefill again at the measured rate, in a background thread (no turn waits for it); a newer
  save replaces one not yet started; :meth:`SlotStore.close` waits at most :data:`SAVE_WAIT_S` for the one
  in flight. One file per conversation (:func:`slot_file_name`), rewritten each time, so the server's disk
  holds one state per conversation, not one per turn.
- **What it restores**: on a turn whose earlier messages this engine has not just sent, the longest prefix
  of them (at a message boundary) that a finished save holds, if :func:`~chatphase.engine.restore_policy.decide_restore`
  says it pays. The server compares the restored tokens with the new prompt and reuses only their common
  prefix, so a stale file costs time, never a wrong reply.
- **The index** (``remote-slots.json`` in the user cache directory) is the client's record of what each
  finished save holds (server, file, the prefix's hash, tokens, bytes) and of the measured rates (the
  server's restore read rate, the model's prefill rate). An entry is withdrawn *before* its file is
  rewritten and published only after the server said the save finished, so a save cut short (a killed
  server, a full disk) leaves a file that is never asked for: llama-server 0.3.36 aborts on a truncated
  slot file (``GGML_ASSERT(nread <= state_size)`` in ``llama_state_seq_load_file``), it does not refuse it.
  A file the server refuses (another model, another KV type, a damaged header), or a restore it never
  answers (it died on it), is dropped from the index and the prompt recomputed, in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from chatphase.engine.events import Message
from chatphase.engine.remote.errors import http_error_message, transport_message
from chatphase.engine.restore_policy import decide_restore
from chatphase.system.paths import cache_dir
from chatphase.units import fmt_bytes, fmt_int, fmt_ms

#: the longest :meth:`SlotStore.close` waits for a save in flight (seconds); a save still running then is left
#: to finish on the server, its file unpublished (never restored).
SAVE_WAIT_S = 3.0
#: the limit on one save or restore request (seconds): a state of a long context on a slow disk.
SLOT_TIMEOUT_S = 60.0
#: a slot action llama-server does not know: 400 "Invalid action" with slot saving on, 501 without.
PROBE_ACTION = "chatphase-probe"
#: the fewest prompt tokens whose prefill rate is kept as the model's (shorter prefills are mostly overhead).
MIN_RATE_TOKENS = 16
#: a turn's slot is saved only where prefilling it again would take at least this long (seconds) at the
#: measured prefill rate: below it a restore saves less than the user notices, and the file costs disk.
MIN_SAVE_RECOMPUTE_S = 1.0
#: the index keeps the newest this many files.
MAX_ENTRIES = 256
INDEX_VERSION = 1
#: the note where the server has no slot saving.
NO_SLOT_SAVE_NOTE = (
    "prefix restore: off (this llama-server was started without --slot-save-path DIR, so a resumed chat "
    "prefills its whole history again)"
)


def index_path() -> Path:
    """``remote-slots.json`` in :func:`chatphase.system.paths.cache_dir` (``$CHATPHASE_CACHE_DIR``)."""
    return cache_dir() / "remote-slots.json"


def prefix_hash(model_key: str, messages: Sequence[Message]) -> str:
    """SHA-256 (hex) of the model's identity and the messages' roles and texts (thinking left out: the server
    compares the tokens themselves)."""
    text = json.dumps([model_key, [[m.role, m.content] for m in messages]], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def opening(messages: Sequence[Message]) -> tuple[Message, ...]:
    """The messages up to and including the first user message (a system prompt and the first question)."""
    for i, m in enumerate(messages):
        if m.role == "user":
            return tuple(messages[: i + 1])
    return tuple(messages)


def slot_file_name(model_key: str, served: str, messages: Sequence[Message]) -> str:
    """The slot file of the conversation that ``messages`` open: ``chatphase-<model>-<hash>.slot`` in
    ``[A-Za-z0-9._-]`` only (llama-server refuses path separators, ``..`` and a trailing dot), the hash over
    the model's identity and :func:`opening`."""
    base = served.replace("\\", "/").rsplit("/", 1)[-1]
    slug = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9._-]+", "-", base))[:40].strip("-.") or "model"
    return f"chatphase-{slug}-{prefix_hash(model_key, opening(messages))[:20]}.slot"


@dataclass(frozen=True)
class SavedPrefix:
    """One finished save: its ``filename`` in the server's slot directory, the :func:`prefix_hash` of the
    messages it holds, its ``tokens`` (``n_saved``) and ``bytes`` (``n_written``), when (``saved_at``, Unix s)."""

    filename: str
    prefix: str
    tokens: int
    bytes: int
    saved_at: float


@dataclass(frozen=True)
class Rates:
    """Measured rates of one server and model: ``read_bytes_per_s`` (a restore's ``n_read`` over its
    ``restore_ms``, the server's clock) and ``prefill_tokens_per_s`` (llama-server's ``prompt_per_second``)."""

    read_bytes_per_s: float | None = None
    prefill_tokens_per_s: float | None = None


class SlotIndex:
    """The JSON index at ``path`` (:func:`index_path`): finished saves per server and the measured rates.

    Every change reads the file afresh and replaces it atomically (a temporary file renamed over it), so
    two chatphase processes lose at most each other's latest entry; an unreadable file reads as empty."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or index_path()
        self._lock = threading.Lock()

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {"version": INDEX_VERSION, "files": {}, "rates": {}}
        if not isinstance(data, dict) or data.get("version") != INDEX_VERSION:
            return {"version": INDEX_VERSION, "files": {}, "rates": {}}
        for key in ("files", "rates"):
            if not isinstance(data.get(key), dict):
                data[key] = {}
        return data

    def _write(self, data: dict[str, Any]) -> None:
        files = data["files"]
        if len(files) > MAX_ENTRIES:
            newest = sorted(files, key=lambda k: files[k].get("saved_at", 0), reverse=True)[:MAX_ENTRIES]
            data["files"] = {k: files[k] for k in newest}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass  # an index that cannot be written only means no restore next time

    def find(self, server: str, prefix: str) -> SavedPrefix | None:
        """The finished save on ``server`` that holds exactly the messages hashed to ``prefix``."""
        with self._lock:
            files = self._read()["files"]
        for key, e in files.items():
            if key.startswith(f"{server}|") and isinstance(e, dict) and e.get("prefix") == prefix:
                try:
                    return SavedPrefix(
                        str(e["filename"]), prefix, int(e["tokens"]), int(e["bytes"]), float(e["saved_at"])
                    )
                except (KeyError, TypeError, ValueError):
                    return None
        return None

    def publish(self, server: str, saved: SavedPrefix) -> None:
        with self._lock:
            data = self._read()
            data["files"][f"{server}|{saved.filename}"] = asdict(saved)
            self._write(data)

    def withdraw(self, server: str, filename: str) -> None:
        with self._lock:
            data = self._read()
            if data["files"].pop(f"{server}|{filename}", None) is not None:
                self._write(data)

    def rates(self, server: str, model_key: str) -> Rates:
        with self._lock:
            r = self._read()["rates"].get(_rates_key(server, model_key)) or {}
        return Rates(_positive(r.get("read_bytes_per_s")), _positive(r.get("prefill_tokens_per_s")))

    def learn(self, server: str, model_key: str, **rates: float) -> None:
        """Keep the newest measurement of each rate named (``read_bytes_per_s``, ``prefill_tokens_per_s``)."""
        with self._lock:
            data = self._read()
            data["rates"].setdefault(_rates_key(server, model_key), {}).update(rates)
            self._write(data)


@dataclass(frozen=True)
class Restored:
    """What happened to a saved prefix before a turn: ``tokens`` (``n_restored``), ``bytes`` (``n_read``) and
    ``ms`` (the restore request on the client's clock, which the turn's TTFT includes) when it was restored,
    all ``None`` when it was not; ``note`` says which and why in one line."""

    note: str
    tokens: int | None = None
    bytes: int | None = None
    ms: float | None = None


class SlotStore:
    """Saves and restores one engine's chat prefixes in llama-server's slot ``slot`` (see the module doc).

    Args:
        root: the server's base URL (no ``/v1``); ``display``: its printable form (the index's key).
        headers: the engine's request headers (its API key).
        model_key: the served model's identity (:func:`model_key`); ``served``: its id as served.
        slot: the slot this engine's chat requests are pinned to.
        index: the client's record (:class:`SlotIndex`).
    """

    def __init__(
        self,
        root: str,
        display: str,
        headers: dict[str, str],
        model_key: str,
        served: str,
        slot: int,
        index: SlotIndex | None = None,
        trust_env: bool = False,
    ) -> None:
        self.root, self.display = root.rstrip("/"), display
        self.model_key, self.served, self.slot = model_key, served, slot
        self.index = index or SlotIndex()
        self._client = httpx.Client(headers=headers, timeout=SLOT_TIMEOUT_S, trust_env=trust_env)
        self._covers: set[str] = set()  # prefix hashes of what this engine last sent to its slot
        self._cond = threading.Condition()
        self._pending: tuple[Message, ...] | None = None
        self._busy = False
        self._closing = False
        self._worker: threading.Thread | None = None
        #: the last background save's failure in one line (``None`` after a good one): for the log and tests
        self.last_save_error: str | None = None

    # -- before a turn ----------------------------------------------------------------------------
    def before_turn(self, messages: Sequence[Message]) -> Restored | None:
        """Restore the longest saved prefix of ``messages[:-1]`` into the slot when it pays; ``None`` when
        there is nothing to decide (the slot already holds the prefix, as far as this engine knows, or no
        finished save holds one). Never raises: a failure is a :class:`Restored` whose note says so."""
        saved = None
        for k in range(len(messages) - 1, 0, -1):
            h = prefix_hash(self.model_key, messages[:k])
            if h in self._covers:
                return None
            saved = self.index.find(self.display, h)
            if saved is not None:
                break
        if saved is None:
            return None
        rates = self.index.rates(self.display, self.model_key)
        decision = decide_restore(saved.bytes, saved.tokens, rates.read_bytes_per_s, rates.prefill_tokens_per_s)
        if not decision.restore:
            return Restored(f"prefix restore: not restored ({decision.why})")
        self._wait_for_save(SAVE_WAIT_S)  # a save of this very file may still be writing it
        t0 = time.perf_counter_ns()
        try:
            response = self._client.post(self._url("restore"), json={"filename": saved.filename})
        except httpx.HTTPError as exc:
            if not isinstance(exc, httpx.ConnectError):  # it reached the server: never again (it may have died on it)
                self.index.withdraw(self.display, saved.filename)
            return Restored(f"prefix restore: {transport_message(exc, self.display)}; the prompt is recomputed")
        ms = (time.perf_counter_ns() - t0) / 1e6
        data = _json(response)
        if response.status_code >= 400 or data is None:
            self.index.withdraw(self.display, saved.filename)
            why_not = http_error_message(response, self.display) if response.status_code >= 400 else "no JSON"
            return Restored(f"prefix restore: {saved.filename} was not restored ({why_not}); the prompt is recomputed")
        n_tokens, n_bytes = _count(data.get("n_restored")), _count(data.get("n_read"))
        server_ms = _positive((data.get("timings") or {}).get("restore_ms"))
        if n_bytes and server_ms:
            self.index.learn(self.display, self.model_key, read_bytes_per_s=n_bytes / (server_ms / 1000))
        note = f"prefix restore: {fmt_int(n_tokens)} tok · {fmt_bytes(n_bytes)} in {fmt_ms(ms)} ({decision.why})"
        return Restored(note, n_tokens, n_bytes, ms)

    # -- after a turn -----------------------------------------------------------------------------
    def turn_done(self, held: Sequence[Message], timings: dict[str, Any] | None, save: bool) -> None:
        """After a turn: the slot now holds ``held`` (the request's messages, plus the reply when it finished);
        llama-server's ``timings`` give the model's prefill rate; ``save`` queues a background save of the
        slot (a finished reply)."""
        self._covers = {prefix_hash(self.model_key, held[:k]) for k in range(1, len(held) + 1)}
        n, rate = (timings or {}).get("prompt_n"), _positive((timings or {}).get("prompt_per_second"))
        if isinstance(n, (int, float)) and n >= MIN_RATE_TOKENS and rate:
            self.index.learn(self.display, self.model_key, prefill_tokens_per_s=rate)
        if save and self._worth_saving(timings):
            with self._cond:
                self._pending = tuple(held)
                if self._worker is None:
                    self._worker = threading.Thread(target=self._save_loop, name="chatphase-slot-save", daemon=True)
                    self._worker.start()
                self._cond.notify_all()

    def close(self) -> None:
        """Wait at most :data:`SAVE_WAIT_S` for a queued or running save, then stop. Idempotent."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        done = self._wait_for_save(SAVE_WAIT_S)
        if done:
            self._client.close()

    # -- helpers ----------------------------------------------------------------------------------
    def _worth_saving(self, timings: dict[str, Any] | None) -> bool:
        """Whether the slot's tokens after the turn (``prompt_n + cache_n + predicted_n``) would take at least
        :data:`MIN_SAVE_RECOMPUTE_S` to prefill at the measured rate: a shorter prefix is recomputed faster than
        the user notices, and its file would only cost the server's disk (a rate or a count not known: saved)."""
        t = timings or {}
        counts = [_count(t.get(k)) for k in ("prompt_n", "cache_n", "predicted_n")]
        rate = self.index.rates(self.display, self.model_key).prefill_tokens_per_s
        if rate is None or None in counts:
            return True
        return sum(c or 0 for c in counts) / rate >= MIN_SAVE_RECOMPUTE_S

    def _url(self, action: str) -> str:
        return f"{self.root}/slots/{self.slot}?action={action}"

    def _wait_for_save(self, timeout_s: float = SLOT_TIMEOUT_S) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout_s)

    def _save_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closing)
                held, self._pending = self._pending, None
                if held is None:
                    return
                self._busy = True
            try:
                self._save(held)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _save(self, held: tuple[Message, ...]) -> None:
        filename = slot_file_name(self.model_key, self.served, held)
        self.index.withdraw(self.display, filename)  # never restored while the server rewrites it
        try:
            response = self._client.post(self._url("save"), json={"filename": filename})
        except httpx.HTTPError as exc:
            self.last_save_error = transport_message(exc, self.display)
            return
        data = _json(response)
        if response.status_code >= 400 or data is None:
            self.last_save_error = http_error_message(response, self.display)
            return
        tokens, n_bytes = _count(data.get("n_saved")), _count(data.get("n_written"))
        if tokens and n_bytes:
            prefix = prefix_hash(self.model_key, held)
            self.index.publish(self.display, SavedPrefix(filename, prefix, tokens, n_bytes, time.time()))
            self.last_save_error = None


def probe(client: httpx.Client, root: str, where: str, total_slots: object) -> tuple[int | None, str | None]:
    """``(slot, None)`` where llama-server at ``root`` saves slots (the slot to pin: the first idle one in
    ``GET /slots``, else 0), ``(None, note)`` where it does not (the note says so in one line), ``(None,
    None)`` where the server's answer is not llama-server's (nothing to say)."""
    try:
        response = client.post(f"{root.rstrip('/')}/slots/0?action={PROBE_ACTION}", json={})
    except httpx.HTTPError as exc:
        return None, f"prefix restore: off ({transport_message(exc, where)})"
    if response.status_code == 501:
        return None, NO_SLOT_SAVE_NOTE
    if response.status_code != 400 or "invalid action" not in response.text.lower():
        return None, None  # not llama-server's slot API (or a router that wants ?model=): left alone
    slot = 0
    if not (isinstance(total_slots, int) and total_slots <= 1):
        try:
            slots = client.get(f"{root.rstrip('/')}/slots").json()
        except (httpx.HTTPError, ValueError):
            slots = None
        idle = [s.get("id") for s in slots or () if isinstance(s, dict) and not s.get("is_processing")]
        slot = next((i for i in idle if isinstance(i, int)), 0)
    return slot, None


def model_key(served: str, props: dict[str, Any], meta: dict[str, Any] | None) -> str:
    """The served model's identity as the server exposes it: its id, its file (``/props`` ``model_path``),
    its facts (``/v1/models`` ``meta``: parameters, size, vocabulary, embedding width) and the server's
    build. A saved state is looked up only under the same identity."""
    meta = meta or {}
    facts = {k: meta.get(k) for k in ("n_params", "size", "n_vocab", "n_embd", "n_ctx_train", "vocab_type")}
    return json.dumps([served, props.get("model_path"), facts, props.get("build_info")], sort_keys=True)


def _rates_key(server: str, model_key: str) -> str:
    return f"{server}|{hashlib.sha256(model_key.encode()).hexdigest()[:20]}"


def _json(response: httpx.Response) -> dict[str, Any] | None:
    try:
        data = response.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _count(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _positive(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None
