#!/usr/bin/env bash
# Build llama.cpp's shared libraries with the Vulkan backend, from the same vendored source as the
# installed llama-cpp-python, into a cache of their own; print the folder to point the bindings at.
#
#   scripts/vulkan_build.sh            # build (or reuse) and print the library folder
#   scripts/vulkan_build.sh --cached   # print it only if already built, else exit 3 (the test tier's check)
#   LLAMA_CPP_LIB_PATH=$(scripts/vulkan_build.sh) GGML_VK_VISIBLE_DEVICES=0 chatphase ask "Hi"
#
# Debian 12 / Ubuntu (apt). Steps, each failing with one line "vulkan_build: ..." and a non-zero exit:
#   1. apt packages: glslc spirv-headers libvulkan1 mesa-vulkan-drivers (llvmpipe, a software Vulkan
#      device) and the compiler tools; installed only when one is missing (needs root), retried once.
#   2. Vulkan headers >= 1.4: Debian 12's (1.3.239) are too old for ggml-vulkan ('LayerSettingEXT' is
#      not a member of 'vk'). Debian 13's libvulkan-dev is fetched with `apt-get download` through a
#      private apt configuration (its own sources list, lists and cache in a temporary folder: the
#      system's sources are never touched, nothing from trixie is installed) and unpacked with
#      `dpkg -x` into the cache.
#   3. the llama-cpp-python sdist of the installed version (pip download, or $LLAMA_CPP_SDIST), unpacked
#      into the cache.
#   4. cmake + ninja: libllama, libggml*, with -DGGML_VULKAN=on, in <cache>/build; ~15 min on 2 cores.
# The cache is <user cache>/chatphase/llama-cpp-<version>-vulkan ($CHATPHASE_VULKAN_DIR overrides the
# whole path). A stamp records the source, the build options and the CPU's flags (the CPU backend is
# built for this CPU, -march=native): when it matches, the script prints the folder at once.
#
# Why not `CMAKE_ARGS=-DGGML_VULKAN=on pip install llama-cpp-python`: pip's wheel cache does not key on
# CMAKE_ARGS, so that can silently reinstall the cached CPU wheel, and it replaces the CPU build the
# product runs on. Libraries beside it, picked by LLAMA_CPP_LIB_PATH, keep both (same source, same ABI).
#
# ggml skips CPU-type Vulkan devices (llvmpipe is one) unless GGML_VK_VISIBLE_DEVICES=0 is set.
set -euo pipefail

