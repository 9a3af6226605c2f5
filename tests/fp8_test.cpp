// FP8 emulation against independent references: the E4M3/E5M2 codes against values written out by hand
// and against a brute-force nearest-value search over all 256 codes (every midpoint between neighbours,
// ties to the even code, saturation, underflow, NaN, signed zero); the delayed-scaling update against the
// recipe's formula; the backend's cast and the FP8 linear layer against host sums in double; and training:
// a tiny model in FP8 (hybrid and e4m3) ends within 2 % of the bf16 run's loss after 200 steps.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "app/trainer.h"
#include "model/fp8.h"
#include "model/fp8_linear.h"
#include "model/fp8_scaling.h"
#include "tests/tiny_model_config.h"

using namespace gpt;

namespace {

const Fp8Format kFormats[] = {Fp8Format::E4M3, Fp8Format::E5M2};

// The positive finite codes in increasing order of value: 0x00..0x7E (E4M3), 0x00..0x7B (E5M2).
int last_finite_code(Fp8Format f) { return f == Fp8Format::E4M3 ? 0x7E : 0x7B; }

// Nearest finite FP8 value by exhaustive search: ties go to the even code; beyond the largest finite value
// saturate. The reference the encoder is checked against.
uint8_t nearest_code(float x, Fp8Format f) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  const int last = last_finite_code(f);
  if (a >= fp8_decode(static_cast<uint8_t>(last), f)) return sign | last;
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= last; ++c) {
    const double d = std::fabs(a - fp8_decode(static_cast<uint8_t>(c), f));
    if (d < best_d || (d == best_d && c % 2 == 0)) best = c, best_d = d;
  }
  return sign | best;
}

}  // namespace

TEST(Fp8Format, HandWrittenValues) {
  const auto e4 = Fp8Format::E4M3, e5 = Fp8Format::E5M2;
  EXPECT_EQ(fp8_decode(0x00, e4), 0.f);
  EXPECT_TRUE(std::signbit(fp8_decode(0x80, e4)));
  EXPECT_EQ(fp8_decode(0x01, e4), std::ldexp(1.f, -9));     // smallest subnormal
  EXPECT_EQ(fp8_decode(0x07, e4), 7 * std::ldexp(1.f, -9));  // largest subnormal
  EXPECT_EQ(fp8_decode(0x08, e4), std::ldexp(1.f, -6));     // smallest normal
  EXPECT_EQ(fp8_decode(0x38, e4), 1.f);
  EXPECT_EQ(fp8_decode(0x39, e4), 1.125f);
  EXPECT_EQ(fp8_decode(0x7E, e4), 448.f);
  EXPECT_EQ(fp8_decode(0xFE, e4), -448.f);
  EXPECT_TRUE(std::isnan(fp8_decode(0x7F, e4)));
  EXPECT_TRUE(std::isnan(fp8_decode(0xFF, e4)));
  EXPECT_EQ(fp8_decode(0x78, e4), 256.f);  // E4M3 has no infinity: 0x78 is finite
  EXPECT_EQ(fp8_decode(0x01, e5), std::ldexp(1.f, -16));
  EXPECT_EQ(fp8_decode(0x04, e5), std::ldexp(1.f, -14));
  EXPECT_EQ(fp8_decode(0x3C, e5), 1.f);
  EXPECT_EQ(fp8_decode(0x3D, e5), 1.25f);
  EXPECT_EQ(fp8_decode(0x7B, e5), 57344.f);
  EXPECT_EQ(fp8_decode(0x7C, e5), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp8_decode(0xFC, e5), -std::numeric_limits<float>::infinity());
  for (int c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) EXPECT_TRUE(std::isnan(fp8_decode(uint8_t(c), e5))) << c;
  EXPECT_EQ(fp8_info(e4).max_finite, 448.f);
  EXPECT_EQ(fp8_info(e5).max_finite, 57344.f);
}

TEST(Fp8Format, EveryFiniteCodeRoundTripsAndValuesIncrease) {
  for (Fp8Format f : kFormats) {
    for (int c = 0; c <= 0xFF; ++c) {
      const float v = fp8_decode(uint8_t(c), f);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(fp8_encode(v, f), c) << fp8_name(f) << " code " << c;
      EXPECT_EQ(fp8_round(v, f), v) << fp8_name(f) << " code " << c;
    }
    for (int c = 1; c <= last_finite_code(f); ++c)
      EXPECT_LT(fp8_decode(uint8_t(c - 1), f), fp8_decode(uint8_t(c), f)) << fp8_name(f) << " code " << c;
  }
}

