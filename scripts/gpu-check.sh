#!/usr/bin/env bash
# gpu-check.sh — the device check: mpar's CUDA path against the host reference on one GPU, in a budget
# of 8 minutes on one H200. Three ways to run it:
#
#   scripts/gpu-check.sh                 on a GPU machine that has the build tools (CMake, Catch2, a
#                                        host BLAS): configure, build the CUDA targets, then run them.
#   scripts/gpu-check.sh --bundle [DIR]  here, on a machine WITHOUT a GPU: build the CUDA tests,
#                                        bench/cuda_block and train_gpt for sm_90 (no MPI), copy them
#                                        with the shared libraries they need that a bare CUDA machine
#                                        lacks (host BLAS, oneDNN, ...; xz-compressed) into DIR (default
#                                        build/gpu-bundle, at most 64 MiB), and write DIR/MANIFEST.
#   scripts/gpu-check.sh --run DIR       on the GPU machine: run only the bundle's binaries (no build,
#                                        no Catch2, MPI or OpenBLAS needed there); NCCL is taken from
#                                        the Python wheel nvidia-nccl-cu13 when no system NCCL exists.
#                                        Every log goes under $OUT (when set) or DIR/logs.
#
# What runs: the CUDA tests (kernels and GPT steps against the host reference; a skipped test is a
# failure here, the GPU is supposed to be there), bench/cuda_block (block MFU and the cuBLAS GEMM it is
# compared with), train_gpt --backend cuda --check-against-host at one rank and at tp = 2 × pp = 2
# thread ranks sharing the GPU, and 20 training steps (in the first mode, where mpirun exists, also 20
# steps under mpirun with NCCL on every axis). The summary ends with one JSON line.
#
# Environment: BUILD_DIR (default build/gpu-check, build/gpu-bundle-build for --bundle), JOBS (default:
# all cores), CUDA_ARCH (default: what nvidia-smi reports; 90 for --bundle). No managed memory is used
# by anything this script runs.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
jobs=${JOBS:-$(nproc)}
bundle_limit_mib=64

die() { echo "gpu-check: $*" >&2; exit 1; }

# configure_and_build BUILD_DIR ARCH EXTRA_CMAKE_ARGS... — configures with CUDA on and builds the three
# targets; prints the build log's tail on failure.
configure_and_build() {
  local build=$1 arch=$2; shift 2
  local log=$build/gpu-check-logs
  mkdir -p "$log"
  echo "== configure (Release, CUDA arch $arch) =="
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMPAR_ENABLE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" \
    -DMPAR_BUILD_TESTS=ON -DMPAR_BUILD_BENCHMARKS=ON -DMPAR_BUILD_EXAMPLES=ON "$@" > "$log/configure.log" 2>&1 \
    || { tail -40 "$log/configure.log"; die "configure FAILED (log: $log/configure.log)"; }
  grep -q 'CUDA=ON' "$log/configure.log" || die "CMake did not enable the CUDA backend (no nvcc?); see $log/configure.log"
  echo "== build test_cuda bench_cuda_block train_gpt (-j $jobs) =="
  cmake --build "$build" -j "$jobs" --target test_cuda bench_cuda_block train_gpt > "$log/build.log" 2>&1 \
    || { tail -60 "$log/build.log"; die "build FAILED (log: $log/build.log)"; }
}

