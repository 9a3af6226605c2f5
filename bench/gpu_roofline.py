#!/usr/bin/python3
"""Roofline estimate of one training step of a GPT on one GPU, op by op, for the CUDA design in
docs/gpu.md: each op costs max(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency)).

The step is `microbatches` forward + backward passes of B x T tokens plus one optimizer update. The ops
are the kernels the design launches per layer (cuBLASLt GEMMs with fused epilogues, fused residual-add +
LayerNorm, fused attention, vocab-parallel cross-entropy on bf16 logits, one flat AdamW). Activations
and weights are bf16 (2 bytes), gradients and master weights fp32, as in gpt-train's mixed precision.
Predicted MFU uses the model-FLOPs formula of scripts/gpu-check.sh: (6 N + 12 L h s) per token.

  /usr/bin/python3 bench/gpu_roofline.py                       # GPT-3 1.3B shape on an H200, bf16
  /usr/bin/python3 bench/gpu_roofline.py --gemm-eff 0.6 --attn-eff 0.35   # pessimistic
  /usr/bin/python3 bench/gpu_roofline.py --fp8            # the blocks' linears in FP8 (precision.fp8)

With --fp8 the blocks' linear GEMMs (qkv, proj, fc1, fc2: forward, dX and dW) run at the dense FP8 peak
on 1-byte operands, and the casts that feed them are added as memory-bound kernels (read bf16, write FP8,
for the input, the weight and the output gradient of each linear, with the amax taken in the same pass);
attention, the norms and the LM head stay in bf16, as in Transformer Engine's recipe. MFU stays quoted
against the bf16 peak, so bf16 and FP8 rows compare as throughput.
"""
import argparse


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--micro", type=int, default=8, help="sequences per microbatch")
    ap.add_argument("--microbatches", type=int, default=8, help="microbatches per optimizer step")
    ap.add_argument("--peak-tflops", type=float, default=989, help="dense bf16 (H100/H200 SXM)")
    ap.add_argument("--bandwidth-gbs", type=float, default=4800, help="HBM (H200: 4.8 TB/s)")
    ap.add_argument("--gemm-eff", type=float, default=0.70, help="achieved/peak for the large GEMMs")
    ap.add_argument("--attn-eff", type=float, default=0.45, help="achieved/peak for fused causal attention")
    ap.add_argument("--mem-eff", type=float, default=0.80, help="achieved/peak bandwidth of streaming kernels")
    ap.add_argument("--fp8", action="store_true", help="the blocks' linear GEMMs in FP8")
    ap.add_argument("--fp8-peak-tflops", type=float, default=1979, help="dense FP8 (H100/H200 SXM)")
    a = ap.parse_args()

    L, h, H, s, B = a.layers, a.hidden, a.heads, a.seq, a.micro
    Vp = (a.vocab + 127) // 128 * 128
    N = B * s  # tokens per microbatch
    f = 4 * h  # MLP width
    peak, bw = a.peak_tflops * 1e12, a.bandwidth_gbs * 1e9
    act = 2 * N * h  # bytes of one bf16 [N, h] activation

    ops = []  # (name, flops, bytes, efficiency of compute), per microbatch for the whole model

    def gemm(name, m, n, k, count, fp8=False):
        flops = 2 * m * n * k * count
        # FP8: 1-byte operands, bf16 output; counted at the FP8 peak by scaling the efficiency.
        byts = ((m * k + k * n) * (1 if fp8 else 2) + 2 * m * n) * count
        ops.append((name, flops, byts, a.gemm_eff * (a.fp8_peak_tflops / a.peak_tflops if fp8 else 1)))

    # Per layer, forward and the two backward GEMMs (dX and dW) of each linear.
    for name, n_out, k_in in (("qkv", 3 * h, h), ("attention proj", h, h), ("mlp fc1", f, h), ("mlp fc2", h, f)):
        gemm(f"GEMM {name} (fwd + dX + dW){' FP8' if a.fp8 else ''}", N, n_out, k_in, 3 * L, a.fp8)
        if a.fp8:
            # Casts with amax: input [N, k_in] and weight [n_out, k_in] forward, output gradient [N, n_out]
            # backward; each reads bf16 and writes FP8 (3 bytes per element).
            cast = 3 * (N * k_in + n_out * k_in + N * n_out) * L
            ops.append((f"FP8 casts + amax of {name} (x, w, dy)", 0, cast, 1))
    gemm("GEMM LM head (fwd + dX + dW)", N, Vp, h, 3)
    # Fused causal attention: the unmasked half of QK^T and PV forward, recomputed S and 4 products back.
    causal = 2 * B * H * s * s * (h // H) / 2
    ops.append(("fused attention (fwd 2 + bwd 5 products)", 7 * causal * L, 2 * 8 * act * L, a.attn_eff))
    # Memory-bound kernels (bytes per layer, forward + backward): fused residual-add + LayerNorm twice
    # (fwd reads x, r and writes y, h; bwd reads dy, x, dres and writes dx, twice the stats), the GELU aux
    # output of fc1's epilogue (written forward, read by DGELU_BGRAD backward).
    ln = 2 * (4 * act + 5 * act)
    gelu_aux = 2 * (2 * N * f)
    ops.append(("residual add + LayerNorm (2 per layer, fwd + bwd)", 0, ln * L, 1))
    ops.append(("GELU aux of the fc1 epilogue (fwd write, bwd read)", 0, gelu_aux * L, 1))
    ops.append(("cross-entropy on bf16 logits (read twice, dlogits written)", 0, 3 * 2 * N * Vp, 1))
    ops.append(("embedding + positions (fwd + bwd scatter)", 0, 4 * act, 1))
    params = Vp * h + s * h + L * (12 * h * h + 13 * h) + 2 * h
    # One flat AdamW per step: read w, g, m, v (fp32), write w, m, v and the bf16 copy; amortised.
    ops.append(("flat AdamW + bf16 copy (per step / microbatches)", 0, params * (16 + 12 + 2) / a.microbatches, 1))

    rows, total = [], 0.0
    for name, flops, byts, eff in ops:
        t_compute = flops / (peak * eff) if flops else 0.0
        t_memory = byts / (bw * a.mem_eff)
        t = max(t_compute, t_memory)
        total += t
        rows.append((name, flops / 1e12, byts / 1e9, t * 1e3, "compute" if t_compute >= t_memory else "memory"))
    model_flops = (6 * params + 12 * L * h * s) * N
    print(f"GPT L={L} h={h} heads={H} s={s} V={a.vocab} ({params / 1e9:.3f}B parameters), microbatch {B} x {s} "
          f"tokens, {a.microbatches} microbatches per step; peak {a.peak_tflops:.0f} TFLOP/s, {a.bandwidth_gbs:.0f} GB/s;"
          f" efficiencies GEMM {a.gemm_eff}, attention {a.attn_eff}, memory {a.mem_eff}")
    print(f"{'op':58} {'TFLOP':>7} {'GB':>7} {'ms':>7} {'share':>6}  bound")
    for name, tf, gb, ms, bound in sorted(rows, key=lambda r: -r[3]):
        print(f"{name:58} {tf:7.2f} {gb:7.2f} {ms:7.2f} {100 * ms / (total * 1e3):5.1f}%  {bound}")
    print(f"{'total per microbatch':58} {'':7} {'':7} {total * 1e3:7.2f}")
    if a.fp8:
        print(f"FP8: the blocks' linear GEMMs at {a.fp8_peak_tflops:.0f} TFLOP/s dense FP8 peak x {a.gemm_eff}; the percentage "
              f"below is model FLOP/s against the bf16 peak")
    print(f"model FLOPs per microbatch (6 N + 12 L h s) x tokens = {model_flops / 1e12:.1f} TFLOP -> "
          f"{model_flops / total / 1e12:.0f} TFLOP/s, predicted "
          f"{'model FLOP/s against the bf16 peak' if a.fp8 else 'MFU'} {100 * model_flops / total / peak:.1f}%")


if __name__ == "__main__":
    main()
