// Tests of the CPU backend's storage side: bf16/fp16 conversion (round-to-nearest-even, special values,
// exhaustive round trips), upload/download/copy across dtypes, 16-bit inputs to the kernels, the fast exp,
// the memory counters and the backend factory.
#include "tests/ops_test_util.h"

namespace gpt {
namespace {

// Its own suite name: a fixture from another translation unit cannot share the OpsTest suite.
class OpsStorageTest : public OpsTest {};

// ---------------------------------------------------------------------------------------------------
// 16-bit conversion

// Nearest value of a 16-bit format to x, ties to the even bit pattern, found by search over every finite
// pattern (an independent reference for the bit tricks in half.h). `overflow` is the threshold at and
// past which the format rounds to infinity.
uint16_t reference_round(float x, const std::vector<std::pair<double, uint16_t>>& sorted_positive, double overflow,
                         uint16_t inf_bits) {
  const double ax = std::fabs(double(x));
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (ax >= overflow) return sign | inf_bits;
  auto hi = std::lower_bound(sorted_positive.begin(), sorted_positive.end(), std::make_pair(ax, uint16_t(0)));
  if (hi == sorted_positive.end()) return sign | sorted_positive.back().second;  // below the overflow tie
  if (hi->first == ax) return sign | hi->second;
  auto lo = hi - 1;
  const double dlo = ax - lo->first, dhi = hi->first - ax;
  if (dlo < dhi) return sign | lo->second;
  if (dhi < dlo) return sign | hi->second;
  return sign | ((lo->second & 1) ? hi->second : lo->second);
}

std::vector<std::pair<double, uint16_t>> finite_positive(float (*to_f32)(uint16_t), uint16_t inf_bits) {
  std::vector<std::pair<double, uint16_t>> v;
  for (uint32_t b = 0; b < inf_bits; ++b) v.push_back({double(to_f32(uint16_t(b))), uint16_t(b)});
  // The largest finite value's upper neighbour (infinity) is handled by the overflow threshold.
  std::sort(v.begin(), v.end());
  return v;
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1p-8f), 0x3F80);         // tie -> even (down)
  EXPECT_EQ(fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);     // tie -> even (up)
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // just past the tie
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest bf16
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::bit_cast<float>(0x7F800001u)))));  // payload in low bits
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);

  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_fp16(65504.f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65519.f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65520.f), 0x7C00);  // tie between 65504 (odd) and 65536 -> Inf
  EXPECT_EQ(fp32_to_fp16(1e6f), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-1e6f), 0xFC00);
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);      // tie -> even (down)
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie -> even (up)
  EXPECT_EQ(fp32_to_fp16(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);             // tie with zero -> zero
  EXPECT_EQ(fp32_to_fp16(3 * 0x1p-25f), 0x0002);         // 1.5 ulp tie -> even
  EXPECT_EQ(fp32_to_fp16(0x1p-14f), 0x0400);             // smallest normal
  EXPECT_EQ(fp32_to_fp16(0x1p-14f - 0x1p-25f), 0x0400);  // subnormal rounding carries into the normal range
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(std::bit_cast<float>(0xFF800001u)))));
  EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.f);
  EXPECT_EQ(fp16_to_fp32(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_fp32(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(fp16_to_fp32(0x8000)));
}

TEST(HalfTest, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = uint16_t(b);
    const float f16 = fp16_to_fp32(h), fb = bf16_to_fp32(h);
    if (std::isnan(f16)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f16))));
    } else {
      ASSERT_EQ(fp32_to_fp16(f16), h) << std::hex << b;
    }
    if (std::isnan(fb)) {
      EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(fb))));
    } else {
      ASSERT_EQ(fp32_to_bf16(fb), h) << std::hex << b;
    }
  }
}

TEST(HalfTest, RandomFloatsRoundToNearestEven) {
  const auto f16 = finite_positive(&fp16_to_fp32, 0x7C00);
  const auto b16 = finite_positive(&bf16_to_fp32, 0x7F80);
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    // Random bit patterns cover every exponent; half of them are pulled into fp16's range.
    uint32_t u = bits(rng);
    if (i % 2) u = (u & 0x807FFFFFu) | ((100u + (u >> 23) % 45u) << 23);
    const float x = std::bit_cast<float>(u);
    if (std::isnan(x)) continue;
    ASSERT_EQ(fp32_to_fp16(x), reference_round(x, f16, 65520.0, 0x7C00)) << x;
    // bf16's overflow threshold: half-way between the largest finite bf16 (0x1.FEp127) and 2^128.
    ASSERT_EQ(fp32_to_bf16(x), reference_round(x, b16, 0x1.FFp127, 0x7F80)) << x;
#ifdef __F16C__
    ASSERT_EQ(fp32_to_fp16(x), _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)) << x;
