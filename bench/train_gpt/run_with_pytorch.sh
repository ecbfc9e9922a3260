#!/usr/bin/env bash
# Runs the mpar GPT training benchmark and the PyTorch baseline of the same model back to back, and
# prints as its last line one JSON object: ours = mpar's best 2-rank tokens/s, baseline = PyTorch's
# best tokens/s (one process with 1 or 2 threads, or DDP over 2 processes), ratio = ours / baseline.
#
#   bench/train_gpt/run_with_pytorch.sh BUILD/bench/train_gpt/bench_train_gpt [ARGS...]
#
# ARGS go to both programs (both understand --hidden --layers --heads --seq --batch --rounds --warm
# --steps --data --precision --smoke; --precision bf16 compares mpar's nn::Autocast with torch's bf16
# autocast); MPAR_ARGS holds extra arguments for the mpar binary only (e.g.
# "--microbatches 8"). PAIRS=N runs N such pairs back to back, mpar then PyTorch each time, and reports
# the pair whose ratio is the median (with every pair's ratio): the baseline's idle-machine runs vary
# by as much as the gap measured. Builds nothing; needs python3 with torch. OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE are unset for the PyTorch run only (they tune the OpenBLAS that mpar links).
set -euo pipefail
if [[ $# -lt 1 || ! -x "$1" ]]; then
  echo "usage: $0 PATH/TO/bench_train_gpt [ARGS...]  (build it first: cmake --build BUILD --target bench_train_gpt)" >&2
  exit 2
fi
bin=$1
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python3 -c 'import torch' 2>/dev/null || { echo "$0: python3 cannot import torch (pip install torch)" >&2; exit 2; }

pairs=${PAIRS:-1}
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || { echo "$0: PAIRS must be a positive whole number, got '$pairs'" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((i = 1; i <= pairs; ++i)); do
  echo "== pair $i of $pairs; load average before: $(cat /proc/loadavg)"
  echo "== mpar: $bin $* ${MPAR_ARGS:-}"
  # shellcheck disable=SC2086
  "$bin" "$@" ${MPAR_ARGS:-} | tee "$tmp/mpar.out"
  tail -n 1 "$tmp/mpar.out" >> "$tmp/mpar.lines"
  echo "== load average between: $(cat /proc/loadavg)"
  echo "== PyTorch: python3 $here/pytorch_gpt.py $*"
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 "$here/pytorch_gpt.py" "$@" | tee "$tmp/torch.out"
  tail -n 1 "$tmp/torch.out" >> "$tmp/torch.lines"
  echo "== load average after: $(cat /proc/loadavg)"
done

python3 - "$tmp/mpar.lines" "$tmp/torch.lines" <<'PY'
import json, statistics, sys
ours = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
torch = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
ratios = [o["ours"] / t["tokens_per_second"] for o, t in zip(ours, torch)]
# One pair: that pair's figures. Several: the pair with the median ratio (the upper median for an even
# count), so every figure printed comes from one mpar run and the PyTorch run right after it.
m = sorted(range(len(ratios)), key=lambda i: ratios[i])[len(ratios) // 2]
o, t = ours[m], torch[m]
load = open("/proc/loadavg").read().split()[0]
out = {"bench": "train_gpt_vs_pytorch", "ours": round(o["ours"], 1),
       "baseline": round(t["tokens_per_second"], 1), "unit": "tokens/s",
       "ratio": round(ratios[m], 4),
       "mpar_best": o["best"], "mpar_single_rank": round(o["baseline"], 1),
       "pytorch_best": t["best"], "torch": t["torch"], "load": float(load)}
if len(ratios) > 1:
    out["pairs"] = len(ratios)
    out["pair_ratios"] = [round(r, 4) for r in ratios]
print(json.dumps(out))
PY
