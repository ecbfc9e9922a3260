#!/usr/bin/env bash
# run-test-cases.sh — runs every test case of a Catch2 (v2) test binary in its own process, so that a crash,
# a hang or a device left in a bad state by one case does not hide the cases after it. scripts/gpu-check.sh
# runs the CUDA tests with it on a GPU machine; any Catch2 binary works (Catch2 v2 is compiled into it, so the
# machine needs no Catch2).
#
#   scripts/run-test-cases.sh [--budget SECONDS] [--case-timeout SECONDS] [--part NAME] EXE LOGDIR
#
# Lists the cases (EXE --list-test-names-only), then runs each alone within what is left of --budget
# (default 600 s) and at most --case-timeout seconds (default 60). Writes LOGDIR/NAME/<n>.log for case n and
# LOGDIR/NAME.json (NAME: --part, default "tests"): one object with the counts and one entry per case, whose
# status is passed, failed (a failed check: exit 1), crashed (killed by a signal), timeout, skipped (exit 77:
# the binary found no device), not found (the name did not select exactly this case) or not run (the budget
# was spent before it). Prints one line per case and exits 0 when every case passed, 1 otherwise, 2 on bad
# usage or when the cases cannot be listed.
set -uo pipefail

budget=600 case_timeout=60 part=tests
die() { echo "run-test-cases: $*" >&2; exit 2; }
whole_seconds() { [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] || die "$1 takes a whole number of seconds >= 1, not '$2'"; }
while [ $# -gt 0 ]; do
  case $1 in
    --budget) [ $# -ge 2 ] || die "--budget needs a value"; whole_seconds "$1" "$2"; budget=$2; shift 2 ;;
    --case-timeout) [ $# -ge 2 ] || die "--case-timeout needs a value"; whole_seconds "$1" "$2"; case_timeout=$2; shift 2 ;;
    --part) [ $# -ge 2 ] || die "--part needs a name"; [[ $2 =~ ^[A-Za-z0-9_.-]+$ ]] || die "--part '$2': use letters, digits, _ . -"
            part=$2; shift 2 ;;
    --*) die "unknown option '$1' (usage: run-test-cases.sh [--budget S] [--case-timeout S] [--part NAME] EXE LOGDIR)" ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || die "usage: run-test-cases.sh [--budget S] [--case-timeout S] [--part NAME] EXE LOGDIR"
exe=$1 logdir=$2
[ -x "$exe" ] || die "'$exe' is not an executable"
start=$(date +%s)
deadline=$((start + budget))
mkdir -p "$logdir/$part" || die "cannot create $logdir/$part"

