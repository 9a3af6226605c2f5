// oneDNN matmul (see cpu_matmul.h): the primitive cache and the execution of one product. Strided memory
// descriptors express transposes and leading dimensions without copies; the bias is a matmul input and
// beta a sum post-op, so neither costs a pass of its own.
#include "model/ops/cpu/cpu_matmul.h"

#include <dnnl.hpp>
#include <fmt/format.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "model/ops/cpu/cpu_tensor_access.h"
#include "model/ops/half.h"

namespace gpt::cpu {

namespace {

using dnnl::memory;

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

memory::data_type dnnl_type(MatType t) { return t == MatType::BF16 ? memory::data_type::bf16 : memory::data_type::f32; }

using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, float, float, bool>;

Key key_of(const MatmulShape& s) {
  return {s.trans_a, s.trans_b, s.M, s.N, s.K, s.lda, s.ldb, s.ldc, static_cast<int>(s.a), static_cast<int>(s.b),
          static_cast<int>(s.c), s.alpha, s.beta, s.bias};
}

struct Prepared {
  dnnl::matmul primitive;
  memory::desc a, b, c, bias;
};

// Builds the primitive for `s`; throws dnnl::error when this library has no implementation for it.
std::shared_ptr<Prepared> prepare(const MatmulShape& s) {
  auto p = std::make_shared<Prepared>();
  const memory::dims a_strides = s.trans_a ? memory::dims{1, s.lda} : memory::dims{s.lda, 1};
  const memory::dims b_strides = s.trans_b ? memory::dims{1, s.ldb} : memory::dims{s.ldb, 1};
  p->a = memory::desc({s.M, s.K}, dnnl_type(s.a), a_strides);
  p->b = memory::desc({s.K, s.N}, dnnl_type(s.b), b_strides);
  p->c = memory::desc({s.M, s.N}, dnnl_type(s.c), memory::dims{s.ldc, 1});
  if (s.bias) p->bias = memory::desc({1, s.N}, memory::data_type::f32, memory::dims{s.N, 1});
  dnnl::primitive_attr attr;
  if (s.alpha != 1.f) attr.set_output_scales(0, {s.alpha});
  if (s.beta != 0.f) {
    dnnl::post_ops ops;
    ops.append_sum(s.beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc d = s.bias ? dnnl::matmul::desc(p->a, p->b, p->bias, p->c) : dnnl::matmul::desc(p->a, p->b, p->c);
  p->primitive = dnnl::matmul(dnnl::matmul::primitive_desc(d, attr, engine()));
  return p;
}

std::mutex g_cache_mu;
std::map<Key, std::shared_ptr<Prepared>> g_cache;  // guarded by g_cache_mu
std::atomic<int64_t> g_created{0};

// The cached primitive for `s`, or nullptr when this library cannot run a bf16 product of this shape on
// this CPU (decided once per shape: a failed creation is cached too, so the fallback costs no retry).
std::shared_ptr<Prepared> cached(const MatmulShape& s) {
  const Key k = key_of(s);
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    auto it = g_cache.find(k);
    if (it != g_cache.end()) return it->second;
  }
  std::shared_ptr<Prepared> p;
  try {
    p = prepare(s);  // outside the lock: creation can take a while
  } catch (const dnnl::error& e) {
    if (s.a == MatType::F32 && s.b == MatType::F32 && s.c == MatType::F32)
      throw std::runtime_error(fmt::format("oneDNN matmul {}x{}x{}: {}", s.M, s.N, s.K, e.what()));
  }
  ++g_created;
  std::lock_guard<std::mutex> lock(g_cache_mu);
  return g_cache.emplace(k, p).first->second;
}

// This thread's memory objects for one cached primitive's operands, re-pointed at each call's data: making
// fresh ones (and an argument map) per call cost about as much as a 64 x 64 x 64 product.
struct Operands {
  memory a, b, c, bias;
};

void execute(const Prepared& p, const void* A, const void* B, void* C, const float* bias) {
  thread_local dnnl::stream stream(engine());
  thread_local std::map<const Prepared*, Operands> operands;  // primitives live as long as the cache
  auto it = operands.find(&p);
  if (it == operands.end()) {
    Operands o{memory(p.a, engine(), DNNL_MEMORY_NONE), memory(p.b, engine(), DNNL_MEMORY_NONE),
               memory(p.c, engine(), DNNL_MEMORY_NONE), {}};
    if (p.bias) o.bias = memory(p.bias, engine(), DNNL_MEMORY_NONE);
    it = operands.emplace(&p, std::move(o)).first;
  }
  Operands& o = it->second;
  o.a.set_data_handle(const_cast<void*>(A));
  o.b.set_data_handle(const_cast<void*>(B));
  o.c.set_data_handle(C);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, o.a.get()}, {DNNL_ARG_WEIGHTS, o.b.get()}, {DNNL_ARG_DST, o.c.get()}};
  int nargs = 3;
  if (bias) {
    o.bias.set_data_handle(const_cast<float*>(bias));
    args[nargs++] = {DNNL_ARG_BIAS, o.bias.get()};
  }
  dnnl::error::wrap_c_api(dnnl_primitive_execute(p.primitive.get(), stream.get(), nargs, args), "matmul execute");
  stream.wait();
}

DType dtype_of(MatType t) { return t == MatType::BF16 ? DType::BF16 : DType::F32; }
size_t bytes_of(MatType t) { return t == MatType::BF16 ? 2 : 4; }

// fp32 copy of a stored [rows, cols] operand with leading dimension ld (same layout), in a pooled buffer.
std::unique_ptr<ScratchBuffer> widen(const void* data, MatType t, int64_t rows, int64_t cols, int64_t ld) {
  auto out = std::make_unique<ScratchBuffer>(static_cast<size_t>(rows * ld) * sizeof(float));
  const char* src = static_cast<const char*>(data);
  if (ld == cols) {
    to_f32(src, dtype_of(t), out->as<float>(), rows * cols);
  } else {
    for (int64_t r = 0; r < rows; ++r) to_f32(src + r * ld * bytes_of(t), dtype_of(t), out->as<float>() + r * ld, cols);
  }
  return out;
}

float load(const void* C, MatType t, int64_t i) {
  return t == MatType::BF16 ? bf16_to_fp32(static_cast<const uint16_t*>(C)[i]) : static_cast<const float*>(C)[i];
}

void store(void* C, MatType t, int64_t i, float v) {
  if (t == MatType::BF16) static_cast<uint16_t*>(C)[i] = fp32_to_bf16(v);
  else static_cast<float*>(C)[i] = v;
}

}  // namespace

