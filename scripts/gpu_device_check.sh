#!/usr/bin/env bash
# chatphase's GPU path on a real GPU: llama.cpp's Vulkan backend (the libraries scripts/llama_build.sh builds) on
# whatever Vulkan driver the machine has, with synthetic models of real sizes (no network there, and the default
# model is too large to carry). Each step has its own time limit and its own output, so one that fails costs
# only itself; all of it goes to $OUT (default /tmp/gpu-check): check.log and results.tar.gz, packed on any exit
# (a time limit's TERM too). On the device tool: `timeout -k 5 230 bash scripts/gpu_device_check.sh`, carrying
# .gpu .whl .gl; pack nothing after it (a second tar of the emptied folder would overwrite the archive).
# Results of 2026-12-04 on an H200: benchmarks/results/gpu_h200_vulkan-2026-12-04.md.
#
# It expects, in the repository root (all ignored by git):
#   .gpu/lib   the Vulkan build's libraries (libllama.so, libggml*.so)
#   .gpu/py    llama-cpp-python's Python package (llama_cpp/, without its lib/)
#   .whl/      wheels of the Python dependencies the machine lacks (installed into /tmp/site)
#   .gl/       the Vulkan loader's .deb (libvulkan1), unpacked when the machine has no libvulkan.so.1
# QUICK=1 runs every step at the smallest sizes on the default model (a dry run of the plumbing, e.g. on llvmpipe).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu-check}"
RES="$OUT/results"
mkdir -p "$RES"
exec > >(tee -a "$OUT/check.log") 2>&1
pack() { tar -C "$OUT" -czf "$OUT/results.tar.gz" results && rm -rf "$RES" "$OUT/doc.txt" && echo "packed: $OUT/results.tar.gz"; }
trap pack EXIT
CHILD=""
trap '[ -n "$CHILD" ] && kill "$CHILD" 2>/dev/null; exit 124' TERM
step() { echo; echo "=== $* ($(date +%T))"; }
run() {  # run LIMIT_S NAME COMMAND...: its stdout to $RES/NAME, stderr to the log
    local limit=$1 name=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$RES/$name" &  # in the background: a TERM reaches the trap while it runs
    CHILD=$!
    wait $CHILD
    local rc=$?
    echo "--- $name: exit $rc after $((SECONDS - t0)) s"
    return $rc
}

step "machine"
uname -srm; nproc; grep -m1 "model name" /proc/cpuinfo; free -g | head -2; uptime
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.max.memory --format=csv 2>&1 || true

step "setup"
if ! ldconfig -p | grep -q "libvulkan.so.1 "; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
# NVIDIA's driver folder, where the container runtime mounts it, holds the Vulkan ICD's manifest
NV_ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f $NV_ICD ]; then export VK_DRIVER_FILES=$NV_ICD; fi
ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/nvidia/share/vulkan/icd.d 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "the wheels did not install"; exit 1; }
export PYTHONPATH="$PWD:/tmp/site:$PWD/.gpu/py"
export LLAMA_CPP_LIB_PATH="$PWD/.gpu/lib" LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
HOME_DIR=/tmp/chatphase-home
export CHATPHASE_CONFIG=$HOME_DIR/config.toml CHATPHASE_DATA_DIR=$HOME_DIR/data CHATPHASE_LOG_DIR=$HOME_DIR/log
export CHATPHASE_CACHE_DIR=$HOME_DIR/cache CHATPHASE_MODELS_DIR=$HOME_DIR/models PYTHONUNBUFFERED=1
mkdir -p "$CHATPHASE_MODELS_DIR"
python3 --version
python3 -c "import textual, gguf, llama_cpp; print('textual', textual.__version__, '· llama_cpp', llama_cpp.__version__)"
GPU_OK=$(python3 -c "import llama_cpp; print(int(llama_cpp.llama_supports_gpu_offload()))")
if [ "$GPU_OK" != 1 ]; then  # no device: say why (the loader's own words) and stop before the CPU does it all
    VK_LOADER_DEBUG=error,warn python3 -c "import llama_cpp; llama_cpp.llama_backend_init()" 2>&1 | tail -20
    echo "no GPU device: llama.cpp's Vulkan backend found none"
    exit 1
fi


