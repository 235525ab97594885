// The memory estimator (trainer/memory/estimate.h) against the trainer's DeviceMemory: the model of
// configs/tiny.toml (bf16; fp8 and mxfp4 routed experts, also under the `moe` recompute policy, which keeps the
// routing and the routed experts' dispatched input in the recipe's format; q_proj instead of q_lora; the v2 router;
// every linear fp8 under mla_up_proj) and a 2-layer configs/small.toml (one dense, one MoE layer: 8 x 1024 tokens,
// hidden 768, 32 experts top-4; bf16 and mxfp4 routed experts) are built on the device. The estimator and the
// layers read the same buffer plans (trainer/memory/buffer_plan.h), so the counts agree to the byte:
//   - the parameter tensors (names and element counts) equal parameter_tensors();
//   - DeviceMemory's weights, grads, optimizer and activations equal the estimate's DeviceMemory view after
//     construction (without the first forward's buffers) and after one forward_backward (with them);
//   - per layer (Model::layer_memory, Model::head_activation_bytes) the estimate's buckets
//     (layer_activation_buckets), the Linears' and Group Linears' copies included;
//   - the shared scratch arena's capacity equals the estimate's arena term (both Model::scratch_arena_bytes, the
//     estimate without cub's sort storage, which the embedding backward's workspace holds and which sizes the arena
//     only when that workspace is its largest call: not on these models), and the arena's high water stays within
//     it; DeviceMemory's workspace peak equals the estimate's workspace without the Trainer's own buffers (module
//     "trainer": the batch and the gradient-norm partials, which a Model alone does not allocate);
//   - comm is printed beside the estimate, not checked (no layout here: none);
//   - tiny with BF16 AdamW moments (train.moments = "bf16"): the optimizer category at 2 B per moment element.
// Each case prints a line per category: estimate, DeviceMemory, difference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "kernels/nn/cross_entropy.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/model.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

// configs/<name>.toml of the repository (FP4MOE_SOURCE_DIR), else from the working directory.
std::string config_path(const std::string& name) {
  const auto root = std::filesystem::path(FP4MOE_SOURCE_DIR);
  const auto p = root / "configs" / (name + ".toml");
  return std::filesystem::exists(p) ? p.string() : "configs/" + name + ".toml";
}

TrainerConfig load(const std::string& name, const std::vector<std::string>& overrides) {
  std::vector<std::string> args = {"--config", config_path(name)};
  args.insert(args.end(), overrides.begin(), overrides.end());
  return parse_config_args(args);
}

// A model on its own stream and allocator (the allocator outlives the model).
struct BuiltModel {
  explicit BuiltModel(const TrainerConfig& cfg) {
    CUDA_CHECK(cudaStreamCreate(&stream));
    model = std::make_unique<Model>(cfg, mem, stream);
  }
  ~BuiltModel() {
    model.reset();
    cudaStreamDestroy(stream);
  }
  DeviceMemory mem;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Model> model;
};

// One forward_backward of a full micro-batch: random tokens, targets the next token (the last of a row ignored).
void one_step(BuiltModel& b, const TrainerConfig& cfg) {
  const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len, M = B * T;
  std::mt19937 rng(20261129);
  std::vector<int32_t> tokens(static_cast<size_t>(M)), targets(static_cast<size_t>(M));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(cfg.model.vocab_size));
  for (int64_t m = 0; m < M; ++m) targets[m] = (m + 1) % T == 0 ? kIgnoreIndex : tokens[m + 1];
  DeviceBuffer<int32_t> d_tokens(static_cast<size_t>(M)), d_targets(static_cast<size_t>(M));
  d_tokens.upload(tokens);
  d_targets.upload(targets);
  b.model->init_weights(cfg.train.seed);
  b.model->params().zero_grads(b.stream);
  const StepStats s = b.model->forward_backward(d_tokens.ptr, d_targets.ptr, B, 1.0f);
  ASSERT_TRUE(std::isfinite(s.loss));
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

void print_row(const char* what, int64_t estimate, int64_t measured) {
  std::printf("  %-34s estimate %12.3f MiB  DeviceMemory %12.3f MiB  difference %+.2f%%\n", what, mib(estimate),
              mib(measured),
              estimate ? 100.0 * (static_cast<double>(measured) / static_cast<double>(estimate) - 1.0) : 0.0);
}

