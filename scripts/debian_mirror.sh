#!/usr/bin/env bash
# Print the Debian archive this machine's apt configuration uses (e.g. http://deb.debian.org/debian), from its
# sources files (one-line `deb URL suite …` and deb822 `URIs: URL`; comments ignored); no fallback host: a
# machine whose sources name none gets one line on stderr and exit 1.
#
#   scripts/debian_mirror.sh [SOURCES_FILE …]   (default: /etc/apt/sources.list and sources.list.d/*)
set -euo pipefail
if [ $# -eq 0 ]; then
  set -- /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources
fi
mirror=$(cat -- "$@" 2>/dev/null | grep -vE '^[[:space:]]*#' |
  grep -oE 'https?://[^[:space:]]*/debian/?([[:space:]]|$)' | head -1 | tr -d '[:space:]' || true)
if [ -z "$mirror" ]; then
  echo "debian_mirror: this machine's apt sources ($*) name no Debian archive (a URL ending in /debian); add one" >&2
  exit 1
fi
echo "${mirror%/}"
