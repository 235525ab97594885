// GPU tests of the step profile (`fp4moe train --profile`: trainer/model/profile.h, trainer/train/step_profile.h) on
// the tiny configuration (configs/tiny.toml: one dense and one MoE layer, shared and routed experts, v3 router) with
// synthetic tokens:
//   - a profiled run under each recompute policy below gives, for every range, the rows that configuration runs
//     (each module's forward and backward, the recomputed ones under the policy, the optimizer's and the router's
//     update), each with a positive time and scopes opened; the rows sum to the step row (every interval of the
//     stream belongs to one row); the step row is at most the step's wall time and most of it; the intervals follow
//     the log interval; the result file holds the table;
//   - profiling changes nothing computed: the losses and gradient norms of a profiled run are bitwise those of the
//     same run without it (bf16, and fp8 / mxfp4 recipes under full recompute).
// Run: fp4moe_tests_gpu_trainer --gtest_filter='*StepProfileGpu*'
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "results/h5_read.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/trainer_options_test_util.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/train/trainer.h"

namespace fp4moe {
namespace {

using test::TempDir;

TrainerConfig tiny_config(const std::vector<std::string>& overrides) {
  std::vector<std::string> args = {"--config", test::preset("tiny"), "--train.eval_interval", "0"};
  args.insert(args.end(), overrides.begin(), overrides.end());
  return parse_config_args(args);
}

// test::quiet_options with the step profile on or off, a log line every 3 steps, 2 warm-up steps.
TrainerOptions profiled_options(const TempDir& dir, const std::string& out, bool profile) {
  TrainerOptions o = test::quiet_options(dir.file(out));
  o.profile = profile;
  o.log_interval = 3;
  o.profile_warmup = 2;
  return o;
}

using Key = std::pair<std::string, std::string>;  // (module, pass)

// The rows the tiny configuration must show under `recompute` (modules as in trainer/model/recompute.h).
std::set<Key> expected_rows(bool full) {
  std::set<Key> keys;
  for (const char* m : {"embedding", "rmsnorm", "mla_proj", "core_attn", "mla_other", "router", "moe_permute",
                        "routed_experts", "shared_experts", "dense_mlp", "lm_head_loss", "other"})
    for (const char* p : {"forward", "backward"}) keys.insert({m, p});
  keys.insert({"optimizer", "update"});
  keys.insert({"router", "update"});  // the v3 bias update
  if (full)
    for (const char* m : {"rmsnorm", "mla_proj", "core_attn", "mla_other", "routed_experts", "shared_experts",
                          "dense_mlp"})
      keys.insert({m, "recompute"});
  return keys;
}

struct Policy {
  const char* name;
  std::vector<std::string> overrides;
  bool full;
};

void PrintTo(const Policy& p, std::ostream* os) { *os << p.name; }

class StepProfileGpu : public ::testing::TestWithParam<Policy> {};

TEST_P(StepProfileGpu, RowsArePresentPositiveAndSumToTheStep) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  std::vector<std::string> overrides = {"--train.steps", "7"};
  overrides.insert(overrides.end(), GetParam().overrides.begin(), GetParam().overrides.end());
  const TrainerConfig cfg = tiny_config(overrides);
  TrainResult r;
  {
    Trainer trainer(cfg, profiled_options(dir, "run.h5", true));
    r = trainer.run();
  }
  ASSERT_EQ(r.steps.size(), 7u);
  ASSERT_FALSE(r.profile.empty());

  // Ranges: intervals 1-3, 4-6, 7 (log interval 3), then the run after 2 warm-up steps: 3-7.
  std::map<std::pair<std::string, int64_t>, std::vector<ProfileRow>> ranges;
  for (const ProfileRow& row : r.profile) ranges[{row.range, row.first_step}].push_back(row);
  ASSERT_EQ(ranges.size(), 4u);
  auto range = [&](const char* name, int64_t first) -> const ProfileRow& {
    const auto it = ranges.find(std::make_pair(std::string(name), first));
    EXPECT_TRUE(it != ranges.end()) << name << " from step " << first;
    static const ProfileRow none;
    return it == ranges.end() ? none : it->second.front();
  };
  for (const auto& [first, last] : std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {4, 6}, {7, 7}})
    EXPECT_EQ(range("interval", first).last_step, last) << first;
  EXPECT_EQ(range("run", 3).last_step, 7);
  EXPECT_EQ(range("run", 3).steps, 5);

