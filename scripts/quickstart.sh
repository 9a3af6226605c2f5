#!/usr/bin/env bash
# The main job on a fresh machine: installs dependencies, builds, and trains the tiny demo model
# (configs/tiny-cpu.yaml) on CPU under mpirun with 2 data-parallel ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
NP=${NP:-2}
mpirun --oversubscribe --bind-to none -np "$NP" ./build/gpt-train train --config configs/tiny-cpu.yaml "$@"
