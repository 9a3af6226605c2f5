// The shared backend argument checks declared in op_checks.h.
#include "model/ops/op_checks.h"

#include <cstdint>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gpt::ops {

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

std::string describe(const Tensor& t) { return shape_str(t.shape()) + " " + dtype_name(t.dtype()); }

void OpChecks::require(bool ok, const char* op, const std::string& message) const {
  if (!ok) throw std::runtime_error(std::string(backend) + "::" + op + ": " + message);
}

void OpChecks::require_here(const Tensor& t, const char* op, const char* arg) const {
  require(t.defined(), op, std::string(arg) + " is an undefined tensor");
  require(t.device() == device, op,
          std::string(arg) + (device == Device::CPU ? " does not live in host memory" : " does not live in GPU memory"));
}

void OpChecks::require_float(const Tensor& t, const char* op, const char* arg) const {
  require_here(t, op, arg);
  require(is_float(t.dtype()), op, std::string(arg) + " must be a float tensor, got " + describe(t));
}

void OpChecks::require_dtype(const Tensor& t, DType dtype, const char* op, const char* arg) const {
  require_here(t, op, arg);
  require(t.dtype() == dtype, op, std::string(arg) + " must be " + dtype_name(dtype) + ", got " + describe(t));
}

void OpChecks::require_numel(const Tensor& t, int64_t numel, const char* op, const char* arg,
                             const std::string& what) const {
  require(t.numel() == numel, op,
          std::string(arg) + " is " + describe(t) + " but " + what + " (" + std::to_string(numel) +
              " elements) is required");
}

LinearDims check_linear(const OpChecks& c, const Tensor& x, const Tensor& w, const char* op) {
  c.require_float(x, op, "x");
  c.require_float(w, op, "w");
  c.require(w.ndim() == 2, op, "w must be [out, in], got " + describe(w));
  const int64_t in = w.dim(1), out = w.dim(0);
  c.require(x.ndim() >= 1 && x.dim(-1) == in, op,
            "x " + describe(x) + " does not end in w's in-features " + std::to_string(in) + " (w " + describe(w) + ")");
  int64_t rows = 1;  // the leading dims' product: x.numel() / in is 0 / 0 when in == 0
  for (int i = 0; i + 1 < x.ndim(); ++i) rows *= x.dim(i);
  return {rows, in, out};
}

void check_add_norm(const OpChecks& c, const Tensor& x, const Tensor& r, const Tensor& h, const char* op) {
  check_elementwise(c, op, {{x, "x"}, {r, "r"}, {h, "h"}});
  c.require(h.dtype() == x.dtype(), op, "h must have x's dtype " + std::string(dtype_name(x.dtype())) + ", got " +
                                            describe(h));
}

int64_t check_elementwise(const OpChecks& c, const char* op, std::initializer_list<NamedTensor> args) {
  for (const NamedTensor& a : args) c.require_float(a.tensor, op, a.name);
  const NamedTensor& first = *args.begin();
  for (const NamedTensor& a : args)
    c.require(a.tensor.numel() == first.tensor.numel(), op,
              std::string(first.name) + " " + describe(first.tensor) + " and " + a.name + " " + describe(a.tensor) +
                  " differ in element count");
  return first.tensor.numel();
}

AttentionDims check_attention(const OpChecks& c, const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t B,
                              int64_t T, int64_t H, int64_t G, int64_t D, const char* op) {
  return check_attention_last(c, qkv, out, lse, B, T, T, H, G, D, op);
}

std::string check_head_counts(const OpChecks& c, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                              const char* op) {
  c.require(B > 0 && T > 0 && H > 0 && D > 0, op,
            "B, T, H, D must be positive, got " + std::to_string(B) + ", " + std::to_string(T) + ", " +
                std::to_string(H) + ", " + std::to_string(D));
  c.require(G > 0 && H % G == 0, op,
            "the key/value heads (query groups) G=" + std::to_string(G) + " must be positive and divide the query "
                "heads H=" + std::to_string(H));
  return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
         (G == H ? "" : " G=" + std::to_string(G)) + " D=" + std::to_string(D);
}

