// The op interface every compute backend implements (CPU now, CUDA later). Model layers are written
// once against it and never touch raw memory. Conventions, shared by all backends:
//  - all float tensors are row-major and contiguous; [N, C] means N rows of C values;
//  - "dX =" overwrites the output, "dW +=" accumulates into it (gradients accumulate over microbatches);
//  - activations and weights may be F32/BF16/F16 (compute dtype), gradients of weights are always F32;
//  - token ids and targets are I32 tensors;
//  - vocab-parallel ops take `vocab_start` (first global id held by this shard) and `vocab_size`
//    (the real, unpadded vocabulary): ids at or past vocab_size are padding and never win the softmax.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/fp8.h"
#include "model/ops/adamw_update.h"
#include "model/ops/flat_segments.h"
#include "model/tensor.h"

namespace gpt {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // For the start-up log: the libraries and instruction set the backend runs on here ("" if nothing to say),
  // and a warning when `compute` cannot run at full speed on this machine ("" when it can).
  virtual std::string details() const { return {}; }
  virtual std::string dtype_warning(DType compute) const { return {}; }
  // model.attention_backend (auto | cudnn | unfused): which attention implementation a backend with more
  // than one uses; a backend with one ignores it.
  virtual void set_attention_backend(const std::string& name) {}
  virtual Device device() const = 0;

  // ---- memory ----
  virtual Tensor empty(const Shape& shape, DType dtype = DType::F32) = 0;
  Tensor zeros(const Shape& shape, DType dtype = DType::F32);
  virtual void fill(Tensor& t, float value) = 0;
  // dst = src (same element count; converts between float dtypes).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  // Host fp32 <-> tensor of any float dtype (or I32 for the int variants).
  virtual void upload(const float* host, Tensor& dst) = 0;
  virtual void download(const Tensor& src, float* host) = 0;
  virtual void upload_i32(const int32_t* host, Tensor& dst) = 0;
  virtual void download_i32(const Tensor& src, int32_t* host) = 0;
  // Host fp64 <- F64 tensor (the device-side sums of a step; the one transfer that waits for the device).
  virtual void download_f64(const Tensor& src, double* host) = 0;
  // Bytes currently allocated and the high-water mark since start (or last reset).
  virtual size_t memory_in_use() const = 0;
  virtual size_t memory_peak() const = 0;
  virtual void reset_memory_peak() = 0;
  virtual void synchronize() {}
  // Host memory for large transfers (checkpoint snapshots), not counted in memory_in_use: page-locked on
  // CUDA, so downloads into it run at full bus speed; plain 64-byte-aligned memory by default. Throws
  // std::runtime_error naming the size when it cannot be had. free_host takes what alloc_host returned.
  virtual void* alloc_host(size_t bytes);
  virtual void free_host(void* p);

