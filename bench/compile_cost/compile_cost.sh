#!/usr/bin/env bash
# The compile cost a header-only library puts on every consumer: user CPU seconds of -fsyntax-only
# of a file that only includes <mpar/mpar.hpp>, against <bits/stdc++.h> (the whole standard
# library) measured in the same run and the same way, so the ratio stays meaningful on a loaded or
# slower machine. The smallest of --repeat runs counts (noise only ever adds time).
#
#   compile_cost.sh [--cxx g++] [--include DIR] [--repeat N] [--smoke] [--per-header] [--budget B]
#
# --per-header also prints where the umbrella header's time goes: for each header it includes, in its
# order, the time of that header alone and its marginal cost (the umbrella's includes up to and including
# it, minus those before it: what it adds that the earlier ones did not already pull in).
#
# --budget B (default 1.5): the umbrella header may cost at most B times <bits/stdc++.h> measured in the
# same run. Above it the script says so on stderr ("over budget", naming both times and the ratio) and
# exits with status 3 after printing its JSON line, so a header that regrows fails its test instead of
# regressing silently. A ratio, not seconds: the standard library is the yardstick that loads and slower
# machines inflate alike. 0 turns the check off.
#
# The last line is one JSON object: bench, ours, baseline, unit, ratio (baseline / ours: > 1 means
# the umbrella header is cheaper than the standard library), loadavg (1-minute, at the start), and
# the other headers' times for reference.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cxx=${CXX:-g++}
include="$here/../../include"
repeat=3
per_header=0
budget=1.5
while [[ $# -gt 0 ]]; do
  case $1 in
    --cxx) cxx=$2; shift 2 ;;
    --include) include=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --smoke) repeat=1; shift ;;
    --per-header) per_header=1; shift ;;
    --budget) budget=$2; shift 2 ;;
    *) echo "compile_cost.sh: unknown option '$1' (options: --cxx, --include, --repeat, --smoke, --per-header, --budget)" >&2; exit 2 ;;
  esac
done
[[ $repeat =~ ^[1-9][0-9]*$ ]] || { echo "compile_cost.sh: --repeat takes a positive whole number, got '$repeat'" >&2; exit 2; }
[[ $budget =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "compile_cost.sh: --budget takes a number (umbrella / <bits/stdc++.h>; 0 = off), got '$budget'" >&2; exit 2; }
[[ -f $include/mpar/mpar.hpp ]] || { echo "compile_cost.sh: no mpar/mpar.hpp under --include '$include'" >&2; exit 2; }
flags=(-std=c++20 -O2 -fsyntax-only -I"$include")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
loadavg=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo null)

# user_seconds HEADER...: the smallest user CPU time of `repeat` syntax-only compiles of `#include <HEADER>`
# for each HEADER given (none: an empty file).
user_seconds() {
  local src="$work/tu.cpp" best="" t
  : > "$src"
  for h in "$@"; do printf '#include <%s>\n' "$h" >> "$src"; done
  for ((i = 0; i < repeat; ++i)); do
    # bash's `time` reports the children's user time; its output goes to the group's stderr.
    t=$( { TIMEFORMAT=%U; time "$cxx" "${flags[@]}" "$src" 2> "$work/err" >&2; } 2>&1 ) ||
      { cat "$work/err" >&2; echo "compile_cost.sh: '$cxx' failed on #include <$*>" >&2; exit 1; }
    if [[ -z $best ]] || awk -v a="$t" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$t; fi
  done
  echo "$best"
}

if ((per_header)); then
  # The umbrella's own include lines, in order ("mpar/core.hpp", ...).
  mapfile -t parts < <(sed -n 's/^#include "\(mpar\/[^"]*\)"/\1/p' "$include/mpar/mpar.hpp")
  empty=$(user_seconds)
  echo "per header of <mpar/mpar.hpp> (syntax-only user seconds, best of $repeat; an empty file: $empty):"
  printf '  %-40s %8s %9s\n' header alone marginal
  before=$empty
  for ((k = 0; k < ${#parts[@]}; ++k)); do
    alone=$(user_seconds "${parts[k]}")
    upto=$(user_seconds "${parts[@]:0:k+1}")
    printf '  %-40s %8s %9s\n' "<${parts[k]}>" "$alone" "$(awk -v a="$upto" -v b="$before" 'BEGIN { printf "%.2f", a - b }')"
    before=$upto
  done
fi

ours=$(user_seconds mpar/mpar.hpp)
baseline=$(user_seconds bits/stdc++.h)
tools=null
[[ -f $include/mpar/tools.hpp ]] && tools=$(user_seconds mpar/tools.hpp)
echo "syntax-only user seconds (best of $repeat, $($cxx --version | head -1), 1-min loadavg $loadavg):"
echo "  <mpar/mpar.hpp>  $ours"
echo "  <mpar/tools.hpp> $tools"
echo "  <bits/stdc++.h>  $baseline"
ratio=$(awk -v a="$baseline" -v b="$ours" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }')
# cost: the umbrella in units of the standard library (the budget's unit; the inverse of `ratio`).
cost=$(awk -v a="$baseline" -v b="$ours" 'BEGIN { printf "%.3f", (a > 0 ? b / a : 0) }')
over=false
if awk -v c="$cost" -v b="$budget" 'BEGIN { exit !(b > 0 && c > b) }'; then over=true; fi
echo "  <mpar/mpar.hpp> / <bits/stdc++.h> = $cost (budget $budget)"
printf '{"bench": "compile_cost", "ours": %s, "baseline": %s, "unit": "s user (-fsyntax-only, -std=c++20 -O2)", "ratio": %s, "loadavg": %s, "ours_header": "<mpar/mpar.hpp>", "baseline_header": "<bits/stdc++.h>", "tools_hpp": %s, "repeat": %s, "cost_in_stdlibs": %s, "budget": %s, "over_budget": %s}\n' \
  "$ours" "$baseline" "$ratio" "$loadavg" "$tools" "$repeat" "$cost" "$budget" "$over"
if [[ $over == true ]]; then
  echo "compile_cost.sh: over budget: <mpar/mpar.hpp> took $ours s, $cost times <bits/stdc++.h> ($baseline s) in the same run; the budget is $budget. Find the header that grew with --per-header and move what a training program does not need behind mpar/tools.hpp or mpar/io.hpp (docs/performance.md)" >&2
  exit 3
fi