AttentionDims check_attention_last(const OpChecks& c, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                   int64_t B, int64_t T, int64_t Tq, int64_t H, int64_t G, int64_t D, const char* op) {
  const std::string heads = check_head_counts(c, B, T, H, G, D, op);
  c.require(Tq > 0 && Tq <= T, op,
            "the query positions Tq=" + std::to_string(Tq) + " must be between 1 and T=" + std::to_string(T));
  const std::string dims = heads + (Tq == T ? "" : " Tq=" + std::to_string(Tq));
  c.require_float(qkv, op, "qkv");
  c.require_numel(qkv, B * T * (H + 2 * G) * D, op, "qkv",
                  (G == H ? "[B*T, 3*H*D] for " : "[B*T, (H+2G)*D] for ") + dims);
  c.require_float(out, op, "out");
  c.require_numel(out, B * Tq * H * D, op, "out", (Tq == T ? "[B*T, H*D] for " : "[B*Tq, H*D] for ") + dims);
  c.require_dtype(lse, DType::F32, op, "lse");
  c.require_numel(lse, B * H * Tq, op, "lse", (Tq == T ? "[B, H, T] for " : "[B, H, Tq] for ") + dims);
  return {B, T, H, G, D, Tq};
}

AttentionDims check_attention_block(const OpChecks& c, const Tensor& q, const Tensor& kv, const Tensor& out,
                                    const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t G,
                                    int64_t D, bool causal, const char* op) {
  const std::string dims = check_head_counts(c, B, Tq, H, G, D, op) + " Tk=" + std::to_string(Tk);
  c.require(Tk > 0, op, "the key block must hold at least one position (Tk=" + std::to_string(Tk) + ")");
  c.require(!causal || Tq == Tk, op, "a causal block pairs queries and keys of the same positions, so Tq=" +
                                         std::to_string(Tq) + " must equal Tk=" + std::to_string(Tk));
  c.require_float(q, op, "q");
  c.require(q.ndim() == 2 && q.dim(0) == B * Tq && q.dim(1) >= H * D, op,
            "q " + describe(q) + " must be [B*Tq, >= H*D] for " + dims);
  c.require_float(kv, op, "kv");
  c.require(kv.ndim() == 2 && kv.dim(0) == B * Tk && kv.dim(1) >= 2 * G * D, op,
            "kv " + describe(kv) + " must be [B*Tk, >= 2G*D] for " + dims);
  c.require_float(out, op, "out");
  c.require_numel(out, B * Tq * H * D, op, "out", "[B*Tq, H*D] for " + dims);
  c.require_dtype(lse, DType::F32, op, "lse");
  c.require_numel(lse, B * H * Tq, op, "lse", "[B, H, Tq] for " + dims);
  return {B, Tk, H, G, D, Tq};
}

AttentionDims check_attention_block_backward(const OpChecks& c, const Tensor& dout, const Tensor& q, const Tensor& kv,
                                             const Tensor& out, const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk,
                                             int64_t H, int64_t G, int64_t D, bool causal, const Tensor& dq,
                                             const Tensor& dkv, const char* op) {
  const AttentionDims d = check_attention_block(c, q, kv, out, lse, B, Tq, Tk, H, G, D, causal, op);
  c.require_float(dout, op, "dout");
  c.require_numel(dout, B * Tq * H * D, op, "dout", "[B*Tq, H*D]");
  c.require_dtype(dq, DType::F32, op, "dq");
  c.require_numel(dq, B * Tq * H * D, op, "dq", "[B*Tq, H*D]");
  c.require_dtype(dkv, DType::F32, op, "dkv");
  c.require_numel(dkv, B * Tk * 2 * G * D, op, "dkv", "[B*Tk, 2G*D]");
  return d;
}

