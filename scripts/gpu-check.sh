#!/usr/bin/env bash
# gpu-check.sh — the device check: mpar's CUDA path against the host reference on one GPU, its training
# throughput (MFU) next to PyTorch's on the same model, within a time budget. Three ways to run it:
#
#   scripts/gpu-check.sh [--budget S]          on a GPU machine that has the build tools (CMake, Catch2, a
#                                              host BLAS): configure, build the CUDA targets, then run them.
#   scripts/gpu-check.sh --bundle [DIR]        here, on a machine WITHOUT a GPU: build the CUDA tests,
#                                              bench/cuda_block and train_gpt for sm_80, sm_90 and sm_100 (with
#                                              compute_100 PTX for newer GPUs; no MPI), and pack them with the
#                                              shared libraries a bare CUDA machine lacks (host BLAS, oneDNN,
#                                              ...), the scripts and a training text into DIR (default
#                                              build/gpu-bundle, at most 64 MiB). DIR/MANIFEST says what is in it.
#   scripts/gpu-check.sh --run DIR [--budget S] on the GPU machine: run only the bundle's binaries (no build,
#                                              no Catch2, MPI or OpenBLAS needed there); NCCL, cuDNN and cuBLAS
#                                              come from the Python wheels (nvidia-*) when the system has none.
#   --print-plan (with any of them)            print the resolved paths, architectures and the parts with
#                                              their time limits, and exit without building or running.
#
# Paths may be relative to the directory it is started from. Parts of a run, in order, each in its own
# process(es) with a time limit taken from what is left of the budget (--budget, default 480 s, the whole run
# from the start, or the end of the build, to the summary): the CUDA tests, one process per test case
# (scripts/run-test-cases.sh; a skipped case fails here: the GPU is supposed to be there); train_gpt
# --backend cuda --check-against-host at one rank and at tp = 2 x pp = 2 thread ranks sharing the GPU; mpar's
# MFU from train_gpt --backend cuda (bf16, hidden 2048, its own "throughput:" line); PyTorch on the same model,
# eager and torch.compile (bench/train_gpt/torch_gpt_cuda.py); bench/cuda_block (kernel-level block MFU beside
# raw cuBLAS); in the build mode, where mpirun exists, 20 steps under mpirun with NCCL on every axis. Each part writes
# LOGDIR/PART.log and LOGDIR/PART.json; LOGDIR/summary.json (also the last line printed) gathers them.
# LOGDIR is $OUT when set, else DIR/logs (--run) or BUILD_DIR/gpu-check-logs.
#
# Environment: BUILD_DIR (default build/gpu-check, build/gpu-bundle-build for --bundle), JOBS (default:
# all cores), CUDA_ARCH (CMake's CUDA architectures; default: what nvidia-smi reports, "80-real;90-real;100"
# for --bundle), PEAK_TFLOPS (the GPU's dense bf16 peak for MFU; default from its name: H100/H200 SXM 989,
# H100 PCIe 756, H100 NVL 835, A100 312, B200 2250), MFU_ARGS (train_gpt's options for the MFU run; default:
# --precision bf16 --hidden 2048 --heads 16 --layers 8 --seq 1024 --batch 8 --microbatches 1 --steps 6).
# No managed memory is used by anything this script runs.
set -uo pipefail
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
die() { echo "gpu-check: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
absolute() { realpath -m -- "$1"; }
repo=$(absolute "$(dirname "${BASH_SOURCE[0]}")/..")
bundle_limit_mib=64
mfu_args_default="--precision bf16 --hidden 2048 --heads 16 --layers 8 --seq 1024 --batch 8 --microbatches 1 --steps 6"

# ---- arguments: every path is made absolute here, before anything changes directory ----
mode=build dir="" budget=480 print_plan=0
while [ $# -gt 0 ]; do
  case $1 in
    --bundle) mode=bundle
      if [ $# -ge 2 ] && [[ $2 != --* ]]; then dir=$2; shift; fi ;;
    --run) mode=run
      { [ $# -ge 2 ] && [[ $2 != --* ]]; } || die "--run needs the bundle directory (usage: gpu-check.sh --run DIR)"
      dir=$2; shift ;;
    --budget)
      [ $# -ge 2 ] || die "--budget needs a number of seconds"
      [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge 240 ] && [ "$2" -le 3600 ] ||
        die "--budget $2: give whole seconds between 240 (the parts' minimum times) and 3600"
      budget=$2; shift ;;
    --print-plan) print_plan=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
  shift
done
[ "$mode" = bundle ] && [ -z "$dir" ] && dir=$repo/build/gpu-bundle
[ -n "$dir" ] && dir=$(absolute "$dir")
case $mode in
  bundle) build=$(absolute "${BUILD_DIR:-$repo/build/gpu-bundle-build}") ;;
  build) build=$(absolute "${BUILD_DIR:-$repo/build/gpu-check}") ;;
  run) build="" ;;