void expect_estimate_matches(const std::string& name, const TrainerConfig& cfg) {
  SCOPED_TRACE(name);
  const ParallelLayout layout = single_gpu_layout(cfg);
  const MemoryEstimate e = estimate_memory(cfg, layout);
  BuiltModel b(cfg);

  // The tensors the model registered, by name.
  std::map<std::string, int64_t> expected, built;
  for (const ParamTensor& t : parameter_tensors(cfg, layout, 0)) expected[t.name] = t.n;
  for (const Param& p : b.model->params().params()) built[p.name] = p.n;
  for (const StateTensor& s : b.model->params().states()) built[s.name] = s.n;
  EXPECT_EQ(built, expected);

  // The estimate's DeviceMemory view, and the part of it the first forward allocates.
  int64_t lazy[kMemCategories] = {};
  for (const MemoryTerm& t : e.terms)
    if (t.first_forward && t.kept && t.device_memory)
      lazy[static_cast<int>(t.category)] += ((t.bytes + 255) / 256 * 256) * t.instances;
  auto dm = [&](MemCategory c) { return e.device_memory[static_cast<int>(c)]; };
  auto built_view = [&](MemCategory c) { return dm(c) - lazy[static_cast<int>(c)]; };
  auto current = [&](MemCategory c) { return static_cast<int64_t>(b.mem.current(c)); };

  const int64_t weights_built = current(MemCategory::weights), act_built = current(MemCategory::activations);
  EXPECT_EQ(weights_built, built_view(MemCategory::weights)) << "weights after construction";
  EXPECT_EQ(current(MemCategory::grads), dm(MemCategory::grads)) << "grads after construction";
  EXPECT_EQ(current(MemCategory::optimizer), dm(MemCategory::optimizer)) << "optimizer after construction";
  EXPECT_EQ(act_built, built_view(MemCategory::activations)) << "activations after construction";

  one_step(b, cfg);
  EXPECT_EQ(current(MemCategory::weights), dm(MemCategory::weights)) << "weights after a step";
  EXPECT_EQ(current(MemCategory::grads), dm(MemCategory::grads)) << "grads after a step";
  EXPECT_EQ(current(MemCategory::optimizer), dm(MemCategory::optimizer)) << "optimizer after a step";
  const int64_t act_after = current(MemCategory::activations);
  const int64_t act_peak = static_cast<int64_t>(b.mem.peak(MemCategory::activations));
  EXPECT_EQ(act_after, dm(MemCategory::activations)) << "activations after a step";
  EXPECT_EQ(act_peak, dm(MemCategory::activations)) << "activations at their peak";

  // Per layer, as the model reports it.
  const std::vector<LayerMemory> layers = b.model->layer_memory();
  ASSERT_EQ(static_cast<int64_t>(layers.size()), cfg.model.layers);
  int64_t sum = static_cast<int64_t>(b.model->head_activation_bytes());
  for (const LayerMemory& m : layers) {
    const LayerActivationBuckets x = layer_activation_buckets(cfg, layout, m.layer);
    SCOPED_TRACE("layer " + std::to_string(m.layer));
    EXPECT_EQ(x.residual, static_cast<int64_t>(m.residual));
    EXPECT_EQ(x.norms, static_cast<int64_t>(m.norms));
    EXPECT_EQ(x.attn, static_cast<int64_t>(m.attn));
    EXPECT_EQ(x.ffn, static_cast<int64_t>(m.ffn));
    EXPECT_EQ(x.routed_experts, static_cast<int64_t>(m.routed_experts));
    EXPECT_EQ(x.quantized_copies, static_cast<int64_t>(m.quantized_copies));
    sum += static_cast<int64_t>(m.kept() + m.quantized_copies);
  }
  EXPECT_EQ(sum, act_after) << "the model's per-layer report against DeviceMemory";

  int64_t arena = 0;
  for (const MemoryTerm& t : e.terms)
    if (t.category == MemCategory::workspace && t.tensor == kScratchArenaTerm) arena += t.total();
  EXPECT_EQ(static_cast<int64_t>(b.model->scratch().capacity()), arena) << "the shared scratch arena";
  EXPECT_LE(b.model->scratch().high_water(), b.model->scratch().capacity());
  int64_t trainer_workspace = 0;  // the Trainer's batch and gradient-norm buffers: not allocated by a Model alone
  for (const MemoryTerm& t : e.terms)
    if (t.category == MemCategory::workspace && t.module == "trainer" && t.kept && t.device_memory)
      trainer_workspace += ((t.bytes + 255) / 256 * 256) * t.instances;
  const int64_t model_workspace = dm(MemCategory::workspace) - trainer_workspace;
  const int64_t workspace_peak = static_cast<int64_t>(b.mem.peak(MemCategory::workspace));
  EXPECT_EQ(workspace_peak, model_workspace) << "workspace at its peak";

  std::printf("[ %s ] %s\n", name.c_str(), b.mem.report().c_str());
  for (MemCategory c : {MemCategory::weights, MemCategory::grads, MemCategory::optimizer})
    print_row(mem_category_name(c), dm(c), static_cast<int64_t>(b.mem.current(c)));
  print_row("activations (after construction)", built_view(MemCategory::activations), act_built);
  print_row("activations (peak)", dm(MemCategory::activations), act_peak);
  print_row("workspace (peak)", model_workspace, workspace_peak);
  print_row("scratch arena high water", arena, static_cast<int64_t>(b.model->scratch().high_water()));
  print_row("comm (peak; not checked)", dm(MemCategory::comm), static_cast<int64_t>(b.mem.peak(MemCategory::comm)));
}