void matmul(const MatmulShape& s, const void* A, const void* B, void* C, const float* bias) {
  if (s.M <= 0 || s.N <= 0) return;
  if (s.K <= 0) {  // an empty sum: oneDNN wants K >= 1
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t j = 0; j < s.N; ++j) {
        const int64_t at = i * s.ldc + j;
        store(C, s.c, at, (s.beta == 0.f ? 0.f : s.beta * load(C, s.c, at)) + (bias ? bias[j] : 0.f));
      }
    return;
  }
  if (s.bias && s.alpha != 1.f) throw std::invalid_argument("cpu::matmul: alpha with a bias is not supported");
  if (s.bias != (bias != nullptr)) throw std::invalid_argument("cpu::matmul: bias pointer and shape disagree");
  const std::shared_ptr<Prepared> p = cached(s);
  if (!p) {
    // bf16 that this CPU or library cannot run: the same product on fp32 copies, rounded into a bf16 C.
    MatmulShape f = s;
    f.a = f.b = f.c = MatType::F32;
    const auto a = widen(A, s.a, s.trans_a ? s.K : s.M, s.trans_a ? s.M : s.K, s.lda);
    const auto b = widen(B, s.b, s.trans_b ? s.N : s.K, s.trans_b ? s.K : s.N, s.ldb);
    if (s.c == MatType::F32) return matmul(f, a->as<float>(), b->as<float>(), C, bias);
    const auto c = widen(C, s.c, s.M, s.N, s.ldc);
    matmul(f, a->as<float>(), b->as<float>(), c->as<float>(), bias);
    for (int64_t i = 0; i < s.M; ++i)
      from_f32(c->as<float>() + i * s.ldc, static_cast<uint16_t*>(C) + i * s.ldc, DType::BF16, s.N);
    return;
  }
  execute(*p, A, B, C, bias);
}

std::string matmul_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

// Without bf16 dot products (AVX512-BF16, AMX) bf16 products are emulated (AVX-512 without BF16: 148
// against 400 GFLOP/s fp32 on 2 cores) or, on AVX2, run on fp32 copies. Running them as fp32 products on
// converted operands was tried on AVX-512 without BF16 and was no faster than the emulation.
bool matmul_has_native_bf16() {
  static const bool yes = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  }();
  return yes;
}

int64_t matmul_primitives_created() { return g_created.load(); }

std::string matmul_library_version() {
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
}

}  // namespace gpt::cpu
