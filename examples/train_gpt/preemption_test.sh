#!/usr/bin/env bash
# train_gpt stopped by a real signal in the middle of training, as a cluster scheduler stops a job: it must exit
# with status 0 after a checkpoint and print the command that resumes it; that command, run as printed, must train
# to the last step and end with the uninterrupted run's checkpoint, byte for byte, and its last loss.
#
# Usage: preemption_test.sh TRAIN_GPT WORKDIR SIGNAL ARGS...   (ARGS: the run, with --steps, without --save)
set -euo pipefail
exe=$1 dir=$2 sig=$3
shift 3
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir"
fail() {
  echo "preemption: FAILED: $*" >&2
  for f in full.log stopped.log resumed.log; do [[ -f $f ]] && { echo "--- $f" >&2; tail -n 8 "$f" >&2; }; done
  exit 1
}
steps=$(printf '%s\n' "$@" | grep -A1 -x -- --steps | tail -n 1)
[[ $steps =~ ^[0-9]+$ ]] || fail "give --steps N among the arguments"
last=$(printf 'step-%08d' "$steps")

# The uninterrupted run.
"$exe" "$@" --save full > full.log 2>&1 || fail "the uninterrupted run failed"

# The same run, sent the signal once step 2 is printed: training is under way, neither starting nor ending.
signal_option=()
[[ $sig == SIGTERM ]] || signal_option=(--exit-signal "$sig")
"$exe" "$@" "${signal_option[@]}" --log-every 1 --save stopped > stopped.log 2>&1 &
pid=$!
for ((i = 0; i < 12000; ++i)); do
  grep -qE '^step +2/' stopped.log && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.01
done
kill -s "${sig#SIG}" "$pid" 2> /dev/null || true
rc=0
wait "$pid" || rc=$?
grep -q '^done: ' stopped.log && fail "the run ended before the signal reached it; give more --steps"
[[ $rc == 0 ]] || fail "the signalled run exited with status $rc, not 0"
line=$(grep -E "^stopped by $sig after step [0-9]+ of $steps, checkpoint " stopped.log) ||
  fail "no 'stopped by $sig after step K of $steps, checkpoint ...' line"
k=$(sed -E 's/^stopped by [A-Z0-9]+ after step ([0-9]+) .*/\1/' <<< "$line")
((k >= 2 && k < steps)) || fail "stopped after step $k, not between step 2 and step $steps"
[[ -d stopped/$(printf 'step-%08d' "$k") ]] || fail "no checkpoint of step $k in stopped/"
[[ $(tail -n 1 stopped.log) == "resume with: "* ]] || fail "the last line is not 'resume with: COMMAND'"
command=$(tail -n 1 stopped.log)
command=${command#resume with: }
[[ $command == *" --resume stopped" ]] || fail "the resume command does not end with --resume stopped: $command"

# The printed command, as a user would paste it.
eval "$command" > resumed.log 2>&1 || fail "the resume command failed: $command"
grep -qE "^done: steps $((k + 1))-$steps of $steps " resumed.log || fail "the resumed run did not train steps $((k + 1))-$steps"

# The resumed run ends where the uninterrupted one did: every rank's checkpoint file equal, the same last loss.
files=$(cd "full/$last" && ls rank-*.bin)
[[ -n $files ]] || fail "no rank files in full/$last"
[[ $files == "$(cd "stopped/$last" && ls rank-*.bin)" ]] || fail "the two final checkpoints hold different rank files"
for f in $files; do
  cmp -s "full/$last/$f" "stopped/$last/$f" || fail "$f of step $steps differs from the uninterrupted run's"
done
loss_full=$(grep -E "^step +$steps/$steps " full.log | sed -E 's/.* loss ([^ ]+) .*/\1/')
loss_resumed=$(grep -E "^step +$steps/$steps " resumed.log | sed -E 's/.* loss ([^ ]+) .*/\1/')
[[ -n $loss_full && $loss_full == "$loss_resumed" ]] ||
  fail "last loss '$loss_resumed' after the resume, '$loss_full' uninterrupted"
echo "preemption: stopped by $sig after step $k of $steps, resumed to step $steps: $(wc -w <<< "$files") rank files" \
  "and the last loss $loss_full equal to the uninterrupted run's"
echo "preemption: passed"
