// The expert dispatch payload in a run's metrics file (trainer/train/metrics.h set_dispatch_attributes): the
// dispatch_* attributes of /memory/<run> as the reproduction suite's comm_volume scenario reads them, read back
// with the HDF5 C API (numbers) and results/h5_read.h (text); nothing for a dense model; layers that disagree and
// the allocator's own budget_bytes refused.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <optional>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "results/h5_read.h"
#include "results/h5_util.h"
#include "trainer/config.h"
#include "trainer/model/moe_experts.h"
#include "trainer/train/metrics.h"

namespace fp4moe {
namespace {

using test::expect_error_with;
using test::TempDir;

TrainMetrics one_step_run(const TrainerConfig& cfg) {
  TrainMetrics m("tiny", train_run_attributes(cfg), "fp4moe train --config configs/tiny.toml", EnvInfo{});
  StepRecord r;
  r.step = 1;
  r.tokens = cfg.train.tokens_per_step();
  r.loss = 10.0;
  m.add_step(r);
  return m;
}

// A numeric attribute of a group, as float64 (nullopt when absent).
std::optional<double> number_attribute(const std::string& path, const std::string& object, const std::string& name) {
  h5::ErrorSilencer quiet;
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  EXPECT_TRUE(file.valid()) << path;
  if (!file.valid() || H5Aexists_by_name(file.get(), object.c_str(), name.c_str(), H5P_DEFAULT) <= 0)
    return std::nullopt;
  h5::Handle attr(H5Aopen_by_name(file.get(), object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  double v = 0;
  EXPECT_GE(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v), 0) << object << " " << name;
  return v;
}

TEST(TrainDispatchMetrics, MemoryGroupCarriesThePayloadPerRoutedToken) {
  TempDir dir;
  // tiny: hidden 64, top-2, 2 layers (1 MoE), 4 x 64 = 256 tokens per step.
  const TrainerConfig cfg = parse_config_args({"--config", test::preset("tiny"), "--recipe.routed_experts", "mxfp4"});
  ASSERT_EQ(cfg.train.tokens_per_step(), 256);
  TrainMetrics m = one_step_run(cfg);
  set_dispatch_attributes(m, cfg, {DispatchBytes{32.0, 2.0}});
  const std::string path = dir.file("run.h5");
  m.write(path);

  EXPECT_EQ(H5Reader(path).string_attribute("memory/tiny", "dispatch_recipe"), "mxfp4");
  EXPECT_EQ(number_attribute(path, "memory/tiny", "dispatch_hidden"), 64.0);
  EXPECT_EQ(number_attribute(path, "memory/tiny", "dispatch_top_k"), 2.0);
  EXPECT_EQ(number_attribute(path, "memory/tiny", "dispatch_moe_layers"), 1.0);
  EXPECT_EQ(number_attribute(path, "memory/tiny", "dispatch_payload_bytes_per_token"), 32.0);
  EXPECT_EQ(number_attribute(path, "memory/tiny", "dispatch_scale_bytes_per_token"), 2.0);
  EXPECT_EQ(number_attribute(path, "memory/tiny", "dispatch_bytes_per_token"), 34.0);
  EXPECT_EQ(number_attribute(path, "memory/tiny", "dispatch_bytes_per_step"), 34.0 * 256 * 2 * 1);
  EXPECT_EQ(number_attribute(path, "memory/tiny", "budget_bytes"), 0.0);  // still the allocator's
}

TEST(TrainDispatchMetrics, PerStepCountsEveryMoeLayerAndFractionalScaleBytes) {
  TempDir dir;
  const TrainerConfig cfg = parse_config_args({"--config", test::preset("tiny"), "--recipe.routed_experts", "fp8"});
  TrainMetrics m = one_step_run(cfg);
  // fp8 rows of 64 elements, R = 10 rows: 4 * ceil(64/128) * round_up(10, 4) / 10 = 4.8 scale bytes per row.
  const DispatchBytes layer{64.0, 4.8};
  set_dispatch_attributes(m, cfg, {layer, layer, layer});
  const std::string path = dir.file("run.h5");
  m.write(path);
  EXPECT_EQ(H5Reader(path).string_attribute("memory/tiny", "dispatch_recipe"), "fp8");
  EXPECT_EQ(number_attribute(path, "memory/tiny", "dispatch_moe_layers"), 3.0);
  EXPECT_EQ(number_attribute(path, "memory/tiny", "dispatch_scale_bytes_per_token"), 4.8);
  EXPECT_DOUBLE_EQ(*number_attribute(path, "memory/tiny", "dispatch_bytes_per_step"), (64.0 + 4.8) * 256 * 2 * 3);
}

TEST(TrainDispatchMetrics, DenseModelGetsNoAttributes) {
  TempDir dir;
  const TrainerConfig cfg = parse_config_args({"--config", test::preset("tiny")});
  TrainMetrics m = one_step_run(cfg);
  set_dispatch_attributes(m, cfg, {});
  const std::string path = dir.file("run.h5");
  m.write(path);
  EXPECT_FALSE(H5Reader(path).string_attribute("memory/tiny", "dispatch_recipe").has_value());
  EXPECT_FALSE(number_attribute(path, "memory/tiny", "dispatch_bytes_per_token").has_value());
}

TEST(TrainDispatchMetrics, RejectsLayersThatDisagreeAndTheBudgetAttribute) {
  const TrainerConfig cfg = parse_config_args({"--config", test::preset("tiny")});
  TrainMetrics m = one_step_run(cfg);
  expect_error_with([&] { set_dispatch_attributes(m, cfg, {DispatchBytes{128, 0}, DispatchBytes{64, 0}}); },
                    {"MoE layer 1", "every MoE layer has one shape and recipe"});
  expect_error_with([&] { m.set_memory_attribute("budget_bytes", int64_t{1}); }, {"budget_bytes"});
}

}  // namespace
}  // namespace fp4moe
