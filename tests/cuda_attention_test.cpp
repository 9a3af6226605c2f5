// The CUDA backend's Llama-style ops (RMSNorm, SwiGLU, rotary embedding) and both attention paths (cuDNN's
// fused attention and the unfused one) against the CPU backend, at odd and real shapes.
#include "tests/cuda_test_util.h"

namespace gpt {

// ---------------------------------------------------------------------------------------------------
// Llama-style ops: RMSNorm, SwiGLU, rotary embedding (widths that take the 16-byte chunk path and widths
// that do not)

void CudaVsCpu::llama_ops(DType dt) {
  const std::string name = dtype_name(dt);
  for (int64_t C : {8, 100, 4096}) {
    for (DType gd : {dt, DType::F32}) {
      const int64_t N = 67;
      const std::string at = " " + name + " C=" + std::to_string(C) + " gamma " + dtype_name(gd);
      Pair x = randn_pair({N, C}, dt, 2.f), gamma = randn_pair({C}, gd);
      Pair y = empty({N, C}, dt), rstd = empty({N});
      cpu->rmsnorm_forward(x.c, gamma.c, y.c, rstd.c, 1e-5f);
      gpu->rmsnorm_forward(x.g, gamma.g, y.g, rstd.g, 1e-5f);
      expect_close(y, tol(dt), "rmsnorm y" + at);
      expect_close(rstd, 1e-5, "rmsnorm rstd" + at);
      Pair dy = randn_pair({N, C}, dt), dx = empty({N, C}, dt), dgamma = randn_pair({C});
      cpu->rmsnorm_backward(dy.c, x.c, gamma.c, rstd.c, dx.c, dgamma.c);
      gpu->rmsnorm_backward(dy.g, x.g, gamma.g, rstd.g, dx.g, dgamma.g);
      expect_close(dx, tol(dt), "rmsnorm dx" + at);
      expect_close(dgamma, tol(dt), "rmsnorm dgamma" + at);
    }
  }
  for (int64_t F : {8, 13, 2816}) {
    const int64_t N = 45;
    const std::string at = " " + name + " F=" + std::to_string(F);
    Pair x = randn_pair({N, 2 * F}, dt, 2.f), y = empty({N, F}, dt);
    cpu->swiglu_forward(x.c, y.c);
    gpu->swiglu_forward(x.g, y.g);
    expect_close(y, tol(dt), "swiglu y" + at);
    Pair dy = randn_pair({N, F}, dt), dx = empty({N, 2 * F}, dt);
    cpu->swiglu_backward(dy.c, x.c, dx.c);
    gpu->swiglu_backward(dy.g, x.g, dx.g);
    expect_close(dx, tol(dt), "swiglu dx" + at);
  }
  // {B, T, H, G, D, rotary_dims, pos0}
  const std::vector<std::array<int64_t, 7>> ropes{
      {2, 37, 4, 2, 12, 6, 0}, {1, 5, 3, 1, 16, 16, 4090}, {2, 300, 8, 2, 128, 128, 0}, {1, 64, 32, 8, 64, 32, 17}};
  for (auto [B, T, H, G, D, R, pos0] : ropes) {
    const std::string at = " " + name + " H=" + std::to_string(H) + " G=" + std::to_string(G) + " D=" +
                           std::to_string(D) + " R=" + std::to_string(R) + " pos0=" + std::to_string(pos0);
    Pair qkv = randn_pair({B * T, (H + 2 * G) * D}, dt);
    cpu->rope_forward(qkv.c, B, T, H, G, D, R, 10000.f, pos0);
    gpu->rope_forward(qkv.g, B, T, H, G, D, R, 10000.f, pos0);
    expect_close(qkv, tol(dt), "rope_forward" + at);
    cpu->rope_backward(qkv.c, B, T, H, G, D, R, 500000.f, pos0);
    gpu->rope_backward(qkv.g, B, T, H, G, D, R, 500000.f, pos0);
    expect_close(qkv, tol(dt), "rope_backward" + at);
  }
  // The shared argument checks, as the CUDA backend.
  Pair qkv = randn_pair({4, 32}, dt);
  try {
    gpu->rope_forward(qkv.g, 1, 4, 2, 1, 8, 7, 10000.f, 0);
    ADD_FAILURE() << "odd rotary_dims accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("CudaBackend::rope_forward: rotary_dims=7 must be even"), std::string::npos)
        << e.what();
  }
}

TEST_P(CudaVsCpuDtype, LlamaOps) { llama_ops(GetParam()); }

TEST_F(CudaVsCpu, LlamaOpsFp16) { llama_ops(DType::F16); }

// ---------------------------------------------------------------------------------------------------
// Attention

// Both CUDA attention paths (model.attention_backend: unfused, and cudnn for 16-bit) against the CPU's fused
// attention: odd shapes, then real ones (head dims 64 and 128, T = 1024 and 2048, B*H up to 192), multi-head
// and grouped-query.
TEST_P(CudaVsCpuDtype, CausalAttentionForwardBackward) { attention_paths(GetParam()); }

TEST_F(CudaVsCpu, CausalAttentionForwardBackwardFp16) { attention_paths(DType::F16); }

// Tolerances, as |gpu - cpu| / (|cpu| + rms) at the worst element. fp32: both sides accumulate in fp32 in
// different orders, over up to T = 2048 keys and r = 4 heads per group (seen: 4e-5 on an H200). 16-bit:
// the GPU rounds P and dS to the activation dtype for the tensor-core products that consume them (as cuDNN
// and FlashAttention do) while the CPU keeps them in fp32, so the error scales with the dtype's epsilon
// (2^-8 bf16, 2^-11 fp16; seen: out 10 eps, dqkv 40 eps at the worst of up to 38M elements).
double attention_tol(DType dt, bool grad) {
  if (dt == DType::F32) return 1e-4;
  const double eps = dt == DType::BF16 ? 1.0 / 256 : 1.0 / 2048;
  return (grad ? 64 : 16) * eps;
}

void CudaVsCpu::attention_paths(DType dt) {
  // {B, T, H, G, D}: multi-head (G = H) and grouped-query (G < H, G = 1 multi-query) shapes.
  const std::vector<std::array<int64_t, 5>> shapes{
      {2, 67, 3, 3, 16},    {1, 5, 2, 2, 8},       {1, 130, 2, 2, 64},  {2, 1024, 12, 12, 64}, {1, 2048, 8, 8, 128},
      {16, 1024, 12, 12, 64}, {2, 67, 4, 2, 16},   {1, 130, 8, 1, 64},  {2, 1024, 12, 4, 64},  {1, 2048, 8, 2, 128}};
  std::vector<std::string> paths{"unfused"};
  if (dt != DType::F32) paths.push_back("cudnn");
  struct Restore {  // the backend is shared by every test: leave it on `auto` however this one ends
    Backend* gpu;
    ~Restore() { gpu->set_attention_backend("auto"); }
  } restore{gpu};
  int on_cudnn = 0;
  for (const std::string& path : paths) {
    gpu->set_attention_backend(path);
    for (auto [B, T, H, G, D] : shapes) {
      const std::string at = " " + path + " " + dtype_name(dt) + " B=" + std::to_string(B) + " T=" + std::to_string(T) +
                             " H=" + std::to_string(H) + " G=" + std::to_string(G) + " D=" + std::to_string(D);
      const int64_t width = (H + 2 * G) * D;
      Pair qkv = randn_pair({B * T, width}, dt);
      Pair out = empty({B * T, H * D}, dt), lse = empty({B, H, T});
      cpu->attention_forward(qkv.c, B, T, H, G, D, out.c, lse.c);
      try {
        gpu->attention_forward(qkv.g, B, T, H, G, D, out.g, lse.g);
      } catch (const std::runtime_error& e) {
        // The cuDNN found at run time may be too old for a shape (a documented refusal, not a wrong result).
        if (path != "cudnn" || std::string(e.what()).find("at run time") == std::string::npos) throw;
        std::printf("[skipped]%s: %s\n", at.c_str(), e.what());
        continue;
      }
      on_cudnn += path == "cudnn";
      expect_close(lse, dt == DType::F32 ? 1e-5 : 1e-2, "lse" + at);
      expect_close(out, attention_tol(dt, false), "out" + at);
      Pair dout = randn_pair({B * T, H * D}, dt), dqkv = empty({B * T, width}, dt);
      cpu->attention_backward(dout.c, qkv.c, out.c, lse.c, B, T, H, G, D, dqkv.c);
      gpu->attention_backward(dout.g, qkv.g, out.g, lse.g, B, T, H, G, D, dqkv.g);
      expect_close(dqkv, attention_tol(dt, true), "dqkv" + at);
      // A key/value cache's decoding step: the last Tq query positions only (cuDNN declines, unfused runs).
      for (int64_t Tq : {int64_t{1}, T / 3 + 1}) {
        Pair o = empty({B * Tq, H * D}, dt), l = empty({B, H, Tq});
        cpu->attention_forward_last(qkv.c, B, T, Tq, H, G, D, o.c, l.c);
        gpu->attention_forward_last(qkv.g, B, T, Tq, H, G, D, o.g, l.g);
        expect_close(l, dt == DType::F32 ? 1e-5 : 1e-2, "lse (last " + std::to_string(Tq) + ")" + at);
        expect_close(o, attention_tol(dt, false), "out (last " + std::to_string(Tq) + ")" + at);
      }
    }
  }
  // The real shapes (T = 1024, 2048) run on cuDNN with any cuDNN the backend accepts at all.
  if (dt != DType::F32) {
    EXPECT_GE(on_cudnn, 5) << "shapes that ran on cuDNN";
  }
}

}  // namespace gpt

