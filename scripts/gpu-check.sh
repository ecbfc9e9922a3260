#!/usr/bin/env bash
# gpu-check.sh — the one command to run on a machine with an NVIDIA GPU (budget: 8 minutes on one H200).
#
#   1. configures a Release build with the CUDA backend for the local GPU's architecture,
#   2. builds the CUDA tests and the CUDA benchmark (nothing else, so the build stays short),
#   3. runs the CUDA tests (a skipped test counts as a failure here: the GPU is supposed to be there),
#   4. runs bench/cuda_block (GPT block fwd+bwd bf16, cuBLAS baseline, all-reduce bandwidth),
#   5. runs the GPT training-step check against the host, when examples/train_gpt supports it,
#   6. prints a summary; record the numbers in docs/performance.md ("CUDA" section).
#
# Environment: BUILD_DIR (default build/gpu-check), JOBS (default: all cores), CUDA_ARCH (default:
# the compute capability nvidia-smi reports, e.g. 90 for H100/H200).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
build=${BUILD_DIR:-build/gpu-check}
jobs=${JOBS:-$(nproc)}
log=$build/gpu-check-logs
elapsed() { echo $(( $(date +%s) - start )); }

if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); this script needs one." >&2
  exit 2
fi
nvidia-smi -L
arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')}
[ -n "$arch" ] || arch="80;90"
mkdir -p "$log"

# ---- 1-2. configure and build ------------------------------------------------------------------
echo "== configure (Release, CUDA arch $arch) =="
if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMPAR_ENABLE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" \
     -DMPAR_BUILD_TESTS=ON -DMPAR_BUILD_BENCHMARKS=ON > "$log/configure.log" 2>&1; then
  tail -40 "$log/configure.log"; echo "gpu-check: configure FAILED"; exit 1
fi
targets=(test_cuda bench_cuda_block)
has_train_gpt=0
if cmake --build "$build" --target help 2>/dev/null | grep -qE '(^|[ .])train_gpt($|[ :])'; then
  has_train_gpt=1
  targets+=(train_gpt)
fi
echo "== build ${targets[*]} (-j $jobs) =="
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" > "$log/build.log" 2>&1; then
  tail -60 "$log/build.log"; echo "gpu-check: build FAILED"; exit 1
fi
build_s=$(elapsed)

# ---- 3. CUDA tests -----------------------------------------------------------------------------
echo "== CUDA tests =="
timeout 240 ctest --test-dir "$build" -L cuda -LE bench-smoke --output-on-failure --timeout 180 2>&1 | tee "$log/ctest.log"
test_rc=${PIPESTATUS[0]}
skipped=$(grep -c '\*\*\*Skipped' "$log/ctest.log" || true)
tests_line=$(grep -E 'tests passed' "$log/ctest.log" | tail -1)
test_status=ok
if [ "$test_rc" -ne 0 ]; then test_status=FAILED; fi
if [ "$skipped" -ne 0 ]; then test_status="FAILED ($skipped skipped although a GPU is present)"; fi

# ---- 4. benchmark ------------------------------------------------------------------------------
echo "== bench_cuda_block =="
timeout 200 "$build/bench/cuda_block/bench_cuda_block" 2>&1 | tee "$log/bench.log"
bench_rc=${PIPESTATUS[0]}
bench_json=$(tail -1 "$log/bench.log")

# ---- 5. hook: GPT training step on CUDA against the host ---------------------------------------
# Runs only when examples/train_gpt exists and its --help lists both --backend and --check-against-host.
train_status="not run (examples/train_gpt not built by this tree)"
if [ "$has_train_gpt" -eq 1 ]; then
  exe=$(find "$build/examples" -type f -name train_gpt -perm -u+x | head -1)
  if [ -n "$exe" ] && "$exe" --help 2>&1 | grep -q -- '--check-against-host' && "$exe" --help 2>&1 | grep -q -- '--backend'; then
    echo "== GPT training steps: CUDA vs host (one rank, then tp=2 x pp=2 thread ranks sharing the GPUs) =="
    timeout 120 "$exe" --backend cuda --check-against-host 2>&1 | tee "$log/train_gpt.log"
    rc1=${PIPESTATUS[0]}
    timeout 120 "$exe" --backend cuda --check-against-host --tp 2 --pp 2 --layers 4 2>&1 | tee -a "$log/train_gpt.log"
    rc2=${PIPESTATUS[0]}
    echo "== train_gpt --backend cuda: 20 steps, one rank =="
    timeout 120 "$exe" --backend cuda --steps 20 --sample 0 2>&1 | tail -4 | tee -a "$log/train_gpt.log"
    rc3=${PIPESTATUS[0]}
    rc4=0
    if command -v mpirun > /dev/null; then
      # NCCL on every axis: one process per GPU (pp=2 x dp when there are GPUs enough).
      gpus=$(nvidia-smi -L | wc -l)
      np=1; extra=()
      if [ "$gpus" -ge 4 ]; then np=4; extra=(--pp 2 --dp 2); elif [ "$gpus" -ge 2 ]; then np=2; extra=(--pp 2); fi
      echo "== train_gpt --backend cuda under mpirun -np $np (NCCL) ${extra[*]} =="
      timeout 180 mpirun --allow-run-as-root -np "$np" "$exe" --backend cuda "${extra[@]}" --steps 20 --sample 0 2>&1 \
        | tail -4 | tee -a "$log/train_gpt.log"
      rc4=${PIPESTATUS[0]}
    fi
    [ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ] && [ "$rc3" -eq 0 ] && [ "$rc4" -eq 0 ] && train_status=ok || train_status=FAILED
  else
    train_status="not run (train_gpt has no --backend/--check-against-host yet)"
  fi
fi

# ---- 6. summary --------------------------------------------------------------------------------
echo
echo "================ gpu-check summary ================"
echo "GPU:            $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
echo "build:          ok in ${build_s} s (arch $arch)"
echo "CUDA tests:     $test_status — $tests_line"
echo "bench:          exit $bench_rc"
grep -E '^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+%' "$log/bench.log" | sed 's/^/  block  /'
echo "bench JSON:     $bench_json"
echo "train_gpt hook: $train_status"
echo "total:          $(elapsed) s; logs in $log"
echo "Record these numbers and the command in docs/performance.md (section 'CUDA backend')."
[ "$test_status" = ok ] && [ "$bench_rc" -eq 0 ] && [[ "$train_status" != FAILED ]]
