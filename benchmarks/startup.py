"""Startup: from the command to a chat prompt that takes input, in a real terminal (tmux).

Run: ``python -m benchmarks.startup [--runs 7] [--size 120x40] [-- COMMAND ...]``
(default command: this Python's ``-m chatphase``, with the config, data and log directories pointed at
a temporary folder so no session is saved and no config file applies).

Each run starts the command in a fresh tmux server (its own socket) through tmux's control mode, which
reports every write to the terminal as it happens, so the screen is read (``capture-pane``) only when
it changed — no polling. Per run, seconds from starting the command to:

- ``drawn``: the screen shows the prompt's placeholder (``--drawn``, default "Message the model");
- ``input``: a key typed into the prompt appears on screen — the prompt accepts input. From ``drawn``
  on, a marker key (``--marker``) is sent every ``--key-every-ms`` until the screen holds more of it
  than it did when drawn (so the figure is at most that interval late);
- ``loaded``: the model is loaded (``--loaded``, default the phase line's "READY").

A warm-up run (not counted) fills the page cache. Prints each run, then median and spread (min–max).
The app is asked to quit (Ctrl+Q) after each run, and the tmux server is killed whatever happens.
"""

from __future__ import annotations

import argparse
import os
import select
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque

from benchmarks.harness import ROOT, load_note, machine_line

MILESTONES = ("drawn", "input", "loaded")