[ $# -eq 0 ] || [ "$1" = --cached ] || { echo "vulkan_build: unknown argument $1 (usage: scripts/vulkan_build.sh [--cached])" >&2; exit 2; }
PY=${PYTHON:-python3}
JOBS=${VULKAN_BUILD_JOBS:-$(nproc)}
die() { echo "vulkan_build: $*" >&2; exit 1; }
log() { echo "vulkan_build: $*" >&2; }
STEP_LOG=$(mktemp) || die "mktemp failed"
trap 'rm -rf "$STEP_LOG" "${TMP:-}"' EXIT
# the last lines a failed step wrote, on one line
tail_of() { tail -n 3 "$STEP_LOG" | tr '\n' ' '; }

VERSION=${LLAMA_CPP_PYTHON_VERSION:-$("$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null || true)}
[ -n "$VERSION" ] || die "llama-cpp-python is not installed for $PY (install chatphase first, or set LLAMA_CPP_PYTHON_VERSION)"
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/chatphase
DIR=${CHATPHASE_VULKAN_DIR:-$CACHE_ROOT/llama-cpp-$VERSION-vulkan}
LIB="$DIR/build/bin"
HEADERS="$DIR/vulkan-headers"
CMAKE_OPTS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_VULKAN=ON
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF)
CPU_FLAGS=$(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12)
STAMP_WANT="llama-cpp-python=$VERSION cpu=$CPU_FLAGS opts=${CMAKE_OPTS[*]}"

if [ -f "$DIR/stamp" ] && [ "$(cat "$DIR/stamp")" = "$STAMP_WANT" ] && [ -f "$LIB/libllama.so" ]; then
  echo "$LIB"
  exit 0
fi
if [ "${1:-}" = --cached ]; then
  echo "vulkan_build: no Vulkan build for llama-cpp-python $VERSION in $DIR (run scripts/vulkan_build.sh)" >&2
  exit 3
fi

# --- 1. apt packages -------------------------------------------------------------------------
PKGS=(glslc spirv-headers libvulkan1 mesa-vulkan-drivers cmake ninja-build g++ pkg-config)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get (Debian/Ubuntu only)"
  [ "$(id -u)" = 0 ] || die "missing packages ${missing[*]}: run as root, or: sudo apt-get install ${missing[*]}"
  log "apt-get install ${missing[*]}"
  apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$STEP_LOG" 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$STEP_LOG" 2>&1
  }
  apt_install || { log "apt-get failed; retrying once in 10 s"; sleep 10; apt_install; } ||
    die "apt-get install ${missing[*]} failed twice: $(tail_of)"
fi
mkdir -p "$DIR" || die "cannot create the cache folder $DIR"

# --- 2. Vulkan headers, Debian 13's libvulkan-dev unpacked privately ----------------------------
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

# --- 3. the vendored llama.cpp of the installed llama-cpp-python --------------------------------
SRC="$DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  log "downloading the llama-cpp-python $VERSION sdist"
  rm -rf "$DIR/src" && mkdir -p "$DIR/src/dl"
  pip_dl() {
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$DIR/src/dl" \
      "llama-cpp-python==$VERSION" >>"$STEP_LOG" 2>&1
  }
  if [ -n "${LLAMA_CPP_SDIST:-}" ]; then cp "$LLAMA_CPP_SDIST" "$DIR/src/dl/" || die "cannot copy $LLAMA_CPP_SDIST"; fi
  ls "$DIR"/src/dl/llama_cpp_python-*.tar.gz >/dev/null 2>&1 || pip_dl ||
    { log "pip download failed; retrying once in 10 s"; sleep 10; pip_dl; } ||
    die "pip download llama-cpp-python==$VERSION (sdist) failed: $(tail_of)"
  tar -xzf "$DIR"/src/dl/llama_cpp_python-"$VERSION".tar.gz -C "$DIR/src" || die "cannot unpack the sdist"
  [ -f "$SRC/CMakeLists.txt" ] || die "the sdist holds no vendor/llama.cpp"
fi

# --- 4. build ---------------------------------------------------------------------------------
VK_LIB=$(ldconfig -p | grep -m1 -oE '/[^ ]*/libvulkan\.so\.1$' || true)
[ -n "$VK_LIB" ] || die "libvulkan.so.1 not found by ldconfig (package libvulkan1)"
rm -f "$DIR/stamp"
log "building llama.cpp $VERSION with Vulkan in $DIR/build (about 15 minutes on 2 cores; log: $DIR/build.log)"
{
  cmake -S "$SRC" -B "$DIR/build" "${CMAKE_OPTS[@]}" \
    -DVulkan_INCLUDE_DIR="$HEADERS/usr/include" -DVulkan_LIBRARY="$VK_LIB" &&
    cmake --build "$DIR/build" --target llama -j "$JOBS"
} >"$DIR/build.log" 2>&1 || die "build failed; last lines of $DIR/build.log: $(tail -3 "$DIR/build.log" | tr '\n' ' ')"
[ -f "$LIB/libllama.so" ] && ls "$LIB"/libggml-vulkan.so >/dev/null 2>&1 ||
  die "the build left no libllama.so / libggml-vulkan.so in $LIB"
echo "$STAMP_WANT" >"$DIR/stamp"
log "done: LLAMA_CPP_LIB_PATH=$LIB GGML_VK_VISIBLE_DEVICES=0"
echo "$LIB"
