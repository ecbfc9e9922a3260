#!/usr/bin/env bash
# Runs scripts/run-test-cases.sh over catch_cases_fixture and checks the JSON it writes (tests/scripts/CMakeLists.txt):
#   run_cases_test.sh all FIXTURE OUTDIR     every case within its own timeout: each ends as it should, and the
#                                            crash and the hang do not hide the cases after them
#   run_cases_test.sh budget FIXTURE OUTDIR  an 8 s budget: the hang is cut at what is left (or never started), and
#                                            every case after it is recorded as not run
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=$1 fixture=$2 out=$3
rm -rf "$out"
names=(
  'fixture: passes, with [brackets], "quotes", a \ backslash, a ~tilde and a *star'
  'fixture: a failed check'
  'fixture: a crash'
  'fixture: passes after the crash'
  'fixture: a hang'
  'fixture: no device'
  'fixture: passes, a prefix of the next name'
  'fixture: passes, a prefix of the next name, longer'
)
case $mode in
  all)
    bash "$here/../../scripts/run-test-cases.sh" --budget 120 --case-timeout 3 --part fixture "$fixture" "$out"
    rc=$?
    statuses=(passed failed crashed passed timeout skipped passed passed) ;;
  budget)
    bash "$here/../../scripts/run-test-cases.sh" --budget 8 --case-timeout 60 --part fixture "$fixture" "$out"
    rc=$?
    statuses=(passed failed crashed "passed|not run" "timeout|not run" "not run" "not run" "not run") ;;
  *) echo "run_cases_test.sh: unknown mode '$mode'" >&2; exit 2 ;;
esac
[ "$rc" -eq 1 ] || { echo "run-test-cases.sh exited $rc, expected 1 (some cases do not pass)" >&2; exit 1; }
expected=()
for i in "${!names[@]}"; do expected+=("${names[$i]}=${statuses[$i]}"); done
"${PYTHON3:-python3}" "$here/check_cases_json.py" "$out/fixture.json" "${expected[@]}"
