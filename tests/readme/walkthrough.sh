#!/usr/bin/env bash
# Runs one of the README's walkthroughs as a user would: the shell commands of the ```sh blocks under the
# heading that starts with HEADING, in a fresh directory, with `./build/release` read as the build tree under
# test and `examples/` as the source tree's. Two kinds of line are stood in for, and the output says so:
# `cmake --build` (the test's own build made the target) and GPT-2 tokenisation when tiktoken is absent (the same command
# with --bytes: a token file of the same format, one id per byte of the input text). Every line of a
# ```cpp block under the heading must be a line of EXCERPT (the README quotes the example, it does not
# paraphrase it), and every EXPECT path must exist afterwards.
#
#   walkthrough.sh README HEADING SOURCE_DIR BUILD_DIR WORK_DIR [--excerpt FILE] [--expect PATH]...
set -euo pipefail
readme=$1 heading=$2 src=$3 build=$4 work=$5
shift 5
excerpt="" expects=()
while [ $# -gt 0 ]; do
  case $1 in
    --excerpt) excerpt=$2; shift 2 ;;
    --expect) expects+=("$2"); shift 2 ;;
    *) echo "walkthrough.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

# The section: from the heading line to the next heading of any level.
section=$(awk -v h="$heading" 'index($0, h) == 1 {on = 1; next} on && /^#/ {exit} on {print}' "$readme")
[ -n "$section" ] || { echo "README has no section starting with '$heading'" >&2; exit 1; }
block() {  # the lines of every ```$1 block of the section
  awk -v lang="$1" '/^```/ {if (on) {on = 0; next} if ($0 == "```" lang) {on = 1; next}} on {print}' <<<"$section"
}
commands=$(block sh | sed -e ':a' -e '/\\$/N; s/\\\n[[:space:]]*/ /; ta')
[ -n "$commands" ] || { echo "README section '$heading' has no sh block" >&2; exit 1; }

if [ -n "$excerpt" ]; then
  source_lines=$(sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$excerpt")
  while IFS= read -r line; do
    trimmed=$(sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' <<<"$line")
    [ -z "$trimmed" ] && continue
    if ! grep -qxF -- "$trimmed" <<<"$source_lines"; then
      echo "README section '$heading' quotes a line that is not in $excerpt:" >&2
      echo "  $trimmed" >&2
      exit 1
    fi
  done < <(block cpp)
fi

rm -rf "$work" && mkdir -p "$work" && cd "$work"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# A host file's slots are its cores on a real cluster; here 8 ranks share fewer cores, and Open MPI's ranks
# would spin for their messages instead of yielding (20 steps took 170 s instead of 23).
export OMPI_MCA_mpi_yield_when_idle=1
while IFS= read -r cmd; do
  [ -z "$cmd" ] && continue
  case $cmd in
    "cmake --build"*) echo "walkthrough: '$cmd' stood in for by the test's build"; continue ;;
  esac
  cmd=${cmd//.\/build\/release\//$build/}
  cmd=$(sed -e "s#\(^\|[[:space:]]\)examples/#\1$src/examples/#g" <<<"$cmd")
  if [[ $cmd == *tokenize_gpt2.py* ]] && ! python3 -c "import tiktoken" 2>/dev/null; then
    echo "walkthrough: tiktoken is absent: '$cmd' run with --bytes (one id per byte)"
    cmd="$cmd --bytes"
  fi
  echo "walkthrough: $cmd"
  bash -c "set -euo pipefail; $cmd"
done <<<"$commands"

for p in "${expects[@]}"; do
  [ -e "$p" ] || { echo "walkthrough '$heading': $p was not written" >&2; exit 1; }
done
echo "walkthrough '$heading': every command ran"
