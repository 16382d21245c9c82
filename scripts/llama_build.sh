#!/usr/bin/env bash
# Build llama.cpp once, from the same vendored source as the installed llama-cpp-python, into the user cache, and
# print the folder of what it built:
#   - the reference tools: llama-bench, llama-completion, llama-batched-bench, llama-server, llama-fit-params and
#     ggml-rpc-server (llama.cpp's rpc-server);
#   - the shared libraries (libllama, libggml*) with the CPU, RPC and Vulkan backends.
#
#   scripts/llama_build.sh            # build (or reuse) and print the folder
#   scripts/llama_build.sh --cached   # print it only if already built, else exit 3 (the test tiers' check)
#
# Who uses the folder:
#   - the benchmarks (benchmarks/harness.py) run its tools, with the CPU choices chatphase makes;
#   - `chatphase --rpc`: LLAMA_CPP_LIB_PATH=<folder> gives its libraries to the bindings (same source, same ABI;
#     docs/rpc.md);
#   - the GPU path on Vulkan: LLAMA_CPP_LIB_PATH=<folder> GGML_VK_VISIBLE_DEVICES=0 (docs/gpu.md).
# ggml-vulkan skips CPU-type Vulkan devices (Mesa's llvmpipe is one) unless GGML_VK_VISIBLE_DEVICES names them, so
# on a machine without a GPU the libraries and tools run as a CPU build; with the variable set but empty they never
# use a Vulkan device (the benchmarks' tools run so unless LLAMA_CPP_LIB_PATH is set: benchmarks/harness.py).
#
# Debian 12 / Ubuntu (apt). Steps, each failing with one line "llama_build: ..." and a non-zero exit:
#   1. apt packages: cmake ninja-build g++ pkg-config, and for Vulkan glslc spirv-headers libvulkan1
#      mesa-vulkan-drivers (llvmpipe, a software Vulkan device); installed only when one is missing (needs root),
#      retried once.
#   2. Vulkan headers >= 1.4: Debian 12's (1.3.239) are too old for ggml-vulkan ('LayerSettingEXT' is not a member
#      of 'vk'). Debian 13's libvulkan-dev is fetched with `apt-get download` through a private apt configuration
#      (its own sources list, lists and cache in a temporary folder: the system's sources are never touched,
#      nothing from trixie is installed) and unpacked with `dpkg -x` into the cache.
#   3. the llama-cpp-python sdist of the installed version (pip download, or $LLAMA_CPP_SDIST), unpacked once into
#      <user cache>/chatphase/llama-cpp-<version>-src.
#   4. cmake + ninja: shared libraries, -march=native as the product's wheel, -DGGML_RPC=ON -DGGML_VULKAN=ON; the
#      tools and libllama in <cache>/build ($LLAMA_BUILD_JOBS jobs, default all CPUs). On 2 quiet cores 12 minutes
#      from nothing (ggml-vulkan and its shaders 40 % of the compile time); a change of options rebuilds what it touches.
# The cache is <user cache>/chatphase/llama-cpp-<version>-build ($CHATPHASE_LLAMA_BUILD_DIR overrides the whole
# path; the user cache is ${XDG_CACHE_HOME:-~/.cache}). A stamp records the version, the build options and the CPU's
# flags (the CPU backend is built for this CPU): when it matches, the script prints the folder at once.
#
# Why not `CMAKE_ARGS=-DGGML_VULKAN=on pip install llama-cpp-python`: pip's wheel cache does not key on CMAKE_ARGS,
# so that can silently reinstall the cached CPU wheel, and it replaces the CPU build the product runs on.
# Libraries beside it, picked by LLAMA_CPP_LIB_PATH, keep both.
set -euo pipefail

[ $# -eq 0 ] || [ "$1" = --cached ] || { echo "llama_build: unknown argument $1 (usage: scripts/llama_build.sh [--cached])" >&2; exit 2; }
PY=${PYTHON:-python3}
die() { echo "llama_build: $*" >&2; exit 1; }
log() { echo "llama_build: $*" >&2; }
STEP_LOG=$(mktemp) || die "mktemp failed"
trap 'rm -rf "$STEP_LOG" "${TMP:-}"' EXIT
# the last lines a failed step wrote, on one line
tail_of() { tail -n 3 "$STEP_LOG" | tr '\n' ' '; }

VERSION=${LLAMA_CPP_PYTHON_VERSION:-$("$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null || true)}
[ -n "$VERSION" ] || die "llama-cpp-python is not installed for $PY (install chatphase first, or set LLAMA_CPP_PYTHON_VERSION)"
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/chatphase
DIR=${CHATPHASE_LLAMA_BUILD_DIR:-$CACHE_ROOT/llama-cpp-$VERSION-build}
BIN="$DIR/build/bin"
HEADERS="$DIR/vulkan-headers"
JOBS=${LLAMA_BUILD_JOBS:-$(nproc)}
TOOLS=(llama-bench llama-completion llama-batched-bench llama-server llama-fit-params ggml-rpc-server)
CMAKE_OPTS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
  -DLLAMA_CURL=OFF -DGGML_RPC=ON -DGGML_VULKAN=ON)
STAMP="llama-cpp-python=$VERSION cpu=$(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12) opts=${CMAKE_OPTS[*]}"

built() {
  local f
  for f in "${TOOLS[@]}"; do [ -x "$BIN/$f" ] || return 1; done
  [ -f "$BIN/libllama.so" ] && [ -f "$BIN/libggml-vulkan.so" ] && [ -f "$BIN/libggml-rpc.so" ]
}
if [ -f "$DIR/stamp" ] && [ "$(cat "$DIR/stamp")" = "$STAMP" ] && built; then
  echo "$BIN"
  exit 0
fi
if [ "${1:-}" = --cached ]; then
  echo "llama_build: no llama.cpp build for llama-cpp-python $VERSION in $DIR (run scripts/llama_build.sh)" >&2
  exit 3
fi

# --- 1. apt packages -------------------------------------------------------------------------------------------
need_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get (Debian/Ubuntu only)"
  [ "$(id -u)" = 0 ] || die "missing packages ${missing[*]}: run as root, or: sudo apt-get install ${missing[*]}"
  log "apt-get install ${missing[*]}"
  apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$STEP_LOG" 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$STEP_LOG" 2>&1
  }
  apt_install || { log "apt-get failed; retrying once in 10 s"; sleep 10; apt_install; } ||
    die "apt-get install ${missing[*]} failed twice: $(tail_of)"
}
need_packages cmake ninja-build g++ pkg-config glslc spirv-headers libvulkan1 mesa-vulkan-drivers
mkdir -p "$DIR" || die "cannot create the cache folder $DIR"

