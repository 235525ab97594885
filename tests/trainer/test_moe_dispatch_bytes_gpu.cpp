// GPU tests of the expert dispatch payload hook (trainer/model/moe_experts.h MoeRoutedExperts::dispatch_bytes,
// Model::dispatch_bytes, trainer/train/metrics.h set_dispatch_attributes):
//   - per routed token, from the recipe's row layout of the dispatch buffers: bf16 2 d bytes; fp8 d bytes of E4M3
//     plus the FP32 1x128 row scales of fc1's FP8 row buffer (padded to 4 rows: R = 10 rows give 12 scale rows);
//     mxfp4 d/2 code and d/32 scale bytes; at the DeepSeek-V3 and V2 hidden sizes (7168, 5120) and at 64;
//   - the tiny model reports one entry per MoE layer, and a one-step training run writes the dispatch_* attributes
//     into /memory/<run>.
// Run: fp4moe_tests_gpu --gtest_filter='MoeDispatchBytes*'
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "kernels/quant/layouts.h"
#include "results/h5_read.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/model.h"
#include "trainer/model/moe_experts.h"
#include "trainer/model/params.h"
#include "trainer/train/trainer.h"

namespace fp4moe {
namespace {

DispatchBytes experts_dispatch(int64_t d, Recipe recipe, int64_t max_tokens, int64_t k) {
  DeviceMemory mem;
  ParamStore store;
  MoeRoutedExperts experts(store, "layers.1.moe", /*E=*/4, d, /*f=*/64, k, recipe, 0.01f, max_tokens, mem);
  return experts.dispatch_bytes();
}

TEST(MoeDispatchBytes, PerRoutedTokenFromTheRecipesBuffers) {
  FP4MOE_REQUIRE_DEVICE();
  for (const int64_t d : {int64_t{64}, int64_t{5120}, int64_t{7168}}) {
    SCOPED_TRACE("d = " + std::to_string(d));
    const int64_t max_tokens = 5, k = 2, R = max_tokens * k;  // 10 rows: the FP8 scales pad to 12
    const DispatchBytes bf16 = experts_dispatch(d, Recipe::bf16, max_tokens, k);
    EXPECT_EQ(bf16.payload, 2.0 * static_cast<double>(d));
    EXPECT_EQ(bf16.scales, 0.0);

    const DispatchBytes fp8 = experts_dispatch(d, Recipe::fp8, max_tokens, k);
    const int64_t blocks = (d + 127) / 128;
    EXPECT_EQ(fp8.payload, static_cast<double>(d));
    EXPECT_DOUBLE_EQ(fp8.scales, 4.0 * static_cast<double>(blocks * 12) / static_cast<double>(R));
    EXPECT_EQ(fp8_row_scale_count(R, d), blocks * 12);

    const DispatchBytes mx = experts_dispatch(d, Recipe::mxfp4, max_tokens, k);
    EXPECT_EQ(mx.payload, static_cast<double>(d) / 2);
    EXPECT_EQ(mx.scales, static_cast<double>(d) / 32);
    EXPECT_EQ(mx.total(), static_cast<double>(d) * 17 / 32);
  }
  // With R a multiple of 4 (every trainer shape: 4096 tokens x top-k) the FP8 scales are exactly 4 d / 128.
  const DispatchBytes fp8 = experts_dispatch(7168, Recipe::fp8, 8, 2);
  EXPECT_EQ(fp8.scales, 4.0 * 7168 / 128);
  EXPECT_EQ(experts_dispatch(7168, Recipe::bf16, 0, 2).total(), 0.0);  // no rows: nothing to count
}

TEST(MoeDispatchBytes, ModelReportsEachMoeLayerAndTheRunWritesThem) {
  FP4MOE_REQUIRE_DEVICE();
  const TrainerConfig cfg =
      parse_config_args({"--config", test::preset("tiny"), "--recipe.routed_experts", "mxfp4", "--train.steps", "1",
                         "--train.warmup_steps", "0", "--train.eval_interval", "0"});
  {
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    {
      DeviceMemory mem;
      Model model(cfg, mem, stream);
      const std::vector<DispatchBytes> layers = model.dispatch_bytes();
      ASSERT_EQ(layers.size(), 1u);  // tiny: one dense layer, one MoE layer
      EXPECT_EQ(layers[0].payload, 32.0);
      EXPECT_EQ(layers[0].scales, 2.0);
    }
    cudaStreamDestroy(stream);
  }

  test::TempDir dir;
  TrainerOptions o;
  o.synthetic_data = true;
  o.log = nullptr;
  o.handle_signals = false;
  o.run_name = "tiny";
  o.out_path = dir.file("run.h5");
  Trainer trainer(cfg, o);
  trainer.run();
  const H5Reader r(o.out_path);
  EXPECT_EQ(r.string_attribute("memory/tiny", "dispatch_recipe"), "mxfp4");
}

}  // namespace
}  // namespace fp4moe
