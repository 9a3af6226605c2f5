// cuDNN fused attention (cudnn_attention.h) and CudaBackend's choice between it and the unfused path
// (model.attention_backend: auto | cudnn | unfused). Without cuDNN at build time only the choice is
// compiled: `auto` is the unfused path and `cudnn` fails with a clear error.
//
// The graphs follow cudnn-frontend's lowering of its SDPA nodes for cuDNN 9 (causal mask as generated
// row/column indices, a compare and a select; softmax as max, subtract, exp, sum, log):
//   forward:  S = (Q K^T) * scale; S' = row >= col ? S : -inf; M = rowmax S'; E = exp(S' - M);
//             Z = rowsum E; lse = M + log Z; P = E / Z (io dtype); O = P V.
//   backward: Dv = rowsum(dO * O) (written to an fp32 scratch, softmax_sum); P = exp(mask(Q K^T * scale
//             - lse)); dV = P^T dO; dS = (dO V^T - Dv) * P * scale; dK = dS^T Q; dQ = dS K, accumulated
//             in an fp32 scratch (dQ_accum) and written out by an identity.
// K (and V in backward) are described transposed ([B, G, D, T] with swapped strides) over the same memory.
// With groups (G < H), as cudnn-frontend lowers grouped-query attention: K and V have G heads, which the
// products broadcast over each group's H/G query heads, and backward forms dK and dV per query head
// ([B, H, T, D], virtual, in the io dtype) and sums them over each group with a reduction into [B, G, T, D].
#include "model/ops/cuda/cudnn_attention.h"

#include <spdlog/spdlog.h>

#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "model/ops/cuda/cuda_backend.h"
#include "model/ops/cuda/cuda_check.h"

#ifdef GPT_HAVE_CUDNN
#include <cudnn_graph.h>
#endif

namespace gpt {

namespace {

enum class AttentionPath { Auto, Cudnn, Unfused };

AttentionPath parse_path(const std::string& name) {
  if (name == "auto") return AttentionPath::Auto;
  if (name == "cudnn") return AttentionPath::Cudnn;
  if (name == "unfused") return AttentionPath::Unfused;
  throw std::runtime_error("model.attention_backend: unknown value '" + name + "' (expected auto, cudnn or unfused)");
}

}  // namespace

void CudaBackend::set_attention_backend(const std::string& name) {
  attention_path_ = static_cast<int>(parse_path(name));
#ifndef GPT_HAVE_CUDNN
  if (parse_path(name) == AttentionPath::Cudnn)
    throw std::runtime_error("model.attention_backend: cudnn requested, but this gpt-train was built without cuDNN "
                             "(cmake found no cudnn_graph.h / libcudnn next to the CUDA toolkit)");
#endif
}

#ifndef GPT_HAVE_CUDNN

namespace cuda {
struct CudnnAttention::Plan {};
CudnnAttention::~CudnnAttention() = default;
}  // namespace cuda

bool CudaBackend::cudnn_attention_forward(const ops::AttentionDims&, const Tensor&, Tensor&, Tensor&) { return false; }

bool CudaBackend::cudnn_attention_backward(const ops::AttentionDims&, const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&, Tensor&) {
  return false;
}

bool CudaBackend::cudnn_block_forward(const Tensor&, const Tensor&, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                                      Tensor&, Tensor&) {
  return false;
}

bool CudaBackend::cudnn_block_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       int64_t, int64_t, int64_t, int64_t, int64_t, bool, Tensor&, Tensor&) {
  return false;
}

CudaBackend::CudnnState::~CudnnState() = default;

#else

namespace cuda {

namespace {

// Raised by every failing cuDNN call; while a plan is being built, CudnnAttention::plan turns it into
// CudnnUnsupported (the graph was rejected).
[[noreturn]] void fail(cudnnStatus_t status, const char* what) {
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  std::string message = std::string("cuDNN ") + what + ": " + cudnnGetErrorString(status);
  if (detail[0]) message += std::string(" (") + detail + ")";
  throw std::runtime_error(message);
}

void check(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) fail(status, what);
}

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) { check(cudnnBackendCreateDescriptor(type, &d_), "create"); }
  ~Descriptor() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         int64_t count, const void* value, const char* what) {
  check(cudnnBackendSetAttribute(d, name, type, count, value), what);
}