#endif
  }
}

TEST_F(OpsStorageTest, UploadDownloadCopyConvert) {
  const int64_t n = 40013;  // past the threaded-conversion threshold, not a multiple of the vector width
  Vec x = randn(n, 100.f);
  x[0] = 1.0f, x[1] = 65504.f, x[2] = std::numeric_limits<float>::infinity(), x[3] = 1e6f, x[4] = 1e-6f;
  x[5] = std::numeric_limits<float>::quiet_NaN();
  Tensor f32 = make({n}, x), bf = be->empty({n}, DType::BF16), hf = be->empty({n}, DType::F16);
  be->upload(x.data(), bf);
  be->upload(x.data(), hf);
  const Vec xb = host(bf), xh = host(hf);
  for (int64_t i = 0; i < n; ++i) {
    const float wb = bf16_to_fp32(fp32_to_bf16(x[i])), wh = fp16_to_fp32(fp32_to_fp16(x[i]));
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(xb[i]) && std::isnan(xh[i]));
      continue;
    }
    ASSERT_EQ(xb[i], wb) << i;
    ASSERT_EQ(xh[i], wh) << i;
  }
  EXPECT_EQ(xh[1], 65504.f);
  EXPECT_TRUE(std::isinf(xh[3]));
  // copy between every pair of float dtypes agrees with the scalar conversions.
  Tensor bf2 = be->empty({n}, DType::BF16), hf2 = be->empty({n}, DType::F16), f32b = be->empty({n});
  be->copy(f32, bf2);
  be->copy(f32, hf2);
  EXPECT_EQ(std::memcmp(bf2.raw(), bf.raw(), bf.bytes()), 0);
  EXPECT_EQ(std::memcmp(hf2.raw(), hf.raw(), hf.bytes()), 0);
  be->copy(hf, f32b);
  const Vec back = host(f32b);
  for (int64_t i = 6; i < n; ++i) ASSERT_EQ(back[i], xh[i]);
  Tensor hb = be->empty({n}, DType::BF16);
  be->copy(hf, hb);  // fp16 -> bf16 rounds once from the exact fp32 value
  const Vec hbv = host(hb);
  for (int64_t i = 6; i < n; ++i) ASSERT_EQ(hbv[i], bf16_to_fp32(fp32_to_bf16(xh[i])));
  // ints only copy to ints
  Tensor ids = be->zeros({n}, DType::I32), ids2 = be->empty({n}, DType::I32);
  be->copy(ids, ids2);
  EXPECT_THROW(be->copy(ids, f32), std::runtime_error);
  EXPECT_THROW(be->upload(x.data(), ids), std::runtime_error);
  Tensor wrong = be->empty({n + 1});
  EXPECT_THROW(be->copy(f32, wrong), std::runtime_error);
  // fill with each dtype
  be->fill(hf, 0.5f);
  for (float v : host(hf)) ASSERT_EQ(v, 0.5f);
  be->fill(ids, 3.f);
  std::vector<int32_t> iv(n);
  be->download_i32(ids, iv.data());
  for (int32_t v : iv) ASSERT_EQ(v, 3);
  EXPECT_THROW(be->fill(ids, 0.5f), std::runtime_error);
}

// ---------------------------------------------------------------------------------------------------
// 16-bit inputs to the kernels: computed in fp32 from the exact 16-bit values, rounded once on output.

TEST_F(OpsStorageTest, KernelsAcceptSixteenBitTensors) {
  for (DType dt : {DType::BF16, DType::F16}) {
    auto round = [&](Vec v) {
      for (auto& x : v) x = dt == DType::BF16 ? bf16_to_fp32(fp32_to_bf16(x)) : fp16_to_fp32(fp32_to_fp16(x));
      return v;
    };
    const int64_t N = 6, in = 8, out = 5;
    const Vec x = round(randn(N * in)), w = round(randn(out * in)), b = round(randn(out));
    Tensor tx = make({N, in}, x, dt), tw = make({out, in}, w, dt), tb = make({out}, b, dt);
    Tensor y16 = be->empty({N, out}, dt), y32 = be->empty({N, out});
    be->linear_forward(tx, tw, &tb, y16);
    be->linear_forward(tx, tw, &tb, y32);  // mixed: 16-bit inputs, fp32 output (the LM head's logits)
    Tensor fx = make({N, in}, x), fw = make({out, in}, w), fb = make({out}, b), yref = be->empty({N, out});
    be->linear_forward(fx, fw, &fb, yref);
    EXPECT_EQ(host(y32), host(yref));
    EXPECT_EQ(host(y16), round(host(yref)));
    // The residual accumulate into a 16-bit gradient.
    Tensor acc = make({N, out}, round(Vec(N * out, 1.f)), dt);
    be->accumulate(y32, acc);
    Vec want = host(yref);
    for (auto& v : want) v += 1.f;
    EXPECT_EQ(host(acc), round(want));
    // GELU on a 16-bit activation.
    Tensor g16 = be->empty({N, in}, dt), g32 = be->empty({N, in});
    be->gelu_forward(tx, g16);
    be->gelu_forward(fx, g32);
    EXPECT_EQ(host(g16), round(host(g32)));
    // Embedding lookup from a 16-bit table into fp32 and 16-bit outputs.
    Tensor ids = make_ids({3}, {2, 0, 7});
    Tensor e16 = be->empty({3, in}, dt), e32 = be->empty({3, in});
    be->embedding_forward(ids, tx, 0, e16);
    be->embedding_forward(ids, tx, 0, e32);
    for (int r = 0; r < 3; ++r) {
      const int id = r == 0 ? 2 : r == 1 ? 0 : -1;
      for (int64_t c = 0; c < in; ++c) {
        const float want_v = id < 0 ? 0.f : x[id * in + c];
        EXPECT_EQ(host(e32)[r * in + c], want_v);
        EXPECT_EQ(host(e16)[r * in + c], want_v);
      }
    }
  }
}

