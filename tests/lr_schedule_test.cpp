// Learning-rate schedules (app/lr_schedule.h) at hand-computed points: lr 1, min_lr 0.1, 10 warm-up
// iterations, decay until iteration 110, for each of Megatron-LM's decay styles.
#include <gtest/gtest.h>

#include <cmath>

#include <stdexcept>
#include <string>

#include "app/lr_schedule.h"

using namespace gpt;

namespace {

LrSchedule schedule_of(LrDecayStyle style, int64_t warmup = 10, int64_t decay = 110) {
  return LrSchedule{1.0, 0.1, warmup, decay, style};
}

}  // namespace

TEST(LrSchedule, WarmupIsLinearForEveryStyle) {
  for (auto style : {LrDecayStyle::Cosine, LrDecayStyle::Linear, LrDecayStyle::Constant,
                     LrDecayStyle::InverseSquareRoot}) {
    EXPECT_DOUBLE_EQ(schedule_of(style).at(1), 0.1);
    EXPECT_DOUBLE_EQ(schedule_of(style).at(5), 0.5);
    EXPECT_DOUBLE_EQ(schedule_of(style).at(10), 1.0);
  }
}

TEST(LrSchedule, CosineHalvesTheRangeAtMidpoint) {
  const LrSchedule s = schedule_of(LrDecayStyle::Cosine);
  EXPECT_DOUBLE_EQ(s.at(60), 0.55);  // r = 0.5: 0.1 + 0.9 * (1 + cos(pi / 2)) / 2
  EXPECT_NEAR(s.at(35), 0.1 + 0.9 * (1 + std::sqrt(0.5)) / 2, 1e-15);  // r = 0.25: cos(pi / 4)
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(1000), 0.1);
}

TEST(LrSchedule, LinearFallsInEqualSteps) {
  const LrSchedule s = schedule_of(LrDecayStyle::Linear);
  EXPECT_DOUBLE_EQ(s.at(35), 0.775);  // r = 0.25
  EXPECT_DOUBLE_EQ(s.at(85), 0.325);  // r = 0.75
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(111), 0.1);
}

TEST(LrSchedule, ConstantKeepsThePeakPastTheDecay) {
  const LrSchedule s = schedule_of(LrDecayStyle::Constant);
  EXPECT_DOUBLE_EQ(s.at(11), 1.0);
  EXPECT_DOUBLE_EQ(s.at(5000), 1.0);
}

TEST(LrSchedule, InverseSquareRootFromTheEndOfWarmup) {
  const LrSchedule s = schedule_of(LrDecayStyle::InverseSquareRoot, 10, 100000);
  EXPECT_DOUBLE_EQ(s.at(40), 0.5);    // sqrt(10 / 40)
  EXPECT_DOUBLE_EQ(s.at(250), 0.2);   // sqrt(10 / 250)
  EXPECT_DOUBLE_EQ(s.at(4000), 0.1);  // sqrt(10 / 4000) = 0.05, floored at min_lr
  EXPECT_DOUBLE_EQ(schedule_of(LrDecayStyle::InverseSquareRoot, 10, 110).at(111), 0.1);  // past the decay
  EXPECT_DOUBLE_EQ(schedule_of(LrDecayStyle::InverseSquareRoot, 0, 1000).at(4), 0.5);   // no warm-up: sqrt(1 / 4)
}

TEST(LrSchedule, ParsesMegatronNamesAndRejectsOthers) {
  EXPECT_EQ(parse_lr_decay_style("cosine"), LrDecayStyle::Cosine);
  EXPECT_EQ(parse_lr_decay_style("linear"), LrDecayStyle::Linear);
  EXPECT_EQ(parse_lr_decay_style("constant"), LrDecayStyle::Constant);
  EXPECT_EQ(parse_lr_decay_style("inverse-square-root"), LrDecayStyle::InverseSquareRoot);
  try {
    parse_lr_decay_style("step");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.lr_decay_style"), std::string::npos) << e.what();
  }
}