void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value,
              const char* what) {
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
}

using Dims = std::array<int64_t, 4>;

cudnnDataType_t cudnn_type(DType t) { return t == DType::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16; }

}  // namespace

struct CudnnAttention::Plan {
  std::vector<std::unique_ptr<Descriptor>> keep;  // every descriptor the plan refers to, the plan last
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t engine_workspace = 0;
  int64_t scratch = 0;  // fp32 scratch ahead of the engine's workspace (backward: dQ_accum, softmax_sum)
  int64_t workspace() const { return scratch + engine_workspace; }
};

namespace {

constexpr int64_t kScratchAlign = 256;

// Builds one operation graph and its execution plan.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, Dims dims, Dims strides, bool is_virtual = false,
                                  bool by_value = false) {
    Descriptor& t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    const bool yes = true;
    set(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type");
    set(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dimensions");
    set(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    set(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id");
    set(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment");
    if (is_virtual) set(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, "virtual tensor");
    if (by_value) set(t.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "by-value tensor");
    check(cudnnBackendFinalize(t.get()), "finalize tensor");
    return t.get();
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, Dims dims, Dims strides) {
    return tensor(next_uid_++, type, dims, strides, true);
  }
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                 cudnnBackendDescriptor_t b = nullptr, cudnnBackendDescriptor_t t = nullptr,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Descriptor& pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision, "pointwise precision");
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
      set(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "gen-index axis");
    check(cudnnBackendFinalize(pw.get()), "finalize pointwise");
    Descriptor& op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const float one = 1.f;
    set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get(), "pointwise op");
    set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    if (b) set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
    if (t) set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
    set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
    set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1");
    set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
    check(cudnnBackendFinalize(op.get()), "finalize pointwise op");
    ops_.push_back(op.get());
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Descriptor& mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(mm.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "matmul compute type");
    check(cudnnBackendFinalize(mm.get()), "finalize matmul");
    Descriptor& op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b");
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get(), "matmul op");
    check(cudnnBackendFinalize(op.get()), "finalize matmul op");
    ops_.push_back(op.get());
  }

  void reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Descriptor& r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(r.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "reduction compute type");
    set(r.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce, "reduction operator");
    check(cudnnBackendFinalize(r.get()), "finalize reduction");
    Descriptor& op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, r.get(), "reduction op");
    set_desc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
    set_desc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
    check(cudnnBackendFinalize(op.get()), "finalize reduction op");
    ops_.push_back(op.get());
  }

  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Descriptor& op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x");
    set_desc(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y");
    check(cudnnBackendFinalize(op.get()), "finalize reshape op");
    ops_.push_back(op.get());
  }

  // The operation graph, the engine configurations the heuristics rank for it, and the first of them
  // that finalizes as an execution plan. Throws CudnnUnsupported when none does.
  std::unique_ptr<CudnnAttention::Plan> finalize(int64_t scratch) {
    Descriptor& graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
        ops_.data(), "graph ops");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_, "graph handle");
#pragma GCC diagnostic pop
    check(cudnnBackendFinalize(graph.get()), "finalize operation graph");

    Descriptor& heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set_desc(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.get(), "heuristics graph");
    set(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    check(cudnnBackendFinalize(heur.get()), "finalize heuristics");
    int64_t count = 0;
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                   nullptr),
          "heuristics count");
    if (count <= 0) throw CudnnUnsupported("cuDNN has no engine for this attention graph");
    std::vector<cudnnBackendDescriptor_t> configs;
    for (int64_t i = 0; i < count; ++i) configs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
    int64_t returned = 0;
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                   &returned, configs.data()),
          "heuristics results");
    std::string last_error = "no configuration returned";
    for (int64_t i = 0; i < returned; ++i) {
      auto plan = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      set_desc(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i], "plan engine config");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
      set(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_, "plan handle");