void check_attention_merge(const OpChecks& c, const Tensor& out, const Tensor& lse, const Tensor& out_b,
                           const Tensor& lse_b, int64_t B, int64_t T, int64_t H, int64_t D, const char* op) {
  const std::string dims = "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
                           " D=" + std::to_string(D);
  c.require(B > 0 && T > 0 && H > 0 && D > 0, op, "sizes must be positive (" + dims + ")");
  for (auto [t, arg] : {std::pair<const Tensor*, const char*>{&out, "out"}, {&out_b, "out_b"}}) {
    c.require_dtype(*t, DType::F32, op, arg);
    c.require_numel(*t, B * T * H * D, op, arg, "[B*T, H*D] for " + dims);
  }
  for (auto [t, arg] : {std::pair<const Tensor*, const char*>{&lse, "lse"}, {&lse_b, "lse_b"}}) {
    c.require_dtype(*t, DType::F32, op, arg);
    c.require_numel(*t, B * H * T, op, arg, "[B, H, T] for " + dims);
  }
}

void check_copy_columns(const OpChecks& c, const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col,
                        int64_t width, const char* op) {
  c.require_float(src, op, "src");
  c.require_float(dst, op, "dst");
  c.require(src.ndim() == 2 && dst.ndim() == 2 && src.dim(0) == dst.dim(0), op,
            "src " + describe(src) + " and dst " + describe(dst) + " must be 2-D with the same row count");
  c.require(width >= 0 && src_col >= 0 && dst_col >= 0 && src_col + width <= src.dim(1) &&
                dst_col + width <= dst.dim(1),
            op,
            "columns [" + std::to_string(src_col) + ", +" + std::to_string(width) + ") of src " + describe(src) +
                " or [" + std::to_string(dst_col) + ", +" + std::to_string(width) + ") of dst " + describe(dst) +
                " fall outside the tensor");
}

namespace {

// `t` has `like`'s dtype (the activations of one op share a dtype, so kernels are compiled per dtype).
void require_same_dtype(const OpChecks& c, const Tensor& t, const Tensor& like, const char* op, const char* arg,
                        const char* like_arg) {
  c.require(t.dtype() == like.dtype(), op,
            std::string(arg) + " " + describe(t) + " must have " + like_arg + "'s dtype " + dtype_name(like.dtype()));
}

// Whether two tensors' bytes overlap (an empty tensor overlaps nothing).
bool overlaps(const Tensor& a, const Tensor& b) {
  const auto begin = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw()); };
  const auto end = [&](const Tensor& t) { return begin(t) + static_cast<uintptr_t>(t.bytes()); };
  if (a.numel() == 0 || b.numel() == 0) return false;
  return begin(a) < end(b) && begin(b) < end(a);
}

// The norms' backward passes read x and dy again for the parameter gradients after dx is written.
void require_dx_distinct(const OpChecks& c, const Tensor& dx, const Tensor& x, const Tensor& dy, const char* op) {
  c.require(!overlaps(dx, x) && !overlaps(dx, dy), op, "dx must not share its storage with x or dy");
}

}  // namespace

RowDims check_rmsnorm(const OpChecks& c, const Tensor& x, const Tensor& gamma, const Tensor& y, const Tensor& rstd,
                      const char* op) {
  c.require_float(gamma, op, "gamma");
  c.require(gamma.dtype() == x.dtype() || gamma.dtype() == DType::F32, op,
            "gamma " + describe(gamma) + " must have x's dtype " + dtype_name(x.dtype()) + " or be F32");
  const int64_t C = gamma.numel();
  const int64_t N = check_layernorm_rows(c, x, C, op);
  c.require_float(y, op, "y");
  require_same_dtype(c, y, x, op, "y", "x");
  c.require_numel(y, N * C, op, "y", "x's shape " + shape_str(x.shape()));
  c.require_dtype(rstd, DType::F32, op, "rstd");
  c.require_numel(rstd, N, op, "rstd", "one value per row");
  return {N, C};
}

