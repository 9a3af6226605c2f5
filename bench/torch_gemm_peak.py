#!/usr/bin/python3
"""bf16 (and fp32) matrix-multiply peak as PyTorch reaches it on this CPU, for the benchmark harness.

    torch_gemm_peak.py [--threads K] [--sizes 1024,2048] [--min-seconds S]

Times torch.matmul on square bf16 and fp32 matrices (2 n^3 FLOPs per product; the best repetition after
one untimed call, repeated until --min-seconds have passed) and prints one JSON line
{"impl": "torch", "bf16_gflops", "fp32_gflops", "sizes": [...]}. The harness uses the bf16 figure as the
machine's bf16 GEMM peak when OpenBLAS has no cblas_sbgemm (bench/gemm_peak.cpp says so); PyTorch's bf16
matmul goes through oneDNN, which uses the AVX512-BF16 dot-product instructions where the CPU has them.
Threads are set as in scripts/bench_torch.py: OMP_NUM_THREADS / OPENBLAS_NUM_THREADS = K before torch is
loaded, OMP_WAIT_POLICY=PASSIVE unless already set.
"""

import argparse
import json
import os
import sys
import time


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--sizes", default="1024,2048")
    parser.add_argument("--min-seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes must be a comma-separated list of integers, got {args.sizes!r}")
    if any(n <= 0 for n in args.sizes) or args.threads < 0 or not args.min_seconds > 0:
        parser.error("--sizes must be positive, --threads not negative, --min-seconds positive")
    return args


def best_rate(torch, a, b, min_seconds):
    """Best GFLOP/s of a @ b over repetitions filling min_seconds (at least 3), after one untimed call."""
    flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    torch.matmul(a, b)
    best, total, reps = 0.0, 0.0, 0
    while reps < 3 or total < min_seconds:
        start = time.perf_counter()
        torch.matmul(a, b)
        seconds = time.perf_counter() - start
        total += seconds
        reps += 1
        best = max(best, flops / seconds / 1e9)
    return best


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sizes = []
    for n in args.sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        fp32 = best_rate(torch, a, b, args.min_seconds)
        bf16 = best_rate(torch, a.bfloat16(), b.bfloat16(), args.min_seconds)
        sizes.append({"n": n, "fp32": round(fp32, 2), "bf16": round(bf16, 2)})
    print(json.dumps({"impl": "torch", "threads": torch.get_num_threads(),
                      "bf16_gflops": max(s["bf16"] for s in sizes), "fp32_gflops": max(s["fp32"] for s in sizes),
                      "mkldnn_bf16": bool(torch.backends.mkldnn.is_available()), "sizes": sizes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