TEST(Fp8Format, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  for (Fp8Format f : kFormats) {
    for (int c = 0; c < last_finite_code(f); ++c) {
      const float lo = fp8_decode(uint8_t(c), f), hi = fp8_decode(uint8_t(c + 1), f);
      const float mid = (lo + hi) / 2;  // exact in fp32
      const int even = c % 2 == 0 ? c : c + 1;
      for (float sign : {1.f, -1.f}) {
        const uint8_t s = sign < 0 ? 0x80 : 0;
        EXPECT_EQ(fp8_encode(sign * mid, f), s | even) << fp8_name(f) << " tie above code " << c;
        EXPECT_EQ(fp8_encode(sign * std::nextafter(mid, 0.f), f), s | c) << fp8_name(f) << " below mid " << c;
        EXPECT_EQ(fp8_encode(sign * std::nextafter(mid, 1e9f), f), s | (c + 1)) << fp8_name(f) << " above mid " << c;
      }
    }
  }
}

TEST(Fp8Format, RandomValuesMatchTheExhaustiveSearch) {
  std::mt19937 rng(7);
  for (Fp8Format f : kFormats) {
    const float max = fp8_info(f).max_finite;
    std::uniform_real_distribution<float> log2_mag(std::log2(max) - 30, std::log2(max) + 2);
    for (int i = 0; i < 20000; ++i) {
      const float x = (rng() % 2 ? -1.f : 1.f) * std::exp2(log2_mag(rng));
      EXPECT_EQ(fp8_encode(x, f), nearest_code(x, f)) << fp8_name(f) << " x " << x;
    }
  }
}

TEST(Fp8Format, SaturationUnderflowNaNAndZero) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(fp8_encode(464.f, Fp8Format::E4M3), 0x7E);  // the midpoint to the missing 480: saturates
  EXPECT_EQ(fp8_encode(1e6f, Fp8Format::E4M3), 0x7E);
  EXPECT_EQ(fp8_encode(inf, Fp8Format::E4M3), 0x7E);
  EXPECT_EQ(fp8_encode(-inf, Fp8Format::E4M3), 0xFE);
  EXPECT_EQ(fp8_encode(inf, Fp8Format::E5M2), 0x7B);   // saturating cast: no infinity out of it
  EXPECT_EQ(fp8_encode(-1e30f, Fp8Format::E5M2), 0xFB);
  EXPECT_EQ(fp8_round(-inf, Fp8Format::E5M2), -57344.f);
  for (Fp8Format f : kFormats) {
    EXPECT_TRUE(std::isnan(fp8_decode(fp8_encode(nan, f), f)));
    EXPECT_TRUE(std::isnan(fp8_round(nan, f)));
    EXPECT_EQ(fp8_encode(-0.f, f), 0x80);
    EXPECT_EQ(fp8_encode(0.f, f), 0x00);
    const float tiny = fp8_decode(0x01, f);
    EXPECT_EQ(fp8_encode(tiny / 2, f), 0x00);  // a tie between 0 and the smallest subnormal: even (0)
    EXPECT_EQ(fp8_encode(std::nextafter(tiny / 2, 1.f), f), 0x01);
    EXPECT_EQ(fp8_encode(tiny / 4, f), 0x00);
    EXPECT_EQ(fp8_encode(-tiny / 4, f), 0x80);
  }
}