RowDims check_rmsnorm_backward(const OpChecks& c, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                               const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const char* op) {
  const RowDims d = check_rmsnorm(c, x, gamma, dy, rstd, op);  // dy: y's requirements
  c.require_float(dx, op, "dx");
  require_same_dtype(c, dx, x, op, "dx", "x");
  c.require_numel(dx, d.rows * d.cols, op, "dx", "x's shape " + shape_str(x.shape()));
  require_dx_distinct(c, dx, x, dy, op);
  c.require_dtype(dgamma, DType::F32, op, "dgamma");
  c.require_numel(dgamma, d.cols, op, "dgamma", "gamma's shape");
  return d;
}

RowDims check_swiglu(const OpChecks& c, const Tensor& x, const Tensor& y, const char* y_arg, const char* op) {
  c.require_float(x, op, "x");
  c.require_float(y, op, y_arg);
  require_same_dtype(c, y, x, op, y_arg, "x");
  c.require(y.ndim() >= 1 && y.dim(-1) > 0, op, std::string(y_arg) + " must be [N, F], got " + describe(y));
  const int64_t F = y.dim(-1), N = y.numel() / F;
  c.require(x.ndim() >= 1 && x.dim(-1) == 2 * F && x.numel() == 2 * N * F, op,
            "x " + describe(x) + " must be [N, 2F] = [" + std::to_string(N) + ", " + std::to_string(2 * F) +
                "] (per row the gate then the up projection) for " + y_arg + " " + describe(y));
  return {N, F};
}

RowDims check_swiglu_backward(const OpChecks& c, const Tensor& dy, const Tensor& x, const Tensor& dx, const char* op) {
  const RowDims d = check_swiglu(c, x, dy, "dy", op);
  c.require_float(dx, op, "dx");
  require_same_dtype(c, dx, x, op, "dx", "x");
  c.require_numel(dx, x.numel(), op, "dx", "x's shape " + shape_str(x.shape()));
  return d;
}

RopeDims check_rope(const OpChecks& c, const Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                    int64_t rotary_dims, float base, int64_t pos0, const char* op, const char* arg) {
  const std::string dims = check_head_counts(c, B, T, H, G, D, op);
  c.require(rotary_dims >= 2 && rotary_dims % 2 == 0 && rotary_dims <= D, op,
            "rotary_dims=" + std::to_string(rotary_dims) + " must be even and between 2 and the head dim D=" +
                std::to_string(D));
  c.require(std::isfinite(base) && base > 0.f, op, "base must be positive and finite, got " + std::to_string(base));
  c.require(pos0 >= 0, op, "pos0 (the first row's position) must be >= 0, got " + std::to_string(pos0));
  c.require_float(qkv, op, arg);
  c.require_numel(qkv, B * T * (H + 2 * G) * D, op, arg, "[B*T, (H+2G)*D] for " + dims);
  return {B, T, H, G, D, rotary_dims};
}

int64_t check_layernorm_rows(const OpChecks& c, const Tensor& x, int64_t C, const char* op) {
  c.require_float(x, op, "x");
  c.require(C > 0 && x.ndim() >= 1 && x.dim(-1) == C, op,
            "x " + describe(x) + " does not end in the normalised width " + std::to_string(C));
  return x.numel() / C;
}

