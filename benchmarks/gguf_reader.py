"""The GGUF header reader against ``gguf.GGUFReader`` on one file, side by side (best of N).

python -m benchmarks.gguf_reader [PATH] [--repeats N]     # default: the bundled model
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import gguf

from chatphase.models.gguf_meta import _reader_classes, read_metadata
from chatphase.models.resolve import default_model_path


def best_s(fn, repeats: int) -> float:
    """The shortest of ``repeats`` runs of ``fn`` (seconds)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    path = args.path or str(default_model_path())
    _reader_classes()  # import gguf and build the reader class outside the timing
    fast = best_s(lambda: read_metadata(path), args.repeats)
    plain = best_s(lambda: gguf.GGUFReader(path), args.repeats)
    print(
        f"{Path(path).name}: header reader {fast * 1e3:.1f} ms, gguf.GGUFReader {plain * 1e3:.1f} ms, "
        f"ratio {plain / fast:.0f}x (best of {args.repeats})"
    )


if __name__ == "__main__":
    main()