esac
if [ -n "${OUT:-}" ]; then log=$(absolute "$OUT")
elif [ "$mode" = run ]; then log=$dir/logs
else log=$build/gpu-check-logs; fi
jobs=${JOBS:-$(nproc)}
mfu_args=${MFU_ARGS:-$mfu_args_default}

# The parts of a run: name, the most seconds it may take, and the least it needs to be worth starting. A part
# gets min(its most, what is left of the budget less the least of every part after it); one whose share is
# below its least is not run and says so.
parts=(cuda_tests check_one_rank check_tp2_pp2 mfu_train_gpt torch_eager torch_compile bench_cuda_block)
declare -A part_most=([cuda_tests]=200 [check_one_rank]=60 [check_tp2_pp2]=60 [mfu_train_gpt]=90 [torch_eager]=60
  [torch_compile]=150 [bench_cuda_block]=90 [mpirun_nccl]=120)
declare -A part_least=([cuda_tests]=60 [check_one_rank]=20 [check_tp2_pp2]=20 [mfu_train_gpt]=30 [torch_eager]=20
  [torch_compile]=45 [bench_cuda_block]=20 [mpirun_nccl]=30)
[ "$mode" = build ] && command -v mpirun > /dev/null && parts+=(mpirun_nccl)
case_timeout=45  # one CUDA test case

if [ "$mode" = bundle ]; then arch=${CUDA_ARCH:-"80-real;90-real;100"}
elif [ "$mode" = build ]; then arch=${CUDA_ARCH:-}
else arch="(the bundle's; see its MANIFEST)"; fi

print_the_plan() {
  echo "gpu-check plan"
  echo "mode:             $mode"
  case $mode in
    bundle) echo "bundle directory: $dir"
            echo "build directory:  $build"
            echo "CUDA arch:        $arch" ;;
    run)    echo "bundle directory: $dir ($( [ -f "$dir/MANIFEST" ] && echo "MANIFEST present" || echo "no MANIFEST yet"))" ;;
    build)  echo "build directory:  $build"
            echo "CUDA arch:        ${arch:-the local GPU (nvidia-smi compute_cap)}" ;;
  esac
  echo "logs:             $log"
  [ "$mode" = bundle ] && { echo "then on the GPU machine: bash $dir/gpu-check.sh --run $dir"; return; }
  echo "budget:           $budget s for the whole run"
  echo "MFU model:        train_gpt --backend cuda $mfu_args"
  local rest=0 p
  for p in "${parts[@]}"; do rest=$((rest + ${part_least[$p]})); done
  echo "parts (in order; a part gets min(most, left - least of the parts after it)):"
  for p in "${parts[@]}"; do
    rest=$((rest - ${part_least[$p]}))
    printf '  %-17s most %4d s  least %3d s  (then %3d s reserved for the rest)\n' "$p" "${part_most[$p]}" \
      "${part_least[$p]}" "$rest"
  done
  echo "  cuda_tests:        one process per case, at most $case_timeout s a case"
}

# ---- running one part ----

