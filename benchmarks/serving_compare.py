"""Side by side with a serving benchmark: ``chatphase bench --server URL --rates R`` against NVIDIA AIPerf, the same
workload on the same llama-server (built from the vendored llama.cpp: ``scripts/llama_build.sh``).

Run (a quiet machine)::

    python -m benchmarks.serving_compare --install          # once: AIPerf into its own virtualenv
    python -m benchmarks.serving_compare [--rate 2] [--requests 48] [--prompt-tokens 128] [--gen 32] \\
        [--parallel 4] [--threads N] [--reps 4] [--model SPEC] [--aiperf PATH] [--write]

**Why AIPerf.** It keeps every gap between streamed chunks of every request (its "inter-chunk latency", ICL: vLLM's
ITL) and reports its per-request mean ("inter token latency") beside it, both per request in
``profile_export.jsonl``, so chatphase's ITL and TPOT each have a counterpart. It installs from PyPI without PyTorch
(``aiperf==0.13.0``), and it replays a trace of verbatim request bodies at given instants (``--custom-dataset-type
mooncake-trace``, ``payload`` and ``timestamp``: a fixed schedule), so both tools send the *same token ids at the same
instants*. GuideLLM (0.8.1) reports only a per-request mean as "ITL" (no stall can show) and generates its
own text prompts; ``vllm bench serve`` needs the ``vllm`` wheel, which pulls a CUDA build of PyTorch (several GB) and
is made to run with a GPU. AIPerf goes into ``venv-aiperf`` in the cache folder (:func:`chatphase.system.paths.cache_dir`, ``--install``), never into the
site-packages chatphase runs from (its pins could break ours). With no network for the Hugging Face Hub, AIPerf's
tokenizer is written from the GGUF's own vocabulary (GPT-2-style BPE vocabularies, else a stand-in; ``tokenizers``
and ``gguf`` in that virtualenv); it counts nothing here: ``--use-server-token-count`` takes the server's ``usage``.

**The workload, identical for both.** One llama-server (``-np parallel``, ``-c`` = parallel × (prompt + gen + 16)
rounded up to 256, ``-t threads``, chatphase's weight-repacking choice), warmed with one request. ``requests`` prompts
of exactly ``prompt-tokens`` token ids, built by chatphase's prompt builder from the model's vocabulary (the ones the
rate sweep sends: variant i for request i), ``max_tokens`` = ``gen`` with ``ignore_eos``, greedy, ``cache_prompt``
false, the same body fields chatphase sends (``return_progress`` included), to ``/v1/completions`` streamed. Arrivals
open loop, Poisson at ``rate``: the send times chatphase's sweep draws (Gamma shape 1, its seed 0:
:func:`~chatphase.bench.rates.accounting.arrival_times_s`), given to AIPerf as the trace's timestamps, so both replay
one schedule; no cap on requests in flight (chatphase's ``--max-concurrency`` = requests). Reps alternate which tool
runs first.

**Reported.** TTFT, ITL (every gap) and TPOT p50/p90/p99 of both (all reps' requests pooled; ratio = chatphase ÷
AIPerf, the median of the per-rep ratios), AIPerf's own summary figures beside (to show its files are read as it
reads them), each figure under the other tool's definition computed from the raw per-request times, the measured
size of every definitional difference, and per run the server's own prefill and decode time per token (llama-server
``--metrics``, ``/metrics`` before and after) beside the CPU each client took: where the server's figures differ
between the tools' runs, the server ran at a different speed (other load, the client's own CPU), not the clocks. Prints Markdown; ``--write`` saves it and the raw records under
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

from benchmarks.harness import (
    ROOT,
    free_port,
    machine_line,
    ratio,
    repack,
    repack_args,
    rotation,
    tool,
    tool_env,
    wait_ready,
)
from chatphase.bench.rates.accounting import arrival_times_s
from chatphase.engine.metrics import gap_percentiles_ms
from chatphase.system.cpu_features import physical_cores
from chatphase.system.paths import cache_dir

AIPERF_VERSION = "0.13.0"
VENV = cache_dir() / "venv-aiperf"
PERCENTS = (50, 90, 99)
TOLERANCE = 0.05
TOOLS = ("chatphase", "aiperf")

# Run with the AIPerf virtualenv's Python: the GGUF's GPT-2-style BPE vocabulary as a Hugging Face tokenizer folder.
MAKE_TOKENIZER = """
import sys
from gguf import GGUFReader
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
r = GGUFReader(sys.argv[1])
def strings(name):
    f = r.fields[name]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