void check_layernorm_backward(const OpChecks& c, const Tensor& dy, const Tensor& x, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                              int64_t N, int64_t C, const char* op) {
  c.require_float(dy, op, "dy");
  c.require_float(dx, op, "dx");
  c.require_float(dgamma, op, "dgamma");
  c.require_float(dbeta, op, "dbeta");
  c.require_numel(dy, N * C, op, "dy", "x's shape " + shape_str(x.shape()));
  c.require_numel(dx, N * C, op, "dx", "x's shape " + shape_str(x.shape()));
  require_dx_distinct(c, dx, x, dy, op);
  c.require_dtype(mean, DType::F32, op, "mean");
  c.require_dtype(rstd, DType::F32, op, "rstd");
  c.require_numel(mean, N, op, "mean", "one value per row");
  c.require_numel(rstd, N, op, "rstd", "one value per row");
  c.require_numel(dgamma, C, op, "dgamma", "gamma's shape");
  c.require_numel(dbeta, C, op, "dbeta", "gamma's shape");
}

void check_table(const OpChecks& c, const Tensor& table, const char* op, const char* arg) {
  c.require_float(table, op, arg);
  c.require(table.ndim() == 2, op, std::string(arg) + " must be [rows, C], got " + describe(table));
}

int64_t check_sequences(const OpChecks& c, const Tensor& act, int64_t T, int64_t C, const char* op, const char* arg) {
  c.require(T > 0 && C > 0 && act.numel() % (T * C) == 0, op,
            std::string(arg) + " " + describe(act) + " is not a whole number of sequences of T=" + std::to_string(T) +
                " rows of width " + std::to_string(C));
  return act.numel() / (T * C);
}

PositionDims check_positions(const OpChecks& c, const Tensor& table, int64_t T, const Tensor& act, const char* op,
                             const char* table_arg, const char* act_arg) {
  check_table(c, table, op, table_arg);
  const int64_t C = table.dim(1);
  c.require(T <= table.dim(0), op,
            "sequence length " + std::to_string(T) + " exceeds the position table " + describe(table));
  c.require_float(act, op, act_arg);
  return {check_sequences(c, act, T, C, op, act_arg), C};
}

VocabShard check_logits(const OpChecks& c, const Tensor& logits, int64_t vocab_start, int64_t vocab_size,
                        const char* op) {
  c.require_float(logits, op, "logits");
  c.require(logits.ndim() >= 1 && logits.dim(-1) > 0, op, "logits must be [N, Vl], got " + describe(logits));
  c.require(vocab_start >= 0 && vocab_size > 0, op,
            "vocab_start must be >= 0 and vocab_size > 0, got " + std::to_string(vocab_start) + " and " +
                std::to_string(vocab_size));
  const int64_t cols = logits.dim(-1);
  return {logits.numel() / cols, cols, std::clamp<int64_t>(vocab_size - vocab_start, 0, cols)};
}

void check_row_vector(const OpChecks& c, const Tensor& t, int64_t rows, const char* op, const char* arg) {
  c.require_dtype(t, DType::F32, op, arg);
  c.require_numel(t, rows, op, arg, "one value per logits row");
}

void check_targets_shape(const OpChecks& c, const Tensor& targets, int64_t rows, const char* op) {
  c.require_dtype(targets, DType::I32, op, "targets");
  c.require_numel(targets, rows, op, "targets", "one target per logits row");
}

VocabShard check_ce_row_stats(const OpChecks& c, const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                              int64_t vocab_size, const Tensor& row_max, const Tensor& sum_exp,
                              const Tensor& target_logit, const char* op) {
  const VocabShard s = check_logits(c, logits, vocab_start, vocab_size, op);
  check_row_vector(c, row_max, s.rows, op, "row_max");
  check_row_vector(c, sum_exp, s.rows, op, "sum_exp");
  check_row_vector(c, target_logit, s.rows, op, "target_logit");
  check_targets_shape(c, targets, s.rows, op);
  return s;
}

int64_t check_ce_rescale(const OpChecks& c, const Tensor& local_max, const Tensor& global_max, const Tensor& sum_exp,
                         const char* op) {
  const int64_t n = sum_exp.numel();
  check_row_vector(c, sum_exp, n, op, "sum_exp");
  check_row_vector(c, local_max, n, op, "local_max");
  check_row_vector(c, global_max, n, op, "global_max");
  return n;
}

