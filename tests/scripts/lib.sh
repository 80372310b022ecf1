# lib.sh - what every tests/scripts/*.sh test shares: pass/fail counting, the expectations,
# and finding the stories260K test model. Sourced (". "$(dirname "$0")/lib.sh""), never run.
# A script counts each check with ok/bad (or an expect_* helper), prints
# "N passed, N failed" at the end and exits non-zero on any failure; a missing prerequisite
# exits 77, which ctest reports as Skipped (tests/CMakeLists.txt).
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
expect_eq() { if [ "$1" == "$2" ]; then ok; else bad "$3: got [$1] want [$2]"; fi; }
expect_contains() { case "$1" in *"$2"*) ok ;; *) bad "$3: [$1] lacks [$2]" ;; esac; }
expect_lacks() { case "$1" in *"$2"*) bad "$3: [$1] has [$2]" ;; *) ok ;; esac; }

# require_stories: set shared and model (stories260K.gguf under $WELD_SHARED/models), or
# exit 77 when it is missing.
require_stories() {
  shared=${WELD_SHARED:?set WELD_SHARED to the directory with models/ (ctest does)}
  model="$shared/models/stories260K.gguf"
  if [ ! -f "$model" ]; then
    echo "skipped: stories260K.gguf not found under $shared/models (the WELD_SHARED directory)"
    exit 77
  fi
}
