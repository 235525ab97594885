// The step profile of `fp4moe train --profile` over step ranges (one step's times: trainer/model/profile.h): the
// table the run writes to /train/<run>/profile (trainer/train/metrics.h) and prints at its end.
//
// Ranges:
//   "interval"  every log interval: the steps (k - 1) n + 1 .. k n (n = --log-interval, the run's step numbers, so a
//               resumed run keeps the grid), the last one as far as the run went;
//   "run"       the whole run after its first `warmup` steps (they create the cuBLASLt plans, the Linears' lazily
//               allocated copies and the profile's own events); a run of no more steps than that: all of them.
// A range's rows, in ProfileModule order, then ProfilePass order: every (module, pass) that opened a scope or was
// given time in the range, (other, -) included (time inside no scope), then (step, -), the range's step total.
//   ms_per_step     the range's summed milliseconds / its steps (stream time between CUDA events)
//   share           of the range's summed step total, 0..1; the rows other than (step, -) sum to 1
//   calls_per_step  scopes opened / steps (0 for (other, -) and (step, -))
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "results/table.h"
#include "trainer/model/profile.h"

namespace fp4moe {

struct ProfileRow {
  std::string range;       // "interval" or "run"
  int64_t first_step = 0;  // the range's first and last step (inclusive) and how many it has
  int64_t last_step = 0;
  int64_t steps = 0;
  std::string module;      // profile_module_name, or "step"
  std::string pass;        // profile_pass_name ("-" for other outside a pass and for step)
  double ms_per_step = 0;
  double share = 0;
  double calls_per_step = 0;
};

class StepProfile {
 public:
  // interval: steps per "interval" range (>= 1, the log interval); warmup: steps left out of the "run" range (>= 0).
  // Rejects (fp4moe::Error) others.
  StepProfile(int64_t interval, int64_t warmup);

  // One step's times (StepProfiler::collect). Rejects a step not above the previous one's.
  void add_step(int64_t step, const StepTimes& t);

  int64_t steps() const { return all_.steps; }
  // The "interval" ranges in step order, then the "run" range; empty before the first step.
  std::vector<ProfileRow> rows() const;
  // The "run" range's rows alone.
  std::vector<ProfileRow> run_rows() const;
  // rows() as the table /train/<run>/profile (columns range, first_step, last_step, steps, module, pass, ms_per_step,
  // share, calls_per_step; attributes interval, warmup_steps, timing: how the times were taken).
  Table table() const;

  // One range's rows as the text the run prints: a heading naming the range, a header, then one line per row (no
  // newline at the end).
  static std::string format(const std::vector<ProfileRow>& rows);

 private:
  struct Range {
    int64_t first_step = 0, last_step = 0, steps = 0;
    std::array<double, kProfileKeys> ms{};
    std::array<int64_t, kProfileKeys> calls{};
    double total_ms = 0;
    void add(int64_t step, const StepTimes& t);
    std::vector<ProfileRow> rows(const std::string& range) const;
  };
  const Range& run_range() const { return after_warmup_.steps > 0 ? after_warmup_ : all_; }

  int64_t interval_, warmup_;
  std::vector<Range> intervals_;
  Range all_, after_warmup_;
};

}  // namespace fp4moe
