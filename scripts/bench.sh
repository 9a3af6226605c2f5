#!/usr/bin/env bash
# CPU benchmark entry point (not a test): builds gpt-train and bench/gemm_peak (Release) and runs
# bench/compare.py, which measures the machine's GEMM peak and then runs gpt-train and the equivalent
# PyTorch training step (scripts/bench_torch.py) one after the other for configs S, M and GPT-2 124M in
# fp32 and bf16, printing tokens/s, the ratio, achieved GFLOP/s, the fraction of GEMM peak and peak RSS.
# Arguments go to compare.py, e.g.
#   scripts/bench.sh                                   # the full throughput table (about 20 min on 2 cores)
#   scripts/bench.sh --configs S,M --dtypes fp32       # a subset
#   scripts/bench.sh --layouts --no-throughput         # config M under (1,1,1), (1,1,2), (2,1,1), (1,2,1), ...
#   scripts/bench.sh --threads 2 --openblas-coretype SkylakeX
# BUILD_DIR (default build) chooses the build directory. Results: runs/bench/results.json and the logs.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target gpt-train gemm_peak
exec /usr/bin/python3 bench/compare.py --gpt-train "$BUILD_DIR/gpt-train" --gemm-peak "$BUILD_DIR/bench/gemm_peak" "$@"