if "tokenizer.ggml.merges" in r.fields:
    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
else:  # not GPT-2-style: a stand-in, since AIPerf counts nothing with it here (the server's usage counts)
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(sys.argv[2])
"""


class AiperfMissing(SystemExit):
    """AIPerf (or its virtualenv) is not there: the one line says how to install it."""


def install_hint(path: str) -> str:
    return (
        f"benchmarks: AIPerf not found at {path}: install it into its own virtualenv with "
        f"`python -m benchmarks.serving_compare --install` (creates {VENV} with aiperf=={AIPERF_VERSION} and gguf; "
        "never into chatphase's site-packages), or pass --aiperf PATH"
    )


def install() -> None:
    """Create :data:`VENV` and install AIPerf and gguf there (pip from the package registry)."""
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, f"aiperf=={AIPERF_VERSION}", "gguf"], check=True)
    print(f"installed aiperf=={AIPERF_VERSION} in {VENV}", file=sys.stderr)


# --- one request, as either tool saw it ----------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One completed request (ms; chatphase's from its rate's start, AIPerf's from its first ``credit_issued``).
    ``send_ms``: when the tool's clock starts it (chatphase: the scheduled arrival; AIPerf: the worker's
    ``request_start``); ``ttft_ms`` from there; ``gaps_ms``: every gap between content chunks;
    ``end_ms``: chatphase: the response's end (after ``[DONE]``), AIPerf: its last content chunk; ``tokens``: the
    server's count where known, else the chunks; ``start_lag_ms``: AIPerf only, its scheduled instant (``credit_issued``) to ``request_start``; ``late_ms``: the
    send (chatphase) or ``credit_issued`` (AIPerf) after the schedule's instant, both measured from the first."""

    send_ms: float
    ttft_ms: float
    gaps_ms: tuple[float, ...]
    end_ms: float
    tokens: int
    start_lag_ms: float = 0.0
    tool_itl_ms: float | None = None  # AIPerf's own per-request "inter token latency"
    late_ms: float = 0.0

    @property
    def chunks(self) -> int:
        return len(self.gaps_ms) + 1

    @property
    def tpot_ms(self) -> float | None:
        """chatphase's TPOT: (last − first chunk) / (chunks − 1)."""
        return sum(self.gaps_ms) / len(self.gaps_ms) if self.gaps_ms else None

    @property
    def aiperf_itl_ms(self) -> float | None:
        """AIPerf's "ITL": (request latency − TTFT) / (tokens − 1), its request latency ending at the last content
        chunk: (last − first content chunk) / (tokens − 1), the server's count of tokens where known."""
        return sum(self.gaps_ms) / (self.tokens - 1) if self.tokens >= 2 else None


def _late(sent_ms: float, first_sent_ms: float, i: int, schedule_ms: Sequence[float] | None) -> float:
    return 0.0 if not schedule_ms else (sent_ms - first_sent_ms) - (schedule_ms[i] - schedule_ms[0])


def chatphase_requests(data: dict, schedule_ms: Sequence[float] | None = None) -> list[Request]:
    """The completed requests of a ``chatphase bench --rates`` JSON result (one rate); ``schedule_ms``: the send
    times it was given (for ``late_ms``)."""
    rows = data["records"][0]
    first = min((r["send_ms"] for r in rows), default=0.0)
    out = []
    for r in rows:
        if r["status"] != "ok" or not r["token_ms"]:
            continue
        t = r["token_ms"]
        gaps = tuple(b - a for a, b in pairwise(t))
        late = _late(r["send_ms"], first, int(r["index"]), schedule_ms)
        out.append(Request(r["send_ms"], t[0] - r["send_ms"], gaps, r["end_ms"], len(t), late_ms=late))
    return out