#pragma GCC diagnostic pop
      const cudnnStatus_t st = cudnnBackendFinalize(plan->get());
      if (st != CUDNN_STATUS_SUCCESS) {
        char detail[1024] = {0};
        cudnnGetLastErrorString(detail, sizeof detail);
        last_error = std::string(cudnnGetErrorString(st)) + (detail[0] ? std::string(": ") + detail : "");
        continue;
      }
      auto out = std::make_unique<CudnnAttention::Plan>();
      check(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                     nullptr, &out->engine_workspace),
            "plan workspace size");
      out->plan = plan->get();
      out->scratch = scratch;
      out->keep = std::move(owned_);
      out->keep.push_back(std::move(plan));
      return out;
    }
    throw CudnnUnsupported("cuDNN finalized no execution plan for this attention graph (" + last_error + ")");
  }

 private:
  Descriptor& make(cudnnBackendDescriptorType_t type) {
    owned_.push_back(std::make_unique<Descriptor>(type));
    return *owned_.back();
  }
  cudnnHandle_t handle_;
  std::vector<std::unique_ptr<Descriptor>> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_uid_ = 100;  // virtual tensors; the graph's own tensors use the ids below
};

// Tensor ids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDQAccum };

struct Layout {
  Dims q_in, kv_in, kv_in_t, dq_out, dkv_out, rows, sxs, sxs_t, row_stats, heads;  // strides
  Dims bhtd, bgtd, bgdt, bhtt, bht1;  // dims (h: query heads, g: key/value heads)
  explicit Layout(const SdpaShape& s) {
    const int64_t B = s.B, T = s.T, H = s.H, G = s.G, D = s.D, S3 = (H + 2 * G) * D, HD = H * D;
    bhtd = {B, H, T, D}, bgtd = {B, G, T, D}, bgdt = {B, G, D, T}, bhtt = {B, H, T, T}, bht1 = {B, H, T, 1};
    // Q, K, V, dQ, dK, dV in the packed rows; a block's queries, keys and values in their own rows, its
    // gradients dense.
    const int64_t ldq = s.block() ? s.q_ld : S3, ldk = s.block() ? s.kv_ld : S3;
    const int64_t ldgq = s.block() ? HD : S3, ldgk = s.block() ? 2 * G * D : S3;
    q_in = {T * ldq, D, ldq, 1};
    kv_in = {T * ldk, D, ldk, 1};
    kv_in_t = {T * ldk, D, 1, ldk};  // K or V described transposed
    dq_out = {T * ldgq, D, ldgq, 1};
    dkv_out = {T * ldgk, D, ldgk, 1};
    rows = {T * HD, D, HD, 1};     // O and dO in their rows
    sxs = {H * T * T, T * T, T, 1};
    sxs_t = {H * T * T, T * T, 1, T};
    row_stats = {H * T, T, 1, 1};
    heads = {H * T * D, T * D, D, 1};  // a dense [B, H, T, D]
  }
};

// Scores [B, H, T, T] with the causal mask applied: row >= col keeps the score, the rest become `neginf`.
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, const Layout& L, cudnnBackendDescriptor_t scores,
                                     cudnnBackendDescriptor_t neginf) {
  auto row = g.virt(CUDNN_DATA_INT32, L.bhtt, L.sxs), col = g.virt(CUDNN_DATA_INT32, L.bhtt, L.sxs);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, row, nullptr, nullptr, CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, col, nullptr, nullptr, CUDNN_DATA_FLOAT, 3);
  auto keep = g.virt(CUDNN_DATA_BOOLEAN, L.bhtt, L.sxs);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, col, nullptr, CUDNN_DATA_BOOLEAN);
  auto masked = g.virt(CUDNN_DATA_FLOAT, L.bhtt, L.sxs);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, masked, neginf, keep);  // keep ? scores : neginf
  return masked;
}

