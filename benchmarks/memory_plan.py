"""The memory plan of a load before it (``chatphase info --plan``, ``--n-gpu-layers auto``) on a synthetic 8B: how long
llama.cpp's projection takes and how much of the file it reads (none of the weights).

python -m benchmarks.memory_plan [--shape llama-3.1-8b] [--n-ctx 4096] [--repeats 5]

The synthetic file is written with its tensor data a hole (``write_synthetic(layout_only=True)``: the size and
layout of the real 4.7 GB file, no disk used). Per arm, best and median of ``--repeats`` runs:

- ``projection``: one :func:`chatphase.engine.local.projection.project` in this process, llama.cpp's no_alloc model
  and context (the first run, which initialises llama.cpp's backends, is not counted), with the bytes read
  (``rchar`` of ``/proc/self/io``);
- ``info --plan child``: :func:`chatphase.engine.local.projection.plan_in_child`, what ``info --plan`` waits for: a
  Python child that imports llama.cpp, reads the header and projects (auto's search makes one projection per count
  it tries; on a machine with no GPU device, one).

The target (docs/models.md): a projection under 1 s, reading no weights.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import machine_line
from chatphase.engine.config import EngineConfig
from chatphase.engine.local.projection import project
from chatphase.engine.memory_plan import plan_in_child
from chatphase.models.synth import plan as synth_plan
from chatphase.models.synth import write_synthetic
from chatphase.models.synth_shapes import SHAPES

TARGET_S = 1.0


def read_chars() -> int:
    """Bytes this process has read through read() so far (Linux ``/proc/self/io``; 0 elsewhere)."""
    io = Path("/proc/self/io")
    return int(re.search(r"rchar: (\d+)", io.read_text()).group(1)) if io.exists() else 0  # type: ignore[union-attr]


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(machine_line())
    with tempfile.TemporaryDirectory() as folder:
        path = write_synthetic(synth_plan(SHAPES[args.shape], "Q4_0"), Path(folder) / "m.gguf", layout_only=True)
        config = EngineConfig(n_ctx=args.n_ctx)
        s = config.resolved()
        project(str(path), s, 0, False, 0)  # llama.cpp's backends initialise once per process
        before = read_chars()
        inproc = timed(lambda: project(str(path), s, 0, False, 0), args.repeats)
        read = (read_chars() - before) / args.repeats
        child = timed(lambda: plan_in_child(str(path), config.to_dict()), args.repeats)
        size = path.stat().st_size
    for name, times in (("projection", inproc), ("info --plan child", child)):
        print(f"{name:18} best {min(times):.3f} s · median {statistics.median(times):.3f} s ({args.repeats} runs)")
    print(f"read per projection {read / 2**20:.1f} MiB of a {size / 2**30:.2f} GiB file ({args.shape}, Q4_0)")
    verdict = "meets" if min(inproc) < TARGET_S else "misses"
    print(f"projection {verdict} the {TARGET_S:.0f} s target")


if __name__ == "__main__":
    main()