def aiperf_requests(jsonl: str, schedule_ms: Sequence[float] | None = None) -> list[Request]:
    """The completed requests of AIPerf's ``profile_export.jsonl`` (one JSON object a line: ``metadata`` with ns
    clocks, ``metrics`` with ``{"value", "unit"}``; times in ms, ICL a list). Records with an error are left out.
    ``schedule_ms``: the trace's timestamps, request ``i`` in session ``r<i>`` (for ``late_ms``)."""
    out = []
    recs = [json.loads(line) for line in jsonl.splitlines() if line.strip()]
    first_ns = min((r["metadata"]["credit_issued_ns"] for r in recs), default=0)  # times from here, in ns first
    for rec in recs:
        meta, m = rec["metadata"], rec.get("metrics") or {}
        if rec.get("error") or "time_to_first_token" not in m:
            continue
        start_ns = meta["request_start_ns"] - first_ns
        index = int(str(meta.get("conversation_id", "r0")).lstrip("r") or 0) if schedule_ms else 0
        gaps = tuple(float(g) for g in (m.get("inter_chunk_latency") or {}).get("value", []))
        tokens = int((m.get("output_sequence_length") or {}).get("value", len(gaps) + 1))
        itl = (m.get("inter_token_latency") or {}).get("value")
        out.append(
            Request(
                send_ms=start_ns / 1e6,
                ttft_ms=float(m["time_to_first_token"]["value"]),
                gaps_ms=gaps,
                end_ms=start_ns / 1e6 + float(m["request_latency"]["value"]),
                tokens=tokens,
                start_lag_ms=(meta["request_start_ns"] - meta["credit_issued_ns"]) / 1e6,
                tool_itl_ms=None if itl is None else float(itl),
                late_ms=_late((meta["credit_issued_ns"] - first_ns) / 1e6, 0.0, index, schedule_ms),
            )
        )
    return out


def aiperf_summary(data: dict) -> dict[str, list[float | None]]:
    """AIPerf's own p50/p90/p99 (``profile_export_aiperf.json``) of TTFT, ICL and its "ITL"."""
    keys = {"ttft": "time_to_first_token", "icl": "inter_chunk_latency", "itl": "inter_token_latency"}
    return {k: [(data.get(v) or {}).get(f"p{p}") for p in PERCENTS] for k, v in keys.items()}


# --- the figures ----------------------------------------------------------------------------------------------


def pcts(values_ms: Sequence[float]) -> list[float | None]:
    """p50/p90/p99 as chatphase computes them (linear interpolation between closest ranks, numpy's default too)."""
    return list(gap_percentiles_ms([round(v * 1e6) for v in values_ms], PERCENTS))


#: each figure: (label, the values of a list of requests).
FIGURES = {
    "TTFT": lambda rs: [r.ttft_ms for r in rs],
    "ITL, every gap": lambda rs: [g for r in rs for g in r.gaps_ms],
    "TPOT (chatphase's)": lambda rs: [t for r in rs if (t := r.tpot_ms) is not None],
    "AIPerf's ITL (per-request mean)": lambda rs: [t for r in rs if (t := r.aiperf_itl_ms) is not None],
    "TTFT from the scheduled instant": lambda rs: [r.ttft_ms + r.start_lag_ms for r in rs],
}


def realised(rs: Sequence[Request]) -> tuple[float, int]:
    """(requests/s between the first and the last send, most requests in flight at once)."""
    sends = sorted(r.send_ms for r in rs)
    rate = (len(sends) - 1) / ((sends[-1] - sends[0]) / 1e3) if len(sends) > 1 and sends[-1] > sends[0] else 0.0
    events = sorted([(r.send_ms, 1) for r in rs] + [(r.end_ms, -1) for r in rs])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return rate, most


# --- what the server and the client spent on a run ------------------------------------------------------------


def server_counters(url: str) -> dict[str, float]:
    """llama-server's cumulative ``/metrics`` counters (``--metrics``), ``llamacpp:`` dropped."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=30, trust_env=False).text
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("llamacpp:") and value:
            out[name.removeprefix("llamacpp:")] = float(value)
    return out


def client_cpu_s() -> float:
    """User + system CPU seconds of this process's finished children (and theirs, once reaped)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@dataclass(frozen=True)
