#!/usr/bin/env bash
# The one test command: installs dependencies, builds, and runs every test through ctest (unit tests,
# multi-rank tests under mpirun, the PyTorch reference comparison).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh -DGPT_WERROR=ON
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd build && ctest --output-on-failure -j2 "$@"
