// The CPU backend's fused (flash-style) attention against two independent references: the materialised
// attention it replaced (kept test-only in tests/reference/) and PyTorch in float64
// (tests/attention_torch_reference.py), forward (output and log-sum-exp statistics) and backward, at odd
// shapes: T of 1, T not a multiple of either block size, head dims 16 to 128, several heads, and grouped-query
// attention (G = 1 and G = 2 key/value heads shared by the query heads, beside G = H). Also bf16 against the
// fp32 reference, and the contract's argument checks.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/ops_test_util.h"
#include "tests/reference/materialized_attention.h"

namespace gpt {
namespace {

namespace fs = std::filesystem;

struct Dims {
  int64_t B, T, H, G, D;  // G key/value heads (query groups) for the H query heads
  int64_t width() const { return (H + 2 * G) * D; }  // of a qkv row
};

// T = 1; T on either side of the kernel's block sizes (128 query rows, 256 keys); head dims 16..128; G = H
// (multi-head), G = 1 (multi-query) and G = 2.
const Dims kShapes[] = {{1, 1, 1, 1, 16},   {2, 1, 3, 3, 32},   {2, 1, 4, 1, 32},    {1, 63, 2, 2, 16},
                        {1, 63, 4, 2, 16},  {2, 65, 3, 3, 24},  {2, 65, 6, 1, 24},   {1, 129, 2, 2, 64},
                        {1, 129, 4, 2, 64}, {1, 200, 4, 4, 128}, {1, 200, 4, 2, 128}, {3, 70, 5, 5, 40},
                        {1, 257, 2, 2, 96}, {1, 257, 4, 1, 96}};

std::string describe(const Dims& d) {
  std::ostringstream s;
  s << "B=" << d.B << " T=" << d.T << " H=" << d.H << " G=" << d.G << " D=" << d.D;
  return s.str();
}

DVec widen(const Vec& v) { return DVec(v.begin(), v.end()); }

// The log-sum-exp of each query row's scaled causal scores, in double.
DVec lse_reference(const Vec& qkv, const Dims& d) {
  DVec lse(d.B * d.H * d.T);
  const int64_t ld = d.width();
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.T; ++i) {
        DVec s(i + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < d.D; ++c)
            acc += double(qkv[(b * d.T + i) * ld + h * d.D + c]) *
                   qkv[(b * d.T + j) * ld + d.H * d.D + h / (d.H / d.G) * d.D + c];
          s[j] = acc / std::sqrt(double(d.D));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double v : s) sum += std::exp(v - mx);
        lse[(b * d.H + h) * d.T + i] = mx + std::log(sum);
      }
  return lse;
}

struct Result {
  Vec out, lse, dqkv;
};

class AttentionTest : public OpsTest {
 protected:
  // The backend's fused attention on qkv in `dtype`, forward and backward.
  Result fused(const Vec& qkv, const Vec& dout, const Dims& d, DType dtype = DType::F32) {
    const int64_t rows = d.B * d.T, width = d.width();
    Tensor tq = make({rows, width}, qkv, dtype), out = be->empty({rows, d.H * d.D}, dtype);
    Tensor lse = make({d.B, d.H, d.T}, Vec(d.B * d.H * d.T, 7.f));
    be->attention_forward(tq, d.B, d.T, d.H, d.G, d.D, out, lse);
    Tensor tdo = make({rows, d.H * d.D}, dout, dtype), dqkv = make({rows, width}, Vec(rows * width, 5.f), dtype);
    be->attention_backward(tdo, tq, out, lse, d.B, d.T, d.H, d.G, d.D, dqkv);
    return {host(out), host(lse), host(dqkv)};
  }

  Result materialized(const Vec& qkv, const Vec& dout, const Dims& d) {
    const int64_t rows = d.B * d.T, width = d.width();
    Tensor tq = make({rows, width}, qkv), out = be->empty({rows, d.H * d.D});
    Tensor probs = be->empty({d.B, d.H, d.T, d.T});
    reference::materialized_attention_forward(tq, d.B, d.T, d.H, d.G, d.D, out, probs);
    Tensor tdo = make({rows, d.H * d.D}, dout), dqkv = be->empty({rows, width});
    reference::materialized_attention_backward(tdo, tq, probs, d.B, d.T, d.H, d.G, d.D, dqkv);
    return {host(out), {}, host(dqkv)};
  }
};

TEST_F(AttentionTest, FusedMatchesMaterializedReferenceInFp32) {
  for (const Dims& d : kShapes) {
    SCOPED_TRACE(describe(d));
    const Vec qkv = randn(d.B * d.T * d.width()), dout = randn(d.B * d.T * d.H * d.D);
    const Result got = fused(qkv, dout, d), want = materialized(qkv, dout, d);
    EXPECT_LE(rel_err(got.out, widen(want.out)), 1e-5);
    EXPECT_LE(rel_err(got.dqkv, widen(want.dqkv)), 1e-5);
    EXPECT_LE(rel_err(got.lse, lse_reference(qkv, d)), 1e-6);
  }
}