// The row and element-wise kernels read and write 16-bit activations piece by piece (cpu_tensor_access.h's
// Windows): the same values as the fp32 kernels on the same inputs, rounded once, and no fp32 copy of a
// whole activation, which the conversion buffers' high-water mark shows.
TEST_F(OpsStorageTest, SixteenBitKernelsMakeNoWholeTensorCopy) {
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto round = [&](Vec v) {
      for (auto& x : v) x = dt == DType::BF16 ? bf16_to_fp32(fp32_to_bf16(x)) : fp16_to_fp32(fp32_to_fp16(x));
      return v;
    };
    const int64_t B = 4, T = 128, C = 1024, N = B * T;  // activations of 512 Ki elements (2 MiB in fp32)
    const size_t whole = size_t(N * C) * sizeof(float);
    const Vec x = round(randn(N * C)), dyv = round(randn(N * C)), gv = round(randn(C)), bv = round(randn(C));
    Tensor x16 = make({N, C}, x, dt), dy16 = make({N, C}, dyv, dt);
    Tensor x32 = make({N, C}, x), dy32 = make({N, C}, dyv);
    Tensor gamma = make({C}, gv), beta = make({C}, bv);
    cpu::reset_scratch_peak();
    const size_t scratch_before = cpu::scratch_bytes_in_use();

    Tensor y16 = be->empty({N, C}, dt), y32 = be->empty({N, C});
    Tensor mean = be->empty({N}), rstd = be->empty({N}), mean32 = be->empty({N}), rstd32 = be->empty({N});
    be->layernorm_forward(x16, gamma, beta, y16, mean, rstd, 1e-5f);
    be->layernorm_forward(x32, gamma, beta, y32, mean32, rstd32, 1e-5f);
    EXPECT_EQ(host(y16), round(host(y32)));
    Tensor dx16 = be->empty({N, C}, dt), dx32 = be->empty({N, C});
    Tensor dg16 = be->zeros({C}), db16 = be->zeros({C}), dg32 = be->zeros({C}), db32 = be->zeros({C});
    be->layernorm_backward(dy16, x16, gamma, mean, rstd, dx16, dg16, db16);
    be->layernorm_backward(dy32, x32, gamma, mean32, rstd32, dx32, dg32, db32);
    EXPECT_EQ(host(dx16), round(host(dx32)));
    EXPECT_EQ(host(dg16), host(dg32));

    be->gelu_forward(x16, y16);
    be->gelu_forward(x32, y32);
    EXPECT_EQ(host(y16), round(host(y32)));
    be->gelu_backward(dy16, x16, dx16);
    be->gelu_backward(dy32, x32, dx32);
    EXPECT_EQ(host(dx16), round(host(dx32)));

    be->add(x16, dy16, y16);
    be->add(x32, dy32, y32);
    EXPECT_EQ(host(y16), round(host(y32)));
    be->accumulate(dy16, x16);
    be->accumulate(dy32, x32);
    EXPECT_EQ(host(x16), round(host(x32)));
    be->scale(dy16, 0.5f);
    be->scale(dy32, 0.5f);
    EXPECT_EQ(host(dy16), round(host(dy32)));  // fp16 subnormals lose a bit

    be->upload(host(y16).data(), y32);  // both sides go on from the same 16-bit values
    be->upload(host(dy16).data(), dy32);
    Tensor pos = make({T, C}, round(randn(T * C)));
    Tensor pos16 = be->empty({T, C}, dt);
    be->copy(pos, pos16);
    be->add_positions(pos16, T, y16);
    be->add_positions(pos, T, y32);
    EXPECT_EQ(host(y16), round(host(y32)));
    Tensor dpos16 = be->zeros({T, C}), dpos32 = be->zeros({T, C});
    be->add_positions_backward(dy16, T, dpos16);
    be->add_positions_backward(dy32, T, dpos32);
    EXPECT_EQ(host(dpos16), host(dpos32));
    Tensor ids = make_ids({N}, std::vector<int32_t>(N, 3));
    Tensor dtab16 = be->zeros({8, C}), dtab32 = be->zeros({8, C});
    be->embedding_backward(ids, dy16, 0, dtab16);
    be->embedding_backward(ids, dy32, 0, dtab32);
    EXPECT_EQ(host(dtab16), host(dtab32));
    if (dt == DType::BF16) {  // the bias gradient of a bf16 linear layer sums bf16 dy rows
      const int64_t in = 64;
      Tensor xin = make({N, in}, round(randn(N * in)), dt), w = make({C, in}, round(randn(C * in, 0.1f)), dt);
      Tensor dw = be->zeros({C, in}), db = be->zeros({C}), dbref = be->zeros({C});
      be->linear_backward(dy16, xin, w, nullptr, dw, &db);
      be->linear_backward(dy32, make({N, in}, host(xin)), make({C, in}, host(w)), nullptr, dw, &dbref);
      EXPECT_EQ(host(db), host(dbref));
    }
    const size_t scratch = cpu::scratch_bytes_peak() - scratch_before;
    EXPECT_LT(scratch, whole / 8) << "conversion buffers reached " << scratch << " bytes";
  }
}

