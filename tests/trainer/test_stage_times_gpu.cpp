// Measuring a stage time on the GPU (trainer/memory/stage_measure.h) through the fp4moe executable of this build
// (beside the tests folder: build/fp4moe): one dense layer of tiny gives a positive time per micro-batch, saved to the
// cache; a second call over the reloaded cache runs nothing.
// Run: fp4moe_tests_gpu_trainer --gtest_filter='StageTimesGpu*'
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "tests/common/temp_dir.h"
#include "tests/common/trainer_test_util.h"
#include "results/env_info.h"
#include "trainer/config.h"
#include "trainer/memory/stage_measure.h"
#include "trainer/memory/stage_times.h"

namespace fp4moe {
namespace {

TEST(StageTimesGpu, TinyDenseLayerIsMeasuredOnceThenCached) {
  FP4MOE_REQUIRE_DEVICE();
  std::error_code ec;
  const std::filesystem::path exe =
      std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().parent_path() / "fp4moe";
  if (ec || !std::filesystem::exists(exe)) GTEST_SKIP() << "no fp4moe executable at " << exe << " (build it)";
  test::TempDir dir;
  const TrainerConfig tiny = parse_config_args({"--config", test::preset("tiny")});
  StageTimeKey key;
  key.gpu = query_env_info().gpus.at(0).name;
  key.model = model_shape_hash(tiny);
  key.recipe = "bf16";
  key.policy = "none";
  key.kind = LayerKind::dense;
  key.micro_batch = tiny.train.micro_batch;
  key.seq_len = tiny.train.seq_len;
  MeasureSettings settings;
  settings.exe = exe.string();
  settings.work_dir = dir.path().string();
  int64_t runs = 0;
  const MeasureFn run = [&](const TrainerConfig& cfg, const std::string& name) {
    ++runs;
    return run_stage_measurement(cfg, settings, name);
  };
  StageTimeCache cache(dir.file("times.tsv"));
  EXPECT_EQ(measure_stage_times(tiny, {key}, cache, settings, run), 1);
  const StageTimeEntry* e = cache.find(key);
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(e->measured()) << e->failure;
  EXPECT_GT(e->seconds, 0);
  EXPECT_LT(e->seconds, 1.0);  // one layer of 4 x 64 tokens

  StageTimeCache again = StageTimeCache::load(dir.file("times.tsv"));
  EXPECT_EQ(measure_stage_times(tiny, {key}, again, settings, run), 0);
  EXPECT_EQ(runs, 1);
  ASSERT_NE(again.find(key), nullptr);
  EXPECT_NEAR(again.find(key)->seconds, e->seconds, 1e-8 * e->seconds);  // saved with 9 digits
}

}  // namespace
}  // namespace fp4moe