TEST_F(AttentionTest, FusedMatchesPyTorchFloat64) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "python3 not installed";
  const fs::path dir = fs::temp_directory_path() / ("gpt_attention_ref_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<Vec> qkvs, douts;
  std::ostringstream cases;
  cases << "[";
  for (size_t i = 0; i < std::size(kShapes); ++i) {
    const Dims& d = kShapes[i];
    qkvs.push_back(randn(d.B * d.T * d.width()));
    douts.push_back(randn(d.B * d.T * d.H * d.D));
    std::ofstream(dir / ("qkv_" + std::to_string(i)), std::ios::binary)
        .write(reinterpret_cast<const char*>(qkvs[i].data()), qkvs[i].size() * 4);
    std::ofstream(dir / ("dout_" + std::to_string(i)), std::ios::binary)
        .write(reinterpret_cast<const char*>(douts[i].data()), douts[i].size() * 4);
    cases << (i ? "," : "") << "{\"B\":" << d.B << ",\"T\":" << d.T << ",\"H\":" << d.H << ",\"G\":" << d.G
          << ",\"D\":" << d.D
          << ",\"qkv\":\"qkv_" << i << "\",\"dout\":\"dout_" << i << "\"}";
  }
  cases << "]";
  std::ofstream(dir / "cases.json") << cases.str();
  const std::string cmd =
      std::string("/usr/bin/python3 ") + GPT_SOURCE_DIR + "/tests/attention_torch_reference.py " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto read = [&](const std::string& name, size_t n) {
    DVec v(n);
    std::ifstream(dir / name, std::ios::binary).read(reinterpret_cast<char*>(v.data()), n * 8);
    return v;
  };
  for (size_t i = 0; i < std::size(kShapes); ++i) {
    const Dims& d = kShapes[i];
    SCOPED_TRACE(describe(d));
    const Result got = fused(qkvs[i], douts[i], d);
    const std::string n = std::to_string(i);
    EXPECT_LE(rel_err(got.out, read("out_" + n + ".bin", got.out.size())), 1e-5);
    EXPECT_LE(rel_err(got.lse, read("lse_" + n + ".bin", got.lse.size())), 1e-6);
    EXPECT_LE(rel_err(got.dqkv, read("dqkv_" + n + ".bin", got.dqkv.size())), 1e-5);
  }
  fs::remove_all(dir);
}

// bf16 activations: bf16 products with fp32 accumulation, P and dS rounded to bf16 for the products that
// take them, outputs rounded once. Against the fp32 reference on the same (bf16-exact) inputs the error
// is a few bf16 ulps (2^-8 relative); the statistics stay fp32.
TEST_F(AttentionTest, Bf16StaysWithinBf16RoundingOfTheFp32Reference) {
  for (const Dims& d : {Dims{2, 65, 3, 3, 32}, Dims{1, 200, 2, 2, 64}, Dims{1, 130, 6, 2, 32}}) {
    SCOPED_TRACE(describe(d));
    auto round = [](Vec v) {
      for (auto& x : v) x = bf16_to_fp32(fp32_to_bf16(x));
      return v;
    };
    const Vec qkv = round(randn(d.B * d.T * d.width())), dout = round(randn(d.B * d.T * d.H * d.D));
    const Result got = fused(qkv, dout, d, DType::BF16), want = materialized(qkv, dout, d);
    EXPECT_LE(rel_err(got.out, widen(want.out)), 1e-2);
    EXPECT_LE(rel_err(got.dqkv, widen(want.dqkv)), 2e-2);
    EXPECT_LE(rel_err(got.lse, lse_reference(qkv, d)), 1e-3);
  }
}

