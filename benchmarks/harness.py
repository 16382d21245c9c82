"""What every benchmark shares: llama.cpp's tools found and run one way, the machine/load line, the arm
rotation, the per-rep ratio statistic and chatphase's measured turn.

- Tools: :func:`tool` finds llama-bench, llama-completion, llama-batched-bench or llama-server: a path
  given on the command line, else the folder ``$CHATPHASE_LLAMA_TOOLS``, else the build of
  ``scripts/llama_build.sh`` in the user cache. Every tool runs with the CPU-safety choice chatphase
  makes on this CPU and build (:func:`repack`: weight repacking, llama.cpp's extra buffer types, off only on
  an AMX CPU whose build fails chatphase's AMX probe): llama-bench ``--repack 0|1``, the others ``-nr``
  where it is off. The build's Vulkan devices are hidden from the tools (:func:`tool_env`) unless chatphase's
  engine sees them too (``LLAMA_CPP_LIB_PATH`` set).
- :func:`free_port` and :func:`wait_ready`: a loopback port for a server a benchmark or test starts, and the wait
  until it answers.
- :func:`machine_line`: CPU, cores, memory, extra buffer types and the load average, one line.
- :func:`rotation` and :func:`ratio`: arms run in an order that rotates by rep; a ratio of two arms is
  judged by the median of its per-rep ratios (both arms ran in the same rep, on a machine whose speed
  drifts from one minute to the next), with the ratio of the medians beside it.
- :class:`EngineTurns`: chatphase's engine in its child process, a turn from a cleared KV cache with the end
  of sequence ignored (greedy unless told), its :class:`~chatphase.engine.metrics.TurnMetrics`.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import EngineFailed, SamplingParams, TurnFinished, TurnRequest
from chatphase.system.cpu_features import cpu_name, physical_cores

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("llama-bench", "llama-completion", "llama-batched-bench", "llama-server")
TOOLS_ENV = "CHATPHASE_LLAMA_TOOLS"
BUILD_SCRIPT = ROOT / "scripts" / "llama_build.sh"
T = TypeVar("T")


class ToolMissing(SystemExit):
    """A llama.cpp tool was not found (the message says where it was looked for and how to build it)."""


def tools_dir() -> Path | None:
    """``$CHATPHASE_LLAMA_TOOLS``, else the cached build of ``scripts/llama_build.sh`` (``None``: none)."""
    if os.environ.get(TOOLS_ENV):
        return Path(os.environ[TOOLS_ENV])
    try:
        done = subprocess.run([str(BUILD_SCRIPT), "--cached"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


def tool(name: str, path: str | None = None) -> str:
    """The executable of llama.cpp's ``name`` (one of :data:`TOOLS`): ``path`` when given, else from
    :func:`tools_dir`. Raises :class:`ToolMissing` (a one-line exit) when it is not an executable file."""
    if path is None:
        folder = tools_dir()
        if folder is None:
            raise ToolMissing(
                f"benchmarks: {name} not found: build it with scripts/llama_build.sh, set {TOOLS_ENV} to its "
                f"folder, or pass its path (--{name} PATH)"
            )
        path = str(folder / name)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ToolMissing(f"benchmarks: {name}: not an executable file: {path}")
    return path


def repack() -> bool:
    """Whether chatphase keeps llama.cpp's extra buffer types (weight repacking) on for this CPU and build
    (:func:`chatphase.engine.local.llama_params.cpu_auto_plan`), so the tools run as chatphase does."""
    from chatphase.engine.local.llama_params import cpu_auto_plan

    return cpu_auto_plan().use_extra_bufts


def llama_cpp_python_as_chatphase() -> None:
    """Make llama-cpp-python's own ``Llama`` (built in this process from now on) keep or drop llama.cpp's extra
    buffer types as chatphase does on this CPU and build (:func:`repack`): on an AMX CPU whose build fails the
    probe, its defaults fault at the first batched prompt. ``Llama`` reads the submodule's
    ``llama_model_default_params``, so that is the one patched (once)."""
    import llama_cpp.llama_cpp as low

    from chatphase.engine.local.llama_params import cpu_safe_model_defaults

    if not getattr(low.llama_model_default_params, "_chatphase_cpu_safe", False):
        low.llama_model_default_params = cpu_safe_model_defaults(low.llama_model_default_params)
        low.llama_model_default_params._chatphase_cpu_safe = True  # type: ignore[attr-defined]


def repack_args(name: str, on: bool) -> list[str]:
    """The flags that make tool ``name`` repack weights as ``on`` says."""
    if name == "llama-bench":
        return ["--repack", "1" if on else "0"]
    return [] if on else ["-nr"]


def tool_env() -> dict[str, str]:
    """The environment a llama.cpp tool runs in: this one, with ``GGML_VK_VISIBLE_DEVICES`` set empty (no Vulkan
    device) unless it is set already or ``LLAMA_CPP_LIB_PATH`` gives chatphase's engine the same libraries. The
    tools' build has the Vulkan backend (``scripts/llama_build.sh``) where chatphase's own wheel may not; a tool
    that offloads where the engine cannot would measure the device, not chatphase."""
    env = dict(os.environ)
    if "LLAMA_CPP_LIB_PATH" not in env:
        env.setdefault("GGML_VK_VISIBLE_DEVICES", "")
    return env


def run_tool(
    exe: str, args: Sequence[str], *, timeout_s: float | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the llama.cpp tool ``exe`` with ``args`` plus its repacking flags (:func:`repack`), no stdin, in
    :func:`tool_env`.

    Raises:
        subprocess.CalledProcessError: when ``check`` and it exits non-zero.
        subprocess.TimeoutExpired: when it runs longer than ``timeout_s`` (the process is killed).
    """
    cmd = [exe, *args, *repack_args(Path(exe).name, repack())]
    return subprocess.run(
        cmd, capture_output=True, text=True, check=check, timeout=timeout_s, stdin=subprocess.DEVNULL, env=tool_env()
    )


