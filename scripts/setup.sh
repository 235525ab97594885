#!/usr/bin/env bash
# Installs the system packages fp4moe needs on Debian/Ubuntu. Idempotent: it installs only what is missing
# and says what it installs. The CUDA toolkit (>= 12.3, for sm_90a) must already be present.
#   scripts/setup.sh               install what is missing
#   scripts/setup.sh --check-only  exit 1 if something is missing, install nothing
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libcli11-dev libfmt-dev libhdf5-dev libgtest-dev libgmock-dev libbenchmark-dev
  libsentencepiece-dev sentencepiece
  python3-numpy python3-pandas python3-matplotlib python3-h5py
)
# `make data` fetches npm packages with `npm pack`: Debian's npm unless Node.js already brings one.
command -v npm >/dev/null || packages+=(npm)

check_only=0
[[ "${1:-}" == "--check-only" ]] && check_only=1

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

nvcc_path=$(command -v nvcc || true)
[[ -z "$nvcc_path" && -x /usr/local/cuda/bin/nvcc ]] && nvcc_path=/usr/local/cuda/bin/nvcc
if [[ -z "$nvcc_path" ]]; then
  echo "setup: the CUDA toolkit (nvcc >= 12.3) was not found on PATH or in /usr/local/cuda." >&2
  echo "setup: install NVIDIA's CUDA toolkit for your distribution, then run this again." >&2
  exit 1
fi

if [[ ${#missing[@]} -eq 0 ]]; then
  [[ $check_only -eq 1 ]] || echo "setup: all packages present (nvcc: $nvcc_path)"
  exit 0
fi
if [[ $check_only -eq 1 ]]; then
  echo "setup: missing packages: ${missing[*]}" >&2
  exit 1
fi

if ! command -v apt-get >/dev/null; then
  echo "setup: apt-get not found; install these packages by hand: ${missing[*]}" >&2
  exit 1
fi
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
echo "setup: installing ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