std::unique_ptr<CudnnAttention::Plan> build_forward(cudnnHandle_t handle, const SdpaShape& s) {
  const Layout L(s);
  const cudnnDataType_t io = cudnn_type(s.dtype), f32 = CUDNN_DATA_FLOAT;
  GraphBuilder g(handle);
  auto q = g.tensor(kQ, io, L.bhtd, L.q_in), kt = g.tensor(kK, io, L.bgdt, L.kv_in_t);
  auto v = g.tensor(kV, io, L.bgtd, L.kv_in);
  auto o = g.tensor(kO, io, L.bhtd, L.rows), stats = g.tensor(kStats, f32, L.bht1, L.row_stats);
  auto scale = g.scalar(kScale);
  auto S = g.virt(f32, L.bhtt, L.sxs);
  g.matmul(q, kt, S);
  auto S1 = g.virt(f32, L.bhtt, L.sxs);
  g.pointwise(CUDNN_POINTWISE_MUL, S, S1, scale);
  auto S2 = s.causal ? causal_mask(g, L, S1, g.scalar(kNegInf)) : S1;  // a full block masks nothing
  auto M = g.virt(f32, L.bht1, L.row_stats);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, S2, M);
  auto S3 = g.virt(f32, L.bhtt, L.sxs);
  g.pointwise(CUDNN_POINTWISE_SUB, S2, S3, M);
  auto E = g.virt(f32, L.bhtt, L.sxs);
  g.pointwise(CUDNN_POINTWISE_EXP, S3, E);
  auto Z = g.virt(f32, L.bht1, L.row_stats);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, E, Z);
  auto logZ = g.virt(f32, L.bht1, L.row_stats);
  g.pointwise(CUDNN_POINTWISE_LOG, Z, logZ);
  g.pointwise(CUDNN_POINTWISE_ADD, M, stats, logZ);
  auto P = g.virt(io, L.bhtt, L.sxs);  // the io dtype: the second product's A operand
  g.pointwise(CUDNN_POINTWISE_DIV, E, P, Z);
  g.matmul(P, v, o);
  return g.finalize(0);
}

int64_t align_up(int64_t n) { return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// Backward's fp32 scratch: dQ_accum [B, H, T, D], then softmax_sum [B, H, T].
int64_t dq_accum_bytes(const SdpaShape& s) { return align_up(s.B * s.H * s.T * s.D * 4); }
int64_t backward_scratch(const SdpaShape& s) { return dq_accum_bytes(s) + align_up(s.B * s.H * s.T * 4); }

std::unique_ptr<CudnnAttention::Plan> build_backward(cudnnHandle_t handle, const SdpaShape& s) {
  const Layout L(s);
  const cudnnDataType_t io = cudnn_type(s.dtype), f32 = CUDNN_DATA_FLOAT;
  GraphBuilder g(handle);
  auto q = g.tensor(kQ, io, L.bhtd, L.q_in), kt = g.tensor(kK, io, L.bgdt, L.kv_in_t);
  auto vt = g.tensor(kV, io, L.bgdt, L.kv_in_t);
  auto o = g.tensor(kO, io, L.bhtd, L.rows), dO = g.tensor(kDO, io, L.bhtd, L.rows);
  auto stats = g.tensor(kStats, f32, L.bht1, L.row_stats);
  auto dq = g.tensor(kDQ, io, L.bhtd, L.dq_out), dk = g.tensor(kDK, io, L.bgtd, L.dkv_out);
  auto dv = g.tensor(kDV, io, L.bgtd, L.dkv_out);
  // dK and dV per query head, summed over each group's heads (grouped-query attention), else directly.
  const auto kv_grad = [&](cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t out) {
    if (s.G == s.H) return g.matmul(a, b, out);
    auto full = g.virt(io, L.bhtd, L.heads);
    g.matmul(a, b, full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };
  auto scale = g.scalar(kScale), one = g.scalar(kOne);
  auto softmax_sum = g.tensor(kSoftmaxSum, f32, L.bht1, L.row_stats);
  auto dq_accum = g.tensor(kDQAccum, f32, L.bhtd, L.heads);

  auto dOO = g.virt(f32, L.bhtd, L.heads);  // Dv = rowsum(dO * O)
  g.pointwise(CUDNN_POINTWISE_MUL, dO, dOO, o);
  auto rs = g.virt(f32, L.bht1, L.row_stats);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dOO, rs);
  g.pointwise(CUDNN_POINTWISE_MUL, rs, softmax_sum, one);

  auto S = g.virt(f32, L.bhtt, L.sxs);  // P from the statistics
  g.matmul(q, kt, S);
  auto S1 = g.virt(f32, L.bhtt, L.sxs);
  g.pointwise(CUDNN_POINTWISE_MUL, S, S1, scale);
  auto S2 = g.virt(f32, L.bhtt, L.sxs);
  g.pointwise(CUDNN_POINTWISE_SUB, S1, S2, stats);
  auto S3 = s.causal ? causal_mask(g, L, S2, g.scalar(kNegInf)) : S2;
  auto P = g.virt(f32, L.bhtt, L.sxs);
  g.pointwise(CUDNN_POINTWISE_EXP, S3, P);

  auto PT = g.virt(io, L.bhtt, L.sxs_t);  // dV = P^T dO
  g.reshape(P, PT);
  kv_grad(PT, dO, dv);

  auto dP = g.virt(f32, L.bhtt, L.sxs);  // dS = (dO V^T - Dv) * P * scale
  g.matmul(dO, vt, dP);
  auto t1 = g.virt(f32, L.bhtt, L.sxs), t2 = g.virt(f32, L.bhtt, L.sxs), dS = g.virt(f32, L.bhtt, L.sxs);
  g.pointwise(CUDNN_POINTWISE_SUB, dP, t1, softmax_sum);
  g.pointwise(CUDNN_POINTWISE_MUL, t1, t2, P);
  g.pointwise(CUDNN_POINTWISE_MUL, t2, dS, scale);

  auto dST = g.virt(io, L.bhtt, L.sxs_t);  // dK = dS^T Q
  g.reshape(dS, dST);
  kv_grad(dST, q, dk);

  auto K = g.virt(f32, L.bgtd, L.kv_in);  // dQ = dS K, through the fp32 accumulator
  g.reshape(kt, K);
  g.matmul(dS, K, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
  return g.finalize(backward_scratch(s));
}

void execute(cudnnHandle_t handle, const CudnnAttention::Plan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  void* engine_workspace = static_cast<char*>(workspace) + plan.scratch;
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data(),
      "variant ids");
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
      pointers.data(), "variant pointers");
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &engine_workspace, "variant workspace");
  check(cudnnBackendFinalize(pack.get()), "finalize variant pack");
  check(cudnnBackendExecute(handle, plan.plan, pack.get()), "execute attention");
  sync_check("attention", "cuDNN's fused attention (waited for under GPT_CUDA_SYNC_CHECKS)", "cuDNN");
}