# run_checks TEST_EXE BENCH_EXE TRAIN_EXE LOGDIR WITH_MPI — the device part; returns 0 when everything
# passed. WITH_MPI=1 adds 20 steps under mpirun with NCCL on every axis (when mpirun exists).
run_checks() {
  local test_exe=$1 bench_exe=$2 train_exe=$3 log=$4 with_mpi=$5
  mkdir -p "$log"
  nvidia-smi -L
  echo "== CUDA tests =="
  timeout 240 "$test_exe" --reporter compact 2>&1 | tee "$log/test_cuda.log"
  local test_rc=${PIPESTATUS[0]} test_status=ok
  case $test_rc in
    0) ;;
    77) test_status="FAILED (the tests skipped: no CUDA device visible to them)" ;;
    124) test_status="FAILED (timed out after 240 s)" ;;
    *) test_status="FAILED (exit $test_rc)" ;;
  esac
  local tests_line
  tests_line=$(grep -E '^(Passed|Failed|All tests passed)|test cases' "$log/test_cuda.log" | tail -1)

  echo "== bench_cuda_block =="
  timeout 200 "$bench_exe" 2>&1 | tee "$log/bench.log"
  local bench_rc=${PIPESTATUS[0]} bench_json
  bench_json=$(tail -1 "$log/bench.log")

  echo "== GPT training steps: CUDA vs host (one rank, then tp=2 x pp=2 thread ranks sharing the GPU) =="
  local rc1 rc2 rc3 train_status=ok
  timeout 120 "$train_exe" --backend cuda --check-against-host 2>&1 | tee "$log/train_gpt.log"
  rc1=${PIPESTATUS[0]}
  timeout 120 "$train_exe" --backend cuda --check-against-host --tp 2 --pp 2 --layers 4 2>&1 | tee -a "$log/train_gpt.log"
  rc2=${PIPESTATUS[0]}
  echo "== train_gpt --backend cuda: 20 steps, one rank =="
  timeout 120 "$train_exe" --backend cuda --steps 20 --sample 0 2>&1 | tail -4 | tee -a "$log/train_gpt.log"
  rc3=${PIPESTATUS[0]}
  local rc4=0
  if [ "$with_mpi" = 1 ] && command -v mpirun > /dev/null; then
    # NCCL on every axis: one process per GPU (pp=2 x dp=2 when there are GPUs enough).
    local gpus np=1 extra=()
    gpus=$(nvidia-smi -L | wc -l)
    if [ "$gpus" -ge 4 ]; then np=4; extra=(--pp 2 --dp 2); elif [ "$gpus" -ge 2 ]; then np=2; extra=(--pp 2); fi
    echo "== train_gpt --backend cuda under mpirun -np $np (NCCL) ${extra[*]} =="
    timeout 180 mpirun --allow-run-as-root -np "$np" "$train_exe" --backend cuda "${extra[@]}" --steps 20 --sample 0 2>&1 \
      | tail -4 | tee -a "$log/train_gpt.log"
    rc4=${PIPESTATUS[0]}
  fi
  { [ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ] && [ "$rc3" -eq 0 ] && [ "$rc4" -eq 0 ]; } || train_status="FAILED (exits $rc1 $rc2 $rc3 $rc4)"

  echo
  echo "================ gpu-check summary ================"
  echo "GPU:            $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
  echo "CUDA tests:     $test_status — $tests_line"
  echo "bench:          exit $bench_rc"
  echo "bench JSON:     $bench_json"
  echo "train_gpt:      $train_status"
  echo "total:          $(elapsed) s; logs in $log"
  echo "Record these numbers and the command in docs/performance.md (section 'CUDA backend')."
  printf '{"check": "gpu", "tests": "%s", "bench_exit": %d, "train_gpt": "%s", "seconds": %d}\n' \
    "$test_status" "$bench_rc" "$train_status" "$(elapsed)" | tee "$log/summary.json"
  [ "$test_status" = ok ] && [ "$bench_rc" -eq 0 ] && [ "$train_status" = ok ]
}

have_gpu() { command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; }

# The shared libraries a binary resolves here that a bare CUDA machine may lack: everything except the
# C runtime (glibc's own libraries, the dynamic loader) and the CUDA / driver libraries the GPU machine
# brings itself (cudart, cuBLAS, cuDNN, NCCL, libcuda).
libraries_to_bundle() {
  ldd "$@" | awk '/=> \// {print $1" "$3}' | sort -u | while read -r name path; do
    case $name in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|linux-vdso*) ;;
      libcuda.so*|libcudart*|libcublas*|libcudnn*|libnccl*|libnvrtc*|libnvJitLink*|libcusparse*|libcurand*) ;;
      *) echo "$path" ;;
    esac
  done
}