json_string() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/\\t}
  s=${s//$'\n'/\\n}
  printf '"%s"' "$s"
}
# json_field JSON KEY: the value of the first field KEY (a number or a string without quotes or commas) of a
# one-line JSON object.
json_field() { grep -o "\"$2\": \"\{0,1\}[^,\"}]*" <<< "$1" | head -1 | sed 's/^[^:]*: "\{0,1\}//'; }

# part_limit NAME: the seconds NAME may take now (0 when less than its least is left).
part_limit() {
  local name=$1 after=0 seen=0 p
  for p in "${parts[@]}"; do
    [ "$seen" = 1 ] && after=$((after + ${part_least[$p]}))
    [ "$p" = "$name" ] && seen=1
  done
  local left=$((start + budget - $(date +%s) - after)) most=${part_most[$name]}
  local t=$((left < most ? left : most))
  [ "$t" -ge "${part_least[$name]}" ] && echo "$t" || echo 0
}

# write_part NAME STATUS EXIT SECONDS LIMIT [EXTRA_JSON_FIELDS]: LOGDIR/NAME.json.
write_part() {
  printf '{"part": "%s", "status": %s, "exit": %s, "seconds": %s, "limit_s": %s, "log": %s%s}\n' "$1" \
    "$(json_string "$2")" "$3" "$4" "$5" "$(json_string "$log/$1.log")" "${6:+, $6}" > "$log/$1.json"
}

# run_part NAME COMMAND...: runs COMMAND under the part's limit into LOGDIR/NAME.log; sets part_rc, part_status,
# part_seconds, part_limit_s; prints one line, and the log's tail when the part did not pass.
run_part() {
  local name=$1; shift
  part_limit_s=$(part_limit "$name")
  part_seconds=0 part_rc=null
  if [ "$part_limit_s" -eq 0 ]; then
    part_status="not run (budget spent: $(elapsed) of $budget s gone)"
    echo "budget spent" > "$log/$name.log"
  else
    local t0; t0=$(date +%s)
    timeout -k 5 "$((part_limit_s - 5))" "$@" > "$log/$name.log" 2>&1
    part_rc=$?
    part_seconds=$(($(date +%s) - t0))
    case $part_rc in
      0) part_status=passed ;;
      77) part_status="skipped (exit 77: no CUDA device visible)" ;;
      124 | 137) part_status="timeout (after $((part_limit_s - 5)) s)" ;;
      *) if [ "$part_rc" -gt 128 ]; then part_status="crashed (signal $((part_rc - 128)))"
         else part_status="failed (exit $part_rc)"; fi ;;
    esac
  fi
  printf '%-17s %-40s %4d s (limit %d s)\n' "$name" "$part_status" "$part_seconds" "$part_limit_s"
  if [ "$part_status" != passed ] && [ "$part_limit_s" -gt 0 ]; then sed 's/^/    | /' "$log/$name.log" | tail -15; fi
}

# The dense bf16 tensor-core peak of GPU 0 in TFLOP/s (PEAK_TFLOPS overrides), and where it came from.
peak_tflops() {
  local name; name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1)
  if [ -n "${PEAK_TFLOPS:-}" ]; then echo "$PEAK_TFLOPS PEAK_TFLOPS"; return; fi
  case $name in
    *H100*PCIe*) echo "756 H100-PCIe" ;;
    *H100*NVL*) echo "835 H100-NVL" ;;
    *H100* | *H200* | *GH200*) echo "989 H100/H200-SXM" ;;
    *B200* | *GB200*) echo "2250 B200" ;;
    *A100*) echo "312 A100" ;;
    *) echo "989 unknown-GPU-assumed-H100" ;;
  esac
}

