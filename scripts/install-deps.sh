#!/usr/bin/env bash
# Installs what mpar's build, tests and examples need on Debian/Ubuntu, only where missing.
# Works as root or through sudo. clang and its runtime libraries (libFuzzer, sanitizers) build the
# fuzz targets of tests/fuzz, which CI runs.
set -euo pipefail
packages=(cmake g++ make catch2 libopenblas-dev libdnnl-dev libopenmpi-dev openmpi-bin clang libclang-rt-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