class RunCost:
    """One tool's run as the server timed it (``/metrics`` deltas) and the CPU its client took.

    ``prefill_ms_per_token`` / ``decode_ms_per_token``: llama-server's ``prompt_seconds_total`` and
    ``tokens_predicted_seconds_total`` over their token counts (each slot's time summed, so concurrent decoding
    counts once per slot); ``decode_steps``: ``n_decode_total``; ``client_cpu_s``: the tool's processes, start-up
    included; ``wall_s``: the tool's run from start to exit."""

    prefill_ms_per_token: float | None
    decode_ms_per_token: float | None
    decode_steps: float
    client_cpu_s: float
    wall_s: float = 0.0

    @property
    def client_cores(self) -> float | None:
        """The client's CPU over its run's wall time: cores it kept busy on average."""
        return self.client_cpu_s / self.wall_s if self.wall_s > 0 else None

    @classmethod
    def of(cls, before: dict[str, float], after: dict[str, float], cpu_s: float, wall_s: float = 0.0) -> RunCost:
        def per(seconds: str, tokens: str) -> float | None:
            n = after.get(tokens, 0.0) - before.get(tokens, 0.0)
            return (after.get(seconds, 0.0) - before.get(seconds, 0.0)) * 1e3 / n if n > 0 else None

        return cls(
            per("prompt_seconds_total", "prompt_tokens_total"),
            per("tokens_predicted_seconds_total", "tokens_predicted_total"),
            after.get("n_decode_total", 0.0) - before.get("n_decode_total", 0.0),
            cpu_s,
            wall_s,
        )


# --- running the two tools ------------------------------------------------------------------------------------


def start_server(args, model: str) -> tuple[subprocess.Popen, str]:
    exe = tool("llama-server", args.llama_server)
    port = args.port or free_port()
    n_ctx = -(-args.parallel * (args.prompt_tokens + args.gen + 16) // 256) * 256
    argv = [exe, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", str(args.parallel), "-c", str(n_ctx)]
    argv += ["-t", str(args.threads), "-tb", str(args.threads), "--metrics", *repack_args("llama-server", repack())]
    log = Path(args.workdir) / "llama-server.log"
    with log.open("w") as sink:  # the child keeps its own descriptor
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=tool_env())
    url = f"http://127.0.0.1:{port}"
    if wait_ready(proc, url, 120):
        return proc, url
    if proc.poll() is not None:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:]
        sys.exit(f"benchmarks: llama-server exited with {proc.returncode}: {' '.join(tail) or '(no output)'}")
    proc.kill()
    sys.exit("benchmarks: llama-server did not answer within 120 s")


def prompts(model: str, length: int, count: int) -> list[tuple[int, ...]]:
    """The token ids chatphase's rate sweep sends (its builder on the GGUF's vocabulary, variant i for request i)."""
    from chatphase.bench.core.prompts import EngineTokenizer, PromptBuilder
    from chatphase.engine.logfile import default_log_path
    from chatphase.engine.prompting.vocab import VocabFile

    with VocabFile(model, default_log_path()) as vocab:
        builder = PromptBuilder(EngineTokenizer(vocab))
        return [builder.tokens(length, variant=i) for i in range(count)]


def body(prompt: Sequence[int], gen: int) -> dict:
    """The body chatphase's remote engine sends for a bench request (engine/remote/engine.py ``request_body``)."""
    from chatphase.engine.events import SamplingParams

    sp = SamplingParams(max_tokens=gen, temperature=0.0)
    return {
        "stream": True, "stream_options": {"include_usage": True}, "max_tokens": gen, "temperature": 0.0,
        "top_p": sp.top_p, "top_k": sp.top_k, "min_p": sp.min_p, "repeat_penalty": sp.repeat_penalty,
        "prompt": list(prompt), "ignore_eos": True, "return_progress": True, "cache_prompt": False,
    }  # fmt: skip


