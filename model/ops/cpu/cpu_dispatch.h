// Run-time instruction-set dispatch for the CPU backend's own loops. The build targets a baseline that
// every x86-64 server of the last fifteen years runs (x86-64-v2: SSE4.2, POPCNT); a binary built on a
// login node or in a container therefore runs on any compute node. The hot per-row and per-chunk kernels
// (layernorm, GELU, the attention softmax, the cross-entropy, AdamW) are each compiled three times, for
// x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA) and the baseline, and the loader picks the best one the CPU
// runs (GCC's target_clones, an ifunc resolved once). The matrix products dispatch inside oneDNN.
// Kernels are plain loops: the compiler vectorises each clone for its own vector width.
#pragma once

#define GPT_CPU_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
