// Argument checks every backend runs before an op, written once so that the CPU and CUDA backends reject
// the same inputs with the same messages, "<Backend>::<op>: <message>". A backend names itself and the
// device its tensors must live on (OpChecks); the op-level checks below (linear, attention, layernorm,
// embedding, cross-entropy shapes) return the dimensions the kernels need.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "model/ops/adamw_update.h"
#include "model/ops/flat_segments.h"
#include "model/tensor.h"

namespace gpt::ops {

bool is_float(DType t);
// "[2, 3] fp32", for messages.
std::string describe(const Tensor& t);

// The generic checks, for one backend: each throws std::runtime_error naming the backend, op and argument.
struct OpChecks {
  const char* backend;  // "CpuBackend", "CudaBackend"
  Device device;        // where the backend's tensors live

  void require(bool ok, const char* op, const std::string& message) const;
  // Defined, on this backend's device.
  void require_here(const Tensor& t, const char* op, const char* arg) const;
  // ... and of a float dtype (F32/BF16/F16), or of exactly `dtype`.
  void require_float(const Tensor& t, const char* op, const char* arg) const;
  void require_dtype(const Tensor& t, DType dtype, const char* op, const char* arg) const;
  // Exactly `numel` elements; `what` describes the expected shape for the message.
  void require_numel(const Tensor& t, int64_t numel, const char* op, const char* arg, const std::string& what) const;
};

// element-wise ops: every tensor of a float dtype, each with the first one's element count (returned).
struct NamedTensor {
  const Tensor& tensor;
  const char* name;
};
int64_t check_elementwise(const OpChecks& c, const char* op, std::initializer_list<NamedTensor> args);

// linear: x [rows, in] against w [out, in].
struct LinearDims {
  int64_t rows, in, out;
};
LinearDims check_linear(const OpChecks& c, const Tensor& x, const Tensor& w, const char* op);

// attention over packed qkv [B*T, (H + 2G)*D] (q for H heads, then k and v for G groups; G divides H) with fp32
// log-sum-exp statistics lse [B, H, T]; out (and dout) [B*T, H*D] of a float dtype.
// Tq: query positions per sequence, the last Tq of its T (T for training; fewer when decoding with a cache).
struct AttentionDims {
  int64_t B, T, H, G, D;
  int64_t Tq;
  int64_t q0() const { return T - Tq; }  // position of the first query
  int64_t group_size() const { return H / G; }  // query heads per key/value group
  int64_t group(int64_t h) const { return h / group_size(); }  // the key/value group of query head h
  int64_t k_offset() const { return H * D; }  // first k element of a qkv row
  int64_t v_offset() const { return (H + G) * D; }  // first v element of a qkv row
  int64_t qkv_ld() const { return (H + 2 * G) * D; }
  int64_t out_ld() const { return H * D; }
  int64_t bh() const { return B * H; }
};
AttentionDims check_attention(const OpChecks& c, const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t B,
                              int64_t T, int64_t H, int64_t G, int64_t D, const char* op);
// The same with queries only for the last Tq positions: out [B*Tq, H*D], lse [B, H, Tq], 1 <= Tq <= T.
AttentionDims check_attention_last(const OpChecks& c, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                   int64_t B, int64_t T, int64_t Tq, int64_t H, int64_t G, int64_t D, const char* op);
// attention_block_forward / _backward's q, kv, out and lse (backend.h); causal needs Tq == Tk.
AttentionDims check_attention_block(const OpChecks& c, const Tensor& q, const Tensor& kv, const Tensor& out,
                                    const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t G,
                                    int64_t D, bool causal, const char* op);
// attention_block_backward's: the forward's operands, dout [B*Tq, H*D], dq F32 [B*Tq, H*D], dkv F32 [B*Tk, 2G*D].
AttentionDims check_attention_block_backward(const OpChecks& c, const Tensor& dout, const Tensor& q, const Tensor& kv,
                                             const Tensor& out, const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk,
                                             int64_t H, int64_t G, int64_t D, bool causal, const Tensor& dq,
                                             const Tensor& dkv, const char* op);
// attention_merge's operands: out, out_b F32 [B*T, H*D]; lse, lse_b F32 [B, H, T].
void check_attention_merge(const OpChecks& c, const Tensor& out, const Tensor& lse, const Tensor& out_b,
                           const Tensor& lse_b, int64_t B, int64_t T, int64_t H, int64_t D, const char* op);
// copy_columns: 2-D float tensors with equal row counts, each column range inside its tensor.
void check_copy_columns(const OpChecks& c, const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col,
                        int64_t width, const char* op);
// B, T, H, G, D positive and G dividing H (shared by attention and rope); returns "B=.. T=.. H=.. D=.." for messages.
std::string check_head_counts(const OpChecks& c, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                              const char* op);

// rmsnorm, swiglu: rows of a float tensor.
struct RowDims {
  int64_t rows, cols;
};
// rmsnorm_forward: x [N, C] (C = gamma's length), y of x's dtype and shape, gamma of x's dtype or F32, rstd
// F32 [N].
RowDims check_rmsnorm(const OpChecks& c, const Tensor& x, const Tensor& gamma, const Tensor& y, const Tensor& rstd,
                      const char* op);
// rmsnorm_backward: x and gamma as above, dy and dx of x's dtype and shape, rstd F32 [N], dgamma F32 [C];
// dx shares no storage with x or dy.
RowDims check_rmsnorm_backward(const OpChecks& c, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                               const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const char* op);
// swiglu: x [N, 2F] and y [N, F] (`y_arg`: "y" forward, "dy" backward) of one float dtype; returns {N, F}.
RowDims check_swiglu(const OpChecks& c, const Tensor& x, const Tensor& y, const char* y_arg, const char* op);
// swiglu_backward: dy [N, F], x and dx [N, 2F], of one float dtype.
RowDims check_swiglu_backward(const OpChecks& c, const Tensor& dy, const Tensor& x, const Tensor& dx, const char* op);

// rope over packed qkv [B*T, (H + 2G)*D] (`arg`: "qkv" or "dqkv") of a float dtype: rotary_dims R even,
// 2 <= R <= D; base > 0 and finite; pos0 >= 0.
struct RopeDims {
  int64_t B, T, H, G, D, R;
  int64_t rows() const { return B * T; }
  int64_t heads() const { return H + G; }  // q and k heads of a row: the rotated ones, D apart
  int64_t ld() const { return (H + 2 * G) * D; }
};
RopeDims check_rope(const OpChecks& c, const Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                    int64_t rotary_dims, float base, int64_t pos0, const char* op, const char* arg);

// layernorm: x's rows of width C (the rows are returned).
int64_t check_layernorm_rows(const OpChecks& c, const Tensor& x, int64_t C, const char* op);
// The residual add fused before a norm: x, r and h float with x's element count, h of x's dtype.
void check_add_norm(const OpChecks& c, const Tensor& x, const Tensor& r, const Tensor& h, const char* op);
// layernorm_backward's other arguments, for N rows of width C; dx shares no storage with x or dy.
void check_layernorm_backward(const OpChecks& c, const Tensor& dy, const Tensor& x, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                              int64_t N, int64_t C, const char* op);

// embedding: a float [rows, C] table; an activation [B*T, C] that is whole sequences of T rows (B returned).
void check_table(const OpChecks& c, const Tensor& table, const char* op, const char* arg);
int64_t check_sequences(const OpChecks& c, const Tensor& act, int64_t T, int64_t C, const char* op, const char* arg);
// add_positions and its backward: a position table [>= T, C] (`table_arg`) and a float activation of whole
// sequences of T rows of width C (`act_arg`).
struct PositionDims {
  int64_t B, C;  // sequences, width
};
PositionDims check_positions(const OpChecks& c, const Tensor& table, int64_t T, const Tensor& act, const char* op,
                             const char* table_arg, const char* act_arg);

// cross-entropy: a logits shard [N, Vl] whose first `real` columns hold vocabulary entries.
struct VocabShard {
  int64_t rows;  // N
  int64_t cols;  // Vl, including padding
  int64_t real;  // leading columns that hold real vocabulary entries
};
VocabShard check_logits(const OpChecks& c, const Tensor& logits, int64_t vocab_start, int64_t vocab_size,
                        const char* op);
// An F32 vector of one value per logits row; I32 targets of one per row.
void check_row_vector(const OpChecks& c, const Tensor& t, int64_t rows, const char* op, const char* arg);
void check_targets_shape(const OpChecks& c, const Tensor& targets, int64_t rows, const char* op);
// ce_sum_exp and ce_row_stats: the logits shard, one target and one row_max, sum_exp and target_logit per row.
VocabShard check_ce_row_stats(const OpChecks& c, const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                              int64_t vocab_size, const Tensor& row_max, const Tensor& sum_exp,
                              const Tensor& target_logit, const char* op);
// ce_rescale_sum_exp: three F32 vectors of one length; returns it.
int64_t check_ce_rescale(const OpChecks& c, const Tensor& local_max, const Tensor& global_max, const Tensor& sum_exp,
                         const char* op);

// adamw_step: fp32 master weights w, gradient g and moments m, v of one size, and a 1-based step. Returns
// the bias corrections 1 / (1 - beta^step), computed in double (beta^step underflows gracefully and
// 1 - beta^step keeps its precision).
struct AdamWBiasCorrections {
  float inv_bc1, inv_bc2;
};
AdamWBiasCorrections check_adamw(const OpChecks& c, const Tensor& w, const Tensor& g, const Tensor& m,
                                 const Tensor& v, float beta1, float beta2, int64_t step, const char* op);
// adamw_step_flat: the same for flat buffers, plus an optional float `value` of the same length (not
// aliasing master) and a segment table that fits them.
AdamWBiasCorrections check_adamw_flat(const OpChecks& c, const Tensor& master, const Tensor& grad, const Tensor& m,
                                      const Tensor& v, const Tensor* value,
                                      const std::vector<FlatSegment>& segments, const AdamWHyper& h, const char* op);
// A segment table over `numel` elements: ascending, non-overlapping, inside [0, numel), every norm slot
// below `slots` and used by one segment at most (pass slots < 0 when the op ignores them).
void check_flat_segments(const OpChecks& c, const std::vector<FlatSegment>& segments, int64_t numel, int64_t slots,
                         const char* op);
// ce_loss_accumulate: three F32 row vectors of one length N (returned) and an F64 [1] accumulator.
int64_t check_loss_rows(const OpChecks& c, const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                        const Tensor& loss_sum, const char* op);

}  // namespace gpt::ops
