// train.cuda_graph on the CPU (trainer/train/step_graph.h): the option, what validate_config and check_trainable
// refuse with it (one line naming the option and the way out), what the memory estimate adds for it, and the host
// check of a batch's token ids the graph's steps rely on (check_batch_ids, trainer/model/model.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "kernels/nn/cross_entropy.h"
#include "trainer/config.h"
#include "trainer/memory/estimate.h"
#include "trainer/model/model.h"
#include "trainer/train/trainer.h"

namespace fp4moe {
namespace {

using test::expect_error_with;

TrainerConfig tiny_with(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--config", test::preset("tiny")};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_config_args(args);
}

TrainerConfig graph_with(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--train.cuda_graph", "true"});
  return tiny_with(extra);
}

TEST(TrainGraphConfig, OptionDefaultsOffAndTakesABoolean) {
  for (const char* name : {"tiny", "small", "dense_small", "v3", "v2"})
    EXPECT_FALSE(parse_config_args({"--config", test::preset(name)}).train.cuda_graph) << name;
  EXPECT_TRUE(graph_with({}).train.cuda_graph);
  EXPECT_FALSE(tiny_with({"--train.cuda_graph", "false"}).train.cuda_graph);
  expect_error_with([] { tiny_with({"--train.cuda_graph", "1"}); }, {"not a boolean"});
  expect_error_with([] { tiny_with({"--train.cuda_graph", "yes"}); }, {"not a boolean"});
  // Not part of the model's identity: a checkpoint resumes with the graph on or off.
  EXPECT_EQ(model_config_hash(graph_with({})), model_config_hash(tiny_with({})));
}

TEST(TrainGraphConfig, RefusesPerStepHostSeedsMxfp4WgradOfRoutedExpertsAndCudnn) {
  // Accepted: the presets, paper 2's deterministic transforms, an MXFP4 Wgrad outside the routed experts.
  for (const char* r : {"bf16", "fp8", "mxfp4"})
    graph_with({"--recipe.attention", r, "--recipe.dense_mlp", r, "--recipe.shared_experts", r,
                "--recipe.routed_experts", r});
  graph_with({"--recipe.attention", "fp8 fprop=mxfp4 wgrad=mxfp4 transform=h32",
              "--recipe.routed_experts", "fp8 fprop=mxfp4 dgrad=mxfp4 transform=h16"});
  // The same without the graph: accepted.
  tiny_with({"--recipe.dense_mlp", "fp8 fprop=mxfp4 dgrad=mxfp4 rounding=sr", "--recipe.attention",
             "fp8 fprop=mxfp4 transform=rht", "--recipe.shared_experts", "fp8 fprop=mxfp4 dgrad=mxfp4 rounding=sr",
             "--recipe.routed_experts", "fp8 fprop=mxfp4 wgrad=mxfp4", "--model.attention_backend", "cudnn"});
  tiny_with({"--model.attention_backend", "auto", "--train.grad_accum", "8388608"});

  expect_error_with([] { graph_with({"--recipe.dense_mlp", "fp8 fprop=mxfp4 dgrad=mxfp4 rounding=sr"}); },
                    {"train.cuda_graph = true with recipe.dense_mlp", "rounding=sr", "stochastic rounding",
                     "train.cuda_graph = false"});
  expect_error_with([] { graph_with({"--recipe.attention", "fp8 fprop=mxfp4 transform=rht"}); },
                    {"recipe.attention", "transform=rht", "random Hadamard"});
  expect_error_with([] { graph_with({"--recipe.shared_experts", "fp8 fprop=mxfp4 dgrad=mxfp4 rounding=sr"}); },
                    {"recipe.shared_experts"});
  expect_error_with([] { graph_with({"--recipe.routed_experts", "fp8 fprop=mxfp4 wgrad=mxfp4"}); },
                    {"recipe.routed_experts", "MXFP4 Wgrad", "wgrad=fp8"});
  expect_error_with([] { graph_with({"--model.attention_backend", "cudnn"}); },
                    {"train.cuda_graph = true needs model.attention_backend = own", "cudnn"});
  expect_error_with([] { graph_with({"--model.attention_backend", "auto"}); }, {"attention_backend = own"});
  // 2^31 tokens per step (64 x 4 x 2^23): the v3 router's int32 device tally; the v2 router keeps no tally.
  expect_error_with([] { graph_with({"--train.grad_accum", "8388608"}); },
                    {"train.cuda_graph = true with 2147483648 tokens per step", "int32"});
  graph_with({"--train.grad_accum", "8388607"});
  graph_with({"--train.grad_accum", "8388608", "--moe.router", "v2"});
  // A class the model does not have is not checked: a dense model's routed experts.
  graph_with({"--model.n_dense_layers", "2", "--recipe.routed_experts", "fp8 fprop=mxfp4 wgrad=mxfp4 rounding=sr"});
}

TEST(TrainGraphConfig, TrainingRefusesRanksEmulatedLayoutsAndTheProfile) {
  const TrainerConfig c = graph_with({});
  TrainerOptions one;
  one.synthetic_data = true;
  check_trainable(c, one);

  TrainerOptions ranks = one;
  RankEnv env;
  env.world_size = 2;
  env.launched = true;
  ranks.ranks = env;
  check_trainable(tiny_with({}), ranks);  // without the graph: accepted
  expect_error_with([&] { check_trainable(c, ranks); }, {"train.cuda_graph = true is not supported over ranks"});

  const TrainerConfig pp = graph_with({"--parallel.pp", "2", "--parallel.micro_batches", "2", "--train.grad_accum",
                                       "2", "--train.eval_interval", "0"});
  expect_error_with([&] { check_trainable(pp, one); },
                    {"train.cuda_graph = true is not supported with an emulated [parallel] layout", "pp 2"});

  TrainerOptions profile = one;
  profile.profile = true;
  expect_error_with([&] { check_trainable(c, profile); }, {"train.cuda_graph = true with --profile"});
}

// The estimate holds what the graph's steps add: the step's losses (FP32 per micro-batch) and every v3 MoE layer's
// device tally of expert loads (int32 per routed expert); nothing for the v2 router's.
TEST(TrainGraphConfig, MemoryEstimateCountsTheLossesAndTheDeviceTallies) {
  for (const char* router : {"v3", "v2"}) {
    SCOPED_TRACE(router);
    const TrainerConfig off = tiny_with({"--moe.router", router, "--train.grad_accum", "3"});
    const TrainerConfig on = graph_with({"--moe.router", router, "--train.grad_accum", "3"});
    const int64_t moe_layers = off.model.layers - off.model.n_dense_layers;
    const int64_t tallies = std::string(router) == "v3" ? 4 * off.moe.routed_experts * moe_layers : 0;
    const MemoryEstimate a = estimate_memory(off), b = estimate_memory(on);
    EXPECT_EQ(b.category(MemCategory::workspace) - a.category(MemCategory::workspace), 4 * 3 + tallies);
    for (const MemCategory c : {MemCategory::weights, MemCategory::grads, MemCategory::optimizer,
                                MemCategory::activations, MemCategory::comm})
      EXPECT_EQ(b.category(c), a.category(c));
  }
}

TEST(TrainGraphConfig, BatchIdsCheckedOnTheHost) {
  const std::vector<int32_t> tokens = {0, 5, 9, 3}, targets = {5, 9, kIgnoreIndex, 0};
  EXPECT_EQ(check_batch_ids(tokens, targets, 10, 2, "training batch"), 3);
  expect_error_with([&] { check_batch_ids(std::vector<int32_t>{0, 10, 1, 2}, targets, 10, 2, "training batch"); },
                    {"training batch: token id 10 at position 1 (row 0, t=1) is outside [0, vocab_size = 10)"});
  expect_error_with([&] { check_batch_ids(std::vector<int32_t>{0, -1, 1, 2}, targets, 10, 2, "training batch"); },
                    {"token id -1 at position 1"});
  expect_error_with([&] { check_batch_ids(tokens, std::vector<int32_t>{1, 2, 3, -2}, 10, 2, "training batch"); },
                    {"target -2 at position 3 (row 1, t=1) is neither in [0, vocab_size = 10) nor -100"});
  expect_error_with([&] { check_batch_ids(tokens, std::vector<int32_t>{1, 2, 10, 0}, 10, 2, "training batch"); },
                    {"target 10 at position 2"});
  expect_error_with([&] { check_batch_ids(tokens, std::vector<int32_t>{1, 2}, 10, 2, "training batch"); },
                    {"4 tokens and 2 targets"});
}

}  // namespace
}  // namespace fp4moe