  // ---- linear: y[N,out] = x[N,in] . w[out,in]^T (+ b[out]) ----
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) = 0;
  // dx = dy . w (skipped when dx is null); dw += dy^T . x; db += column sums of dy (when db non-null).
  virtual void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor& dw,
                               Tensor* db) = 0;
  // dx = dy . w alone, with linear_backward's dx arithmetic (a row block of dx at a time: the
  // tensor-parallel overlap, model/tp_overlap.h, computes each block while another is in flight).
  virtual void linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx) = 0;
  // The GPT MLP's linears with GELU between them, fused where a backend can: pre = x . w^T (+ b), kept
  // for backward, and act = gelu(pre) (fc1 and its activation); and linear_backward with dx replaced by
  // dpre = (dy . w) * gelu'(pre) (fc2 and the activation's backward). The defaults compose the ops above.
  virtual void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& pre, Tensor& act);
  virtual void linear_dgelu_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& pre,
                                     Tensor& dpre, Tensor& dw, Tensor* db);

  // ---- FP8 emulation (model/fp8.h, model/fp8_linear.h) ----
  // out (F32, x's shape) = fp8_round(x * scale) / scale: x as an FP8 GEMM sees it after the scaled cast,
  // dequantised (every product of two such values is exact in fp32, as in the GEMM's fp32 accumulation).
  // Returns the amax of x (largest |x| before scaling; NaN when x holds one). The default runs on the
  // host through download/upload, so every backend has it.
  virtual float fp8_quantize_dequantize(const Tensor& x, float scale, Fp8Format format, Tensor& out);

  // ---- layernorm over the last dim: y = (x - mean) * rstd * gamma + beta; mean/rstd F32 [N] ----
  virtual void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                 Tensor& mean, Tensor& rstd, float eps) = 0;
  // dx = ...; dgamma += ...; dbeta += ...
  virtual void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                  const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) = 0;
  // The residual add before a LayerNorm, fused where a backend can: h = x + r, then layernorm_forward of h
  // (h is kept: it is the block's residual stream); and layernorm_backward with the residual stream's
  // gradient added, dx = (layernorm's dx) + dres (dx must not alias dres). The defaults compose add,
  // layernorm_* and accumulate.
  virtual void add_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                     Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, float eps);
  virtual void layernorm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                      const Tensor& rstd, const Tensor& dres, Tensor& dx, Tensor& dgamma,
                                      Tensor& dbeta);

  // ---- GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ----
  virtual void gelu_forward(const Tensor& x, Tensor& y) = 0;
  virtual void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) = 0;  // dx = dy * gelu'(x)

  // ---- elementwise ----
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;  // out = a + b (residual)
  virtual void accumulate(const Tensor& src, Tensor& dst) = 0;         // dst += src (residual backward)
  virtual void scale(Tensor& t, float alpha) = 0;                      // t *= alpha

  // ---- embedding: out[N,C] = table[ids[n] - vocab_start] for ids inside this shard, else 0 ----
  virtual void embedding_forward(const Tensor& ids, const Tensor& table, int64_t vocab_start, Tensor& out) = 0;
  // dtable[ids[n] - vocab_start] += dout[n] for ids inside this shard.
  virtual void embedding_backward(const Tensor& ids, const Tensor& dout, int64_t vocab_start, Tensor& dtable) = 0;
  // out[b*T + t] += pos_table[t] for each of the B sequences (learned positions); out is [B*T, C].
  virtual void add_positions(const Tensor& pos_table, int64_t T, Tensor& out) = 0;
  // dpos[t] += sum over b of dout[b*T + t].
  virtual void add_positions_backward(const Tensor& dout, int64_t T, Tensor& dpos) = 0;

  // ---- RMSNorm over the last dim: y = x * rstd * gamma, rstd = 1/sqrt(mean(x^2) + eps); rstd F32 [N] ----
  // y has x's dtype; gamma has x's dtype or F32.
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& gamma, Tensor& y, Tensor& rstd, float eps) = 0;
  // dx = rstd * (g - xhat * mean(g * xhat)), g = dy * gamma, xhat = x * rstd (overwritten; dy, x and dx of one
  // dtype); dgamma += column sums of dy * xhat (F32, accumulates).
  virtual void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                Tensor& dx, Tensor& dgamma) = 0;

  // ---- SwiGLU (Megatron's --swiglu): x [N, 2F] holds per row [gate (F) | up (F)]; y [N, F] = silu(gate) * up ----
  // silu(g) = g * sigmoid(g). All tensors of one dtype.
  virtual void swiglu_forward(const Tensor& x, Tensor& y) = 0;
  // dx [N, 2F] overwritten: dgate = dy * up * silu'(gate), dup = dy * silu(gate).
  virtual void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) = 0;

  // ---- rotary position embedding (rotate-half / GPT-NeoX convention, as Megatron-LM's default and Hugging
  // Face Llama use), in place on the q and k parts of packed qkv [B*T, (H + 2G)*D] (layout below). The first
  // `rotary_dims` R (even, <= D) dims of each q and k head are rotated: for i < R/2, theta_i = base^(-2i/R),
  // angle = pos * theta_i, (x_i, x_{i+R/2}) -> (x_i cos - x_{i+R/2} sin, x_{i+R/2} cos + x_i sin); dims R..D-1
  // and the v part are untouched. Row b*T + t has position pos0 + t. The angle is computed as Megatron and
  // Hugging Face compute it in fp32: theta_i rounded to fp32 (here from a double evaluation of base^(-2i/R),
  // which is within an ulp of their fp32 pow), angle = fp32(pos) * theta_i rounded to fp32; cos and sin of
  // that fp32 angle are evaluated in double and rounded to fp32 (ops::rope_angle, shared by every backend).
  virtual void rope_forward(Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                            int64_t rotary_dims, float base, int64_t pos0) = 0;
  // The gradient through it: rotates the dq and dk parts of dqkv back (the transpose rotation), in place.
  virtual void rope_backward(Tensor& dqkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                             int64_t rotary_dims, float base, int64_t pos0) = 0;

  // ---- causal self-attention over local heads (fused: no [B, H, T, T] tensor outlives a call) ----
  // Grouped-query attention: H query heads share G key/value heads (query groups; G divides H, G == H is
  // multi-head attention). qkv [B*T, (H + 2G)*D]: per token q for heads 0..H-1 (H*D values), then k for
  // groups 0..G-1 (G*D), then v for groups 0..G-1 (G*D); Q, K and V are read in place by strides. Query
  // head h uses key/value group h / (H/G). out [B*T, H*D]. Scores are scaled by 1/sqrt(D); token t attends
  // to tokens 0..t. lse F32 [B, H, T]: each query row's log-sum-exp of its scaled, masked scores (natural
  // log), which with qkv and out is all the backward pass needs.
  void attention_forward(const Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, Tensor& out,
                         Tensor& lse) {
    attention_forward_last(qkv, B, T, T, H, G, D, out, lse);
  }
  // The same for the last Tq positions of each sequence only (decoding with a key/value cache, where the
  // cache holds the first T - Tq positions): query i is position T - Tq + i and attends to positions
  // 0..T-Tq+i. The q slots of the first T - Tq rows of qkv are not read. out [B*Tq, H*D], lse F32 [B, H, Tq].
  virtual void attention_forward_last(const Tensor& qkv, int64_t B, int64_t T, int64_t Tq, int64_t H, int64_t G,
                                      int64_t D, Tensor& out, Tensor& lse) = 0;
  // dqkv = gradient wrt qkv (overwritten); the softmax is recomputed from qkv and lse. Each group's dk and
  // dv are summed over its H/G query heads.
  virtual void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                  int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, Tensor& dqkv) = 0;

  // ---- attention between two blocks of positions (context parallelism's ring, model/ring_attention.h) ----
  // q [B*Tq, Wq]: rows whose first H*D columns are the queries (a packed qkv's rows); kv [B*Tk, Wk], Wk >=
  // 2G*D: rows whose last 2G*D columns hold group g's key at g*D and its value at (G + g)*D (a packed qkv,
  // or a [B*Tk, 2G*D] block of keys then values). causal: both blocks cover the same positions (Tq == Tk)
  // and query i attends keys 0..i; otherwise every query attends every key. out [B*Tq, H*D] (any float
  // dtype on the CPU; F32 or q's dtype on CUDA, where q and kv share a dtype) and lse F32 [B, H, Tq] are
  // attention_forward's over this block's keys alone.
  virtual void attention_block_forward(const Tensor& q, const Tensor& kv, int64_t B, int64_t Tq, int64_t Tk,
                                       int64_t H, int64_t G, int64_t D, bool causal, Tensor& out, Tensor& lse) = 0;
  // dq F32 [B*Tq, H*D] += and dkv F32 [B*Tk, 2G*D] += this block's share of the gradient; out and lse are the
  // queries' final output and statistics over every block (after attention_merge), dout [B*Tq, H*D].
  virtual void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out,
                                        const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t G,
                                        int64_t D, bool causal, Tensor& dq, Tensor& dkv) = 0;
  // Folds one block's result into a running one over the same queries (the log-sum-exp merge):
  // lse' = log(e^lse + e^lse_b), out' = e^(lse - lse') out + e^(lse_b - lse') out_b (out_b itself where
  // lse is -inf: out is then not read). out and out_b F32 [B*T, H*D], lse and lse_b F32 [B, H, T].
  virtual void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b, int64_t B,
                               int64_t T, int64_t H, int64_t D) = 0;
  // dst[:, dst_col .. dst_col + width) = src[:, src_col .. src_col + width) over the rows of two 2-D float
  // tensors with the same row count (converting between float dtypes).
  virtual void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) = 0;

  // ---- softmax cross-entropy over a (possibly vocab-sharded) logits[N, Vl] ----
  // The three stages let the caller all-reduce max and sums over the tensor-parallel group between them.
  // row_max[n] = max over real columns of logits[n] (-inf if the shard has none). F32 [N].
  virtual void ce_row_max(const Tensor& logits, int64_t vocab_start, int64_t vocab_size, Tensor& row_max) = 0;
  // sum_exp[n] = sum over real columns exp(logit - row_max[n]);
  // target_logit[n] = logits[n, target[n] - vocab_start] if the target lies in this shard, else 0.
  virtual void ce_sum_exp(const Tensor& logits, const Tensor& row_max, const Tensor& targets, int64_t vocab_start,
                          int64_t vocab_size, Tensor& sum_exp, Tensor& target_logit) = 0;
  // Both stages above in one read of the logits (online softmax), over this shard alone: row_max[n] = the
  // shard's max over real columns (-inf if it has none), sum_exp[n] = the sum of exp(logit - row_max[n]) over
  // them, target_logit as ce_sum_exp's. With one shard these are ce_row_max's and ce_sum_exp's outputs (up to
  // rounding: the sum is rescaled as the running max rises); across a tensor-parallel group the caller
  // max-reduces a copy of row_max and brings each shard's sum to the common max with ce_rescale_sum_exp
  // before summing. The default composes ce_row_max and ce_sum_exp (two reads).
  virtual void ce_row_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                            Tensor& row_max, Tensor& sum_exp, Tensor& target_logit);
  // sum_exp[n] *= exp(local_max[n] - global_max[n]), and 0 where local_max[n] is -inf (a shard without real
  // columns). F32 [N] each.
  virtual void ce_rescale_sum_exp(const Tensor& local_max, const Tensor& global_max, Tensor& sum_exp) = 0;
  // dlogits = grad_scale * (softmax - onehot(target)), zero on padding columns. Overwrites dlogits, which
  // may be the logits tensor itself (each element is read before it is written, by the same thread).
  virtual void ce_backward(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp,
                           const Tensor& targets, int64_t vocab_start, int64_t vocab_size, float grad_scale,
                           Tensor& dlogits) = 0;
  // loss_sum[0] += the mean over the N rows of ops::token_loss(row_max[n], sum_exp[n], target_logit[n]), in
  // fp64: one microbatch's mean token loss from ce_sum_exp's outputs (after their tensor-parallel
  // reduction), accumulated on the device. row_max, sum_exp, target_logit F32 [N]; loss_sum F64 [1].
  virtual void ce_loss_accumulate(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                                  Tensor& loss_sum) = 0;

  // ---- optimizer ----
  // The training step uses the flat forms: one call per flat buffer, whatever number of parameters it
  // holds (model/ops/flat_segments.h). The single-tensor forms compute the same per-element math on one
  // segment and are kept as their reference.
  virtual double sum_squares(const Tensor& t) = 0;  // sum of x^2 in fp64, returned to the host
  // sums[s.norm_slot] += sum of flat[i]^2 over the elements of each segment s that has a slot, in fp64;
  // a slot belongs to one segment of the table at most. The CPU sums each segment exactly as sum_squares
  // sums a tensor; CUDA sums fixed tiles in order, reproducible from run to run but not bit-equal to its
  // sum_squares. flat F32; sums F64 [slots], on the device.
  virtual void sum_squares_segments(const Tensor& flat, const std::vector<ops::FlatSegment>& segments,
                                    Tensor& sums) = 0;
  // Decoupled AdamW on fp32 master weights: m,v updated, then
  // w -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * w), with bias corrections for `step` (1-based).
  virtual void adamw_step(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, float lr, float beta1, float beta2,
                          float eps, float weight_decay, int64_t step) = 0;
  // The same update over the segments of flat fp32 buffers of one length (master weights, gradients, the
  // two moments), element i of a segment with gradient grad[i] * h.grad_scale and the segment's weight
  // decay. With `value` (the compute-dtype weights, same length) each updated master weight is also stored
  // there, rounded to its dtype, in the same pass. Elements outside every segment are not touched.
  virtual void adamw_step_flat(Tensor& master, const Tensor& grad, Tensor& m, Tensor& v, Tensor* value,
                               const std::vector<ops::FlatSegment>& segments, const ops::AdamWHyper& h) = 0;
};

// Creates the backend named in the config ("cpu" or "cuda"); throws with a clear message when the
// backend is not built in or no device is present.
std::unique_ptr<Backend> make_backend(const std::string& name, int local_rank = 0);

}  // namespace gpt