const char* at(const void* base, int64_t elements, DType t) {
  return static_cast<const char*>(base) + elements * static_cast<int64_t>(dtype_size(t));
}

}  // namespace

CudnnAttention::CudnnAttention(cudaStream_t stream) {
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t st = cudnnCreate(&h);
  if (st != CUDNN_STATUS_SUCCESS)
    throw CudnnUnsupported(std::string("cuDNN could not be initialised: ") + cudnnGetErrorString(st));
  const cudnnStatus_t bound = cudnnSetStream(h, stream);
  if (bound != CUDNN_STATUS_SUCCESS) {
    cudnnDestroy(h);
    throw CudnnUnsupported(std::string("cuDNN could not use the compute stream: ") + cudnnGetErrorString(bound));
  }
  handle_ = h;
}

CudnnAttention::~CudnnAttention() {
  plans_.clear();  // descriptors before the handle they refer to
  if (handle_) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

std::string CudnnAttention::precheck(const SdpaShape& s, int sm, bool backward) {
  if (s.dtype != DType::BF16 && s.dtype != DType::F16)
    return std::string("cuDNN's fused attention takes bf16 or fp16, not ") + dtype_name(s.dtype);
  if (sm < 80) return "cuDNN's fused attention needs compute capability 8.0 or newer, this GPU has " +
                      std::to_string(sm / 10) + "." + std::to_string(sm % 10);
  const int64_t max_d = sm >= 90 && sm < 100 ? 256 : 128;
  if (s.D % 8 != 0 || s.D > max_d)
    return "head dim " + std::to_string(s.D) + " is not a multiple of 8 up to " + std::to_string(max_d);
  if (backward && s.T == 1) return "cuDNN's fused attention backward needs a sequence longer than 1";
  // The graphs are the ones cudnn-frontend builds for cuDNN 9.10 and later (a -inf mask value; dQ_accum
  // needs no zeroing since 9.6). Its constraints for the releases since: 9.10.0 and 9.10.1 have known
  // backward bugs, and up to 9.15 a key length that is not a multiple of 128 needs a padding mask, which
  // is not built here: such calls go unfused (both passes, so a step never mixes the two paths).
  const size_t version = cudnnGetVersion();
  if (version / 10000 != CUDNN_MAJOR || version < 91002)
    return "cuDNN " + std::to_string(version) + " at run time; the fused attention graphs need 9.10.2 or newer 9.x";
  if (version < 91600 && s.T % 128 != 0)
    return "cuDNN " + std::to_string(version) + " at run time needs the sequence length to be a multiple of 128 "
           "(T=" + std::to_string(s.T) + "; 9.16 and newer take any length)";
  return {};
}

CudnnAttention::Plan& CudnnAttention::plan(const SdpaShape& s, bool backward) {
  const auto key = std::make_tuple(s.B, s.T, s.H, s.G, s.D, static_cast<int>(s.dtype), backward, s.q_ld, s.kv_ld, s.causal);
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  if (auto no = rejected_.find(key); no != rejected_.end()) throw CudnnUnsupported(no->second);
  auto handle = static_cast<cudnnHandle_t>(handle_);
  std::unique_ptr<Plan> p;
  try {
    p = backward ? build_backward(handle, s) : build_forward(handle, s);
  } catch (const std::runtime_error& e) {  // a descriptor or plan cuDNN refused: not supported here
    rejected_.emplace(key, e.what());
    throw CudnnUnsupported(e.what());
  }
  return *plans_.emplace(key, std::move(p)).first->second;
}

int64_t CudnnAttention::workspace_bytes(const SdpaShape& s, bool backward) { return plan(s, backward).workspace(); }

void CudnnAttention::run_forward(const SdpaShape& s, const void* q, const void* k, const void* v, void* out,
                                 float* lse, void* workspace) {
  const Plan& p = plan(s, false);
  float scale = 1.f / std::sqrt(static_cast<float>(s.D)), neginf = -std::numeric_limits<float>::infinity();
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs{const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, lse, &scale};
  if (s.causal) uids.push_back(kNegInf), ptrs.push_back(&neginf);  // the mask's value (no mask: no scalar)
  execute(static_cast<cudnnHandle_t>(handle_), p, uids, ptrs, workspace);
}

void CudnnAttention::run_backward(const SdpaShape& s, const void* q, const void* k, const void* v, const void* out,
                                  const void* dout, const float* lse, void* dq, void* dk, void* dv, void* workspace) {
  const Plan& p = plan(s, true);
  float scale = 1.f / std::sqrt(static_cast<float>(s.D)), one = 1.f, neginf = -std::numeric_limits<float>::infinity();
  char* scratch = static_cast<char*>(workspace);
  std::vector<int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kOne, kSoftmaxSum, kDQAccum};
  std::vector<void*> ptrs{const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), const_cast<void*>(out),
                          const_cast<void*>(dout), const_cast<float*>(lse), dq, dk, dv, &scale, &one,
                          scratch + dq_accum_bytes(s), scratch};
  if (s.causal) uids.push_back(kNegInf), ptrs.push_back(&neginf);
  execute(static_cast<cudnnHandle_t>(handle_), p, uids, ptrs, workspace);
}

