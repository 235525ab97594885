#include "trainer/train/step_profile.h"

#include <fmt/format.h>

#include "kernels/common/check.h"

namespace fp4moe {

StepProfile::StepProfile(int64_t interval, int64_t warmup) : interval_(interval), warmup_(warmup) {
  FP4MOE_CHECK(interval >= 1, "StepProfile: the interval must be >= 1 step (the log interval), got {}", interval);
  FP4MOE_CHECK(warmup >= 0, "StepProfile: the warm-up must be >= 0 steps, got {}", warmup);
}

void StepProfile::Range::add(int64_t step, const StepTimes& t) {
  if (steps == 0) first_step = step;
  last_step = step;
  ++steps;
  for (size_t k = 0; k < kProfileKeys; ++k) {
    ms[k] += t.ms[k];
    calls[k] += t.calls[k];
  }
  total_ms += t.total_ms;
}

void StepProfile::add_step(int64_t step, const StepTimes& t) {
  FP4MOE_CHECK(all_.steps == 0 || step > all_.last_step, "StepProfile add_step: step {} does not follow step {}", step,
               all_.last_step);
  const int64_t grid = (step - 1) / interval_;  // the interval holding this step
  if (intervals_.empty() || (intervals_.back().last_step - 1) / interval_ != grid) intervals_.emplace_back();
  intervals_.back().add(step, t);
  if (all_.steps >= warmup_) after_warmup_.add(step, t);
  all_.add(step, t);
}

std::vector<ProfileRow> StepProfile::Range::rows(const std::string& range) const {
  std::vector<ProfileRow> out;
  if (steps == 0) return out;
  const double n = static_cast<double>(steps);
  auto row = [&](std::string module, std::string pass, double sum_ms, int64_t calls) {
    out.push_back({range, first_step, last_step, steps, std::move(module), std::move(pass), sum_ms / n,
                   total_ms > 0 ? sum_ms / total_ms : 0.0, static_cast<double>(calls) / n});
  };
  for (size_t k = 0; k < kProfileKeys; ++k)
    if (calls[k] > 0 || ms[k] > 0)
      row(std::string(profile_module_name(profile_key_module(k))), std::string(profile_pass_name(profile_key_pass(k))),
          ms[k], calls[k]);
  row("step", std::string(profile_pass_name(ProfilePass::none)), total_ms, 0);
  return out;
}

std::vector<ProfileRow> StepProfile::run_rows() const { return run_range().rows("run"); }

std::vector<ProfileRow> StepProfile::rows() const {
  std::vector<ProfileRow> out;
  for (const Range& r : intervals_)
    for (ProfileRow& row : r.rows("interval")) out.push_back(std::move(row));
  for (ProfileRow& row : run_rows()) out.push_back(std::move(row));
  return out;
}

Table StepProfile::table() const {
  Table t;
  t.add_column("range", ColumnType::str).add_column("first_step", ColumnType::i64);
  t.add_column("last_step", ColumnType::i64).add_column("steps", ColumnType::i64);
  t.add_column("module", ColumnType::str).add_column("pass", ColumnType::str);
  t.add_column("ms_per_step", ColumnType::f64).add_column("share", ColumnType::f64);
  t.add_column("calls_per_step", ColumnType::f64);
  for (const ProfileRow& r : rows())
    t.add_row({r.range, r.first_step, r.last_step, r.steps, r.module, r.pass, r.ms_per_step, r.share,
               r.calls_per_step});
  t.set_attribute("interval", interval_);
  t.set_attribute("warmup_steps", warmup_);
  t.set_attribute("timing", std::string("CUDA events on the training stream around each module's scope; a scope's "
                                        "time excludes its nested scopes'; other: time inside no module's scope; "
                                        "step: first to last event of the step (trainer/model/profile.h)"));
  return t;
}

std::string StepProfile::format(const std::vector<ProfileRow>& rows) {
  if (rows.empty()) return "step profile: no step was profiled";
  const ProfileRow& head = rows.front();
  std::string out = fmt::format("step profile ({} range), steps {}-{} ({} steps), GPU stream time per step:\n",
                                head.range, head.first_step, head.last_step, head.steps);
  out += fmt::format("  {:<16} {:<10} {:>12} {:>7} {:>11}", "module", "pass", "ms/step", "share", "calls/step");
  for (const ProfileRow& r : rows)
    out += fmt::format("\n  {:<16} {:<10} {:>12.3f} {:>6.1f}% {:>11.1f}", r.module, r.pass, r.ms_per_step,
                       100.0 * r.share, r.calls_per_step);
  return out;
}

}  // namespace fp4moe
