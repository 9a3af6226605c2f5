// CudaBackend: the Backend interface on one NVIDIA GPU. Every op is enqueued on one CUDA stream (the
// compute stream) and returns without waiting, except the ones that hand a value to the host (download,
// download_f64, sum_squares, synchronize). Matrix products go to cuBLAS with fp32 accumulation for F32, BF16 and F16
// tensors (plain fp32 for F32 unless TF32 is allowed); the rest are small kernels, one per op, each with a
// comment giving what it computes and its shapes. Memory comes from a caching allocator
// (cuda_allocator.h), so a training step that repeats the previous step's shapes never calls cudaMalloc.
// The implementation is split by concern: cuda_backend.cpp (device, stream, handles, host transfers,
// device-side error reports), cuda_memory.cu (fill, dtype casts), cuda_linear.cu, cuda_gemm.cpp (cuBLAS)
// and cublaslt_matmul.cpp (cuBLASLt with fused bias epilogues, for the linear layers), cuda_reduce.cu (column sums, sum of squares), cuda_layernorm.cu, cuda_llama.cu (RMSNorm, SwiGLU,
// rotary embedding), cuda_elementwise.cu (GELU,
// residual add, scale), cuda_adamw.cu (AdamW, flat AdamW, per-segment sums of squares), cuda_embedding.cu,
// cuda_attention.cu, cuda_cross_entropy.cu and cuda_loss.cu (the loss accumulation).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "model/ops/backend.h"
#include "model/ops/cuda/cublaslt_matmul.h"
#include "model/ops/cuda/cudnn_attention.h"
#include "model/ops/op_checks.h"
#include "model/ops/staging_ring.h"