void CudnnAttention::forward(const SdpaShape& s, const void* qkv, void* out, float* lse, void* workspace) {
  const int64_t k = s.H * s.D, v = (s.H + s.G) * s.D;  // first k and v elements of a row
  run_forward(s, qkv, at(qkv, k, s.dtype), at(qkv, v, s.dtype), out, lse, workspace);
}

void CudnnAttention::backward(const SdpaShape& s, const void* qkv, const void* out, const void* dout, const float* lse,
                              void* dqkv, void* workspace) {
  const int64_t k = s.H * s.D, v = (s.H + s.G) * s.D;
  char* d = static_cast<char*>(dqkv);
  run_backward(s, qkv, at(qkv, k, s.dtype), at(qkv, v, s.dtype), out, dout, lse, dqkv,
               d + k * static_cast<int64_t>(dtype_size(s.dtype)), d + v * static_cast<int64_t>(dtype_size(s.dtype)),
               workspace);
}

void CudnnAttention::block_forward(const SdpaShape& s, const void* q, const void* kv, void* out, float* lse,
                                   void* workspace) {
  const int64_t k = s.kv_ld - 2 * s.G * s.D, v = k + s.G * s.D;  // keys, then values, at the rows' end
  run_forward(s, q, at(kv, k, s.dtype), at(kv, v, s.dtype), out, lse, workspace);
}