# run_checks TEST_EXE BENCH_EXE TRAIN_EXE SCRIPTS_DIR DATA: every part; returns 0 when every part passed.
run_checks() {
  local test_exe=$1 bench_exe=$2 train_exe=$3 scripts=$4 data=$5
  mkdir -p "$log" || die "cannot create the log directory $log"
  nvidia-smi -L
  local gpu peak peak_from
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
  read -r peak peak_from <<< "$(peak_tflops)"
  local data_args=()
  [ -n "$data" ] && data_args=(--data "$data")
  echo "== parts (budget $budget s from the start; $(elapsed) s gone) =="

  # 1. The CUDA tests, one process per case (the runner keeps inside the part's limit itself, less the 5 s a killed
  # case may take to go).
  local limit; limit=$(part_limit cuda_tests)
  if [ "$limit" -gt 0 ]; then
    local t0; t0=$(date +%s)
    bash "$scripts/run-test-cases.sh" --budget "$((limit - 5))" --case-timeout "$case_timeout" --part cuda_tests \
      "$test_exe" "$log" 2>&1 | tee "$log/cuda_tests.log" | grep -v '^passed '
    local rc=${PIPESTATUS[0]}
    if [ ! -f "$log/cuda_tests.json" ]; then
      write_part cuda_tests "failed (exit $rc: no per-case results)" "$rc" "$(($(date +%s) - t0))" "$limit"
    fi
  else
    write_part cuda_tests "not run (budget spent)" null 0 0
  fi

  # 2. The CUDA trainer against the host from the same weights and data.
  run_part check_one_rank "$train_exe" --backend cuda --check-against-host "${data_args[@]}"
  write_part check_one_rank "$part_status" "$part_rc" "$part_seconds" "$part_limit_s"
  run_part check_tp2_pp2 "$train_exe" --backend cuda --check-against-host --tp 2 --pp 2 --layers 4 "${data_args[@]}"
  write_part check_tp2_pp2 "$part_status" "$part_rc" "$part_seconds" "$part_limit_s"

  # 3. mpar's MFU: its own trainer's throughput line (mean of the steps after the first), against the peak.
  # shellcheck disable=SC2086
  run_part mfu_train_gpt "$train_exe" --backend cuda $mfu_args --sample 0 --log-every 1 "${data_args[@]}"
  local tp_line mpar_tps="" mpar_tflops="" mpar_mfu=null
  tp_line=$(sed -n 's/^throughput: //p' "$log/mfu_train_gpt.log" | tail -1)
  if [ -n "$tp_line" ]; then
    mpar_tps=$(json_field "$tp_line" tokens_per_second)
    mpar_tflops=$(json_field "$tp_line" model_tflops)
    mpar_mfu=$(awk -v t="$mpar_tflops" -v p="$peak" 'BEGIN { printf "%.4f", t / p }')
  elif [ "$part_status" = passed ]; then
    part_status="failed (no throughput: line in its output)"
  fi
  write_part mfu_train_gpt "$part_status" "$part_rc" "$part_seconds" "$part_limit_s" \
    "\"peak_tflops\": $peak, \"peak_from\": \"$peak_from\", \"mfu\": $mpar_mfu, \"throughput\": ${tp_line:-null}"
  [ -n "$tp_line" ] && echo "    mpar train_gpt: ${mpar_tps} tokens/s, ${mpar_tflops} model TFLOP/s, MFU ${mpar_mfu} (peak $peak, $peak_from)"

  # 4. PyTorch on the same model and batch (the sizes train_gpt reported), eager and torch.compile.
  local torch_sizes=()
  if [ -n "$tp_line" ]; then
    local k
    for k in layers hidden heads seq batch; do torch_sizes+=("--$k" "$(json_field "$tp_line" "$k")"); done
    torch_sizes+=(--vocab "$(json_field "$tp_line" padded_vocab)" --precision "$(json_field "$tp_line" precision)")
  fi
  local mode_ torch_json ratio
  declare -A torch_tps=()
  for mode_ in eager compile; do
    if [ -z "$tp_line" ]; then
      write_part "torch_$mode_" "not run (no model sizes: the mfu_train_gpt part gave no throughput line)" null 0 0
      printf '%-17s %s\n' "torch_$mode_" "not run (no sizes from mfu_train_gpt)"
      continue
    fi
    run_part "torch_$mode_" python3 "$scripts/torch_gpt_cuda.py" --mode "$mode_" "${torch_sizes[@]}" --peak-tflops "$peak"
    torch_json=$(grep '^{' "$log/torch_$mode_.log" | tail -1)
    ratio=null
    if [ -n "$torch_json" ] && [ "$part_status" = passed ]; then
      torch_tps[$mode_]=$(json_field "$torch_json" tokens_per_second)
      ratio=$(awk -v a="$mpar_tps" -v b="${torch_tps[$mode_]}" 'BEGIN { printf "%.4f", a / b }')
      echo "    PyTorch $mode_: ${torch_tps[$mode_]} tokens/s, MFU $(json_field "$torch_json" mfu); mpar / PyTorch $mode_ = $ratio"
    fi
    write_part "torch_$mode_" "$part_status" "$part_rc" "$part_seconds" "$part_limit_s" \
      "\"mpar_over_torch\": $ratio, \"result\": ${torch_json:-null}"
  done

  # 5. The kernel-level number: one hand-assembled bf16 block beside raw cuBLAS.
  run_part bench_cuda_block "$bench_exe" --reps 5 --peak "$peak"
  local bench_json; bench_json=$(grep '^{' "$log/bench_cuda_block.log" | tail -1)
  # Without a device the benchmark says so in its JSON and exits 0; here the GPU is supposed to be there.
  if [[ $bench_json == *'"skipped": true'* ]]; then
    part_status="failed (the benchmark skipped: no CUDA device)"
    echo "    counted as failed: the benchmark skipped (no CUDA device)"
  fi
  write_part bench_cuda_block "$part_status" "$part_rc" "$part_seconds" "$part_limit_s" "\"result\": ${bench_json:-null}"

  # 6. (build mode) NCCL on every axis under mpirun, one process per GPU.
  if [[ " ${parts[*]} " == *" mpirun_nccl "* ]]; then
    local gpus np=1 extra=()
    gpus=$(nvidia-smi -L | wc -l)
    if [ "$gpus" -ge 4 ]; then np=4; extra=(--pp 2 --dp 2); elif [ "$gpus" -ge 2 ]; then np=2; extra=(--pp 2); fi
    run_part mpirun_nccl mpirun --allow-run-as-root -np "$np" "$train_exe" --backend cuda "${extra[@]}" --steps 20 \
      --sample 0 "${data_args[@]}"
    write_part mpirun_nccl "$part_status" "$part_rc" "$part_seconds" "$part_limit_s" "\"processes\": $np"
  fi

  # Summary: every part's status, and the numbers to record.
  local p all_passed=1 statuses=""
  echo
  echo "================ gpu-check summary ================"
  echo "GPU:              $gpu"
  for p in "${parts[@]}"; do
    local st; st=$(json_field "$(cat "$log/$p.json" 2> /dev/null)" status)
    [ -z "$st" ] && st="no result"
    [ "$st" = passed ] || all_passed=0
    printf '%-17s %s\n' "$p:" "$st"
    statuses+="${statuses:+, }\"$p\": $(json_string "$st")"
  done
  echo "total:            $(elapsed) s of a $budget s budget; logs and one JSON per part in $log"
  echo "Record these numbers and the command in docs/performance.md (section 'CUDA backend')."
  printf '{"check": "gpu", "gpu": %s, "passed": %s, "parts": {%s}, "mpar_tokens_per_second": %s, "mpar_model_tflops": %s, "mpar_mfu": %s, "peak_tflops": %s, "torch_eager_tokens_per_second": %s, "torch_compile_tokens_per_second": %s, "seconds": %d, "budget_s": %d}\n' \
    "$(json_string "$gpu")" "$([ $all_passed = 1 ] && echo true || echo false)" "$statuses" "${mpar_tps:-null}" \
    "${mpar_tflops:-null}" "$mpar_mfu" "$peak" "${torch_tps[eager]:-null}" "${torch_tps[compile]:-null}" \
    "$(elapsed)" "$budget" | tee "$log/summary.json"
  [ "$all_passed" = 1 ]
}

