#!/usr/bin/env bash
# Checks C++ files against .clang-format without changing them; prints each file that differs with
# the diff clang-format would apply, and exits 1 if any does.
#
#   scripts/check-format.sh FILE...          the files given
#   scripts/check-format.sh --since BASE     the C++ files changed since commit BASE (e.g. origin/main)
#   scripts/check-format.sh --fix FILE...    formats the files in place instead
#
# The whole tree is formatted and CI checks all of it; --since checks what a change touches before
# pushing. CLANG_FORMAT selects the binary (default clang-format).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cf=${CLANG_FORMAT:-clang-format}
command -v "$cf" > /dev/null || { echo "check-format.sh: '$cf' not found; install clang-format or set CLANG_FORMAT" >&2; exit 2; }
fix=0
files=()
case ${1:-} in
  --since)
    [[ $# -eq 2 ]] || { echo "check-format.sh: --since takes one commit, e.g. --since origin/main" >&2; exit 2; }
    git -C "$root" rev-parse --verify -q "$2^{commit}" > /dev/null || { echo "check-format.sh: '$2' is not a commit" >&2; exit 2; }
    while IFS= read -r f; do files+=("$root/$f"); done < <(git -C "$root" diff --name-only --diff-filter=ACMR "$2" -- \
      '*.hpp' '*.cpp' '*.h' '*.cc' '*.cu' '*.cuh')
    ;;
  --fix) fix=1; shift; files=("$@") ;;
  "") echo "usage: check-format.sh FILE... | --since BASE | --fix FILE..." >&2; exit 2 ;;
  *) files=("$@") ;;
esac
status=0
for f in "${files[@]}"; do
  [[ -f $f ]] || { echo "check-format.sh: no such file '$f'" >&2; status=2; continue; }
  if [[ $fix -eq 1 ]]; then
    "$cf" -i --style=file "$f"
  elif ! out=$("$cf" --style=file "$f" | diff -u --label "$f" --label "$f (formatted)" "$f" -); then
    echo "$out"
    status=1
  fi
done
[[ $status -eq 1 ]] && echo "check-format.sh: the files above differ from .clang-format; fix with scripts/check-format.sh --fix FILE..." >&2
exit $status
