// The flat optimizer ops of the CPU backend against their single-tensor references, bit for bit: the
// flat AdamW (one call over a buffer of segments, gradient scaling and the compute-dtype store fused in)
// against scale + adamw_step + copy per segment; the per-segment sums of squares against sum_squares of
// each segment; the loss accumulation against the row formula the loss was computed with on the host.
#include "tests/error_of.h"
#include "tests/ops_test_util.h"

#include <omp.h>

#include "model/ops/token_loss.h"

namespace gpt {
namespace {

std::vector<uint32_t> bits(const Vec& v) {
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

// Segments of assorted lengths (one spans several 16 Ki threading chunks, some are tiny) with a padding
// gap before the last, alternating weight decay, norm slots in reverse order and one without a slot.
std::vector<ops::FlatSegment> assorted_segments(int64_t& numel) {
  const std::vector<int64_t> lengths = {70001, 3, 16384, 1, 40000, 5000};
  std::vector<ops::FlatSegment> segs;
  int64_t at = 0;
  for (size_t k = 0; k < lengths.size(); ++k) {
    if (k + 1 == lengths.size()) at += 17;  // padding that no segment covers
    segs.push_back({at, at + lengths[k], k % 2 ? 0.f : 0.1f, static_cast<int32_t>(lengths.size() - 1 - k)});
    at += lengths[k];
  }
  segs[3].norm_slot = -1;
  numel = at + 9;  // more padding at the end
  return segs;
}

class FlatOpsTest : public OpsTest {};
class FlatAdamWTest : public OpsTest, public ::testing::WithParamInterface<DType> {};

TEST_P(FlatAdamWTest, EqualsSingleTensorStepsBitForBit) {
  const DType value_dtype = GetParam();
  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    int64_t n = 0;
    const std::vector<ops::FlatSegment> segs = assorted_segments(n);
    const Vec w0 = randn(n);
    // Flat: one call per step. Reference: per segment, the gradient scaled in place, the single-tensor
    // step, the master copied into the values.
    Tensor fw = make({n}, w0), fm = be->zeros({n}), fv = be->zeros({n}), fvalue = make({n}, w0, value_dtype);
    Tensor rw = make({n}, w0), rm = be->zeros({n}), rv = be->zeros({n}), rvalue = make({n}, w0, value_dtype);
    const bool separate_values = value_dtype != DType::F32;
    for (int64_t step = 1; step <= 3; ++step) {
      const Vec g = randn(n, 0.1f);
      const float grad_scale = step == 2 ? 1.f : 0.37f;
      Tensor fg = make({n}, g), rg = make({n}, g);
      const ops::AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, grad_scale, step};
      be->adamw_step_flat(fw, fg, fm, fv, separate_values ? &fvalue : nullptr, segs, h);
      for (const ops::FlatSegment& s : segs) {
        auto seg = [&](const Tensor& t) { return t.slice_elems(s.begin, {s.end - s.begin}); };
        Tensor w = seg(rw), gg = seg(rg), m = seg(rm), v = seg(rv), value = seg(rvalue);
        if (grad_scale != 1.f) be->scale(gg, grad_scale);
        be->adamw_step(w, gg, m, v, h.lr, h.beta1, h.beta2, h.eps, s.weight_decay, step);
        if (separate_values) be->copy(w, value);
      }
    }
    const std::string what = std::string(dtype_name(value_dtype)) + ", threads " + std::to_string(threads);
    EXPECT_EQ(bits(host(fw)), bits(host(rw))) << "master " << what;
    EXPECT_EQ(bits(host(fm)), bits(host(rm))) << "m " << what;
    EXPECT_EQ(bits(host(fv)), bits(host(rv))) << "v " << what;
    EXPECT_EQ(bits(host(fvalue)), bits(host(rvalue))) << "values " << what;
    const Vec w = host(fw);
    for (int64_t i = segs[4].end; i < segs[5].begin; ++i) ASSERT_EQ(w[i], w0[i]) << "padding element " << i;
    for (int64_t i = segs[5].end; i < n; ++i) ASSERT_EQ(w[i], w0[i]) << "padding element " << i;
  }
  omp_set_num_threads(saved_threads);
}

INSTANTIATE_TEST_SUITE_P(ValueDtypes, FlatAdamWTest, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST_F(FlatOpsTest, FlatAdamWRejectsBadTables) {
  Tensor w = be->zeros({10}), g = be->zeros({10}), m = be->zeros({10}), v = be->zeros({10});
  const ops::AdamWHyper h;
  EXPECT_THROW(be->adamw_step_flat(w, g, m, v, nullptr, {{0, 11, 0.f, -1}}, h), std::runtime_error);
  EXPECT_THROW(be->adamw_step_flat(w, g, m, v, nullptr, {{5, 8, 0.f, -1}, {4, 6, 0.f, -1}}, h), std::runtime_error);
  EXPECT_THROW(be->adamw_step_flat(w, g, m, v, &w, {{0, 10, 0.f, -1}}, h), std::runtime_error);  // value aliases
  Tensor short_value = be->zeros({9}, DType::BF16);
  EXPECT_THROW(be->adamw_step_flat(w, g, m, v, &short_value, {{0, 9, 0.f, -1}}, h), std::runtime_error);
}

TEST_F(FlatOpsTest, SegmentSumsOfSquaresEqualSumSquaresOfEachSegment) {
  int64_t n = 0;
  const std::vector<ops::FlatSegment> segs = assorted_segments(n);
  Tensor flat = make({n}, randn(n, 2.f));
  const int64_t slots = static_cast<int64_t>(segs.size());
  Tensor sums = be->zeros({slots}, DType::F64);
  be->fill(sums, 0.5f);  // the op adds to what is there
  be->sum_squares_segments(flat, segs, sums);
  std::vector<double> got(slots);
  be->download_f64(sums, got.data());
  std::vector<double> want(slots, 0.5);
  for (const ops::FlatSegment& s : segs)
    if (s.norm_slot >= 0) want[s.norm_slot] += be->sum_squares(flat.slice_elems(s.begin, {s.end - s.begin}));
  EXPECT_EQ(got, want);
  Tensor too_few = be->zeros({2}, DType::F64);
  EXPECT_THROW(be->sum_squares_segments(flat, segs, too_few), std::runtime_error);
  Tensor f32_sums = be->zeros({slots});
  EXPECT_THROW(be->sum_squares_segments(flat, segs, f32_sums), std::runtime_error);
  // Two segments adding to one slot would race on CUDA: the table is rejected on every backend.
  Tensor two = be->zeros({2}, DType::F64);
  const std::string shared =
      error_of([&] { be->sum_squares_segments(flat, {{0, 3, 0.f, 1}, {3, 5, 0.f, 0}, {5, 9, 0.f, 1}}, two); });
  EXPECT_NE(shared.find("segment 2 [5, 9) adds to slot 1, which an earlier segment adds to"), std::string::npos)
      << shared;
}

TEST_F(FlatOpsTest, LossAccumulationIsTheRowMeanInDouble) {
  const int64_t n = 1001;
  const Vec mx = randn(n), se = uniform(n, 1.f, 500.f), tl = randn(n);
  Tensor loss = be->zeros({1}, DType::F64);
  double want = 0;
  for (int pass = 0; pass < 2; ++pass) {  // accumulates, as over a step's microbatches
    be->ce_loss_accumulate(make({n}, mx), make({n}, se), make({n}, tl), loss);
    // The formula the loss had when it was computed on the host from downloaded row statistics.
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += std::log((double)se[i]) + mx[i] - tl[i];
    want += total / n;
  }
  double got = 0;
  be->download_f64(loss, &got);
  EXPECT_EQ(got, want);
  Tensor f32_loss = be->zeros({1});
  EXPECT_THROW(be->ce_loss_accumulate(make({n}, mx), make({n}, se), make({n}, tl), f32_loss), std::runtime_error);
}

}  // namespace
}  // namespace gpt
