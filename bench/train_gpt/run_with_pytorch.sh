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
# "--microbatches 8"). Builds nothing; needs python3 with torch. OPENBLAS_CORETYPE and
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

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== load average before: $(cat /proc/loadavg)"
echo "== mpar: $bin $* ${MPAR_ARGS:-}"
# shellcheck disable=SC2086
"$bin" "$@" ${MPAR_ARGS:-} | tee "$tmp/mpar.out"
echo "== load average between: $(cat /proc/loadavg)"
echo "== PyTorch: python3 $here/pytorch_gpt.py $*"
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 "$here/pytorch_gpt.py" "$@" | tee "$tmp/torch.out"
echo "== load average after: $(cat /proc/loadavg)"

python3 - "$tmp/mpar.out" "$tmp/torch.out" <<'PY'
import json, sys
ours = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
torch = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
load = open("/proc/loadavg").read().split()[0]
print(json.dumps({"bench": "train_gpt_vs_pytorch", "ours": round(ours["ours"], 1),
                  "baseline": round(torch["tokens_per_second"], 1), "unit": "tokens/s",
                  "ratio": round(ours["ours"] / torch["tokens_per_second"], 4),
                  "mpar_best": ours["best"], "mpar_single_rank": round(ours["baseline"], 1),
                  "pytorch_best": torch["best"], "torch": torch["torch"], "load": float(load)}))
PY