TEST(Fp8Scaling, DelayedScalingFollowsTheRecipe) {
  Fp8Recipe r = parse_fp8_recipe("hybrid", "max", 3, 0);
  EXPECT_TRUE(r.enabled);
  EXPECT_EQ(r.forward_format(), Fp8Format::E4M3);
  EXPECT_EQ(r.backward_format(), Fp8Format::E5M2);
  EXPECT_EQ(parse_fp8_recipe("e4m3", "max", 1, 0).backward_format(), Fp8Format::E4M3);
  Fp8TensorScale s;
  EXPECT_EQ(s.scale, 1.f);  // the first iteration runs at scale 1
  const float amaxes[] = {2, 8, 4, 1};
  const float expected_max[] = {448.f / 2, 448.f / 8, 448.f / 8, 448.f / 8};  // window of 3: {1, 4, 8}
  for (int i = 0; i < 4; ++i) {
    s.record(amaxes[i] / 2);
    s.record(amaxes[i]);  // the largest of an iteration's records counts
    s.update(r, s.pending);
    EXPECT_EQ(s.pending, 0.f);
    EXPECT_FLOAT_EQ(s.scale, expected_max[i]) << "iteration " << i;
  }
  EXPECT_EQ(s.history, (std::vector<float>{1, 4, 8}));
  s.update(r, 1);  // 8 leaves the window: {1, 1, 4}
  EXPECT_FLOAT_EQ(s.scale, 448.f / 4);

  Fp8Recipe recent = parse_fp8_recipe("hybrid", "most_recent", 16, 2);
  Fp8TensorScale g;
  g.format = Fp8Format::E5M2;
  g.update(recent, 1024);
  g.update(recent, 0.5f);
  EXPECT_FLOAT_EQ(g.scale, 57344.f / 0.5f / 4);  // margin 2: a quarter
  const float before = g.scale;
  g.update(recent, 0.f);  // nothing seen: keep the scale
  EXPECT_EQ(g.scale, before);
  g.update(recent, std::numeric_limits<float>::infinity());
  EXPECT_EQ(g.scale, before);
  g.update(recent, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(g.scale, before);

  EXPECT_THROW(parse_fp8_recipe("e5m2", "max", 1, 0), std::invalid_argument);
  EXPECT_THROW(parse_fp8_recipe("hybrid", "mean", 1, 0), std::invalid_argument);
  EXPECT_THROW(parse_fp8_recipe("hybrid", "max", 0, 0), std::invalid_argument);
  try {
    parse_fp8_recipe("fp8", "max", 1, 0);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("precision.fp8"), std::string::npos) << e.what();
  }
}

TEST(Fp8Backend, CastIsTheScaledRoundingAndReportsTheAmax) {
  auto be = make_backend("cpu");
  std::vector<float> x = {0.3f, -1.7f, 5e-4f, 2.5f, -0.f, 1e-9f, 3.14159f};
  Tensor t = be->empty({7}, DType::F32), out = be->empty({7}, DType::F32);
  be->upload(x.data(), t);
  const float scale = 77.3f;
  for (Fp8Format f : kFormats) {
    EXPECT_EQ(be->fp8_quantize_dequantize(t, scale, f, out), 3.14159f);
    std::vector<float> got(7);
    be->download(out, got.data());
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(got[i], fp8_decode(nearest_code(x[i] * scale, f), f) / scale) << fp8_name(f) << " " << x[i];
  }
  x[2] = std::numeric_limits<float>::quiet_NaN();
  be->upload(x.data(), t);
  EXPECT_TRUE(std::isnan(be->fp8_quantize_dequantize(t, 1.f, Fp8Format::E4M3, out)));
  Tensor wrong = be->empty({6}, DType::F32);
  EXPECT_THROW(be->fp8_quantize_dequantize(t, 1.f, Fp8Format::E4M3, wrong), std::invalid_argument);
}

