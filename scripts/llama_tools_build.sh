#!/usr/bin/env bash
# Build llama.cpp's reference tools (llama-bench, llama-completion, llama-batched-bench, llama-server,
# llama-fit-params, ggml-rpc-server: llama.cpp's rpc-server) for the CPU, with the RPC backend, from the same
# vendored source as the installed llama-cpp-python, into the user cache; print their folder. The benchmarks
# (benchmarks/harness.py) find them there. Its libllama/libggml carry the RPC backend too: LLAMA_CPP_LIB_PATH=<that
# folder> gives them to the bindings (same source and ABI), for `chatphase --rpc` (docs/rpc.md).
#
#   scripts/llama_tools_build.sh            # build (or reuse) and print the bin folder
#   scripts/llama_tools_build.sh --cached   # print it only if already built, else exit 3
#
# Steps, each failing with one line "llama_tools_build: ..." and a non-zero exit:
#   1. apt packages cmake, ninja-build, g++ (installed only when one is missing; needs root)
#   2. the llama-cpp-python sdist of the installed version (shared with scripts/vulkan_build.sh:
#      scripts/llama_build_lib.sh)
#   3. cmake + ninja, a CPU build (shared libraries, -march=native as the product's wheel, -DGGML_RPC=ON), the
#      tools only, in <cache>/build; about 10 minutes on 2 cores ($LLAMA_TOOLS_JOBS jobs, default all CPUs)
# The cache is <user cache>/chatphase/llama-cpp-<version>-tools ($CHATPHASE_TOOLS_DIR overrides the whole
# path), keyed like the Vulkan build: a stamp records the version, the build options and the CPU's flags;
# when it matches, the script prints the folder at once.
set -euo pipefail

[ $# -eq 0 ] || [ "$1" = --cached ] || { echo "llama_tools_build: unknown argument $1 (usage: scripts/llama_tools_build.sh [--cached])" >&2; exit 2; }
NAME=llama_tools_build
# shellcheck source=scripts/llama_build_lib.sh
. "$(dirname "$0")/llama_build_lib.sh"
JOBS=${LLAMA_TOOLS_JOBS:-$(nproc)}
DIR=${CHATPHASE_TOOLS_DIR:-$CACHE_ROOT/llama-cpp-$VERSION-tools}
BIN="$DIR/build/bin"
TOOLS=(llama-bench llama-completion llama-batched-bench llama-server llama-fit-params ggml-rpc-server)
CMAKE_OPTS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
  -DGGML_RPC=ON)

all_built() { local t; for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || return 1; done; }
if stamp_ok "$DIR" "$BIN/llama-server" "${CMAKE_OPTS[@]}" && all_built; then
  echo "$BIN"
  exit 0
fi
if [ "${1:-}" = --cached ]; then
  echo "llama_tools_build: no llama.cpp tools for llama-cpp-python $VERSION in $DIR (run scripts/llama_tools_build.sh)" >&2
  exit 3
fi

need_packages cmake ninja-build g++
mkdir -p "$DIR" || die "cannot create the cache folder $DIR"
fetch_source
rm -f "$DIR/stamp"
log "building ${TOOLS[*]} of llama.cpp $VERSION in $DIR/build (about 10 minutes on 2 cores; log: $DIR/build.log)"
{
  cmake -S "$SRC" -B "$DIR/build" "${CMAKE_OPTS[@]}" &&
    cmake --build "$DIR/build" --target "${TOOLS[@]}" -j "$JOBS"
} >"$DIR/build.log" 2>&1 || die "build failed; last lines of $DIR/build.log: $(tail -3 "$DIR/build.log" | tr '\n' ' ')"
all_built || die "the build left not all of ${TOOLS[*]} in $BIN"
write_stamp "$DIR" "${CMAKE_OPTS[@]}"
log "done: $BIN"
echo "$BIN"
