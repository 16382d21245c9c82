"""Loopback servers for the remote-engine tests (nothing here reaches beyond 127.0.0.1).

- :class:`ScriptedServer`: a tiny ``http.server`` that answers each path with a scripted status, JSON or
  server-sent events (with optional pauses), and records the requests it got — for the llama-server
  ``timings`` path, HTTP errors and malformed streams.
- :func:`start_llama_cpp_server`: llama-cpp-python's own OpenAI-compatible server serving the bundled
  default model, started as a child process with its logs discarded, waited for with a bounded poll.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

#: the llama-cpp-python server's entry point with llama.cpp's extra buffer types off: on CPUs with
#: Intel AMX its batched prompt evaluation segfaults with them on (docs/architecture.md); the server has no flag.
_SERVER_MAIN = """
import llama_cpp
_default = llama_cpp.llama_model_default_params
def _params():
    p = _default()
    p.use_extra_bufts = False
    return p
llama_cpp.llama_model_default_params = _params
from llama_cpp.server.__main__ import main
main()
"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """``routes`` maps ``"GET /v1/models"`` style keys to ``(status, body)`` where body is a dict (JSON)
    or a list of SSE parts from :func:`sse`. Unknown routes answer 404. ``requests`` records
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
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-cpp-python server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=1.0, trust_env=False).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
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