void CudnnAttention::block_backward(const SdpaShape& s, const void* q, const void* kv, const void* out,
                                    const void* dout, const float* lse, void* dq, void* dkv, void* workspace) {
  const int64_t k = s.kv_ld - 2 * s.G * s.D, v = k + s.G * s.D;
  char* d = static_cast<char*>(dkv);
  run_backward(s, q, at(kv, k, s.dtype), at(kv, v, s.dtype), out, dout, lse, dq, d,
               d + s.G * s.D * static_cast<int64_t>(dtype_size(s.dtype)), workspace);
}

}  // namespace cuda

CudaBackend::CudnnState::~CudnnState() = default;

// Why cuDNN cannot take this call (checked before any graph is built), or "" when it can be tried.
std::string CudaBackend::cudnn_blocker(const cuda::SdpaShape& s, bool backward,
                                       std::initializer_list<const Tensor*> io) const {
  std::string why = cuda::CudnnAttention::precheck(s, sm_, backward);
  for (const Tensor* t : io) {
    if (why.empty() && t->dtype() != s.dtype)
      why = "every attention tensor must have qkv's dtype " + std::string(dtype_name(s.dtype)) + ", got " +
            ops::describe(*t);
    if (why.empty() && reinterpret_cast<uintptr_t>(t->raw()) % 16 != 0)
      why = "a tensor that does not start on a 16-byte boundary: " + ops::describe(*t);
  }
  return why;
}

// For messages: what makes a grouped-query call different from the multi-head ones cuDNN is known to take.
std::string grouped(const cuda::SdpaShape& s) {
  return s.G == s.H ? "" : " (grouped-query attention, H=" + std::to_string(s.H) + " G=" + std::to_string(s.G) + ")";
}

// After cuDNN could not run an attention op: an error under model.attention_backend=cudnn, else one
// logged warning per backend and the unfused path (false).
bool CudaBackend::cudnn_fallback(const std::string& why, const char* op) {
  if (static_cast<AttentionPath>(attention_path_) == AttentionPath::Cudnn)
    throw std::runtime_error(std::string("CudaBackend::") + op +
                             ": model.attention_backend is cudnn, but cuDNN cannot run it: " + why);
  if (!cudnn_.fallback_logged) {
    spdlog::warn("attention: not on cuDNN's fused attention ({}); using the unfused path (model.attention_backend: "
                 "auto; this warning is given once per backend, for the first such call)",
                 why);
    cudnn_.fallback_logged = true;
  }
  return false;
}

cuda::CudnnAttention& CudaBackend::cudnn_runner() {
  if (!cudnn_.unavailable.empty()) throw cuda::CudnnUnsupported(cudnn_.unavailable);
  if (!cudnn_.attention) {
    try {
      cudnn_.attention = std::make_unique<cuda::CudnnAttention>(stream_);
    } catch (const cuda::CudnnUnsupported& e) {
      cudnn_.unavailable = e.what();  // decided once
      throw;
    }
  }
  return *cudnn_.attention;
}

// fp32 attention runs unfused by design under `auto` (cuDNN's fused attention is 16-bit): no warning.
bool CudaBackend::cudnn_skipped(DType dtype) const {
  const auto path = static_cast<AttentionPath>(attention_path_);
  return path == AttentionPath::Unfused || (path == AttentionPath::Auto && dtype == DType::F32);
}

