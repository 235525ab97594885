#include "trainer/train/schedule.h"

#include <cmath>
#include <numbers>

#include "kernels/common/check.h"

namespace fp4moe {

double learning_rate(int64_t step, int64_t steps, int64_t warmup_steps, double lr, double min_lr) {
  FP4MOE_CHECK(step >= 1, "learning_rate: step is 1-based, got {}", step);
  FP4MOE_CHECK(steps >= 1, "learning_rate: steps must be >= 1, got {}", steps);
  FP4MOE_CHECK(warmup_steps >= 0 && warmup_steps <= steps, "learning_rate: warmup_steps = {} must be in [0, {}]",
               warmup_steps, steps);
  FP4MOE_CHECK(std::isfinite(lr) && lr >= 0, "learning_rate: lr must be finite and >= 0, got {}", lr);
  FP4MOE_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr,
               "learning_rate: min_lr = {} must be finite and in [0, lr = {}]", min_lr, lr);
  if (step <= warmup_steps) return lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  if (step >= steps) return min_lr;
  const double p = static_cast<double>(step - warmup_steps) / static_cast<double>(steps - warmup_steps);
  return min_lr + (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * p)) / 2.0;
}

double learning_rate(const TrainingConfig& t, int64_t step) {
  return learning_rate(step, t.steps, t.warmup_steps, t.lr, t.min_lr);
}

}  // namespace fp4moe