TEST(MemoryEstimateModel, TinyBf16) {
  FP4MOE_REQUIRE_DEVICE();
  expect_estimate_matches("tiny bf16", load("tiny", {}));
}

TEST(MemoryEstimateModel, TinyBf16Moments) {
  FP4MOE_REQUIRE_DEVICE();
  expect_estimate_matches("tiny bf16, BF16 moments", load("tiny", {"--train.moments", "bf16"}));
}

TEST(MemoryEstimateModel, TinyRoutedMxfp4AndFp8) {
  FP4MOE_REQUIRE_DEVICE();
  expect_estimate_matches("tiny routed mxfp4", load("tiny", {"--recipe.routed_experts", "mxfp4"}));
  expect_estimate_matches("tiny routed fp8", load("tiny", {"--recipe.routed_experts", "fp8"}));
}

TEST(MemoryEstimateModel, TinyMoePolicyEveryRoutedRecipe) {
  FP4MOE_REQUIRE_DEVICE();
  for (const char* recipe : {"bf16", "fp8", "mxfp4"})
    expect_estimate_matches(std::string("tiny routed ") + recipe + ", recompute moe",
                            load("tiny", {"--recipe.routed_experts", recipe, "--recompute.modules", "moe"}));
}

TEST(MemoryEstimateModel, TinyQProjAndV2Router) {
  FP4MOE_REQUIRE_DEVICE();
  expect_estimate_matches("tiny q_proj", load("tiny", {"--model.q_lora_rank", "0"}));
  expect_estimate_matches("tiny v2 router", load("tiny", {"--moe.router", "v2", "--moe.aux_alpha", "0.003",
                                                          "--moe.bias_update_rate", "0"}));
}

// The Linears' own copies (fp8 FP8 column copies, mxfp4 MXFP4 copies), their weight copies and the BF16 Dgrad
// scratch of the FP32 sums, under a policy that reruns the up-projections.
TEST(MemoryEstimateModel, TinyQuantizedLinearsUnderMlaUpProj) {
  FP4MOE_REQUIRE_DEVICE();
  expect_estimate_matches("tiny fp8 attention, mxfp4 dense and shared, mla_up_proj",
                          load("tiny", {"--recipe.attention", "fp8", "--recipe.dense_mlp", "mxfp4",
                                        "--recipe.shared_experts", "mxfp4", "--recompute.modules", "mla_up_proj"}));
}

TEST(MemoryEstimateModel, SmallTwoLayers) {
  FP4MOE_REQUIRE_DEVICE();
  expect_estimate_matches("small, 2 layers, bf16", load("small", {"--model.layers", "2"}));
  expect_estimate_matches("small, 2 layers, routed mxfp4",
                          load("small", {"--model.layers", "2", "--recipe.routed_experts", "mxfp4"}));
}

}  // namespace
}  // namespace fp4moe
