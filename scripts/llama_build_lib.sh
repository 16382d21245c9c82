# Shared steps of the llama.cpp builds (scripts/vulkan_build.sh, scripts/llama_tools_build.sh); sourced, not run.
#
#   NAME=vulkan_build; . "$(dirname "$0")/llama_build_lib.sh"
#
# Sets PY, VERSION (the installed llama-cpp-python's), CACHE_ROOT (<user cache>/chatphase) and CPU_FLAGS (a
# hash of this CPU's flags: the CPU backend is built for this CPU, -march=native). Gives:
#   die / log MESSAGE          one line "$NAME: MESSAGE" on stderr (die: and exit 1)
#   stamp_ok DIR FILE OPTS...  true when DIR/stamp records this version, CPU and OPTS, and FILE exists
#   write_stamp DIR OPTS...    record them after a build
#   need_packages PKG...       apt-get install the missing ones (root; Debian/Ubuntu), retried once
#   fetch_source               the sdist of the installed version (pip download, or $LLAMA_CPP_SDIST),
#                              unpacked once into <cache>/llama-cpp-<version>-src and shared by every
#                              build; sets SRC to its vendor/llama.cpp
set -euo pipefail
: "${NAME:?set NAME before sourcing llama_build_lib.sh}"
PY=${PYTHON:-python3}
die() { echo "$NAME: $*" >&2; exit 1; }
log() { echo "$NAME: $*" >&2; }
STEP_LOG=$(mktemp) || die "mktemp failed"
trap 'rm -rf "$STEP_LOG" "${TMP:-}"' EXIT
# the last lines a failed step wrote, on one line
tail_of() { tail -n 3 "$STEP_LOG" | tr '\n' ' '; }

VERSION=${LLAMA_CPP_PYTHON_VERSION:-$("$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null || true)}
[ -n "$VERSION" ] || die "llama-cpp-python is not installed for $PY (install chatphase first, or set LLAMA_CPP_PYTHON_VERSION)"
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/chatphase
CPU_FLAGS=$(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12)

stamp_line() { echo "llama-cpp-python=$VERSION cpu=$CPU_FLAGS opts=$*"; }
stamp_ok() {
  local dir=$1 file=$2; shift 2
  [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$(stamp_line "$@")" ] && [ -f "$file" ]
}
write_stamp() { local dir=$1; shift; stamp_line "$@" >"$dir/stamp"; }

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

fetch_source() {
  local top="$CACHE_ROOT/llama-cpp-$VERSION-src"
  SRC="$top/llama_cpp_python-$VERSION/vendor/llama.cpp"
  [ -f "$SRC/CMakeLists.txt" ] && return 0
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
}