bool CudaBackend::cudnn_attention_forward(const ops::AttentionDims& d, const Tensor& qkv, Tensor& out, Tensor& lse) {
  if (cudnn_skipped(qkv.dtype())) return false;
  const cuda::SdpaShape s{d.B, d.T, d.H, d.G, d.D, qkv.dtype()};
  std::string why = cudnn_blocker(s, false, {&out});
  if (why.empty()) {
    try {
      cuda::CudnnAttention& a = cudnn_runner();
      Tensor workspace = empty({a.workspace_bytes(s, false) / 4 + 1});
      a.forward(s, qkv.raw(), out.raw(), lse.f32(), workspace.raw());
      return true;
    } catch (const cuda::CudnnUnsupported& e) {
      why = e.what() + grouped(s);
    }
  }
  return cudnn_fallback(why, "attention_forward");
}

bool CudaBackend::cudnn_attention_backward(const ops::AttentionDims& d, const Tensor& dout, const Tensor& qkv,
                                           const Tensor& out, const Tensor& lse, Tensor& dqkv) {
  if (cudnn_skipped(qkv.dtype())) return false;
  const cuda::SdpaShape s{d.B, d.T, d.H, d.G, d.D, qkv.dtype()};
  std::string why = cudnn_blocker(s, true, {&out, &dout, &dqkv});
  if (why.empty()) {
    try {
      cuda::CudnnAttention& a = cudnn_runner();
      Tensor workspace = empty({a.workspace_bytes(s, true) / 4 + 1});
      a.backward(s, qkv.raw(), out.raw(), dout.raw(), lse.f32(), dqkv.raw(), workspace.raw());
      return true;
    } catch (const cuda::CudnnUnsupported& e) {
      why = e.what() + grouped(s);
    }
  }
  return cudnn_fallback(why, "attention_backward");
}

bool CudaBackend::cudnn_block_forward(const Tensor& q, const Tensor& kv, int64_t B, int64_t T, int64_t H, int64_t G,
                                      int64_t D, bool causal, Tensor& out, Tensor& lse) {
  if (cudnn_skipped(q.dtype())) return false;
  const cuda::SdpaShape s{B, T, H, G, D, q.dtype(), q.dim(1), kv.dim(1), causal};
  std::string why = cudnn_blocker(s, false, {&q, &kv, &out});
  if (why.empty() && (s.q_ld % 8 || s.kv_ld % 8))
    why = "block rows of " + std::to_string(s.q_ld) + " and " + std::to_string(s.kv_ld) + " elements (not multiples of 8)";
  if (why.empty()) {
    try {
      cuda::CudnnAttention& a = cudnn_runner();
      Tensor workspace = empty({a.workspace_bytes(s, false) / 4 + 1});
      a.block_forward(s, q.raw(), kv.raw(), out.raw(), lse.f32(), workspace.raw());
      return true;
    } catch (const cuda::CudnnUnsupported& e) {
      why = e.what() + grouped(s);
    }
  }
  return cudnn_fallback(why, "attention_block_forward");
}

bool CudaBackend::cudnn_block_backward(const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out,
                                       const Tensor& lse, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                                       bool causal, Tensor& dq, Tensor& dkv) {
  if (cudnn_skipped(q.dtype())) return false;
  const cuda::SdpaShape s{B, T, H, G, D, q.dtype(), q.dim(1), kv.dim(1), causal};
  std::string why = cudnn_blocker(s, true, {&q, &kv, &out, &dout, &dq, &dkv});
  if (why.empty() && (s.q_ld % 8 || s.kv_ld % 8))
    why = "block rows of " + std::to_string(s.q_ld) + " and " + std::to_string(s.kv_ld) + " elements (not multiples of 8)";
  if (why.empty()) {
    try {
      cuda::CudnnAttention& a = cudnn_runner();
      Tensor workspace = empty({a.workspace_bytes(s, true) / 4 + 1});
      a.block_backward(s, q.raw(), kv.raw(), out.raw(), dout.raw(), lse.f32(), dq.raw(), dkv.raw(), workspace.raw());
      return true;
    } catch (const cuda::CudnnUnsupported& e) {
      why = e.what() + grouped(s);
    }
  }
  return cudnn_fallback(why, "attention_block_backward");
}

#endif  // GPT_HAVE_CUDNN

}  // namespace gpt