# a long document for the prompt: the repository's own prose, about 4,000 tokens
DOC=$OUT/doc.txt
cat README.md docs/*.md 2>/dev/null | head -c 16000 >"$DOC"

if [ "${QUICK:-0}" = 1 ]; then
    SMALL=""; BIG=""; LENGTHS=16,32; DEPTHS=none; GEN=4; REPS=1; NCTX=1024; PAR=1,2; OFFLOAD=0,all
    head -c 2000 "$DOC" >"$DOC.q" && mv "$DOC.q" "$DOC"
else
    step "synthetic models"
    run 120 synth-1b.txt python3 -m chatphase models synth llama-3.2-1b:Q4_0 -o "$CHATPHASE_MODELS_DIR/1b.gguf"
    run 240 synth-8b.txt python3 -m chatphase models synth llama-3.1-8b:Q4_0 -o "$CHATPHASE_MODELS_DIR/8b.gguf"
    cat "$RES"/synth-*.txt
    SMALL="--model $CHATPHASE_MODELS_DIR/1b.gguf"; BIG="--model $CHATPHASE_MODELS_DIR/8b.gguf"
    LENGTHS=512,2048,8192; DEPTHS=0,4096; GEN=32; REPS=2; NCTX=16384; PAR=1,4,8; OFFLOAD=0,all
fi
step "chatphase info"
# shellcheck disable=SC2086
run 60 info.txt python3 -m chatphase info $SMALL; cat "$RES/info.txt"
ASK=(python3 -m chatphase ask --json --no-save --temperature 0 --max-tokens 64 --n-ctx 16384)

step "ask: 1B, every layer on the GPU, a ~4k-token file; then the same prompt again (prefix store)"
# shellcheck disable=SC2086
run 60 ask-1b-gpu.json "${ASK[@]}" $SMALL --n-gpu-layers -1 -f "$DOC" "Summarise this."
# shellcheck disable=SC2086
run 60 ask-1b-gpu-again.json "${ASK[@]}" $SMALL --n-gpu-layers -1 -f "$DOC" "Summarise this."

step "ask: 8B, every layer on the GPU, again (prefix store), then half of them"
# shellcheck disable=SC2086
run 60 ask-8b-gpu.json "${ASK[@]}" $BIG --n-gpu-layers -1 -f "$DOC" "Summarise this."
# shellcheck disable=SC2086
run 60 ask-8b-gpu-again.json "${ASK[@]}" $BIG --n-gpu-layers -1 -f "$DOC" "Summarise this."
# shellcheck disable=SC2086
run 60 ask-8b-half.json "${ASK[@]}" $BIG --n-gpu-layers 16 --prefix-cache off -f "$DOC" "Summarise this."

step "bench: TTFT by prompt length and decode by depth, 1B on the GPU"
# shellcheck disable=SC2086
run 80 bench-1b.json python3 -m chatphase bench $SMALL --n-gpu-layers -1 --n-ctx $NCTX --prompt-lengths $LENGTHS \
    --depths $DEPTHS --gen $GEN --reps $REPS --format json

step "bench: parallel sequences, 1B on the GPU"
# shellcheck disable=SC2086
run 50 bench-parallel-1b.json python3 -m chatphase bench $SMALL --n-gpu-layers -1 --n-ctx 8192 --parallel $PAR \
    --prompt-lengths 512 --gen $GEN --reps 1 --format json

step "bench: the offload sweep, 8B, with the device's bandwidth as measured there (4.3 TB/s copy)"
# shellcheck disable=SC2086
run 80 bench-offload-8b.json python3 -m chatphase bench $BIG --gpu-layers $OFFLOAD --device-bandwidth 4300 \
    --n-ctx 2048 --prompt-lengths 256 --depths none --gen 16 --reps 1 --format json --plot "$RES/offload-8b.svg"

step "the TUI: two turns, 1B on the GPU"
run 45 tui.txt python3 scripts/gpu_tui_shot.py "${SMALL#--model }" "$RES/tui-1b.svg" -1

step "engine log (llama.cpp's lines about the device)"
grep -h -E "ggml_vulkan|offloaded|buffer size|Vulkan0" "$CHATPHASE_LOG_DIR"/*.log 2>/dev/null | sort | uniq -c \
    | sort -rn | head -40
cp "$CHATPHASE_LOG_DIR"/engine.log "$RES/" 2>/dev/null
nvidia-smi --query-gpu=name,memory.used --format=csv 2>&1 || true
