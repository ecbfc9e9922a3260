#!/usr/bin/env bash
# Builds and runs the consumer project with each integration path: find_package after install,
# FetchContent of the local source tree, and add_subdirectory.
set -euo pipefail
src=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
cmake -S "$src" -B "$work/mpar-build" -DMPAR_BUILD_TESTS=OFF -DMPAR_BUILD_EXAMPLES=OFF -DMPAR_BUILD_BENCHMARKS=OFF \
  -DMPAR_ENABLE_CUDA=OFF -DCMAKE_INSTALL_PREFIX="$work/prefix" > "$work/mpar-configure.log"
cmake --install "$work/mpar-build" > "$work/mpar-install.log"
test -f "$work/prefix/include/mpar/mpar.hpp"
for mode in find_package fetchcontent subdirectory; do
  cmake -S "$src/tests/packaging/consumer" -B "$work/$mode" -DMPAR_CONSUME=$mode -DMPAR_SOURCE_DIR="$src" \
    -DMPAR_ENABLE_CUDA=OFF -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/$mode-configure.log" 2>&1 ||
    { cat "$work/$mode-configure.log"; exit 1; }
  cmake --build "$work/$mode" > "$work/$mode-build.log" 2>&1 || { cat "$work/$mode-build.log"; exit 1; }
  "$work/$mode/consumer" | grep -q "consumer ok"
  echo "packaging: $mode ok"
done
