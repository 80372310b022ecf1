#!/usr/bin/env bash
# Check that the C lines changed since BASE (default HEAD~1: on main after a merge, everything
# the merge brought) are formatted as .clang-format says. Only changed lines are checked; the
# rest of the tree keeps its hand formatting. Prints clang-format's diff and fails if any.
#   scripts/check-format.sh [BASE]        e.g. origin/main on a branch
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD~1}
if ! command -v git-clang-format >/dev/null 2>&1; then
  echo "format: git-clang-format not found (Debian package clang-format; scripts/install-deps.sh)" >&2
  exit 1
fi
if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
  echo "format: no commit $base to compare with (a shallow clone needs --depth 2 or more)" >&2
  exit 1
fi
# The commit that adopts .clang-format brings code written before it: nothing to hold it to.
if ! git cat-file -e "$base:.clang-format" 2>/dev/null; then
  echo "format: $base has no .clang-format yet; not checked"
  exit 0
fi
# two commits: compares committed trees, so a dirty work tree does not matter. git-clang-format
# 14 exits 0 whether or not it found changes: its diff on stdout is the verdict.
rc=0
out=$(git -c color.ui=never clang-format --quiet --extensions c,h --diff "$base" HEAD \
      -- src tests bench include) || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "format: git clang-format failed (exit $rc)" >&2
  exit 1
fi
short=$(git rev-parse --short "$base")
if [ -z "$out" ] || [ "$out" = "no modified files to format" ]; then
  echo "format: the C lines changed since $short follow .clang-format"
  exit 0
fi
printf '%s\n' "$out"
echo "format: the lines above, changed since $short, are not formatted as .clang-format says." >&2
echo "format: fix with: git clang-format $base   (formats only those lines), then commit" >&2
exit 1
