#!/usr/bin/env bash
# Installs what mpar's build, tests and examples need on Debian/Ubuntu, only where missing.
# Works as root or through sudo. clang and its runtime libraries (libFuzzer, sanitizers) build the
# fuzz targets of tests/fuzz, which CI runs; clang-format checks the formatted files (scripts/check-format.sh).
set -euo pipefail
packages=(cmake g++ make ninja-build catch2 libopenblas-dev libdnnl-dev libopenmpi-dev openmpi-bin clang libclang-rt-dev clang-format)
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

# Optional (off by default; CI does not need it): the Python packages of the tests that compare mpar with
# Hugging Face transformers (tests/data/check_transformers.py, check_safetensors.py; skipped without
# them) and of examples/tokenize_gpt2.py. MPAR_INSTALL_PYTHON_ML=1 installs them with pip from the
# configured index (torch's default Linux wheel also pulls its CUDA libraries, several GiB; point
# PIP_INDEX_URL at a CPU-only wheel index to avoid them).
if [ "${MPAR_INSTALL_PYTHON_ML:-0}" = "1" ]; then
  python3 -c 'import torch' 2>/dev/null || python3 -m pip install torch
  python3 -m pip install transformers safetensors numpy tiktoken
fi