have_gpu() { command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; }

# configure_and_build ARCH EXTRA_CMAKE_ARGS...: configures $build with CUDA on and builds the three targets.
configure_and_build() {
  local arch=$1; shift
  local blog=$build/gpu-check-build-logs
  mkdir -p "$blog"
  echo "== configure $build (Release, CUDA architectures $arch) =="
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMPAR_ENABLE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" \
    -DMPAR_BUILD_TESTS=ON -DMPAR_BUILD_BENCHMARKS=ON -DMPAR_BUILD_EXAMPLES=ON -DMPAR_UNITY_TESTS=ON "$@" \
    > "$blog/configure.log" 2>&1 || { tail -40 "$blog/configure.log"; die "configure FAILED (log: $blog/configure.log)"; }
  grep -q 'CUDA=ON' "$blog/configure.log" ||
    die "CMake did not enable the CUDA backend (no nvcc?); see $blog/configure.log"
  echo "== build test_cuda bench_cuda_block train_gpt (-j $jobs) =="
  cmake --build "$build" -j "$jobs" --target test_cuda bench_cuda_block train_gpt > "$blog/build.log" 2>&1 ||
    { tail -60 "$blog/build.log"; die "build FAILED (log: $blog/build.log)"; }
}

# The shared libraries a binary resolves here that a bare CUDA machine may lack: everything except the
# C runtime (glibc's own libraries, the dynamic loader) and the CUDA / driver libraries the GPU machine
# brings itself (cudart, cuBLAS, cuDNN, NCCL, libcuda).
libraries_to_bundle() {
  ldd "$@" | awk '/=> \// {print $1" "$3}' | sort -u | while read -r name path; do
    case $name in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | linux-vdso*) ;;
      libcuda.so* | libcudart* | libcublas* | libcudnn* | libnccl* | libnvrtc* | libnvJitLink* | libcusparse* | libcurand*) ;;
      *) echo "$path" ;;
    esac
  done
}