namespace gpt {

// Context parallelism's block ops (model/ring_attention.h) against the CPU: a query block against a
// key/value block (causal diagonal and full), its backward adding into fp32 accumulators that already hold
// values, the log-sum-exp merge, and the column copies with a dtype change.
void CudaVsCpu::block_attention(DType dt) {
  // {B, T, H, G, D}
  const std::vector<std::array<int64_t, 5>> shapes{{2, 37, 4, 2, 16}, {1, 128, 8, 8, 64}, {2, 512, 8, 2, 128}};
  for (auto [B, T, H, G, D] : shapes)
    for (bool causal : {true, false}) {
      const std::string at = std::string(" ") + dtype_name(dt) + (causal ? " causal" : " full") + " B=" +
                             std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
                             " G=" + std::to_string(G) + " D=" + std::to_string(D);
      Pair q = randn_pair({B * T, (H + 2 * G) * D}, dt), kv = randn_pair({B * T, 2 * G * D}, dt);
      Pair out = empty({B * T, H * D}), lse = empty({B, H, T});
      cpu->attention_block_forward(q.c, kv.c, B, T, T, H, G, D, causal, out.c, lse.c);
      gpu->attention_block_forward(q.g, kv.g, B, T, T, H, G, D, causal, out.g, lse.g);
      expect_close(out, attention_tol(dt, false), "attention_block_forward out" + at);
      expect_close(lse, 1e-4, "attention_block_forward lse" + at);
      Pair dout = randn_pair({B * T, H * D}, dt), dq = randn_pair({B * T, H * D}), dkv = randn_pair({B * T, 2 * G * D});
      cpu->attention_block_backward(dout.c, q.c, kv.c, out.c, lse.c, B, T, T, H, G, D, causal, dq.c, dkv.c);
      gpu->attention_block_backward(dout.g, q.g, kv.g, out.g, lse.g, B, T, T, H, G, D, causal, dq.g, dkv.g);
      expect_close(dq, attention_tol(dt, true), "attention_block_backward dq" + at);
      expect_close(dkv, attention_tol(dt, true), "attention_block_backward dkv" + at);
      Pair out_b = randn_pair({B * T, H * D}), lse_b = randn_pair({B, H, T}, DType::F32, 3.f);
      cpu->attention_merge(out.c, lse.c, out_b.c, lse_b.c, B, T, H, D);
      gpu->attention_merge(out.g, lse.g, out_b.g, lse_b.g, B, T, H, D);
      expect_close(out, attention_tol(dt, false), "attention_merge out" + at);
      expect_close(lse, 1e-5, "attention_merge lse" + at);
      Pair cols = empty({B * T, 2 * G * D}, DType::F32);
      cpu->copy_columns(q.c, H * D, cols.c, 0, 2 * G * D);
      gpu->copy_columns(q.g, H * D, cols.g, 0, 2 * G * D);
      expect_close(cols, 0, "copy_columns" + at);
    }
}

TEST_P(CudaVsCpuDtype, BlockAttentionForContextParallelism) { block_attention(GetParam()); }

}  // namespace gpt