namespace gpt {

// A problem a kernel found in its inputs (an out-of-range target, a negative token id). Kernels cannot
// throw, so they record the first problem in a small device buffer and the host raises it at its next
// synchronisation point (download, synchronize).
struct DeviceErrorReport {
  int code;     // 0: none; see cuda_backend.cpp for the others
  int op;       // which op reported it (index into the op names in cuda_backend.cpp)
  long long where;  // row or position
  long long value;  // the offending value
  long long limit;  // the bound it broke (vocabulary size)
};

enum class CudaOp : int { CeSumExp = 1, CeBackward = 2, EmbeddingForward = 3, EmbeddingBackward = 4, CeRowStats = 5 };
enum class DeviceError : int { None = 0, TargetOutOfVocabulary = 1, NegativeTokenId = 2 };

namespace cuda {
// Checks run while the host waits for the device (CudaBackend::wait_checks).
class WaitChecks {
 public:
  void add(const void* owner, std::function<void()> check);
  void remove(const void* owner);
  bool empty() const;
  void run() const;  // each check in turn; one may throw

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<const void*, std::function<void()>>> checks_;
};

// Waits for `stream` by polling: while it is busy, runs `check` (which may throw to end the wait) and
// sleeps, 20 us at a time for the first 2 ms, then 500 us. Returns cudaSuccess once the stream is idle, or
// the first error other than "not ready" that querying it gave.
cudaError_t poll_until_idle(cudaStream_t stream, const std::function<void()>& check);
}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  // Selects device `device_index`, creates the compute stream and the cuBLAS handle. `allow_tf32` lets
  // F32 products use TF32 tensor cores (faster, about 1e-3 relative error instead of 1e-6).
  CudaBackend(int device_index, bool allow_tf32);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::CUDA; }

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
  void synchronize() override;
  void* alloc_host(size_t bytes) override;  // page-locked (cudaMallocHost)
  void free_host(void* p) override;

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) override;
  void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor& dw,
                       Tensor* db) override;
  void linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx) override;
  // cuBLASLt's GELU_AUX(_BIAS) and DGELU epilogues; the composed default where cuBLASLt declines.
  void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& pre, Tensor& act) override;
  void linear_dgelu_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& pre, Tensor& dpre,
                             Tensor& dw, Tensor* db) override;

  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& mean,
                         Tensor& rstd, float eps) override;
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) override;
  void add_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta, Tensor& h,
                             Tensor& y, Tensor& mean, Tensor& rstd, float eps) override;
  void layernorm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dres, Tensor& dx, Tensor& dgamma, Tensor& dbeta) override;

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
  // model.attention_backend: auto (cuDNN's fused attention where it takes the shape, else the unfused
  // path, with one logged warning), cudnn (an error instead of the fallback), unfused.
  void set_attention_backend(const std::string& name) override;

  void ce_row_max(const Tensor& logits, int64_t vocab_start, int64_t vocab_size, Tensor& row_max) override;
  void ce_sum_exp(const Tensor& logits, const Tensor& row_max, const Tensor& targets, int64_t vocab_start,
                  int64_t vocab_size, Tensor& sum_exp, Tensor& target_logit) override;
  void ce_row_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                    Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) override;
  void ce_rescale_sum_exp(const Tensor& local_max, const Tensor& global_max, Tensor& sum_exp) override;
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

  // ---- for the NCCL communicator, tests and the rest of the backend ----
  cudaStream_t stream() const { return stream_; }
  int device_index() const { return device_; }
  // cudaMalloc calls made by the caching allocator so far (a repeated training step adds none).
  int64_t device_allocations() const;
  // Bytes held from the driver: in use plus cached for reuse.
  size_t memory_reserved() const;
  // Waits for the compute stream, then raises (and clears) a problem a kernel recorded.
  void raise_device_errors();
  // Checks run while the host waits for the compute stream, e.g. a communicator's asynchronous NCCL errors:
  // a check that throws ends the wait with its error instead of a wait that never ends. One per owner.
  // Shared, so that an owner destroyed after the backend can still remove its check.
  std::shared_ptr<cuda::WaitChecks> wait_checks() const { return wait_checks_; }

  // Row-major products with fp32 accumulation, see cuda_gemm.cpp:
  // C[batch][m, n] = alpha * op(A)[m, k] . op(B)[k, n] + beta * C, A and B of dtype ab, C of dtype c.
  struct GemmArgs {
    bool trans_a = false, trans_b = false;
    int64_t m = 0, n = 0, k = 0;
    const void* a = nullptr;
    int64_t lda = 0, stride_a = 0;
    const void* b = nullptr;
    int64_t ldb = 0, stride_b = 0;
    void* c = nullptr;
    int64_t ldc = 0, stride_c = 0;
    DType ab = DType::F32, c_dtype = DType::F32;
    float alpha = 1.f, beta = 0.f;
    int64_t batch = 1;
  };
  void gemm(const GemmArgs& g, const char* op);
  // The same dense product (batch 1) on cuBLASLt, with `epilogue` fused (cublaslt_matmul.h): Bias adds
  // bias[n] to every row of C, GradA writes bias[m] = the row sums of op(A). False, with nothing enqueued,
  // when cuBLASLt takes no such problem; the caller then runs gemm() and the bias step on its own.
  bool lt_gemm(const GemmArgs& g, cuda::LtEpilogue epilogue, void* bias, DType bias_dtype, const char* op,
               void* aux = nullptr);
  // LayerNorm's kernels with the residual add fused in (r, h) or out (dres), each optional.
  void layernorm_forward_impl(const Tensor& x, const Tensor* r, Tensor* h, const Tensor& gamma, const Tensor& beta,
                              Tensor& y, Tensor& mean, Tensor& rstd, float eps, const char* op);
  void layernorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                               const Tensor& rstd, const Tensor* dres, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                               const char* op);
  // Products cuBLASLt ran so far, as distinct cached problems (for tests).
  size_t lt_plans() const;
  // Products that ran with a GELU epilogue (GELU_AUX(_BIAS) or DGELU) so far (for tests).
  size_t gelu_epilogue_products() const { return gelu_epilogue_products_; }
  // `t` itself when it already has `dtype`, else a converted copy (enqueued on the stream).
  Tensor as_dtype(const Tensor& t, DType dtype);
  // Device pointer to the error report kernels write into.
  DeviceErrorReport* device_error_report() const { return error_device_; }
  // A device copy of `bytes` bytes of constant host data (a flat op's segment table), made on first use
  // and returned again whenever the same bytes are asked for, so a training step copies no tables.
  const void* cached_device_copy(const void* host, size_t bytes, const char* op);

 private:
  int device_ = 0;
  bool allow_tf32_ = false;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cuda::LtMatmulCache* lt_ = nullptr;  // the device's, shared with every backend there
  size_t gelu_epilogue_products_ = 0;
  std::shared_ptr<cuda::WaitChecks> wait_checks_ = std::make_shared<cuda::WaitChecks>();
  // cudaStreamSynchronize, or with wait checks registered a polling wait that runs them. Called before any
  // device-to-host copy into pageable memory, which would itself block without polling.
  void wait_for_stream(const char* op);
  DeviceErrorReport* error_device_ = nullptr;
  int sm_ = 0;  // compute capability, e.g. 90
  std::map<std::string, Tensor> device_copies_;
  // Token and target uploads go through page-locked staging buffers, so cudaMemcpyAsync returns at once
  // instead of staging pageable memory itself; each slot's event marks its copy done before reuse.
  static constexpr int kStagingSlots = 64;  // a step's uploads, normally: 32 microbatches
  // Uploads come from the training thread only (the ring is not locked).
  std::vector<cudaEvent_t> staging_events_;
  std::unique_ptr<StagingRing> staging_;
  void wait_for_staging_slot(int slot);  // polls the slot's event, running the wait checks
  // y[r, o] = b[o] for a [rows, out] y (the linear layer's bias on the cublasGemmEx path).
  void broadcast_bias(const Tensor& b, Tensor& y, int64_t rows, int64_t out, const char* op);  // cached_device_copy: host bytes -> device copy
  // dx = dy . w for linear_backward and linear_backward_input, dy already in the product dtype `ab`.
  void input_gradient(const ops::LinearDims& d, const Tensor& dy, const Tensor& w, DType ab, Tensor& dx,
                      const char* op);
  // The attention path (cudnn_attention.cpp): an AttentionPath there, and cuDNN's state.
  int attention_path_ = 0;
  struct CudnnState {
    ~CudnnState();
    std::unique_ptr<cuda::CudnnAttention> attention;  // created on first use
    std::string unavailable;                          // why cuDNN could not be initialised, once it failed
    bool fallback_logged = false;
  } cudnn_;
  bool cudnn_attention_forward(const ops::AttentionDims& d, const Tensor& qkv, Tensor& out, Tensor& lse);
  // Context parallelism's blocks on cuDNN (T queries against T keys): out, dq and dkv in q's dtype (the
  // caller converts and accumulates); false with nothing enqueued when the call goes unfused.
  bool cudnn_block_forward(const Tensor& q, const Tensor& kv, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                           bool causal, Tensor& out, Tensor& lse);
  bool cudnn_block_backward(const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out, const Tensor& lse,
                            int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, bool causal, Tensor& dq,
                            Tensor& dkv);
  bool cudnn_attention_backward(const ops::AttentionDims& d, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                const Tensor& lse, Tensor& dqkv);
  std::string cudnn_blocker(const cuda::SdpaShape& s, bool backward, std::initializer_list<const Tensor*> io) const;
  bool cudnn_fallback(const std::string& why, const char* op);
  cuda::CudnnAttention& cudnn_runner();
  bool cudnn_skipped(DType dtype) const;  // throws cuda::CudnnUnsupported when cuDNN cannot start
};

}  // namespace gpt