case ${1:-} in
  --bundle)
    dir=${2:-build/gpu-bundle}
    arch=${CUDA_ARCH:-90}
    build=${BUILD_DIR:-build/gpu-bundle-build}
    # MPI is left out: the GPU machine has no MPI runtime, and the check runs thread ranks only.
    configure_and_build "$build" "$arch" -DMPAR_ENABLE_MPI=OFF
    rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" || die "cannot create $dir"
    test_exe=$build/tests/cuda/test_cuda
    bench_exe=$build/bench/cuda_block/bench_cuda_block
    train_exe=$(find "$build/examples" -type f -name train_gpt -perm -u+x | head -1)
    for exe in "$test_exe" "$bench_exe" "$train_exe"; do
      [ -x "$exe" ] || die "$exe was not built"
      cp "$exe" "$dir/bin/" && strip --strip-unneeded "$dir/bin/$(basename "$exe")"
    done
    for lib in $(libraries_to_bundle "$dir"/bin/*); do cp -L "$lib" "$dir/lib/"; done
    cp scripts/gpu-check.sh "$dir/"
    {
      echo "mpar gpu-check bundle: CUDA arch sm_$arch, built $(date -u +%FT%TZ) from $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
      echo "binaries: $(cd "$dir/bin" && echo *)"
      echo "bundled libraries: $(cd "$dir/lib" && echo *)"
      echo "needed from the GPU machine:"
      ldd "$dir"/bin/* | awk '/=> / {print "  "$1}' | grep -E 'libcud|libcublas|libnccl' | sort -u
      echo "newest glibc symbol version required: $(objdump -T "$dir"/bin/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
    } > "$dir/MANIFEST"
    # The libraries travel compressed (the host BLAS and oneDNN alone are ~80 MB, the carry limit 64 MiB).
    tar -C "$dir" -cf - lib | xz -6 -T1 > "$dir/lib.tar.xz" && rm -rf "$dir/lib" || die "cannot compress $dir/lib"
    cat "$dir/MANIFEST"
    mib=$(( ($(du -sk "$dir" | cut -f1) + 1023) / 1024 ))
    [ "$mib" -le "$bundle_limit_mib" ] || die "the bundle is $mib MiB, over the $bundle_limit_mib MiB a device run carries"
    echo "gpu-check: bundle of $mib MiB in $dir after $(elapsed) s; on the GPU machine run: bash $dir/gpu-check.sh --run $dir"
    ;;
  --run)
    dir=${2:?usage: gpu-check.sh --run BUNDLE_DIR}
    [ -f "$dir/MANIFEST" ] || die "$dir holds no bundle (no MANIFEST); make one with --bundle"
    have_gpu || { echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); --run needs one." >&2; exit 2; }
    cat "$dir/MANIFEST"
    # The bundled libraries, unpacked outside the bundle (which may be read-only there).
    unpacked=$(mktemp -d "${TMPDIR:-/tmp}/mpar-gpu-bundle.XXXXXX")
    xz -dc "$dir/lib.tar.xz" | tar -C "$unpacked" -xf - || die "cannot unpack $dir/lib.tar.xz"
    libs=$unpacked/lib
    # NCCL: the system's if the loader finds one, else the wheel's (pip's nvidia-nccl-cu13).
    if ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so'; then
      nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
      [ -n "$nccl" ] && libs="$libs:$nccl"
    fi
    # cuDNN and cuBLAS from the CUDA wheels too, when the toolkit's lib64 lacks them.
    for pkg in cudnn cublas cuda_runtime; do
      p=$(python3 -c "import nvidia.$pkg, os; print(os.path.join(list(nvidia.$pkg.__path__)[0], 'lib'))" 2>/dev/null)
      [ -n "$p" ] && libs="$libs:$p"
    done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    missing=$(ldd "$dir"/bin/* | grep 'not found' | sort -u)
    [ -z "$missing" ] || die "libraries not found on this machine: $missing"
    log=${OUT:-$dir/logs}
    run_checks "$dir/bin/test_cuda" "$dir/bin/bench_cuda_block" "$dir/bin/train_gpt" "$log" 0
    ;;
  "")
    have_gpu || { echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); this mode needs one (build a bundle here with --bundle)." >&2; exit 2; }
    arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')}
    build=${BUILD_DIR:-build/gpu-check}
    configure_and_build "$build" "${arch:-90}"
    train_exe=$(find "$build/examples" -type f -name train_gpt -perm -u+x | head -1)
    run_checks "$build/tests/cuda/test_cuda" "$build/bench/cuda_block/bench_cuda_block" "$train_exe" "$build/gpu-check-logs" 1
    ;;
  *)
    sed -n '2,25p' "$0"; exit 2 ;;
esac
