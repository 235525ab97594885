// The step profile without a GPU: ProfileTimeline's attribution of a step's boundaries to the innermost scope
// (trainer/model/profile.h) on hand-made times, ProfileScope off (no profiler, or no step open), StepProfile's ranges and rows (trainer/train/step_profile.h), the
// printed table, /train/<run>/profile in the result file (trainer/train/metrics.h) and a resumed run continuing such
// a file, and the --profile options of `fp4moe train`. StepProfiler's events run on the GPU:
// tests/trainer/test_step_profile_gpu.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "results/h5_read.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/model/context.h"
#include "trainer/model/profile.h"
#include "trainer/train/command_line.h"
#include "trainer/train/metrics.h"
#include "trainer/train/step_profile.h"

namespace fp4moe {
namespace {

using test::expect_error_with;
using test::TempDir;

constexpr ProfileModule kInheritModule = ProfileModule::inherit;
constexpr ProfilePass kInheritPass = ProfilePass::inherit;

double ms_of(const StepTimes& t, ProfileModule m, ProfilePass p) { return t.ms[profile_key(m, p)]; }
int64_t calls_of(const StepTimes& t, ProfileModule m, ProfilePass p) { return t.calls[profile_key(m, p)]; }

// A forward with a nested scope, a backward with a recompute that inherits its module, and a gap outside any scope:
//   t=0 begin | 1 open(other, forward) | 2 open(router) | 5 close | 6 close | 8 open(mla_other, backward)
//   | 9 open(inherit, recompute) | 10 open(mla_proj, inherit) | 14 close | 15 close | 17 close | 20 end
TEST(ProfileTimeline, TimeGoesToTheInnermostScope) {
  ProfileTimeline tl;
  tl.begin();
  tl.open(ProfileModule::other, ProfilePass::forward);
  tl.open(ProfileModule::router, kInheritPass);
  EXPECT_EQ(tl.depth(), 2u);
  tl.close();
  tl.close();
  tl.open(ProfileModule::mla_other, ProfilePass::backward);
  tl.open(kInheritModule, ProfilePass::recompute);
  tl.open(ProfileModule::mla_proj, kInheritPass);
  tl.close();
  tl.close();
  tl.close();
  tl.end();
  ASSERT_EQ(tl.boundaries(), 12u);
  const std::vector<double> times = {0, 1, 2, 5, 6, 8, 9, 10, 14, 15, 17, 20};
  const StepTimes t = tl.attribute(times);

  EXPECT_DOUBLE_EQ(t.total_ms, 20);
  EXPECT_DOUBLE_EQ(ms_of(t, ProfileModule::other, ProfilePass::none), 1 + 2 + 3);  // [0,1] [6,8] [17,20]
  EXPECT_DOUBLE_EQ(ms_of(t, ProfileModule::other, ProfilePass::forward), 1 + 1);   // [1,2] [5,6]
  EXPECT_DOUBLE_EQ(ms_of(t, ProfileModule::router, ProfilePass::forward), 3);      // inherits the pass
  EXPECT_DOUBLE_EQ(ms_of(t, ProfileModule::mla_other, ProfilePass::backward), 1 + 2);
  EXPECT_DOUBLE_EQ(ms_of(t, ProfileModule::mla_other, ProfilePass::recompute), 1 + 1);  // inherits the module
  EXPECT_DOUBLE_EQ(ms_of(t, ProfileModule::mla_proj, ProfilePass::recompute), 4);       // inherits the pass
  EXPECT_DOUBLE_EQ(std::accumulate(t.ms.begin(), t.ms.end(), 0.0), t.total_ms);
  EXPECT_EQ(calls_of(t, ProfileModule::router, ProfilePass::forward), 1);
  EXPECT_EQ(calls_of(t, ProfileModule::mla_proj, ProfilePass::recompute), 1);
  EXPECT_EQ(calls_of(t, ProfileModule::other, ProfilePass::none), 0);
  EXPECT_EQ(calls_of(t, ProfileModule::router, ProfilePass::backward), 0);
}

TEST(ProfileTimeline, AScopeOutsideEveryOtherInheritsOtherAndNone) {
  ProfileTimeline tl;
  tl.begin();
  tl.open(ProfileModule::embedding, kInheritPass);
  tl.close();
  tl.end();
  const StepTimes t = tl.attribute(std::vector<double>{0, 0.5, 2, 2});
  EXPECT_DOUBLE_EQ(ms_of(t, ProfileModule::embedding, ProfilePass::none), 1.5);
  EXPECT_DOUBLE_EQ(ms_of(t, ProfileModule::other, ProfilePass::none), 0.5);
  // A new step starts from nothing: calls and boundaries of the last one are gone.
  tl.begin();
  tl.end();
  EXPECT_EQ(tl.boundaries(), 2u);
  EXPECT_EQ(tl.attribute(std::vector<double>{0, 3}).calls[profile_key(ProfileModule::embedding, ProfilePass::none)],
            0);
}

TEST(ProfileTimeline, MisuseIsRefused) {
  ProfileTimeline tl;
  expect_error_with([&] { tl.open(ProfileModule::router, ProfilePass::forward); }, {"no step is open"});
  expect_error_with([&] { tl.end(); }, {"no step is open"});
  expect_error_with([&] { tl.attribute(std::vector<double>{0, 1}); }, {"has not ended"});
  tl.begin();
  expect_error_with([&] { tl.begin(); }, {"a step is open"});
  expect_error_with([&] { tl.close(); }, {"no scope is open"});
  tl.open(ProfileModule::router, ProfilePass::forward);
  expect_error_with([&] { tl.end(); }, {"1 scope(s) still open", "router / forward"});
  tl.begin(/*restart=*/true);  // a step an exception left open
  EXPECT_EQ(tl.depth(), 0u);
  tl.open(ProfileModule::core_attn, ProfilePass::backward);
  tl.close();
  tl.end();
  expect_error_with([&] { tl.attribute(std::vector<double>{0, 1, 2}); }, {"3 times for 4 boundaries"});
  expect_error_with([&] { tl.attribute(std::vector<double>{0, 2, 1, 3}); },
                    {"boundary 2 at 1 ms precedes boundary 1 at 2 ms"});
}

// Off, a scope records nothing and calls no CUDA function: without a profiler, and with one outside a step (as in an
// evaluation between steps). Neither needs a device.
TEST(ProfileScope, OutsideAStepItRecordsNothing) {
  ModelContext ctx;
  { ProfileScope s(ctx, ProfileModule::router, ProfilePass::forward); }
  StepProfiler profiler(nullptr);
  ctx.profiler = &profiler;
  {
    ProfileScope s(ctx, ProfileModule::router, ProfilePass::forward);
    ProfileScope inner(ctx, ProfileModule::mla_proj);
    inner.end();
    inner.end();  // once only
  }
  EXPECT_FALSE(profiler.in_step());
  expect_error_with([&] { profiler.collect(); }, {"no step has ended"});
}

TEST(ProfileNames, EveryModuleAndPassHasOneName) {
  std::vector<std::string> names;
  for (size_t m = 0; m < kProfileModules; ++m) names.emplace_back(profile_module_name(static_cast<ProfileModule>(m)));
  EXPECT_EQ(names.front(), "embedding");
  EXPECT_EQ(names.back(), "other");
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "a module name is used twice";
  EXPECT_EQ(profile_pass_name(ProfilePass::recompute), "recompute");
  EXPECT_EQ(profile_pass_name(ProfilePass::none), "-");
  expect_error_with([] { profile_module_name(ProfileModule::inherit); }, {"is not a module"});
  expect_error_with([] { profile_pass_name(ProfilePass::count); }, {"is not a pass"});
  for (size_t k = 0; k < kProfileKeys; ++k)
    EXPECT_EQ(profile_key(profile_key_module(k), profile_key_pass(k)), k);
}

// A step of `scale` x (router forward 2 ms, core_attn backward 3 ms twice, other 1 ms): 9 ms in all.
StepTimes fake_step(double scale) {
  StepTimes t;
  t.ms[profile_key(ProfileModule::router, ProfilePass::forward)] = 2 * scale;
  t.calls[profile_key(ProfileModule::router, ProfilePass::forward)] = 1;
  t.ms[profile_key(ProfileModule::core_attn, ProfilePass::backward)] = 6 * scale;
  t.calls[profile_key(ProfileModule::core_attn, ProfilePass::backward)] = 2;
  t.ms[profile_key(ProfileModule::other, ProfilePass::none)] = 1 * scale;
  t.total_ms = 9 * scale;
  return t;
}

const ProfileRow& row_of(const std::vector<ProfileRow>& rows, const std::string& range, int64_t first,
                         const std::string& module, const std::string& pass) {
  for (const ProfileRow& r : rows)
    if (r.range == range && r.first_step == first && r.module == module && r.pass == pass) return r;
  ADD_FAILURE() << "no row " << range << " " << first << " " << module << " " << pass;
  static const ProfileRow none;
  return none;
}

TEST(StepProfile, RangesAreLogIntervalsAndTheRunAfterWarmUp) {
  StepProfile p(/*interval=*/3, /*warmup=*/2);
  EXPECT_TRUE(p.rows().empty());
  for (int64_t s = 1; s <= 7; ++s) p.add_step(s, fake_step(static_cast<double>(s)));
  const std::vector<ProfileRow> rows = p.rows();
  // Per range: router forward, core_attn backward, other -, step -.
  ASSERT_EQ(rows.size(), 4u * 4u);
  const std::vector<std::pair<int64_t, int64_t>> intervals = {{1, 3}, {4, 6}, {7, 7}};
  for (size_t i = 0; i < intervals.size(); ++i) {
    EXPECT_EQ(rows[4 * i].range, "interval");
    EXPECT_EQ(rows[4 * i].first_step, intervals[i].first);
    EXPECT_EQ(rows[4 * i].last_step, intervals[i].second);
  }
  // ProfileModule order: core_attn comes before router.
  EXPECT_EQ(rows[0].module, "core_attn");
  EXPECT_EQ(rows[1].module, "router");
  EXPECT_EQ(rows[2].module, "other");
  EXPECT_EQ(rows[3].module, "step");

  // Steps 4-6: scales 4, 5, 6 -> router 2 * 5 ms per step, core_attn 6 * 5, 2 calls per step; shares of 9.
  const ProfileRow& router = row_of(rows, "interval", 4, "router", "forward");
  EXPECT_EQ(router.steps, 3);
  EXPECT_DOUBLE_EQ(router.ms_per_step, 10);
  EXPECT_DOUBLE_EQ(router.share, 2.0 / 9.0);
  EXPECT_DOUBLE_EQ(router.calls_per_step, 1);
  EXPECT_DOUBLE_EQ(row_of(rows, "interval", 4, "core_attn", "backward").calls_per_step, 2);
  EXPECT_DOUBLE_EQ(row_of(rows, "interval", 4, "step", "-").ms_per_step, 45);
  EXPECT_DOUBLE_EQ(row_of(rows, "interval", 4, "step", "-").share, 1);
  EXPECT_DOUBLE_EQ(row_of(rows, "interval", 4, "other", "-").calls_per_step, 0);

  // The run: steps 3-7 (the first two are warm-up): scales 3..7, mean 5.
  const std::vector<ProfileRow> run = p.run_rows();
  ASSERT_EQ(run.size(), 4u);
  EXPECT_EQ(run[0].range, "run");
  EXPECT_EQ(run[0].first_step, 3);
  EXPECT_EQ(run[0].last_step, 7);
  EXPECT_EQ(run[0].steps, 5);
  EXPECT_DOUBLE_EQ(row_of(run, "run", 3, "step", "-").ms_per_step, 45);
  double shares = 0;
  for (const ProfileRow& r : run)
    if (r.module != "step") shares += r.share;
  EXPECT_NEAR(shares, 1.0, 1e-12);
  EXPECT_EQ(rows.back().range, "run");  // rows(): the intervals' 12 rows, then the run's 4
}

TEST(StepProfile, AResumedRunKeepsTheIntervalGridAndAShortRunIsAllWarmUp) {
  StepProfile p(/*interval=*/10, /*warmup=*/5);
  for (int64_t s = 8; s <= 12; ++s) p.add_step(s, fake_step(1));  // resumed after step 7
  const std::vector<ProfileRow> rows = p.rows();
  EXPECT_EQ(row_of(rows, "interval", 8, "step", "-").last_step, 10);
  EXPECT_EQ(row_of(rows, "interval", 11, "step", "-").last_step, 12);
  // Five steps, all warm-up: the run's range is all of them.
  const ProfileRow& run = row_of(rows, "run", 8, "step", "-");
  EXPECT_EQ(run.last_step, 12);
  EXPECT_EQ(run.steps, 5);
  expect_error_with([&] { p.add_step(12, fake_step(1)); }, {"step 12 does not follow step 12"});
  expect_error_with([] { StepProfile(0, 1); }, {"interval must be >= 1"});
  expect_error_with([] { StepProfile(1, -1); }, {"warm-up must be >= 0"});
}

TEST(StepProfile, TheTextTableNamesTheRangeAndEveryRow) {
  StepProfile p(10, 0);
  EXPECT_EQ(StepProfile::format(p.run_rows()), "step profile: no step was profiled");
  p.add_step(1, fake_step(1));
  p.add_step(2, fake_step(3));
  const std::string text = StepProfile::format(p.run_rows());
  EXPECT_NE(text.find("step profile (run range), steps 1-2 (2 steps)"), std::string::npos) << text;
  EXPECT_NE(text.find("  router           forward           4.000   22.2%         1.0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  core_attn        backward         12.000   66.7%         2.0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  step             -                18.000  100.0%         0.0"), std::string::npos) << text;
  EXPECT_NE(text.back(), '\n');
}

TrainerConfig tiny_cfg() { return parse_config_args({"--config", test::preset("tiny")}); }

TEST(StepProfile, TheResultFileHoldsTheTableUnderTheRun) {
  TempDir dir;
  const TrainerConfig cfg = tiny_cfg();
  StepProfile p(2, 1);
  for (int64_t s = 1; s <= 3; ++s) p.add_step(s, fake_step(static_cast<double>(s)));
  TrainMetrics m("tiny", train_run_attributes(cfg), "fp4moe train --profile", EnvInfo{});
  StepRecord r;
  r.step = 1;
  m.add_step(r);
  const std::string without = dir.file("without.h5"), with = dir.file("with.h5");
  m.write(without);
  EXPECT_FALSE(H5Reader(without).has_dataset("train/tiny/profile/module"));  // off: no table
  m.set_profile(p.table());
  m.write(with);

  const H5Reader h5(with);
  const std::string t = "train/tiny/profile/";
  for (const char* c : {"range", "module", "pass"}) EXPECT_TRUE(h5.has_dataset(t + c)) << c;
  const std::vector<double> first = h5.read_f64(t + "first_step"), ms = h5.read_f64(t + "ms_per_step");
  const std::vector<double> share = h5.read_f64(t + "share"), calls = h5.read_f64(t + "calls_per_step");
  // Intervals 1-2 and 3, then the run 2-3: 4 rows each.
  ASSERT_EQ(first, (std::vector<double>{1, 1, 1, 1, 3, 3, 3, 3, 2, 2, 2, 2}));
  EXPECT_EQ(h5.read_f64(t + "last_step"), (std::vector<double>{2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3}));
  EXPECT_EQ(h5.read_f64(t + "steps"), (std::vector<double>{2, 2, 2, 2, 1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_DOUBLE_EQ(ms[0], 6 * 1.5);  // core_attn backward of steps 1-2: 6 x mean scale 1.5
  EXPECT_DOUBLE_EQ(ms[11], 9 * 2.5);  // the run's step total: steps 2-3
  EXPECT_DOUBLE_EQ(share[1], 2.0 / 9.0);
  EXPECT_DOUBLE_EQ(calls[0], 2);
  const auto timing = h5.string_attribute("train/tiny/profile", "timing");
  ASSERT_TRUE(timing.has_value());
  EXPECT_NE(timing->find("CUDA events"), std::string::npos);
}

TEST(StepProfile, AResumedRunContinuesAFileWithAProfile) {
  TempDir dir;
  const TrainerConfig cfg = tiny_cfg();
  StepProfile p(10, 0);
  p.add_step(1, fake_step(1));
  TrainMetrics m("tiny", train_run_attributes(cfg), "fp4moe train --profile", EnvInfo{});
  StepRecord r;
  r.step = 1;
  m.add_step(r);
  m.set_profile(p.table());
  const std::string out = dir.file("run.h5");
  m.write(out);
  CheckpointState st;
  st.config_hash = model_config_hash(cfg);
  st.step = 1;
  const std::string ckpt = dir.file(checkpoint_file_name(1));
  write_checkpoint(ckpt, st, {});
  const TrainRequest resumed = parse_train_command(
      {"--config", test::preset("tiny"), "--synthetic-data", "--resume", ckpt, "--out", out, "--profile"});
  EXPECT_FALSE(resumed.options.replace_out);  // continued, not refused as a file of other results
}

TEST(StepProfile, TheCommandLineOptions) {
  const std::vector<std::string> base = {"--config", test::preset("tiny"), "--synthetic-data"};
  auto with = [&](std::initializer_list<std::string> more) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more);
    return args;
  };
  const TrainRequest off = parse_train_command(base);
  EXPECT_FALSE(off.options.profile);
  EXPECT_EQ(off.options.profile_warmup, 2);
  const TrainRequest on = parse_train_command(with({"--profile", "--profile-warmup", "0"}));
  EXPECT_TRUE(on.options.profile);
  EXPECT_EQ(on.options.profile_warmup, 0);
  expect_error_with([&] { parse_train_command(with({"--profile-warmup", "3"})); },
                    {"--profile-warmup applies with --profile only"});
  expect_error_with([&] { parse_train_command(with({"--profile", "--profile-warmup", "-1"})); },
                    {"--profile-warmup must be >= 0 steps, got -1"});
}

}  // namespace
}  // namespace fp4moe
