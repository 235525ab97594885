// The learning-rate schedule (trainer/train/schedule.h): warm-up endpoints, the cosine midpoint, min_lr at the
// last step and beyond, the W = 0 and W = S corner cases, and what it rejects.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/train/schedule.h"

namespace fp4moe {
namespace {

using test::expect_error_with;

constexpr double kLr = 1e-3, kMin = 1e-4;

TEST(TrainSchedule, WarmupIsLinearFromLrOverWToLr) {
  EXPECT_DOUBLE_EQ(learning_rate(1, 100, 10, kLr, kMin), kLr / 10);
  EXPECT_DOUBLE_EQ(learning_rate(5, 100, 10, kLr, kMin), kLr / 2);
  EXPECT_EQ(learning_rate(10, 100, 10, kLr, kMin), kLr);  // exactly lr at the last warm-up step
  for (int64_t s = 1; s < 10; ++s)
    EXPECT_LT(learning_rate(s, 100, 10, kLr, kMin), learning_rate(s + 1, 100, 10, kLr, kMin)) << "step " << s;
}

TEST(TrainSchedule, CosineDecaysThroughTheMidpointToMinLr) {
  // p = (s - W) / (S - W): step 55 of 100 with W = 10 is p = 1/2.
  EXPECT_NEAR(learning_rate(55, 100, 10, kLr, kMin), (kLr + kMin) / 2, 1e-15);
  const double first = learning_rate(11, 100, 10, kLr, kMin);
  EXPECT_LT(first, kLr);
  EXPECT_NEAR(first, kMin + (kLr - kMin) * (1 + std::cos(std::numbers::pi / 90)) / 2, 1e-18);
  for (int64_t s = 10; s < 100; ++s)
    EXPECT_GT(learning_rate(s, 100, 10, kLr, kMin), learning_rate(s + 1, 100, 10, kLr, kMin)) << "step " << s;
  EXPECT_EQ(learning_rate(100, 100, 10, kLr, kMin), kMin);  // exactly min_lr at the last step
  EXPECT_EQ(learning_rate(101, 100, 10, kLr, kMin), kMin);  // and past the schedule
  EXPECT_EQ(learning_rate(100, 100, 10, kLr, 0.0), 0.0);
}

TEST(TrainSchedule, CornerCases) {
  // No warm-up: the cosine starts at once.
  EXPECT_NEAR(learning_rate(1, 4, 0, kLr, kMin), kMin + (kLr - kMin) * (1 + std::cos(std::numbers::pi / 4)) / 2,
              1e-18);
  EXPECT_NEAR(learning_rate(2, 4, 0, kLr, kMin), (kLr + kMin) / 2, 1e-15);
  // Warm-up only: lr at the last step.
  EXPECT_EQ(learning_rate(4, 4, 4, kLr, kMin), kLr);
  // One step.
  EXPECT_EQ(learning_rate(1, 1, 0, kLr, kMin), kMin);
  EXPECT_EQ(learning_rate(1, 1, 1, kLr, kMin), kLr);
  // min_lr = lr: constant after the warm-up.
  EXPECT_EQ(learning_rate(7, 10, 2, kLr, kLr), kLr);
}

TEST(TrainSchedule, FromTheTrainingConfig) {
  const TrainerConfig cfg = parse_config_args({"--config", test::preset("tiny")});  // 20 steps, 2 warm-up
  EXPECT_DOUBLE_EQ(learning_rate(cfg.train, 1), cfg.train.lr / 2);
  EXPECT_EQ(learning_rate(cfg.train, 2), cfg.train.lr);
  EXPECT_NEAR(learning_rate(cfg.train, 11), (cfg.train.lr + cfg.train.min_lr) / 2, 1e-15);
  EXPECT_EQ(learning_rate(cfg.train, 20), cfg.train.min_lr);
}

TEST(TrainSchedule, RejectsBadArguments) {
  expect_error_with([] { learning_rate(0, 10, 2, kLr, kMin); }, {"1-based", "0"});
  expect_error_with([] { learning_rate(1, 0, 0, kLr, kMin); }, {"steps"});
  expect_error_with([] { learning_rate(1, 10, 11, kLr, kMin); }, {"warmup_steps = 11", "[0, 10]"});
  expect_error_with([] { learning_rate(1, 10, -1, kLr, kMin); }, {"warmup_steps = -1"});
  expect_error_with([] { learning_rate(1, 10, 2, kLr, 2 * kLr); }, {"min_lr"});
  expect_error_with([] { learning_rate(1, 10, 2, NAN, kMin); }, {"lr"});
}

}  // namespace
}  // namespace fp4moe