AdamWBiasCorrections check_adamw(const OpChecks& c, const Tensor& w, const Tensor& g, const Tensor& m,
                                 const Tensor& v, float beta1, float beta2, int64_t step, const char* op) {
  c.require_dtype(w, DType::F32, op, "w (fp32 master weights)");
  c.require_dtype(g, DType::F32, op, "g");
  c.require_dtype(m, DType::F32, op, "m");
  c.require_dtype(v, DType::F32, op, "v");
  const std::string wshape = "w's shape " + shape_str(w.shape());
  c.require_numel(g, w.numel(), op, "g", wshape);
  c.require_numel(m, w.numel(), op, "m", wshape);
  c.require_numel(v, w.numel(), op, "v", wshape);
  c.require(step >= 1, op, "step is 1-based, got " + std::to_string(step));
  return {static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), step))),
          static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), step)))};
}

AdamWBiasCorrections check_adamw_flat(const OpChecks& c, const Tensor& master, const Tensor& grad, const Tensor& m,
                                      const Tensor& v, const Tensor* value,
                                      const std::vector<FlatSegment>& segments, const AdamWHyper& h, const char* op) {
  const AdamWBiasCorrections bc = check_adamw(c, master, grad, m, v, h.beta1, h.beta2, h.step, op);
  if (value) {
    c.require_float(*value, op, "value");
    c.require_numel(*value, master.numel(), op, "value", "master's shape " + shape_str(master.shape()));
    c.require(value->raw() != master.raw(), op, "value aliases master: pass no value when the weights are fp32");
  }
  check_flat_segments(c, segments, master.numel(), -1, op);
  return bc;
}

void check_flat_segments(const OpChecks& c, const std::vector<FlatSegment>& segments, int64_t numel, int64_t slots,
                         const char* op) {
  int64_t previous_end = 0;
  std::vector<char> slot_taken(slots > 0 ? static_cast<size_t>(slots) : 0, 0);
  for (size_t k = 0; k < segments.size(); ++k) {
    const FlatSegment& s = segments[k];
    const std::string which = "segment " + std::to_string(k) + " [" + std::to_string(s.begin) + ", " +
                              std::to_string(s.end) + ")";
    c.require(s.begin >= previous_end && s.end >= s.begin && s.end <= numel, op,
              which + " is not ascending, disjoint and inside the " + std::to_string(numel) + " elements");
    if (slots >= 0)
      c.require(s.norm_slot < slots, op, which + " adds to slot " + std::to_string(s.norm_slot) + " of " +
                                             std::to_string(slots));
    // One segment per slot: the CUDA backend adds each segment's sum into its slot concurrently.
    if (slots >= 0 && s.norm_slot >= 0) {
      c.require(!slot_taken[static_cast<size_t>(s.norm_slot)], op,
                which + " adds to slot " + std::to_string(s.norm_slot) + ", which an earlier segment adds to");
      slot_taken[static_cast<size_t>(s.norm_slot)] = 1;
    }
    previous_end = s.end;
  }
}

int64_t check_loss_rows(const OpChecks& c, const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                        const Tensor& loss_sum, const char* op) {
  c.require_dtype(row_max, DType::F32, op, "row_max");
  c.require_dtype(sum_exp, DType::F32, op, "sum_exp");
  c.require_dtype(target_logit, DType::F32, op, "target_logit");
  c.require_dtype(loss_sum, DType::F64, op, "loss_sum");
  const int64_t n = row_max.numel();
  c.require_numel(sum_exp, n, op, "sum_exp", "row_max's length");
  c.require_numel(target_logit, n, op, "target_logit", "row_max's length");
  c.require_numel(loss_sum, 1, op, "loss_sum", "one accumulator");
  c.require(n > 0, op, "no rows");
  return n;
}

}  // namespace gpt::ops
