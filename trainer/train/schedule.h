// The learning-rate schedule of the reference trainer (DESIGN.md "Trainer"): linear warm-up, then cosine decay.
//
// Steps are 1-based: step s = 1 is the first optimizer step, s = S = train.steps the last (the step a checkpoint
// records is the number of steps completed, so a run resumed from step k continues with s = k + 1). With
// W = train.warmup_steps, lr = train.lr and min_lr = train.min_lr, in double:
//
//   1 <= s <= W:   lr(s) = lr * s / W                                    (lr / W at step 1, lr at step W)
//   W < s <= S:    p = (s - W) / (S - W),  lr(s) = min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
//                  (just below lr at step W + 1, (lr + min_lr) / 2 at p = 1/2, exactly min_lr at step S)
//   s > S:         lr(s) = min_lr                                        (past the end of the schedule)
//
// W = 0 starts the cosine at once (step 1 has p = 1/S); W = S is warm-up only (lr at the last step).
#pragma once

#include <cstdint>

#include "trainer/config.h"

namespace fp4moe {

// The rule above. Throws fp4moe::Error for step < 1, steps < 1, warmup_steps outside [0, steps], lr not finite or
// < 0, min_lr not finite or outside [0, lr].
double learning_rate(int64_t step, int64_t steps, int64_t warmup_steps, double lr, double min_lr);

// The same with train.steps, train.warmup_steps, train.lr and train.min_lr.
double learning_rate(const TrainingConfig& t, int64_t step);

}  // namespace fp4moe
