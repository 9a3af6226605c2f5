// FP8 linear forward and backward over the backend's fp32 linear kernels (model/fp8_linear.h).
#include "model/fp8_linear.h"

namespace gpt {

namespace {
// x cast at `scale` and dequantised, F32; the amax goes to `record` when given.
Tensor cast(Backend& be, const Tensor& x, const Fp8TensorScale& s, Fp8TensorScale* record) {
  Tensor out = be.empty(x.shape(), DType::F32);
  const float amax = be.fp8_quantize_dequantize(x, s.scale, s.format, out);
  if (record) record->record(amax);
  return out;
}
Tensor to_f32(Backend& be, const Tensor& t) {
  if (t.dtype() == DType::F32) return t;
  Tensor out = be.empty(t.shape(), DType::F32);
  be.copy(t, out);
  return out;
}
}  // namespace

Fp8LinearScales register_fp8_linear(Fp8ScaleSet& set, const std::string& prefix) {
  Fp8LinearScales s;
  s.recipe = &set.recipe();
  s.input = &set.add(prefix + ".fp8.input", set.recipe().forward_format());
  s.weight = &set.add(prefix + ".fp8.weight", set.recipe().forward_format());
  s.grad_output = &set.add(prefix + ".fp8.grad_output", set.recipe().backward_format());
  return s;
}

void fp8_linear_forward(Backend& be, const Fp8LinearScales& s, const Tensor& x, const Tensor& w, const Tensor* b,
                        Tensor& y) {
  const Tensor qx = cast(be, x, *s.input, s.input), qw = cast(be, w, *s.weight, s.weight);
  Tensor b32;
  if (b) b32 = to_f32(be, *b);
  Tensor y32 = y.dtype() == DType::F32 ? y : be.empty(y.shape(), DType::F32);
  be.linear_forward(qx, qw, b ? &b32 : nullptr, y32);
  if (y32.raw() != y.raw()) be.copy(y32, y);
}

void fp8_linear_backward_input(Backend& be, const Fp8LinearScales& s, const Tensor& dy, const Tensor& w, Tensor& dx) {
  const Tensor qdy = cast(be, dy, *s.grad_output, s.grad_output), qw = cast(be, w, *s.weight, nullptr);
  Tensor dx32 = dx.dtype() == DType::F32 ? dx : be.empty(dx.shape(), DType::F32);
  be.linear_backward_input(qdy, qw, dx32);
  if (dx32.raw() != dx.raw()) be.copy(dx32, dx);
}

void fp8_linear_backward(Backend& be, const Fp8LinearScales& s, const Tensor& dy, const Tensor& x, const Tensor& w,
                         Tensor* dx, Tensor& dw, Tensor* db) {
  const Tensor qdy = cast(be, dy, *s.grad_output, s.grad_output);
  // The same casts as forward (the scales have not moved since), not recorded again.
  const Tensor qx = cast(be, x, *s.input, nullptr), qw = cast(be, w, *s.weight, nullptr);
  Tensor dx32;
  if (dx) dx32 = dx->dtype() == DType::F32 ? *dx : be.empty(dx->shape(), DType::F32);
  be.linear_backward(qdy, qx, qw, dx ? &dx32 : nullptr, dw, nullptr);
  if (dx && dx32.raw() != dx->raw()) be.copy(dx32, *dx);
  if (db) {
    // db += column sums of the unquantised dy, as the weight gradient of a [N, 1] input of ones.
    const int64_t N = dy.dim(0), out = dy.dim(1);
    Tensor ones = be.empty({N, 1}, dy.dtype()), unused_w = be.zeros({out, 1}, dy.dtype());
    be.fill(ones, 1.f);
    Tensor db_column = db->view({out, 1});
    be.linear_backward(dy, ones, unused_w, nullptr, db_column, nullptr);
  }
}

}  // namespace gpt
