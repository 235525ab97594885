// The buffer plans (trainer/memory/buffer_plan.h): the plan type's own rules, and the layers' plans as the
// estimator reads them (one statement of every buffer: the estimator's terms are the plans' entries).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/buffer_plan.h"
#include "trainer/memory/estimate.h"
#include "trainer/model/decoder_layer.h"
#include "trainer/model/group_linear.h"
#include "trainer/model/linear.h"
#include "trainer/model/moe_experts.h"

namespace fp4moe {
namespace {

using test::error_message;

TEST(BufferPlan, CountsHeldBuffersAsDeviceMemoryDoes) {
  BufferPlan p("mla");
  p.add("q", 100, ElemType::bf16)                                   // 200 bytes -> 256
      .add("lse", 64, ElemType::fp32, /*held=*/false)              // not held: 0
      .add("copy", 300, ElemType::e4m3, true, MemCategory::activations, Lifetime::first_forward)
      .add("w", 10, ElemType::e4m3, true, MemCategory::weights, Lifetime::first_forward)
      .add("none", 0, ElemType::bf16);
  EXPECT_EQ(p.at("q").bytes(), 200);
  EXPECT_EQ(p.at("q").counted_bytes(), 256);
  EXPECT_EQ(p.at("lse").bytes(), 256);
  EXPECT_EQ(p.at("lse").counted_bytes(), 0);
  EXPECT_EQ(p.at("none").counted_bytes(), 0);
  EXPECT_EQ(p.counted_bytes(MemCategory::activations), 256);
  EXPECT_EQ(p.counted_bytes(MemCategory::activations, Lifetime::first_forward), 512);
  EXPECT_EQ(p.counted_bytes(MemCategory::weights, Lifetime::first_forward), 256);
}

TEST(BufferPlan, RejectsDuplicatesNegativeSizesUnknownNamesAndWrongTypes) {
  BufferPlan p("moe.experts");
  p.add("h", 8, ElemType::bf16);
  EXPECT_NE(error_message([&] { p.add("h", 8, ElemType::bf16); }).find("h is listed twice"), std::string::npos);
  EXPECT_NE(error_message([&] { p.add("ys", -1, ElemType::bf16); }).find("-1 elements"), std::string::npos);
  EXPECT_NE(error_message([&] { p.at("a"); }).find("no buffer named a"), std::string::npos);
  DeviceMemory mem;  // nothing is allocated: the type check comes first
  const std::string wrong = error_message([&] { p.allocate<float>(mem, "h", "layers.1.moe"); });
  EXPECT_NE(wrong.find("bf16"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("4-byte"), std::string::npos) << wrong;
  BufferPlan q("mlp");
  q.append(p, "fc1 ");
  EXPECT_EQ(q.at("fc1 h").elems, 8);
}

TrainerConfig tiny(const std::vector<std::string>& overrides) {
  std::vector<std::string> args = {"--config", test::preset("tiny")};
  args.insert(args.end(), overrides.begin(), overrides.end());
  return parse_config_args(args);
}

// The estimator's activation terms are the layer plans' activation entries, one for one.
TEST(BufferPlan, EstimatorTermsAreThePlansEntries) {
  for (const char* recipe : {"bf16", "fp8", "mxfp4"}) {
    SCOPED_TRACE(recipe);
    const TrainerConfig cfg = tiny({"--recipe.routed_experts", recipe, "--recipe.attention", recipe});
    const ParallelLayout one = single_gpu_layout(cfg);
    const int64_t M = cfg.train.micro_batch * cfg.train.seq_len;
    for (int64_t l = 0; l < cfg.model.layers; ++l) {
      std::vector<std::string> planned, estimated;
      for (const BufferPlan& p : DecoderLayer::buffers(cfg, l, LayerShape::one_gpu(cfg, M)))
        for (const PlannedBuffer& b : p.buffers())
          if (b.category == MemCategory::activations && b.bytes() > 0)
            planned.push_back(p.module() + "/" + b.tensor + "/" + std::to_string(b.bytes()) + (b.held ? "" : "/-"));
      for (const MemoryTerm& t : layer_activation_terms(cfg, one, l))
        estimated.push_back(t.module + "/" + t.tensor + "/" + std::to_string(t.bytes) + (t.kept ? "" : "/-"));
      EXPECT_EQ(estimated, planned);
    }
  }
}

// Tensors a recipe never makes are not in the plan with a size (so the estimate does not count them as scratch);
// those a policy does not keep are, as not held.
TEST(BufferPlan, ExpertsListOnlyWhatTheRecipeMakes) {
  const int64_t R = 512, E = 8, d = 64, f = 32;
  const BufferPlan bf = MoeRoutedExperts::buffers(R, E, d, f, Recipe::bf16, {});
  EXPECT_EQ(bf.at("xs MXFP4 codes").bytes(), 0);
  EXPECT_EQ(bf.at("xs FP8 row codes").bytes(), 0);
  EXPECT_TRUE(bf.at("xs").held);
  const BufferPlan mx = MoeRoutedExperts::buffers(R, E, d, f, Recipe::mxfp4, MoeRecompute{true, true, true});
  EXPECT_FALSE(mx.at("xs").held) << "BF16 xs is forward scratch for mxfp4";
  EXPECT_GT(mx.at("xs").bytes(), 0);
  EXPECT_TRUE(mx.at("xs MXFP4 codes").held) << "the dispatched input stays under moe";
  EXPECT_FALSE(mx.at("h").held);
  const BufferPlan f8 = MoeRoutedExperts::buffers(R, E, d, f, Recipe::fp8, MoeRecompute{true, true, true});
  EXPECT_TRUE(f8.at("xs FP8 row codes").held);
  EXPECT_EQ(f8.at("fc1 X FP8 column codes").category, MemCategory::activations);
  EXPECT_EQ(f8.at("fc1 W FP8 codes").category, MemCategory::weights);
  // Group Linear's sizes are the plan's: the held activation and the weight copies.
  EXPECT_EQ(GroupLinear::held_activation_bytes(Recipe::fp8, R, d, E),
            static_cast<size_t>(f8.at("fc1 X FP8 column codes").bytes() + f8.at("fc1 X FP8 column scales").bytes()));
  EXPECT_EQ(GroupLinear::weight_copy_bytes(Recipe::fp8, E, 2 * f, d),
            static_cast<size_t>(f8.at("fc1 W FP8 codes").bytes() + f8.at("fc1 W FP8 scales").bytes() +
                                f8.at("fc1 W^T FP8 codes").bytes() + f8.at("fc1 W^T FP8 scales").bytes()));
}

// A Linear's BF16 Dgrad scratch exists only when its caller takes Dgrad in FP32; mxfp4 keeps its MXFP4 copy.
TEST(BufferPlan, LinearPlansFollowTheRecipeAndTheDgradOutput) {
  EXPECT_TRUE(Linear::buffers(Recipe::bf16, 256, 64, 64, true).buffers().empty());
  const BufferPlan mx = Linear::buffers(Recipe::mxfp4, 256, 64, 64, false);
  EXPECT_EQ(mx.at("X MXFP4 codes").bytes(), 256 * 32);
  EXPECT_EQ(mx.at("X MXFP4 scales").bytes(), 256 * 2);
  EXPECT_EQ(mx.at("BF16 Dgrad before FP32").bytes(), 0);
  EXPECT_EQ(Linear::buffers(Recipe::fp8, 256, 64, 64, true).at("BF16 Dgrad before FP32").bytes(), 2 * 256 * 64);
  EXPECT_NE(error_message([] { Linear::buffers(Recipe::mxfp4, 8, 64, 48, false); }).find("K % 32"), std::string::npos);
}

}  // namespace
}  // namespace fp4moe
