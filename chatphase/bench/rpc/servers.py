"""``rpc-server`` processes on this machine for the RPC experiment: llama.cpp's RPC server (its ``rpc``
tool, built as ``ggml-rpc-server`` by ``scripts/llama_build.sh``), each exposing this machine's CPU as one
RPC device on a free loopback port.

The binary is looked for beside the llama.cpp libraries the bindings loaded (the tools build's folder, given
with ``LLAMA_CPP_LIB_PATH``), then on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from chatphase.errors import UsageError

#: the rpc tool's names: the tools build's target, and upstream's.
SERVER_NAMES = ("ggml-rpc-server", "rpc-server")
#: seconds a server has to accept connections after it starts.
START_TIMEOUT_S = 20.0

HOW = "build it with scripts/llama_build.sh and run with LLAMA_CPP_LIB_PATH set to the folder it prints"


def server_binary(lib_folder: Path | None = None) -> Path:
    """The ``rpc-server`` binary: in ``lib_folder`` (default: the loaded llama.cpp's), else on ``PATH``.

    Raises:
        UsageError: none found (one line saying how to get one).
    """
    if lib_folder is None:
        from chatphase.engine.local.ggml_devices import lib_folder as loaded_folder

        lib_folder = loaded_folder()
    for name in SERVER_NAMES:
        if (lib_folder / name).is_file() and os.access(lib_folder / name, os.X_OK):
            return lib_folder / name
    for name in SERVER_NAMES:
        if found := shutil.which(name):
            return Path(found)
    raise UsageError(f"no llama.cpp rpc-server next to {lib_folder} or on PATH: {HOW}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRpcServers:
    """``n`` rpc-servers on 127.0.0.1, ``threads`` CPU threads each, their output to ``log_path`` (default:
    discarded). A ``with`` block starts them (waiting until each accepts a connection) and always stops them.

    Raises (on start):
        UsageError: no binary (:func:`server_binary`), or a server that exits or does not listen within
            :data:`START_TIMEOUT_S`.
    """

    def __init__(self, n: int, threads: int = 1, binary: Path | None = None, log_path: Path | None = None) -> None:
        self.n, self.threads, self.binary, self.log_path = n, threads, binary, log_path
        self.procs: list[subprocess.Popen] = []
        self.ports: list[int] = []

    @property
    def endpoints(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", port) for port in self.ports]

    def start(self) -> LocalRpcServers:
        binary = self.binary or server_binary()
        with open(self.log_path or os.devnull, "ab") as log:  # each child holds its own copy
            for _ in range(self.n):
                port = free_port()
                # the CPU device, named: an rpc-server otherwise serves every GPU its build sees
                cmd = [str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", str(self.threads), "-d", "CPU"]
                self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log))
                self.ports.append(port)
        for proc, port in zip(self.procs, self.ports, strict=True):
            self._wait_listening(proc, port)
        return self

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> LocalRpcServers:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @staticmethod
    def _wait_listening(proc: subprocess.Popen, port: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise UsageError(f"rpc-server on port {port} exited at start (status {proc.returncode})")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise UsageError(f"rpc-server on port {port} did not listen within {START_TIMEOUT_S:g} s")