// ---------------------------------------------------------------------------------------------------
// fast_exp (used by softmax, cross-entropy and GELU)

TEST(CpuMathTest, FastExpIsAccurate) {
  double worst = 0;
  for (float x = -86.f; x < 88.7f; x += 0.00137f) {
    const double want = std::exp(double(x));
    worst = std::max(worst, std::fabs(cpu::fast_exp(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(cpu::fast_exp(0.f), 1.f);
  EXPECT_EQ(cpu::fast_exp(-std::numeric_limits<float>::infinity()), 0.f);
  EXPECT_EQ(cpu::fast_exp(-1000.f), 0.f);
  EXPECT_TRUE(std::isinf(cpu::fast_exp(89.f)));
  EXPECT_TRUE(std::isinf(cpu::fast_exp(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(cpu::fast_exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_NEAR(cpu::fast_exp(88.72f), std::exp(double(88.72f)), 1e-6 * std::exp(double(88.72f)));
  EXPECT_EQ(cpu::fast_tanh(100.f), 1.f);
  EXPECT_EQ(cpu::fast_tanh(-100.f), -1.f);
}

// ---------------------------------------------------------------------------------------------------
// Memory and the factory

TEST_F(OpsStorageTest, MemoryCountersTrackAllocations) {
  const size_t base = be->memory_in_use();
  be->reset_memory_peak();
  EXPECT_EQ(be->memory_peak(), base);
  {
    Tensor a = be->empty({1000});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.raw()) % 64, 0u);
    EXPECT_EQ(be->memory_in_use(), base + 4000);
    {
      Tensor b = be->empty({10, 10}, DType::BF16);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.raw()) % 64, 0u);
      EXPECT_EQ(be->memory_in_use(), base + 4200);
      Tensor view = b.view({100});  // views share storage: no new bytes
      EXPECT_EQ(be->memory_in_use(), base + 4200);
    }
    EXPECT_EQ(be->memory_in_use(), base + 4000);
    EXPECT_EQ(be->memory_peak(), base + 4200);
  }
  EXPECT_EQ(be->memory_in_use(), base);
  EXPECT_EQ(be->memory_peak(), base + 4200);
  be->reset_memory_peak();
  EXPECT_EQ(be->memory_peak(), base);
  Tensor none = be->empty({0});
  EXPECT_TRUE(none.defined());
  EXPECT_THROW(be->empty({-1, 3}), std::runtime_error);
}

TEST(BackendFactory, NamesBackends) {
  auto cpu = make_backend("cpu");
  EXPECT_EQ(cpu->name(), "cpu");
  EXPECT_EQ(cpu->device(), Device::CPU);
#ifndef GPT_HAVE_CUDA  // with the CUDA backend built in, tests/cuda_ops_test.cpp (CudaFactory) checks "cuda"
  try {
    make_backend("cuda");
    ADD_FAILURE() << "cuda should not be available in this build";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not built"), std::string::npos) << e.what();
  }
#endif
  try {
    make_backend("tpu");
    ADD_FAILURE() << "unknown backend accepted";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace gpt