class Terminal:
    """A command in a detached tmux session, watched through control mode (``tmux -C``)."""

    runs = 0

    def __init__(self, command: list[str], size: tuple[int, int], env: dict[str, str]) -> None:
        Terminal.runs += 1  # a socket of its own per run: the last run's server may still be going away
        self.socket = f"chatphase-startup-{os.getpid()}-{Terminal.runs}"
        args = ["tmux", "-L", self.socket, "-f", "/dev/null", "-C", "new-session", "-x", str(size[0])]
        args += ["-y", str(size[1]), *[f"-e{k}={v}" for k, v in env.items()], shlex.join(command)]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self._buf = b""
        self._pending = deque(["new-session"])  # commands whose %begin/%end reply has not come yet
        self._reply: list[str] | None = None
        self.screen: str | None = ""
        self.changed = False  # output arrived since the last capture
        self.exited = False

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def command(self, text: str) -> None:
        """Send one tmux command; a command that has ended closes tmux's pipe, which is an exit, not an error."""
        if self.exited:
            return
        try:
            self.proc.stdin.write(text.encode() + b"\n")
        except (BrokenPipeError, OSError):  # the session ended before its %exit line was read
            self.exited = True
            return
        self._pending.append(text.split()[0])

    def send_key(self, key: str, literal: bool = True) -> None:
        self.command(f"send-keys {'-l ' if literal else ''}{shlex.quote(key)}")

    def pump(self, timeout_s: float) -> None:
        """Read what tmux reports for up to ``timeout_s`` (returns at the first report)."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            return
        chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not chunk:
            self.exited = True
            return
        self._buf += chunk
        while b"\n" in self._buf:
            raw, self._buf = self._buf.split(b"\n", 1)
            line = raw.decode("utf-8", "replace")
            if self._reply is not None:
                if line.startswith(("%end ", "%error ")):
                    if self._pending and self._pending.popleft() == "capture-pane":
                        self.screen = "\n".join(self._reply)
                    self._reply = None
                else:
                    self._reply.append(line)
            elif line.startswith("%begin "):
                self._reply = []
            elif line.startswith("%output "):
                self.changed = True
            elif line.startswith(("%exit", "%session-closed", "%window-close")):
                self.exited = True

    def capture(self, timeout_s: float = 2.0) -> str:
        """The screen's text now (a ``capture-pane`` through control mode)."""
        self.changed = False
        before, self.screen = self.screen, None
        self.command("capture-pane -p")
        deadline = time.monotonic() + timeout_s
        while self.screen is None and time.monotonic() < deadline and not self.exited:
            self.pump(0.05)
        if self.screen is None:
            self.screen = before
        return self.screen

    def close(self) -> None:
        self.command("kill-server")
        try:
            self.proc.wait(3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def one_run(command: list[str], size: tuple[int, int], env: dict[str, str], args) -> dict[str, float | None]:
    """Seconds from start to each milestone (``None``: not reached within ``--timeout-s``)."""
    term = Terminal(command, size, env)
    got: dict[str, float | None] = dict.fromkeys(MILESTONES)
    markers_at_draw = 0
    next_key = 0.0
    try:
        while term.elapsed() < args.timeout_s and not term.exited and None in got.values():
            term.pump(0.01)
            now = term.elapsed()
            if got["drawn"] is not None and got["input"] is None and now >= next_key:
                term.send_key(args.marker)
                next_key = now + args.key_every_ms / 1000
            if not term.changed:
                continue
            t = term.elapsed()  # the change happened before this capture
            screen = term.capture()
            if got["drawn"] is None and args.drawn in screen:
                got["drawn"] = t
                markers_at_draw = screen.count(args.marker)
                next_key = 0.0
            if got["drawn"] is not None and got["input"] is None and screen.count(args.marker) > markers_at_draw:
                got["input"] = t
            if got["loaded"] is None and args.loaded in screen:
                got["loaded"] = t
        term.send_key("C-q", literal=False)
        deadline = time.monotonic() + 3
        while not term.exited and time.monotonic() < deadline:
            term.pump(0.1)
    finally:
        term.close()
    return got


def fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="counted runs (default 7), after one warm-up")
    ap.add_argument("--size", default="120x40", help="terminal columns x rows (default 120x40)")
    ap.add_argument("--timeout-s", type=float, default=30.0, help="give up on a run after this (default 30)")
    ap.add_argument("--drawn", default="Message the model", help="text on screen once the prompt is drawn")
    ap.add_argument("--loaded", default="READY", help="text on screen once the model is loaded")
    ap.add_argument("--marker", default="z", help="the key typed to see the prompt take input")
    ap.add_argument("--key-every-ms", type=float, default=50.0, help="marker key interval (default 50)")
    ap.add_argument("--keep-env", action="store_true", help="use the real config, data and log directories")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command (after --); default python -m chatphase")
    args = ap.parse_args(argv)
    command = [c for c in args.command if c != "--"] or [sys.executable, "-m", "chatphase"]
    try:
        cols, rows = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        ap.error(f"--size: expected COLSxROWS like 120x40, got {args.size!r}")
    if args.runs < 1 or len(args.marker) != 1:
        ap.error("--runs must be >= 1 and --marker one character")

    with tempfile.TemporaryDirectory(prefix="chatphase-startup-") as tmp:
        env = {"PYTHONPATH": str(ROOT)}
        if not args.keep_env:
            env |= {
                "CHATPHASE_CONFIG": f"{tmp}/config.toml",
                "CHATPHASE_DATA_DIR": f"{tmp}/data",
                "CHATPHASE_LOG_DIR": f"{tmp}/log",
            }
        print(f"command: {shlex.join(command)} in tmux {cols}x{rows}; {machine_line()} at the start")
        results = []
        for i in range(args.runs + 1):
            got = one_run(command, (cols, rows), env, args)
            label = "warm-up" if i == 0 else f"run {i}/{args.runs}"
            print(f"{label:>10}: " + "  ".join(f"{k} {fmt(v)} s" for k, v in got.items()), flush=True)
            if i:
                results.append(got)
    print("\n| milestone | median s | min–max s | runs |\n|---|---:|---:|---:|")
    for k in MILESTONES:
        xs = [r[k] for r in results if r[k] is not None]
        spread = f"{min(xs):.2f}–{max(xs):.2f}" if xs else "–"
        print(f"| {k} | {fmt(statistics.median(xs) if xs else None)} | {spread} | {len(xs)}/{len(results)} |")
    print(f"\n{load_note()} at the end (other processes skew every figure)")
    return 0 if all(r["input"] is not None for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