// Queries for the last Tq positions only (a key/value cache's decoding step) give the same rows and
// statistics as the whole forward: Tq = 1, a partial query block, more than a block, all of T; multi-head and
// grouped-query.
TEST_F(AttentionTest, LastQueriesMatchTheWholeForward) {
  for (const Dims& d : {Dims{2, 300, 3, 3, 32}, Dims{2, 300, 4, 2, 32}}) {
    SCOPED_TRACE(describe(d));
    const int64_t rows = d.B * d.T, width = d.H * d.D;
    const Vec qkv = randn(rows * d.width());
    Tensor tq = make({rows, d.width()}, qkv), out = be->empty({rows, width}), lse = be->empty({d.B, d.H, d.T});
    be->attention_forward(tq, d.B, d.T, d.H, d.G, d.D, out, lse);
    const Vec full_out = host(out), full_lse = host(lse);
    for (int64_t Tq : {int64_t{1}, int64_t{37}, int64_t{170}, d.T}) {
      SCOPED_TRACE("Tq=" + std::to_string(Tq));
      Tensor o = be->empty({d.B * Tq, width}), l = be->empty({d.B, d.H, Tq});
      be->attention_forward_last(tq, d.B, d.T, Tq, d.H, d.G, d.D, o, l);
      const Vec got_out = host(o), got_lse = host(l);
      double err = 0;
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t i = 0; i < Tq; ++i) {
          const int64_t t = d.T - Tq + i;
          for (int64_t c = 0; c < width; ++c)
            err = std::max(err,
                           double(std::fabs(got_out[(b * Tq + i) * width + c] - full_out[(b * d.T + t) * width + c])));
          for (int64_t h = 0; h < d.H; ++h)
            err = std::max(err,
                           double(std::fabs(got_lse[(b * d.H + h) * Tq + i] - full_lse[(b * d.H + h) * d.T + t])));
        }
      EXPECT_LE(err, 1e-5);
    }
    Tensor o = be->empty({d.B * 4, width}), l = be->empty({d.B, d.H, 4});
    EXPECT_THROW(be->attention_forward_last(tq, d.B, d.T, 0, d.H, d.G, d.D, o, l), std::runtime_error);
    EXPECT_THROW(be->attention_forward_last(tq, d.B, d.T, 5, d.H, d.G, d.D, o, l), std::runtime_error);  // out's size
  }
}

TEST_F(AttentionTest, RejectsBadArguments) {
  Tensor qkv = be->zeros({10, 18}), out = be->empty({10, 6}), lse = be->empty({2, 2, 5});
  EXPECT_NO_THROW(be->attention_forward(qkv, 2, 5, 2, 2, 3, out, lse));
  EXPECT_THROW(be->attention_forward(qkv, 2, 5, 2, 2, 4, out, lse), std::runtime_error);  // qkv's width
  Tensor lse_bf16 = be->empty({2, 2, 5}, DType::BF16), lse_short = be->empty({2, 2, 4});
  EXPECT_THROW(be->attention_forward(qkv, 2, 5, 2, 2, 3, out, lse_bf16), std::runtime_error);
  EXPECT_THROW(be->attention_forward(qkv, 2, 5, 2, 2, 3, out, lse_short), std::runtime_error);
  Tensor out_short = be->empty({10, 5}), dqkv = be->empty({10, 18}), dout = be->zeros({10, 6});
  EXPECT_THROW(be->attention_forward(qkv, 2, 5, 2, 2, 3, out_short, lse), std::runtime_error);
  EXPECT_THROW(be->attention_backward(dout, qkv, out_short, lse, 2, 5, 2, 2, 3, dqkv), std::runtime_error);
  Tensor dqkv_short = be->empty({10, 17});
  EXPECT_THROW(be->attention_backward(dout, qkv, out, lse, 2, 5, 2, 2, 3, dqkv_short), std::runtime_error);
  EXPECT_THROW(be->attention_forward(qkv, 0, 5, 2, 2, 3, out, lse), std::runtime_error);
  try {
    be->attention_forward(qkv, 2, 5, 2, 2, 3, out, lse_short);
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("lse"), std::string::npos) << e.what();
  }
  // Grouped-query: qkv [B*T, (H + 2G)*D]; G must divide H.
  Tensor gqa = be->zeros({10, 4 * 3 + 2 * 2 * 3}), gout = be->empty({10, 12}), glse = be->empty({2, 4, 5});
  EXPECT_NO_THROW(be->attention_forward(gqa, 2, 5, 4, 2, 3, gout, glse));
  Tensor gdqkv = be->empty({10, 24}), gdout = be->zeros({10, 12});
  EXPECT_NO_THROW(be->attention_backward(gdout, gqa, gout, glse, 2, 5, 4, 2, 3, gdqkv));
  for (int64_t G : {int64_t{3}, int64_t{0}, int64_t{8}}) {
    try {
      be->attention_forward(gqa, 2, 5, 4, G, 3, gout, glse);
      ADD_FAILURE() << "G=" << G << " accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("CpuBackend::attention_forward: the key/value heads (query groups) G=" +
                                           std::to_string(G) + " must be positive and divide the query heads H=4"),
                std::string::npos)
          << e.what();
    }
  }
  try {
    be->attention_backward(gdout, gqa, gout, glse, 2, 5, 4, 1, 3, gdqkv);  // qkv is for G = 2
    ADD_FAILURE() << "a qkv of the wrong width accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("qkv is [10, 24] fp32 but [B*T, (H+2G)*D] for B=2 T=5 H=4 G=1 D=3"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace gpt