# The files a run needs besides the binaries, as they sit in the repository.
run_scripts=(scripts/gpu-check.sh scripts/run-test-cases.sh bench/train_gpt/torch_gpt_cuda.py bench/train_gpt/pytorch_gpt.py)
default_text=/usr/share/common-licenses/GPL-3  # data::default_text_path, train_gpt's default --data

if [ "$print_plan" = 1 ]; then print_the_plan; exit 0; fi

case $mode in
  bundle)
    # MPI is left out: the GPU machine has no MPI runtime, and the check runs thread ranks only.
    cd "$repo" || die "cannot enter $repo"
    configure_and_build "$arch" -DMPAR_ENABLE_MPI=OFF
    rm -rf "$dir" && mkdir -p "$dir/payload/bin" "$dir/payload/lib" "$dir/data" || die "cannot create $dir"
    test_exe=$build/tests/cuda/test_cuda
    bench_exe=$build/bench/cuda_block/bench_cuda_block
    train_exe=$(find "$build/examples" -type f -name train_gpt -perm -u+x | head -1)
    for exe in "$test_exe" "$bench_exe" "$train_exe"; do
      [ -x "$exe" ] || die "$exe was not built"
      cp "$exe" "$dir/payload/bin/" && strip --strip-unneeded "$dir/payload/bin/$(basename "$exe")"
    done
    for lib in $(libraries_to_bundle "$dir"/payload/bin/*); do cp -L "$lib" "$dir/payload/lib/"; done
    for f in "${run_scripts[@]}"; do cp "$repo/$f" "$dir/" || die "cannot copy $f"; done
    cp "$default_text" "$dir/data/train.txt" || die "cannot copy the training text $default_text"
    {
      echo "mpar gpu-check bundle: CUDA architectures $arch, built $(date -u +%FT%TZ) from $(git -C "$repo" rev-parse --short HEAD 2> /dev/null || echo '?')"
      # The device code nvcc was asked for (cuobjdump, which could list it from the binary, is not in every toolkit).
      echo "device code: $(grep -rho -- '--generate-code=[^ ]*' "$build"/tests/cuda/CMakeFiles/test_cuda.dir/flags.make 2> /dev/null | sed 's/--generate-code=//' | sort -u | tr '\n' ' ')"
      echo "binaries: $(cd "$dir/payload/bin" && echo *)"
      echo "bundled libraries: $(cd "$dir/payload/lib" && echo *)"
      echo "scripts: $(cd "$dir" && echo *.sh *.py); training text: data/train.txt (from $default_text)"
      echo "needed from the GPU machine:"
      ldd "$dir"/payload/bin/* | awk '/=> / {print "  "$1}' | grep -E 'libcud|libcublas|libnccl' | sort -u
      echo "newest glibc symbol version required: $(objdump -T "$dir"/payload/bin/* 2> /dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
    } > "$dir/MANIFEST"
    # Binaries and libraries travel compressed (oneDNN and OpenBLAS alone are ~80 MB, the carry limit 64 MiB).
    tar -C "$dir" -cf - payload | xz -6 -T2 > "$dir/payload.tar.xz" && rm -rf "$dir/payload" ||
      die "cannot compress $dir/payload"
    cat "$dir/MANIFEST"
    mib=$((($(du -sk "$dir" | cut -f1) + 1023) / 1024))
    [ "$mib" -le "$bundle_limit_mib" ] || die "the bundle is $mib MiB, over the $bundle_limit_mib MiB a device run carries"
    echo "gpu-check: bundle of $mib MiB in $dir after $(elapsed) s; on the GPU machine run: bash $dir/gpu-check.sh --run $dir"
    ;;
  run)
    [ -f "$dir/MANIFEST" ] && [ -f "$dir/payload.tar.xz" ] ||
      die "$dir holds no bundle (no MANIFEST or payload.tar.xz); make one with --bundle"
    have_gpu || { echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); --run needs one." >&2; exit 2; }
    cat "$dir/MANIFEST"
    # Unpacked outside the bundle, which may be read-only there.
    unpacked=$(mktemp -d "${TMPDIR:-/tmp}/mpar-gpu-bundle.XXXXXX")
    trap 'rm -rf "$unpacked"' EXIT
    xz -dc "$dir/payload.tar.xz" | tar -C "$unpacked" -xf - || die "cannot unpack $dir/payload.tar.xz"
    libs=$unpacked/payload/lib
    # NCCL: the system's if the loader finds one, else the wheel's (pip's nvidia-nccl-cu13).
    if ! ldconfig -p 2> /dev/null | grep -q 'libnccl.so'; then
      nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2> /dev/null)
      [ -n "$nccl" ] && libs="$libs:$nccl"
    fi
    # cuDNN and cuBLAS from the CUDA wheels too, when the toolkit's lib64 lacks them.
    for pkg in cudnn cublas cuda_runtime; do
      p=$(python3 -c "import nvidia.$pkg, os; print(os.path.join(list(nvidia.$pkg.__path__)[0], 'lib'))" 2> /dev/null)
      [ -n "$p" ] && libs="$libs:$p"
    done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    bin=$unpacked/payload/bin
    missing=$(ldd "$bin"/* 2> /dev/null | grep 'not found' | sort -u)
    [ -z "$missing" ] || die "libraries not found on this machine: $missing"
    echo "gpu-check: unpacked in $(elapsed) s"
    run_checks "$bin/test_cuda" "$bin/bench_cuda_block" "$bin/train_gpt" "$dir" "$dir/data/train.txt"
    ;;
  build)
    have_gpu || { echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); this mode needs one (build a bundle here with --bundle)." >&2; exit 2; }
    [ -n "$arch" ] || arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
    cd "$repo" || die "cannot enter $repo"
    configure_and_build "${arch:-90}"
    # The build is not part of the run's budget: the budget starts when the checks do.
    start=$(date +%s)
    train_exe=$(find "$build/examples" -type f -name train_gpt -perm -u+x | head -1)
    mkdir -p "$build/gpu-check-scripts"
    cp "$repo/scripts/run-test-cases.sh" "$repo/bench/train_gpt/torch_gpt_cuda.py" "$repo/bench/train_gpt/pytorch_gpt.py" \
      "$build/gpu-check-scripts/"
    run_checks "$build/tests/cuda/test_cuda" "$build/bench/cuda_block/bench_cuda_block" "$train_exe" \
      "$build/gpu-check-scripts" ""
    ;;
esac
