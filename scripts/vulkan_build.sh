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
#      once into <user cache>/chatphase/llama-cpp-<version>-src, shared with scripts/llama_tools_build.sh
#      (the shared steps are in scripts/llama_build_lib.sh).
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
NAME=vulkan_build
# shellcheck source=scripts/llama_build_lib.sh
. "$(dirname "$0")/llama_build_lib.sh"
JOBS=${VULKAN_BUILD_JOBS:-$(nproc)}
DIR=${CHATPHASE_VULKAN_DIR:-$CACHE_ROOT/llama-cpp-$VERSION-vulkan}
LIB="$DIR/build/bin"
HEADERS="$DIR/vulkan-headers"
CMAKE_OPTS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_VULKAN=ON
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF)

if stamp_ok "$DIR" "$LIB/libllama.so" "${CMAKE_OPTS[@]}"; then
  echo "$LIB"
  exit 0
fi
if [ "${1:-}" = --cached ]; then
  echo "vulkan_build: no Vulkan build for llama-cpp-python $VERSION in $DIR (run scripts/vulkan_build.sh)" >&2
  exit 3
fi

# --- 1. apt packages -------------------------------------------------------------------------
need_packages glslc spirv-headers libvulkan1 mesa-vulkan-drivers cmake ninja-build g++ pkg-config
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
fetch_source

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
write_stamp "$DIR" "${CMAKE_OPTS[@]}"
log "done: LLAMA_CPP_LIB_PATH=$LIB GGML_VK_VISIBLE_DEVICES=0"
echo "$LIB"