def run_for(cmd: list[str], timeout_s: float, what: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (no stdin, output captured); exits with one line when it runs past ``timeout_s``."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        sys.exit(f"benchmarks: {what} ran past --timeout {timeout_s:g} s")


def run_chatphase(args, url: str, model: str, out: Path, schedule_ms: Sequence[float]) -> list[Request]:
    n = args.requests
    cmd = [sys.executable, "-m", "chatphase", "bench", "--server", url, "--model", model, "--rates", f"{args.rate:g}"]
    cmd += ["--requests", str(n), "--duration", f"{3 * n / args.rate + 60:.0f}", "--gen", str(args.gen)]
    cmd += ["--prompt-lengths", str(args.prompt_tokens), "--max-concurrency", str(min(n, 256))]
    cmd += ["--no-roofline", "--format", "json", "-o", str(out)]
    done = run_for(cmd, args.timeout, "chatphase bench", cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"benchmarks: chatphase bench failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    return chatphase_requests(json.loads(out.read_text()), schedule_ms)


def run_aiperf(
    args, url: str, exe: str, tokenizer: Path, trace: Path, out: Path, schedule_ms: Sequence[float]
) -> tuple[list[Request], dict]:
    cmd = [exe, "profile", "--model", "served", "--url", url, "--endpoint-type", "completions", "--streaming"]
    cmd += ["--input-file", str(trace), "--custom-dataset-type", "mooncake-trace", "--fixed-schedule"]
    cmd += ["--use-server-token-count", "--tokenizer", str(tokenizer), "--no-server-metrics", "--no-gpu-telemetry"]
    cmd += ["--ui-type", "none"]
    cmd += ["--export-level", "records", "--artifact-dir", str(out)]
    done = run_for(cmd, args.timeout, "aiperf")
    records, summary = out / "profile_export.jsonl", out / "profile_export_aiperf.json"
    if done.returncode != 0 or not records.is_file():
        sys.exit(f"benchmarks: aiperf failed ({done.returncode}): {(done.stdout + done.stderr).strip()[-600:]}")
    return aiperf_requests(records.read_text(), schedule_ms), aiperf_summary(json.loads(summary.read_text()))


def tokenizer_dir(exe: str, model: str) -> Path:
    """AIPerf's tokenizer folder for ``model`` (written once from the GGUF with the virtualenv's Python)."""
    folder = Path(exe).resolve().parent.parent / "tokenizers" / Path(model).stem
    if not (folder / "tokenizer.json").is_file():
        python = Path(exe).parent / "python"
        done = subprocess.run([str(python), "-c", MAKE_TOKENIZER, model, str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            sys.exit(f"benchmarks: could not write AIPerf's tokenizer from {model}: {last} (run --install again?)")
    return folder


# --- the report -----------------------------------------------------------------------------------------------


def fmt(values: Sequence[float | None]) -> str:
    return " / ".join("–" if v is None else f"{v:.1f}" for v in values)


def report(
    args, model: str, reps: list[dict[str, list[Request]]], summaries: list[dict], costs: dict[str, list[RunCost]]
) -> str:
    pooled = {t: [r for rep in reps for r in rep[t]] for t in TOOLS}
    lines = [
        f"# Serving benchmark side by side: chatphase vs AIPerf {AIPERF_VERSION} ({datetime.date.today().isoformat()})",
        "",
        f"llama-server (vendored llama.cpp) with `{Path(model).name}`, {args.parallel} slots, {args.threads} threads. "
        f"Workload: {args.requests} requests a rep, prompts of exactly {args.prompt_tokens} token ids (the same ids "
        f"for both), {args.gen} tokens out (`ignore_eos`, greedy), Poisson arrivals at {args.rate:g} requests/s (one "
        "seeded schedule, replayed by both); "
        f"{len(reps)} reps, the first tool alternating. Machine: {machine_line()}.",
        "",
        "p50 / p90 / p99 in ms, all reps' requests pooled; ratio = chatphase ÷ AIPerf (median of the per-rep ratios); "
        f"⚠ where a ratio is more than {TOLERANCE:.0%} from 1.",
        "",
        "| figure | chatphase | AIPerf | ratio p50 / p90 / p99 |",
        "|---|--:|--:|--:|",
    ]
    flagged: list[tuple[str, int, float]] = []
    for name, values in FIGURES.items():
        a, b = pcts(values(pooled["chatphase"])), pcts(values(pooled["aiperf"]))
        cells = []
        for k in range(len(PERCENTS)):
            per_a = [pcts(values(rep["chatphase"]))[k] for rep in reps]
            per_b = [pcts(values(rep["aiperf"]))[k] for rep in reps]
            if any(v is None for v in per_a + per_b) or not all(per_b):
                cells.append("–")
                continue
            r = ratio(per_a, per_b).median_of_ratios  # type: ignore[arg-type]
            cells.append(f"{r:.3f}{' ⚠' if abs(r - 1) > TOLERANCE else ''}")
            if abs(r - 1) > TOLERANCE:
                flagged.append((name, PERCENTS[k], r))
        lines.append(f"| {name} | {fmt(a)} | {fmt(b)} | {' / '.join(cells)} |")
    own = {
        k: [statistics.median(v for s in summaries if (v := s[k][i]) is not None) for i in range(3)]
        for k in summaries[0]
    }
    mine = {
        "ttft": [statistics.median(pcts(FIGURES["TTFT"](rep["aiperf"]))[i] for rep in reps) for i in range(3)],  # type: ignore[type-var]
        "icl": [statistics.median(pcts(FIGURES["ITL, every gap"](rep["aiperf"]))[i] for rep in reps) for i in range(3)],  # type: ignore[type-var]
        "itl": [statistics.median(pcts(FIGURES["AIPerf's ITL (per-request mean)"](rep["aiperf"]))[i] for rep in reps) for i in range(3)],  # type: ignore[type-var]
    }  # fmt: skip
    lines += ["", "AIPerf's own summary (median over reps) beside the same figures computed here from its records:", ""]
    lines += ["| AIPerf figure | its summary | from its records |", "|---|--:|--:|"]
    for key, label in (("ttft", "TTFT"), ("icl", "inter-chunk latency (ICL)"), ("itl", '"inter token latency"')):
        lines.append(f"| {label} | {fmt(own[key])} | {fmt(mine[key])} |")
    lines += [
        "",
        *cost_table(costs),
        "",
        *verdicts(flagged, costs),
        *measured(reps, pooled),
        "",
        *DEFINITIONS,
        "",
        "Command:",
        "",
        "    python -m benchmarks.serving_compare " + " ".join(sys.argv[1:]),
        "",
    ]
    return "\n".join(lines)


def cost_table(costs: dict[str, list[RunCost]]) -> list[str]:
    """The server's own timing of each tool's runs and the client's CPU (median over reps)."""

    def med(t: str, field: str) -> float | None:
        vals = [v for c in costs[t] if (v := getattr(c, field)) is not None]
        return statistics.median(vals) if vals else None

    lines = [
        "The same runs as the server timed them (`/metrics` deltas; median over reps) and the CPU each client took "
        "(its processes' user + system seconds): where the server's own figures agree between the tools, a "
        "difference above is on the client's side (its CPU competing with the server's, its clock, its parsing).",
        "",
        "| per run | chatphase | AIPerf | ratio |",
        "|---|--:|--:|--:|",
    ]
    for field, label in (
        ("prefill_ms_per_token", "server prefill ms/token"),
        ("decode_ms_per_token", "server decode ms/token (per slot)"),
        ("decode_steps", "server decode steps (`llama_decode` calls)"),
        ("client_cpu_s", "client CPU s (start-up included)"),
        ("client_cores", "client CPU ÷ its run's wall time (cores)"),
    ):
        a, b = med("chatphase", field), med("aiperf", field)
        r = f"{a / b:.3f}" if a is not None and b else "–"
        lines.append(f"| {label} | {'–' if a is None else f'{a:.2f}'} | {'–' if b is None else f'{b:.2f}'} | {r} |")
    return lines


def verdicts(flagged: list[tuple[str, int, float]], costs: dict[str, list[RunCost]]) -> list[str]:
    """Each figure more than :data:`TOLERANCE` apart, beside the ratio of the server's own time per token in the
    same runs (prefill for TTFT, decode for the rest): near it, the server's speed moved, not the tools' clocks."""
    if not flagged:
        return [f"Every figure agrees within {TOLERANCE:.0%}.", ""]

    def server(field: str) -> float | None:
        a = [v for c in costs["chatphase"] if (v := getattr(c, field)) is not None]
        b = [v for c in costs["aiperf"] if (v := getattr(c, field)) is not None]
        return statistics.median(a) / statistics.median(b) if a and b else None

    prefill, decode = server("prefill_ms_per_token"), server("decode_ms_per_token")
    lines = [
        f"More than {TOLERANCE:.0%} apart (chatphase ÷ AIPerf), beside the server's own ratio in the same runs:",
        "",
    ]
    for name, p, r in flagged:
        phase, s = ("prefill", prefill) if name.startswith("TTFT") else ("decode", decode)
        own = "–" if s is None else f"{s:.3f}"
        lines.append(f"- {name} p{p}: {r:.3f}; the server's {phase} ms/token {own}")
    return [*lines, ""]


def measured(reps: list[dict[str, list[Request]]], pooled: dict[str, list[Request]]) -> list[str]:
    """The measured size of each definitional difference."""
    cp, ap = pooled["chatphase"], pooled["aiperf"]
    lag = pcts([r.start_lag_ms for r in ap])
    short = {t: sum(r.chunks != r.tokens for r in pooled[t]) for t in TOOLS}
    rates = {t: [realised(rep[t]) for rep in reps] for t in TOOLS}
    late = {t: pcts([r.late_ms for r in pooled[t]]) for t in TOOLS}

    def arrivals(t: str) -> str:
        return ", ".join(f"{r:.2f}/s ({n})" for r, n in rates[t])

    return [
        "Measured, per difference:",
        "",
        f"- TTFT's start: AIPerf's clock starts at `request_start`, {fmt(lag)} ms (p50/p90/p99) after its scheduled "
        'instant (`credit_issued`); chatphase\'s at the scheduled instant. The row "TTFT from the scheduled instant" '
        "adds that lag back to AIPerf's (chatphase's row is unchanged).",
        f"- Chunks ≠ tokens (a chunk holding 0 or 2+ tokens: llama-server holds back an incomplete UTF-8 character): "
        f"chatphase {short['chatphase']} of {len(cp)} requests (its count is the chunks), AIPerf {short['aiperf']} of "
        f"{len(ap)} (its count is the server's `usage`). Only there do chatphase's TPOT and AIPerf's \"ITL\" differ "
        "by definition; the row \"AIPerf's ITL\" puts both tools' requests under AIPerf's formula.",
        f"- The arrivals: one schedule, replayed by each tool. Sent after the schedule's instant (from each run's "
        f"first send; p50/p90/p99): chatphase {fmt(late['chatphase'])} ms, AIPerf {fmt(late['aiperf'])} ms. Realised "
        f"rate per rep (most requests in flight): chatphase {arrivals('chatphase')}; AIPerf {arrivals('aiperf')}. "
        "More requests in flight than slots wait in the server's queue, and that wait is in both tools' TTFT.",
    ]


DEFINITIONS = [
    "Definitions (what each tool means):",
    "",
    "- **TTFT.** chatphase: first content chunk − the request's scheduled arrival (client clock, "
    "`time.perf_counter`), so its own thread hand-off and the connection are in it. AIPerf: first content chunk − "
    "`request_start` (its worker's clock just before the HTTP request is written), so its scheduling lag is not. "
    "Both include the wait in the server's queue when every slot is busy, and the prompt's prefill.",
    "- **ITL.** chatphase: every gap between consecutive content chunks of every request, pooled (vLLM's ITL). "
    "AIPerf calls that *inter-chunk latency* (ICL, the same formula); its *inter token latency* is a per-request "
    "mean, (request latency − TTFT) / (output tokens − 1), its request latency ending at the last content chunk: "
    "chatphase's TPOT with the server's token count as the divisor. Only the "
    "every-gap figure shows a stall; a mean spreads it over the request.",
    "- **TPOT.** chatphase: (last − first content chunk) / (chunks − 1) per request. AIPerf has no TPOT by that "
    'name; its "ITL" above is the nearest.',
    "- **Tokens.** chatphase times content chunks (one token each on llama-server, except where a character's "
    "bytes span tokens); AIPerf counts the server's `usage.completion_tokens` (`--use-server-token-count`; its "
    "tokenizer, written here from the GGUF vocabulary, counts nothing). The prompt is the same token ids, so no "
    "tokenizer enters the prompt length.",
    "- **Percentiles.** Both: linear interpolation between closest ranks (numpy's default; chatphase's "
    '`statistics.quantiles(method="inclusive")`).',
    "- **Clocks.** Both time on the client, by the arrival of each server-sent event at the client process "
    "(chatphase: after its JSON is parsed; AIPerf: its transport's receive time).",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--install", action="store_true", help=f"create {VENV} with aiperf=={AIPERF_VERSION}, then stop")
    p.add_argument("--aiperf", metavar="PATH", default=str(VENV / "bin" / "aiperf"), help="AIPerf's executable")
    p.add_argument("--llama-server", metavar="PATH", help="default: scripts/llama_build.sh's build")
    p.add_argument("--model", default=None, help="model spec (default: the bundled model)")
    p.add_argument("--rate", type=float, default=2.0, help="requests/s (Poisson)")
    p.add_argument("--requests", type=int, default=48, help="requests a rep")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen", type=int, default=32)
    p.add_argument("--parallel", type=int, default=4, help="llama-server's slots (-np)")
    p.add_argument("--threads", type=int, default=physical_cores())
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--port", type=int, default=0, help="llama-server's port (default: a free one)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one tool run may take")
    p.add_argument("--write", action="store_true", help="save the report and raw records under benchmarks/results/")
    args = p.parse_args()
    if args.install:
        install()
        return 0
    if not (os.path.isfile(args.aiperf) and os.access(args.aiperf, os.X_OK)):
        raise AiperfMissing(install_hint(args.aiperf))
    if min(args.requests, args.reps, args.prompt_tokens, args.gen, args.parallel) < 1 or args.rate <= 0:
        p.error("--rate, --requests, --reps, --prompt-tokens, --gen and --parallel must be positive")
    from chatphase.models.resolve import resolve_model

    model = str(resolve_model(args.model, None))
    tokenizer = tokenizer_dir(args.aiperf, model)
    with tempfile.TemporaryDirectory(prefix="serving_compare-") as work:
        args.workdir = work
        trace = Path(work) / "trace.jsonl"
        ids = prompts(model, args.prompt_tokens, args.requests)
        schedule_ms = [t * 1e3 for t in arrival_times_s(args.rate, args.requests)]  # the sweep's draw (seed 0)
        rows = [
            {"session_id": f"r{i}", "timestamp": at, "payload": body(ids[i], args.gen)}
            for i, at in enumerate(schedule_ms)
        ]
        trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
        server, url = start_server(args, model)
        try:
            import httpx

            httpx.post(f"{url}/v1/completions", json={**body(ids[0], args.gen), "stream": False}, timeout=600)
            reps, summaries = [], []
            costs: dict[str, list[RunCost]] = {}
            for rep in range(args.reps):
                got: dict[str, list[Request]] = {}
                for who in rotation(TOOLS, rep):
                    out = Path(work) / f"{who}-{rep}"
                    before, cpu0, t0 = server_counters(url), client_cpu_s(), time.perf_counter()
                    if who == "chatphase":
                        got[who] = run_chatphase(args, url, model, out.with_suffix(".json"), schedule_ms)
                    else:
                        got[who], summary = run_aiperf(args, url, args.aiperf, tokenizer, trace, out, schedule_ms)
                        summaries.append(summary)
                    cost = RunCost.of(before, server_counters(url), client_cpu_s() - cpu0, time.perf_counter() - t0)
                    costs.setdefault(who, []).append(cost)
                    if not got[who]:
                        sys.exit(f"benchmarks: {who} completed no request in rep {rep + 1}")
                reps.append(got)
                print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
        finally:
            server.terminate()
            server.wait(timeout=30)
    text = report(args, model, reps, summaries, costs)
    print(text)
    if args.write:
        out = ROOT / "benchmarks" / "results" / f"serving_compare-{datetime.date.today().isoformat()}"
        out.with_suffix(".md").write_text(text, encoding="utf-8")
        raw = [{t: [asdict(r) for r in rep[t]] for t in TOOLS} for rep in reps]
        cost = {t: [asdict(c) for c in costs[t]] for t in TOOLS}
        data = {"reps": raw, "aiperf_summaries": summaries, "costs": cost}
        out.with_suffix(".json").write_text(json.dumps(data), encoding="utf-8")
        print(f"wrote {out}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
