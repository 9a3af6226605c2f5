// CpuBackend: the Backend interface on host memory. Every matrix product (the linear layers and the
// attention core's per-head products) runs on oneDNN's matmul (cpu_matmul.h: fp32, and bf16 with fp32
// accumulation), which dispatches on the CPU's instruction set at run time; the rest
// are OpenMP loops written so the compiler vectorises them. Kernels compute in fp32; BF16/F16 tensors are
// accepted everywhere a float tensor is and are converted on the way in and out (see cpu_tensor_access.h).
// The implementation is split by concern: cpu_memory.cpp (allocation, fill, copy, upload/download),
// cpu_linear.cpp, cpu_layernorm.cpp, cpu_elementwise.cpp (GELU, residual add, scale), cpu_llama.cpp (RMSNorm,
// SwiGLU, rotary embedding), cpu_embedding.cpp,
// cpu_attention.cpp, cpu_cross_entropy.cpp (and the loss accumulation) and cpu_adamw.cpp (AdamW, sums of
// squares, single-tensor and flat).
#pragma once
#include "model/ops/backend.h"

namespace gpt {

class CpuBackend final : public Backend {
 public:
  std::string details() const override;
  std::string dtype_warning(DType compute) const override;
  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::CPU; }

  Tensor empty(const Shape& shape, DType dtype = DType::F32) override;
  void fill(Tensor& t, float value) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void upload(const float* host, Tensor& dst) override;
  void download(const Tensor& src, float* host) override;
  void upload_i32(const int32_t* host, Tensor& dst) override;
  void download_i32(const Tensor& src, int32_t* host) override;
  void download_f64(const Tensor& src, double* host) override;
  size_t memory_in_use() const override;
  size_t memory_peak() const override;
  void reset_memory_peak() override;

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) override;
  void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor& dw,
                       Tensor* db) override;
  void linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx) override;

  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& mean,
                         Tensor& rstd, float eps) override;
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) override;

  void gelu_forward(const Tensor& x, Tensor& y) override;
  void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) override;

  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void accumulate(const Tensor& src, Tensor& dst) override;
  void scale(Tensor& t, float alpha) override;

  void embedding_forward(const Tensor& ids, const Tensor& table, int64_t vocab_start, Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& dout, int64_t vocab_start, Tensor& dtable) override;
  void add_positions(const Tensor& pos_table, int64_t T, Tensor& out) override;
  void add_positions_backward(const Tensor& dout, int64_t T, Tensor& dpos) override;

  void rmsnorm_forward(const Tensor& x, const Tensor& gamma, Tensor& y, Tensor& rstd, float eps) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd, Tensor& dx,
                        Tensor& dgamma) override;
  void swiglu_forward(const Tensor& x, Tensor& y) override;
  void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) override;
  void rope_forward(Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, int64_t rotary_dims,
                    float base, int64_t pos0) override;
  void rope_backward(Tensor& dqkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, int64_t rotary_dims,
                     float base, int64_t pos0) override;

  void attention_forward_last(const Tensor& qkv, int64_t B, int64_t T, int64_t Tq, int64_t H, int64_t G, int64_t D,
                              Tensor& out, Tensor& lse) override;
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t B,
                          int64_t T, int64_t H, int64_t G, int64_t D, Tensor& dqkv) override;
  void attention_block_forward(const Tensor& q, const Tensor& kv, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                               int64_t G, int64_t D, bool causal, Tensor& out, Tensor& lse) override;
  void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out,
                                const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t G, int64_t D,
                                bool causal, Tensor& dq, Tensor& dkv) override;
  void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b, int64_t B, int64_t T,
                       int64_t H, int64_t D) override;
  void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) override;

  void ce_row_max(const Tensor& logits, int64_t vocab_start, int64_t vocab_size, Tensor& row_max) override;
  void ce_row_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                    Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) override;
  void ce_rescale_sum_exp(const Tensor& local_max, const Tensor& global_max, Tensor& sum_exp) override;
  void ce_sum_exp(const Tensor& logits, const Tensor& row_max, const Tensor& targets, int64_t vocab_start,
                  int64_t vocab_size, Tensor& sum_exp, Tensor& target_logit) override;
  void ce_backward(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp, const Tensor& targets,
                   int64_t vocab_start, int64_t vocab_size, float grad_scale, Tensor& dlogits) override;
  void ce_loss_accumulate(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                          Tensor& loss_sum) override;

  double sum_squares(const Tensor& t) override;
  void sum_squares_segments(const Tensor& flat, const std::vector<ops::FlatSegment>& segments, Tensor& sums) override;
  void adamw_step(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t step) override;
  void adamw_step_flat(Tensor& master, const Tensor& grad, Tensor& m, Tensor& v, Tensor* value,
                       const std::vector<ops::FlatSegment>& segments, const ops::AdamWHyper& h) override;
};

}  // namespace gpt
