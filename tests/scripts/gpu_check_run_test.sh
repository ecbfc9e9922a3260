#!/usr/bin/env bash
# gpu-check.sh --run end to end on stand-ins (tests/scripts/CMakeLists.txt): a bundle laid out as --bundle lays it out,
# holding stand-in binaries (stand_in/: a test binary with a passing and a failing case, a train_gpt that passes its
# checks and prints a throughput line, a bench), and nvidia-smi answering for one H100. Started with relative paths
# from WORKDIR; checks that every part wrote its JSON, that the MFU is train_gpt's model TFLOP/s over the H100's 989,
# that the PyTorch parts fail with the script's reason here (no torch, or no CUDA device) and that the run fails.
#   gpu_check_run_test.sh WORKDIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=$1
rm -rf "$work" && mkdir -p "$work/bundle/payload/bin" "$work/bundle/payload/lib" "$work/bundle/data" || exit 1
cp "$here"/stand_in/{test_cuda,train_gpt,bench_cuda_block} "$work/bundle/payload/bin/"
cp "$repo"/scripts/{gpu-check.sh,run-test-cases.sh} "$repo"/bench/train_gpt/{torch_gpt_cuda.py,pytorch_gpt.py} "$work/bundle/"
echo "a training text" > "$work/bundle/data/train.txt"
echo "stand-in bundle" > "$work/bundle/MANIFEST"
tar -C "$work/bundle" -cf - payload | xz -1 > "$work/bundle/payload.tar.xz" && rm -rf "$work/bundle/payload" || exit 1

cd "$work" || exit 1
PATH="$here/stand_in:$PATH" OUT=logs PYTHONDONTWRITEBYTECODE=1 bash bundle/gpu-check.sh --run bundle --budget 300
rc=$?
[ "$rc" -eq 1 ] || { echo "gpu-check.sh --run exited $rc, expected 1 (a test case and the PyTorch parts fail)" >&2; exit 1; }
"${PYTHON3:-python3}" - "$work/logs" <<'PY'
import json, os, sys
logs = sys.argv[1]
problems = []
parts = ["cuda_tests", "check_one_rank", "check_tp2_pp2", "mfu_train_gpt", "torch_eager", "torch_compile",
         "bench_cuda_block"]
doc = {}
for p in parts:
    try:
        with open(os.path.join(logs, p + ".json")) as f:
            doc[p] = json.load(f)
    except (OSError, ValueError) as e:
        problems.append(f"{p}.json: {e}")
with open(os.path.join(logs, "summary.json")) as f:
    summary = json.load(f)
want = {"cuda_tests": "failed", "check_one_rank": "passed", "check_tp2_pp2": "passed", "mfu_train_gpt": "passed",
        "torch_eager": "failed (exit 2)", "torch_compile": "failed (exit 2)", "bench_cuda_block": "passed"}
if summary["parts"] != want:
    problems.append(f"summary parts {summary['parts']} != {want}")
for p in doc:
    if doc[p].get("status") != want[p]:
        problems.append(f"{p}.json status {doc[p].get('status')!r} != {want[p]!r}")
tests = doc.get("cuda_tests", {})
if (tests.get("passed"), tests.get("failed"), tests.get("cases")) != (1, 1, 2):
    problems.append(f"cuda_tests: passed/failed/cases {tests.get('passed')}/{tests.get('failed')}/{tests.get('cases')}")
# train_gpt's stand-in: 8 layers, hidden 2048, seq 1024, batch 8, vocab 80 in 0.5 s -> 42.8971 TFLOP/s; H100 989.
if summary["mpar_mfu"] != round(42.8971 / 989, 4) or summary["peak_tflops"] != 989:
    problems.append(f"MFU {summary['mpar_mfu']} at peak {summary['peak_tflops']}, expected {round(42.8971 / 989, 4)} at 989")
if summary["mpar_tokens_per_second"] != 16384 or doc["mfu_train_gpt"]["throughput"]["hidden"] != 2048:
    problems.append(f"mpar tokens/s {summary['mpar_tokens_per_second']}, throughput {doc['mfu_train_gpt']['throughput']}")
torch_log = open(os.path.join(logs, "torch_eager.log")).read()
if "torch_gpt_cuda.py: needs PyTorch" not in torch_log and "sees no CUDA device" not in torch_log:
    problems.append(f"torch_eager.log does not give the reason: {torch_log[-300:]!r}")
if summary["torch_eager_tokens_per_second"] is not None or summary["passed"] is not False:
    problems.append(f"summary claims PyTorch numbers or a pass: {summary}")
if problems:
    sys.exit("gpu-check --run on stand-ins:\n  " + "\n  ".join(problems))
print("gpu-check --run on stand-ins: every part as expected")
PY