// The FP8 linear against sums in double of the hand-quantised operands, in both directions; the bias
// gradient from the unquantised output gradient.
TEST(Fp8Linear, ForwardAndBackwardMatchTheQuantisedProducts) {
  auto be = make_backend("cpu");
  const int64_t N = 5, in = 7, out = 3;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  auto randv = [&](size_t n, float s) {
    std::vector<float> v(n);
    for (auto& e : v) e = s * nd(rng);
    return v;
  };
  const std::vector<float> x = randv(N * in, 1.f), w = randv(out * in, 0.2f), b = randv(out, 0.1f),
                           dy = randv(N * out, 1e-3f);
  Fp8ScaleSet set(parse_fp8_recipe("hybrid", "max", 4, 0));
  Fp8LinearScales s = register_fp8_linear(set, "layer");
  ASSERT_EQ(set.size(), 3u);
  EXPECT_EQ(s.grad_output->name, "layer.fp8.grad_output");
  s.input->scale = 60.f, s.weight->scale = 900.f, s.grad_output->scale = 2e6f;
  auto q = [](float v, const Fp8TensorScale& sc) { return fp8_round(v * sc.scale, sc.format) / sc.scale; };
  auto upload = [&](const std::vector<float>& v, Shape shape) {
    Tensor t = be->empty(shape, DType::F32);
    be->upload(v.data(), t);
    return t;
  };
  Tensor tx = upload(x, {N, in}), tw = upload(w, {out, in}), tb = upload(b, {out}), tdy = upload(dy, {N, out});
  Tensor y = be->empty({N, out}), dx = be->empty({N, in}), dw = be->zeros({out, in}), db = be->zeros({out});
  fp8_linear_forward(*be, s, tx, tw, &tb, y);
  fp8_linear_backward(*be, s, tdy, tx, tw, &dx, dw, &db);
  std::vector<float> hy(N * out), hdx(N * in), hdw(out * in), hdb(out);
  be->download(y, hy.data()), be->download(dx, hdx.data()), be->download(dw, hdw.data()), be->download(db, hdb.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) {
      double ref = b[o];
      for (int64_t k = 0; k < in; ++k) ref += double(q(x[n * in + k], *s.input)) * q(w[o * in + k], *s.weight);
      EXPECT_NEAR(hy[n * out + o], ref, 1e-5 * (1 + std::fabs(ref))) << n << "," << o;
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < in; ++k) {
      double ref = 0;
      for (int64_t o = 0; o < out; ++o) ref += double(q(dy[n * out + o], *s.grad_output)) * q(w[o * in + k], *s.weight);
      EXPECT_NEAR(hdx[n * in + k], ref, 1e-9 + 1e-5 * std::fabs(ref));
    }
  for (int64_t o = 0; o < out; ++o) {
    double ref_b = 0;
    for (int64_t n = 0; n < N; ++n) ref_b += dy[n * out + o];
    EXPECT_NEAR(hdb[o], ref_b, 1e-9 + 1e-5 * std::fabs(ref_b));
    for (int64_t k = 0; k < in; ++k) {
      double ref = 0;
      for (int64_t n = 0; n < N; ++n) ref += double(q(dy[n * out + o], *s.grad_output)) * q(x[n * in + k], *s.input);
      EXPECT_NEAR(hdw[o * in + k], ref, 1e-9 + 1e-5 * std::fabs(ref));
    }
  }
  // The quantised operands really differ from the plain ones (the test would pass vacuously otherwise).
  EXPECT_NE(q(x[0], *s.input), x[0]);
  // Forward recorded the amaxes of x and w, backward that of dy; the scales move only on update().
  float ax = 0, aw = 0, ady = 0;
  for (float v : x) ax = std::max(ax, std::fabs(v));
  for (float v : w) aw = std::max(aw, std::fabs(v));
  for (float v : dy) ady = std::max(ady, std::fabs(v));
  EXPECT_EQ(set.pending(), (std::vector<double>{ax, aw, ady}));
  EXPECT_EQ(s.input->scale, 60.f);
  set.update(set.pending());
  EXPECT_FLOAT_EQ(s.input->scale, 448.f / ax);
  EXPECT_FLOAT_EQ(s.grad_output->scale, 57344.f / ady);
}

// FP8 training of the tiny model tracks bf16: after 200 steps the mean loss of the last 10 is within 2 %
// of bf16's (the bound), for the hybrid and the all-E4M3 recipe, and the scales have left 1.
TEST(Fp8Training, TinyModelLossWithinTwoPercentOfBf16After200Steps) {
  auto be = make_backend("cpu");
  ParallelState ps = single_process_state();
  auto config = [](const std::string& fp8) {
    Config cfg = tiny_model_config("bf16");
    cfg.training.train_iters = 200;
    cfg.optimizer.lr = 1e-3;
    cfg.optimizer.warmup_iters = 10;
    cfg.precision.fp8 = fp8;
    cfg.precision.fp8_amax_history_len = 16;
    return cfg;
  };
  auto tail_mean = [](const std::vector<StepStats>& s) {
    double sum = 0;
    for (size_t i = s.size() - 10; i < s.size(); ++i) sum += s[i].loss;
    return sum / 10;
  };
  Trainer bf16(config("off"), ps, *be);
  const double ref = tail_mean(bf16.train());
  for (const char* recipe : {"hybrid", "e4m3"}) {
    Trainer fp8(config(recipe), ps, *be);
    const std::vector<StepStats> steps = fp8.train();
    const double got = tail_mean(steps);
    std::printf("fp8 %s: last-10 mean loss %.5f, bf16 %.5f, first %.5f\n", recipe, got, ref, steps.front().loss);
    EXPECT_NEAR(got, ref, 0.02 * ref) << recipe;
    EXPECT_LT(got, steps.front().loss) << recipe;
    size_t moved = 0, total = 0;
    for (ModelChunk* c : fp8.chunks())
      for (Fp8TensorScale* sc : c->fp8_scales().all()) moved += sc->scale != 1.f, ++total;
    EXPECT_EQ(total, 2u * 4 * 3) << recipe;  // 2 layers x 4 linears x 3 operands
    EXPECT_EQ(moved, total) << recipe;
  }
}
