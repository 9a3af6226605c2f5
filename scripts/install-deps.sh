#!/usr/bin/env bash
# Installs gpt-train's build and test dependencies from Debian packages. Idempotent: packages already
# present are skipped, so re-running costs only a dpkg query. Must run as root (or with sudo available).
# libopenblas0-pthread: python3-torch's fp32 products go through the system BLAS, which without it is the
# reference implementation (5 GFLOP/s); the PyTorch peers of the benchmarks and tests assume OpenBLAS.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libdnnl-dev ocl-icd-opencl-dev opencl-headers libopenmpi-dev openmpi-bin
  libhdf5-dev hdf5-tools
  libgtest-dev googletest
  libsentencepiece-dev fortunes
  python3 python3-numpy python3-torch python3-matplotlib libjemalloc2
  libopenblas0-pthread
  slurm-wlm munge libpmix2 python3-h5py
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
