// The linear layers' GEMMs in FP8 (Transformer Engine's recipe, model/fp8_scaling.h), on any backend
// through Backend::fp8_quantize_dequantize: forward y = q(x) . q(w)^T + b with x and w cast to E4M3 at
// their delayed scales; backward dx = q(dy) . q(w) and dw += q(dy)^T . q(x) with dy cast to E5M2 (hybrid)
// or E4M3, the bias gradient from the unquantised dy, as TE's fused cast+dbias computes it. Products and
// sums run in fp32 over the dequantised FP8 values (what the FP8 GEMM's fp32 accumulation sees); the
// results are rounded to the activations' dtype. Forward records the amaxes of x and w, backward that of
// dy; the scales change only when the iteration ends (ModelChunk::end_fp8_iteration).
#pragma once
#include <string>

#include "model/fp8_scaling.h"
#include "model/ops/backend.h"

namespace gpt {

// One linear layer's three FP8 operands, registered under "<prefix>.fp8.{input,weight,grad_output}".
struct Fp8LinearScales {
  const Fp8Recipe* recipe = nullptr;
  Fp8TensorScale *input = nullptr, *weight = nullptr, *grad_output = nullptr;
};
Fp8LinearScales register_fp8_linear(Fp8ScaleSet& set, const std::string& prefix);

// y [N, out] (y's dtype, allocated by the caller) = q(x) . q(w)^T (+ b).
void fp8_linear_forward(Backend& be, const Fp8LinearScales& s, const Tensor& x, const Tensor& w, const Tensor* b,
                        Tensor& y);
// dx [N, in] (dx's dtype, allocated by the caller) = q(dy) . q(w): Backend::linear_backward_input with the
// FP8 operands, dy's amax recorded. The tensor-parallel overlap computes a row block of dx at a time with
// it; a cast at a fixed scale is element-wise, so the blocks are the whole product's rows.
void fp8_linear_backward_input(Backend& be, const Fp8LinearScales& s, const Tensor& dy, const Tensor& w, Tensor& dx);
// Backend::linear_backward's contract (dx skipped when null; dw, db F32 accumulate) with the FP8 operands.
void fp8_linear_backward(Backend& be, const Fp8LinearScales& s, const Tensor& dy, const Tensor& x, const Tensor& w,
                         Tensor* dx, Tensor& dw, Tensor* db);

}  // namespace gpt