# A JSON string: backslashes, quotes and control characters escaped.
json_string() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/\\t}
  s=${s//$'\r'/\\r}
  s=${s//$'\n'/\\n}
  printf '"%s"' "$s"
}

# The test spec that selects exactly the case named $1: Catch2 reads ',' as "or", '[' as a tag, '"' as quoting,
# '~' as "not" and '\' as an escape, so each of them is escaped.
catch_spec() {
  local s=$1 out="" c i
  for ((i = 0; i < ${#s}; ++i)); do
    c=${s:i:1}
    case $c in
      '\' | ',' | '[' | ']' | '"' | '~') out+="\\$c" ;;
      *) out+=$c ;;
    esac
  done
  printf '%s' "$out"
}

mapfile -t names < <(timeout 60 "$exe" --list-test-names-only 2> "$logdir/$part/list.log" | sed '/^[[:space:]]*$/d')
list_rc=${PIPESTATUS[0]}
[ "$list_rc" -eq 0 ] && [ "${#names[@]}" -gt 0 ] ||
  die "listing the cases of $exe failed (exit $list_rc, ${#names[@]} names; $logdir/$part/list.log)"

declare -A count=([passed]=0 [failed]=0 [crashed]=0 [timeout]=0 [skipped]=0 ["not found"]=0 ["not run"]=0)
entries=()
echo "== $part: ${#names[@]} cases of $(basename "$exe"), each in its own process (budget ${budget} s, at most ${case_timeout} s a case) =="
for i in "${!names[@]}"; do
  name=${names[$i]}
  log=$logdir/$part/$((i + 1)).log
  left=$((deadline - $(date +%s)))
  t=$((left < case_timeout ? left : case_timeout))
  t0=$(date +%s)
  rc=
  spec=$(catch_spec "$name")
  if [ "$t" -lt 1 ]; then
    status="not run"
    echo "budget of $budget s spent before this case" > "$log"
  elif [ "$(timeout 30 "$exe" --list-test-names-only "$spec" 2>&1 | sed '/^[[:space:]]*$/d')" != "$name" ]; then
    # The spec must select this case and no other (a binary may stop before Catch2 reads it, e.g. on exit 77).
    status="not found"
    { echo "the test spec '$spec' does not select exactly this case; it lists:"
      timeout 30 "$exe" --list-test-names-only "$spec" 2>&1; } > "$log"
  else
    timeout -k 5 "$t" "$exe" "$spec" --reporter compact > "$log" 2>&1
    rc=$?
    case $rc in
      0) status=passed ;;
      77) status=skipped ;;
      124 | 137) status=timeout ;;
      *) if [ "$rc" -gt 128 ]; then status=crashed; else status=failed; fi ;;
    esac
    # A name the spec did not select exactly: Catch2 reports that nothing matched, or ran more than this case.
    if grep -qE 'No test cases matched|No tests ran' "$log"; then
      status="not found"
    elif [ "$status" = passed ] && ! grep -qE 'Passed 1 test case( with|  ?\(no assertions)' "$log"; then
      status="not found"
    fi
  fi
  seconds=$(($(date +%s) - t0))
  count[$status]=$((${count[$status]} + 1))
  last=$(sed '/^[[:space:]]*$/d' "$log" | tail -1)
  detail=$status
  [ "$status" = crashed ] && detail="crashed (signal $((rc - 128)))"
  [ "$status" = failed ] && detail="failed (exit $rc)"
  [ "$status" = timeout ] && detail="timeout (after $t s)"
  printf '%-9s %4d s  %s\n' "$status" "$seconds" "$name"
  entries+=("{\"name\": $(json_string "$name"), \"status\": \"$status\", \"detail\": $(json_string "$detail"), \"exit\": ${rc:-null}, \"seconds\": $seconds, \"limit_s\": $((t > 0 ? t : 0)), \"log\": $(json_string "$log"), \"last_line\": $(json_string "$last")}")
done

total=${#names[@]}
overall=passed
[ "${count[passed]}" -eq "$total" ] || overall=failed
{
  printf '{"part": %s, "status": "%s", "exe": %s, "cases": %d, "passed": %d, "failed": %d, "crashed": %d, "timeout": %d, ' \
    "$(json_string "$part")" "$overall" "$(json_string "$exe")" "$total" "${count[passed]}" "${count[failed]}" \
    "${count[crashed]}" "${count[timeout]}"
  printf '"skipped": %d, "not_found": %d, "not_run": %d, "seconds": %d, "budget_s": %d, "case_timeout_s": %d, "results": [' \
    "${count[skipped]}" "${count["not found"]}" "${count["not run"]}" "$(($(date +%s) - start))" "$budget" "$case_timeout"
  for i in "${!entries[@]}"; do
    [ "$i" -gt 0 ] && printf ', '
    printf '%s' "${entries[$i]}"
  done
  printf ']}\n'
} > "$logdir/$part.json"
echo "== $part: ${count[passed]} of $total passed, ${count[failed]} failed, ${count[crashed]} crashed, ${count[timeout]} timed out, ${count[skipped]} skipped, ${count["not found"]} not found, ${count["not run"]} not run; $logdir/$part.json"
[ "$overall" = passed ]