# --- 2. Vulkan headers, Debian 13's libvulkan-dev unpacked privately --------------------------------------------
if [ ! -f "$HEADERS/usr/include/vulkan/vulkan.hpp" ]; then
  log "fetching Debian 13's libvulkan-dev headers (private apt configuration; nothing is installed)"
  TMP=$(mktemp -d) || die "mktemp failed"
  mkdir -p "$TMP/lists/partial" "$TMP/cache/archives/partial" "$TMP/deb"
  # the archive this machine's own apt configuration names; no host of our own (one line and exit 1 without)
  MIRROR=$("$(dirname "$0")/debian_mirror.sh" 2>"$STEP_LOG") || die "$(tail_of)"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR trixie main" >"$TMP/sources.list"
  APT_OPTS=(-o Dir::Etc::SourceList="$TMP/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::State::Lists="$TMP/lists" -o Dir::Cache="$TMP/cache" -o APT::Sandbox::User=root -qq)
  fetch_headers() {
    apt-get "${APT_OPTS[@]}" update >>"$STEP_LOG" 2>&1 &&
      (cd "$TMP/deb" && apt-get "${APT_OPTS[@]}" download libvulkan-dev >>"$STEP_LOG" 2>&1)
  }
  fetch_headers || { log "download failed; retrying once in 10 s"; sleep 10; fetch_headers; } ||
    die "could not download Debian 13's libvulkan-dev from $MIRROR (trixie main): $(tail_of)"
  DEB=$(ls "$TMP"/deb/libvulkan-dev_*.deb 2>/dev/null | head -1)
  [ -n "$DEB" ] || die "apt-get download left no libvulkan-dev .deb"
  rm -rf "$HEADERS"
  dpkg -x "$DEB" "$HEADERS" || die "dpkg -x $DEB failed"
  [ -f "$HEADERS/usr/include/vulkan/vulkan.hpp" ] || die "$DEB holds no vulkan/vulkan.hpp"
  basename "$DEB" >"$HEADERS/deb"
fi

# --- 3. the vendored llama.cpp of the installed llama-cpp-python ------------------------------------------------
top="$CACHE_ROOT/llama-cpp-$VERSION-src"
SRC="$top/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  log "downloading the llama-cpp-python $VERSION sdist"
  rm -rf "$top" && mkdir -p "$top/dl" || die "cannot create $top"
  pip_dl() {
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$top/dl" "llama-cpp-python==$VERSION" >>"$STEP_LOG" 2>&1
  }
  if [ -n "${LLAMA_CPP_SDIST:-}" ]; then cp "$LLAMA_CPP_SDIST" "$top/dl/" || die "cannot copy $LLAMA_CPP_SDIST"; fi
  ls "$top"/dl/llama_cpp_python-*.tar.gz >/dev/null 2>&1 || pip_dl ||
    { log "pip download failed; retrying once in 10 s"; sleep 10; pip_dl; } ||
    die "pip download llama-cpp-python==$VERSION (sdist) failed: $(tail_of)"
  tar -xzf "$top"/dl/llama_cpp_python-"$VERSION".tar.gz -C "$top" || die "cannot unpack the sdist"
  [ -f "$SRC/CMakeLists.txt" ] || die "the sdist holds no vendor/llama.cpp"
fi

# --- 4. build ---------------------------------------------------------------------------------------------------
VK_LIB=$(ldconfig -p | grep -m1 -oE '/[^ ]*/libvulkan\.so\.1$' || true)
[ -n "$VK_LIB" ] || die "libvulkan.so.1 not found by ldconfig (package libvulkan1)"
rm -f "$DIR/stamp"
log "building llama.cpp $VERSION (tools; CPU, RPC and Vulkan backends) in $DIR/build (12-25 minutes on 2 cores from nothing; log: $DIR/build.log)"
{
  cmake -S "$SRC" -B "$DIR/build" "${CMAKE_OPTS[@]}" \
    -DVulkan_INCLUDE_DIR="$HEADERS/usr/include" -DVulkan_LIBRARY="$VK_LIB" &&
    cmake --build "$DIR/build" --target "${TOOLS[@]}" llama -j "$JOBS"
} >"$DIR/build.log" 2>&1 || die "build failed; last lines of $DIR/build.log: $(tail -3 "$DIR/build.log" | tr '\n' ' ')"
built || die "the build left not all of ${TOOLS[*]}, libllama.so, libggml-vulkan.so and libggml-rpc.so in $BIN"
echo "$STAMP" >"$DIR/stamp"
log "done: $BIN"
echo "$BIN"
