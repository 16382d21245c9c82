"""Loopback servers for the remote-engine tests (nothing here reaches beyond 127.0.0.1).

- :class:`ScriptedServer`: a tiny ``http.server`` that answers each path with a scripted status, JSON or
  server-sent events (with optional pauses), and records the requests it got — for the llama-server
  ``timings`` path, HTTP errors and malformed streams.
- :func:`start_llama_cpp_server`: llama-cpp-python's own OpenAI-compatible server serving the bundled
  default model, started as a child process with its logs discarded, waited for with a bounded poll.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from benchmarks.harness import free_port as free_port  # re-exported: the remote tests import it from here
from benchmarks.harness import wait_ready

#: llama-cpp-python's server, started with the CPU-safety settings chatphase's own engine uses
#: (:func:`chatphase.engine.local.llama_params.offload_plan`: llama.cpp's extra buffer types off on CPUs with Intel
#: AMX, docs/architecture.md); the server has no flag for them. ``Llama`` reads
#: ``llama_cpp.llama_cpp.llama_model_default_params`` (the submodule), so that is the attribute patched: a patch
#: of the package's re-export never reaches it. Every test that starts a third-party llama.cpp server goes
#: through :func:`start_llama_cpp_server`, so this is the one place.
_SERVER_MAIN = """
import llama_cpp.llama_cpp as low
from chatphase.engine.local.llama_params import cpu_safe_model_defaults
low.llama_model_default_params = cpu_safe_model_defaults(low.llama_model_default_params)
from llama_cpp.server.__main__ import main
main()
"""


def sse(*chunks) -> list:
    """SSE body parts: each dict becomes ``data: {json}``, a str is sent as ``data: str``, a float pauses
    that many seconds, a ``threading.Event`` pauses until it is set."""
    parts: list = []
    for c in chunks:
        if isinstance(c, (float, threading.Event)):
            parts.append(c)
        else:
            parts.append(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode())
    return parts


def content_chunk(text: str) -> dict:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }


class ScriptedServer:
    """``routes`` maps ``"GET /v1/models"`` style keys to ``(status, body)`` where body is a dict (JSON),
    a list of SSE parts from :func:`sse`, or ``None`` (the connection is closed with no answer). Unknown routes answer 404. ``requests`` records
    ``(method, path, headers, json_body)``."""

    def __init__(self, routes: dict):
        self.routes = routes
        self.requests: list[tuple[str, str, dict, dict | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):  # keep test output clean
                pass

            def _handle(self, method):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                outer.requests.append((method, self.path, dict(self.headers), json.loads(raw) if raw else None))
                status, body = outer.routes.get(f"{method} {self.path}", (404, {"detail": "Not Found"}))
                if body is None:  # hang up without an answer (a server that died on the request)
                    self.close_connection = True
                    return
                self.send_response(status)
                if isinstance(body, list):
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    try:
                        for part in body:
                            if isinstance(part, float):
                                time.sleep(part)
                            elif isinstance(part, threading.Event):
                                part.wait(30)
                            else:
                                self.wfile.write(part)
                                self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):  # the client hung up (timeout tests)
                        pass
                else:
                    data = json.dumps(body).encode()
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def start_llama_cpp_server(
    model_path: str, alias: str = "smol", n_ctx: int = 512, deadline_s: float = 90.0
) -> tuple[subprocess.Popen, str]:
    """Start llama-cpp-python's server on a free loopback port; returns ``(process, base_url)``.

    Raises:
        RuntimeError: when it exits or does not answer ``/v1/models`` within ``deadline_s``.
    """
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _SERVER_MAIN,
            "--model",
            str(model_path),
            "--model_alias",
            alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            str(n_ctx),
            "--n_threads",
            "2",
            "--n_batch",
            "256",
            "--verbose",
            "False",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    if wait_ready(proc, url, deadline_s, "/v1/models"):
        return proc, url
    if proc.poll() is not None:
        raise RuntimeError(f"llama-cpp-python server exited with {proc.returncode}")
    stop_process(proc)
    raise RuntimeError(f"llama-cpp-python server did not answer within {deadline_s:g} s")


def stop_process(proc: subprocess.Popen) -> None:
    """Terminate, then kill after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class SlotServer:
    """A loopback stand-in for llama-server with ``total_slots`` parallel slots, for the parallel sweep.

    ``POST /v1/completions`` (token-id prompts) streams ``max_tokens`` text chunks, ``chunk_s`` seconds
    apart, then a final chunk with ``usage`` and ``[DONE]``; with ``endless`` it streams until the client
    hangs up. It records each request's body, the most streams it served at once (``max_active``) and how
    many streams ended because the client went away (``hung_up``). Every request is served in its own
    thread, so concurrent streams really overlap.
    """

    def __init__(self, total_slots: int | None = 4, slot_n_ctx: int = 1024, chunk_s: float = 0.005, endless=False):
        self.bodies: list[dict] = []
        self.active = self.max_active = self.hung_up = 0
        self.lock = threading.Lock()
        self.all_streaming = threading.Event()
        self.expect = 0  # set all_streaming once this many streams are active
        outer = self
        props = {"default_generation_settings": {"n_ctx": slot_n_ctx}, "total_slots": total_slots}
        models = {"data": [{"id": "slots", "object": "model"}]}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):
                pass

            def _json(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._json(models)
                elif self.path == "/props" and total_slots is not None:
                    self._json(props)
                else:
                    self.send_error(404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with outer.lock:
                    outer.bodies.append(body)
                    outer.active += 1
                    outer.max_active = max(outer.max_active, outer.active)
                    if outer.expect and outer.active >= outer.expect:
                        outer.all_streaming.set()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    n = body["max_tokens"]
                    i = 0
                    while endless or i < n:
                        chunk = {"choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                        i += 1
                        time.sleep(chunk_s)
                    usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
                    end = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
                    self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
                except (BrokenPipeError, ConnectionResetError):
                    with outer.lock:
                        outer.hung_up += 1
                finally:
                    with outer.lock:
                        outer.active -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> SlotServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