def llama_bench(
    exe: str,
    model: str | Path,
    threads: int,
    n_prompt: int,
    n_gen: int,
    depths: Sequence[int] = (0,),
    flash_attn: str | None = None,
    timeout_s: float | None = None,
    reps: int = 1,
) -> list[dict[str, Any]]:
    """One ``llama-bench -r reps`` run (``-p n_prompt -n n_gen -d depths``): its JSON rows (``n_prompt``,
    ``n_gen``, ``n_depth``, ``avg_ts`` tokens/s, ``samples_ts`` one a rep, ...). llama-bench prefills a depth once
    and restores it before each rep, so extra reps at depth cost only their own tests."""
    args = ["-m", str(model), "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen)]
    args += ["-d", ",".join(map(str, depths)), "-r", str(reps), "-o", "json"]
    args += ["-fa", flash_attn] if flash_attn else []
    rows: list[dict[str, Any]] = json.loads(run_tool(exe, args, timeout_s=timeout_s).stdout)
    return rows


def pp_tg(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(prompt tokens/s, generation tokens/s) of llama-bench rows (``nan`` where a test is absent)."""
    pp = tg = float("nan")
    for row in rows:
        if row.get("n_prompt") and not row.get("n_gen"):
            pp = float(row["avg_ts"])
        elif row.get("n_gen") and not row.get("n_prompt"):
            tg = float(row["avg_ts"])
    return pp, tg


_PERF = re.compile(
    r"(?:llama_perf_context_print|common_perf_print):\s+(?P<what>[a-z ]+?) time =\s+(?P<ms>[\d.]+) ms(?: /\s+(?P<n>\d+))?"
)


def llama_completion(
    exe: str, model: str | Path, threads: int, prompt: str, sampling: SamplingParams
) -> dict[str, float]:
    """One run of llama-completion with ``sampling``'s chain in chatphase's order (or greedy), the end of
    sequence ignored: ``{"tok_s": n_eval / (total − prompt-eval time), "eval_ms_per_token": ...}`` from its
    perf lines (llama_decode + sampling + the rest of its loop, as chatphase's clock counts)."""
    args = ["-m", str(model), "-t", str(threads), "-tb", str(threads), "-n", str(sampling.max_tokens)]
    args += ["-p", prompt, "--ignore-eos", "-no-cnv", "--no-display-prompt", "-c", "2048", "-fa", "auto"]
    if sampling.temperature <= 0:
        args += ["--temp", "0"]
    else:
        args += ["--temp", str(sampling.temperature), "--top-k", str(sampling.top_k), "--top-p", str(sampling.top_p)]
        args += [
            "--min-p",
            str(sampling.min_p),
            "-s",
            str(sampling.seed),
            "--samplers",
            "top_k;top_p;min_p;temperature",
        ]
    done = run_tool(exe, args, timeout_s=600, check=False)
    perf = {}
    for m in _PERF.finditer(done.stderr):
        perf[m["what"].strip()] = (float(m["ms"]), int(m["n"]) if m["n"] else None)
    if "eval" not in perf or "total" not in perf:
        raise SystemExit(f"llama-completion gave no perf lines (exit {done.returncode}): {done.stderr[-400:]}")
    eval_ms, n_eval = perf["eval"]
    assert n_eval
    decode_wall_ms = perf["total"][0] - perf["prompt eval"][0]
    return {"tok_s": n_eval / (decode_wall_ms / 1000), "eval_ms_per_token": eval_ms / n_eval}


def batched_bench(
    exe: str,
    model: str | Path,
    threads: int,
    n_ctx: int,
    n_batch: int,
    n_ubatch: int,
    prompt_tokens: int,
    gen: int,
    parallel: Sequence[int],
    timeout_s: float | None = None,
) -> dict[int, dict[str, float]]:
    """One llama-batched-bench process (``-npp prompt_tokens -ntg gen -npl parallel``, flash attention auto,
    a non-unified KV cache): ``{N: {"speed_tg", "speed_pp"}}``. Exits with one line when it fails or measured
    other N than asked (``n_ctx`` too small)."""
    args = ["-m", str(model), "-c", str(n_ctx), "-b", str(n_batch), "-ub", str(n_ubatch)]
    args += ["-npp", str(prompt_tokens), "-ntg", str(gen), "-npl", ",".join(map(str, parallel))]
    args += ["-t", str(threads), "-tb", str(threads), "-fa", "auto", "--output-format", "jsonl"]
    proc = run_tool(exe, args, timeout_s=timeout_s, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"llama-batched-bench failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    got = {r["pl"]: {"speed_tg": r["speed_tg"], "speed_pp": r["speed_pp"]} for r in rows}
    if set(got) != set(parallel):
        raise SystemExit(f"llama-batched-bench measured N = {sorted(got)}, not {list(parallel)} (n_ctx too small?)")
    return got


# --- a server started for a benchmark or a test ----------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(proc: subprocess.Popen, url: str, deadline_s: float, path: str = "/health") -> bool:
    """Poll ``url + path`` every 0.2 s: ``True`` once it answers 200; ``False`` when ``proc`` has exited or
    ``deadline_s`` passed (the caller says which, and stops ``proc``)."""
    import httpx

    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        try:
            if httpx.get(f"{url}{path}", timeout=1.0, trust_env=False).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


# --- the machine and its load ------------------------------------------------------------------------------


def load_note() -> str:
    """uptime's 1/5/15-minute load averages against the CPUs: other processes skew every figure."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f}/{five:.2f}/{fifteen:.2f} on {os.cpu_count()} logical CPUs"


def machine_line() -> str:
    """CPU, cores, memory, whether llama.cpp's extra buffer types (weight repacking, AMX) are on as chatphase
    chose them, the system and Python, and the load average now."""
    import psutil

    from chatphase.engine.local.llama_params import cpu_auto_plan

    plan = cpu_auto_plan()
    bufts = "on" if plan.use_extra_bufts else f"off ({plan.extra_bufts_why or 'AMX probe failed'})"
    return (
        f"{cpu_name()}, {physical_cores()} physical cores / {os.cpu_count()} logical CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB; AMX {'yes' if plan.amx else 'no'}, extra buffer types "
        f"{bufts}; {platform.system()} {platform.release()}, Python {platform.python_version()}; {load_note()}"
    )


# --- arms and ratios ---------------------------------------------------------------------------------------


def rotation(arms: Sequence[T], rep: int) -> list[T]:
    """``arms`` in the order of rep ``rep``: rotated by one each rep (two arms alternate), so that no arm
    always runs first on a warm machine."""
    k = rep % len(arms) if arms else 0
    return [*arms[k:], *arms[:k]]


@dataclass(frozen=True)
class Ratio:
    """``a ÷ b`` of two arms measured in the same reps: each rep's ratio, their median (the figure to judge
    by on a shared machine) and the ratio of the two arms' medians (beside it)."""

    per_rep: tuple[float, ...]
    median_of_ratios: float
    of_medians: float


def ratio(a: Sequence[float], b: Sequence[float]) -> Ratio:
    """:class:`Ratio` of arm ``a`` to arm ``b`` (one value a rep each, the same reps). Raises ValueError when
    the lengths differ or are zero."""
    if not a or len(a) != len(b):
        raise ValueError(f"ratio needs the same reps of both arms, got {len(a)} and {len(b)}")
    per = tuple(x / y for x, y in zip(a, b, strict=True))
    return Ratio(per, statistics.median(per), statistics.median(a) / statistics.median(b))


# --- chatphase's measured turn -----------------------------------------------------------------------------


def greedy(max_tokens: int) -> SamplingParams:
    """Greedy sampling of ``max_tokens`` tokens."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


class EngineTurns:
    """chatphase's engine in its child process (:class:`~chatphase.engine.process.host.EngineHost`, loaded
    here with ``config``); :meth:`turn` runs one turn (from a cleared KV cache by default) with the end of sequence
    ignored, cancelled after ``timeout_s`` when given. Exits with one line when the engine fails."""

    def __init__(self, info: Any, config: EngineConfig, timeout_s: float | None = None) -> None:
        from chatphase.engine.process.host import EngineHost

        self.host = EngineHost(info, config)
        self.timeout_s, self._turn = timeout_s, 0
        self.loaded = None
        for ev in self.host.load():
            if isinstance(ev, EngineFailed):
                self.host.close()
                raise SystemExit(f"chatphase engine failed to load: {ev.message}")
            self.loaded = ev.model

    def turn(
        self, prompt: Sequence[int], sampling: SamplingParams, on_event: Any = None, reset_cache: bool = True
    ) -> Any:
        """The :class:`~chatphase.engine.metrics.TurnMetrics` of one turn on ``prompt`` (token ids); ``on_event``
        (optional) is called with each engine event as it arrives (what a chat's listeners would do).
        ``reset_cache=False`` keeps the KV cache, so the prompt's cached prefix is reused as in a chat."""
        self._turn += 1
        req = TurnRequest(
            self._turn, prompt_token_ids=tuple(prompt), reset_cache=reset_cache, ignore_eos=True, sampling=sampling
        )
        timer = threading.Timer(self.timeout_s, self.host.cancel) if self.timeout_s else None
        if timer:
            timer.start()
        metrics = None
        try:
            for ev in self.host.run_turn(req):  # drain the whole turn: the host's end-of-turn marker follows
                if on_event is not None:
                    on_event(ev)
                if isinstance(ev, EngineFailed):
                    raise SystemExit(f"chatphase engine failed: {ev.message}")
                if isinstance(ev, TurnFinished):
                    metrics = ev.metrics
        finally:
            if timer:
                timer.cancel()
        if metrics is None:
            raise SystemExit("chatphase engine ended a turn without metrics")
        return metrics

    def close(self) -> None:
        self.host.close()


def synthetic_model(shape_key: str, quant: str = "Q4_0", folder: Path | None = None) -> Path:
    """A synthetic GGUF of ``shape_key`` (:data:`chatphase.models.synth_shapes.SHAPES`), written once and kept
    between runs in ``folder`` (default: ``synthetic`` in chatphase's user cache directory; never the
    repository: a 1B file is 700 MB)."""
    from chatphase.models.synth import default_file_name, plan, write_synthetic
    from chatphase.models.synth_shapes import SHAPES
    from chatphase.system.paths import cache_dir

    folder = folder if folder is not None else cache_dir() / "synthetic"
    path = folder / default_file_name(SHAPES[shape_key], quant)
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_synthetic(plan(SHAPES[shape_key], quant), path)
    return path
