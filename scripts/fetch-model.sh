#!/usr/bin/env bash
# fetch-model.sh URL DEST SHA256 - download a model file to DEST unless it is already there.
#
# `make model` runs it for stories260K.gguf (the model `make run` and the tests use). An
# existing DEST is left alone (the shared models directory may be read-only), so `make run`
# works offline once the file is in place. A download goes to DEST.part, is checked
# against SHA256 and only then renamed to DEST; on any failure nothing is left at DEST and
# the message says how to put the file there by hand.
set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 URL DEST SHA256" >&2
  exit 2
fi
url=$1 dest=$2 want=$3

if [ -f "$dest" ]; then
  echo "model: $dest is present"
  exit 0
fi

manual() {
  echo "model: $1" >&2
  echo "model: download $url by other means (another machine, a proxy) and place it at" >&2
  echo "model:   $dest" >&2
  echo "model: (sha256 $want), or point MODEL=... at a GGUF file you have." >&2
  exit 1
}

command -v curl >/dev/null || manual "curl is not installed (apt-get install curl)"
dir=$(dirname "$dest")
mkdir -p "$dir" 2>/dev/null && [ -w "$dir" ] || manual "cannot write to $dir"
part=$dest.part
trap 'rm -f "$part"' EXIT
echo "model: fetching $url"
if ! curl -fsSL --retry 2 --connect-timeout 20 -o "$part" "$url"; then
  manual "the download failed (no network here?)"
fi
got=$(sha256sum "$part" | cut -d' ' -f1)
[ "$got" = "$want" ] || manual "the download has sha256 $got, expected $want"
mv "$part" "$dest"
trap - EXIT
echo "model: $dest ready"