  const std::set<Key> expected = expected_rows(GetParam().full);
  for (const auto& [key, rows] : ranges) {
    SCOPED_TRACE(key.first + " from step " + std::to_string(key.second));
    std::set<Key> seen;
    double sum = 0, step_ms = 0;
    for (const ProfileRow& row : rows) {
      if (row.module == "step") {
        step_ms = row.ms_per_step;
        continue;
      }
      seen.insert({row.module, row.pass});
      sum += row.ms_per_step;
      EXPECT_GE(row.ms_per_step, 0) << row.module << " " << row.pass;
      if (expected.count({row.module, row.pass})) {
        EXPECT_GT(row.ms_per_step, 0) << row.module << " " << row.pass;
        EXPECT_GT(row.share, 0) << row.module << " " << row.pass;
        EXPECT_GE(row.calls_per_step, 1) << row.module << " " << row.pass;
      }
    }
    for (const Key& k : expected) EXPECT_TRUE(seen.count(k)) << "missing row " << k.first << " " << k.second;
    EXPECT_GT(step_ms, 0);
    EXPECT_NEAR(sum, step_ms, 1e-6 * step_ms + 1e-4) << "the rows must add up to the step";

    // The step's events lie inside its wall time (steps first..last of the range).
    double wall_ms = 0;
    for (const StepRecord& s : r.steps)
      if (s.step >= rows.front().first_step && s.step <= rows.front().last_step)
        wall_ms += 1e3 * static_cast<double>(cfg.train.tokens_per_step()) / s.tokens_per_s;
    wall_ms /= static_cast<double>(rows.front().steps);
    EXPECT_LE(step_ms, wall_ms * 1.001 + 0.05) << "events cannot outlast the step";
    EXPECT_GE(step_ms, 0.7 * wall_ms) << "the events should cover most of the step";
  }

  // The result file holds the same table.
  const H5Reader h5(dir.file("run.h5"));
  const std::vector<double> ms = h5.read_f64("train/tiny/profile/ms_per_step");
  ASSERT_EQ(ms.size(), r.profile.size());
  for (size_t i = 0; i < ms.size(); ++i) EXPECT_EQ(ms[i], r.profile[i].ms_per_step) << "row " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Policies, StepProfileGpu,
    ::testing::Values(Policy{"none", {}, false}, Policy{"full", {"--recompute.modules", "full"}, true}),
    [](const ::testing::TestParamInfo<Policy>& p) { return std::string(p.param.name); });

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(StepProfileGpuLoss, ProfilingLeavesTheLossBitIdentical) {
  FP4MOE_REQUIRE_DEVICE();
  const std::vector<std::vector<std::string>> configs = {
      {},
      {"--recipe.attention", "fp8", "--recipe.dense_mlp", "fp8", "--recipe.routed_experts", "mxfp4",
       "--recompute.modules", "full"},
  };
  for (const std::vector<std::string>& more : configs) {
    SCOPED_TRACE(more.empty() ? std::string("bf16") : more[1] + " " + more[5]);
    TempDir dir;
    std::vector<std::string> overrides = {"--train.steps", "4"};
    overrides.insert(overrides.end(), more.begin(), more.end());
    const TrainerConfig cfg = tiny_config(overrides);
    TrainResult plain, profiled;
    {
      Trainer trainer(cfg, profiled_options(dir, "plain.h5", false));
      plain = trainer.run();
    }
    {
      Trainer trainer(cfg, profiled_options(dir, "profiled.h5", true));
      profiled = trainer.run();
    }
    EXPECT_TRUE(plain.profile.empty());
    EXPECT_FALSE(profiled.profile.empty());
    EXPECT_FALSE(H5Reader(dir.file("plain.h5")).has_dataset("train/tiny/profile/ms_per_step"));
    ASSERT_EQ(plain.steps.size(), 4u);
    ASSERT_EQ(profiled.steps.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      SCOPED_TRACE("step " + std::to_string(i + 1));
      EXPECT_TRUE(same_bits(plain.steps[i].loss, profiled.steps[i].loss))
          << plain.steps[i].loss << " vs " << profiled.steps[i].loss;
      EXPECT_TRUE(same_bits(plain.steps[i].grad_norm, profiled.steps[i].grad_norm))
          << plain.steps[i].grad_norm << " vs " << profiled.steps[i].grad_norm;
    }
  }
}

}  // namespace
}  // namespace fp4moe
