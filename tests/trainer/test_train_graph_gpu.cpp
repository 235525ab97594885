// GPU tests of train.cuda_graph (trainer/train/step_graph.h) on the tiny configuration with synthetic tokens: two
// micro-batches per step, every layer class in one recipe (bf16, fp8, mxfp4; or paper 2's ladder with H16: `fp8
// fprop=mxfp4 wgrad=mxfp4 transform=h16` in the linear layers, whose MLA shapes take no MXFP4 Dgrad on tiny, and
// `fp8 fprop=mxfp4 dgrad=mxfp4 transform=h16` in the routed experts, whose MXFP4 Wgrad train.cuda_graph refuses), the
// v3 and the v2 router, with no recompute or with the MoE layer's or the whole layer's:
//   - with the graph, step 1 runs eagerly, step 2 is captured and every later step replays it (an evaluation every
//     two steps between them frees nothing: no capture again); its losses, gradient norms, evaluations and final
//     tensors (the checkpoint's CRCs) equal bit for bit those of the same run whose steps all run eagerly in the mode
//     without host synchronisation (TrainerOptions::capture_step_graph = false);
//   - step 1's loss is within 1e-3 of the run without train.cuda_graph (the expert GEMMs there may run on cuBLASLt,
//     another summation order), and training lowers the loss as it does;
//   - a non-finite step (TrainerOptions::inject_nonfinite_step) under `skip` is skipped and the replays go on, bit for
//     bit those of the eager run;
//   - StepGraph itself: an evaluation forward of fewer rows between replays (it rewrites the quantized Linears'
//     device offsets {0, M}) drops the graph: the next step runs eagerly, the one after is captured again, and their
//     loss and gradients are those of the replays before, bit for bit; a batch in other arrays or another
//     grad_scale is refused.
// Run: fp4moe_tests_gpu_trainer --gtest_filter='*TrainGraph*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/nn/cross_entropy.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/trainer_options_test_util.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/model.h"
#include "trainer/train/pipeline_schedule.h"
#include "trainer/train/step_graph.h"
#include "trainer/train/trainer.h"

namespace fp4moe {
namespace {

using test::TempDir;

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

struct GraphRun {
  TrainResult result;
  std::string checkpoint;  // the final checkpoint
};

// tiny with `recipe` in the linear layers, `routed` in the routed experts, `router` and `recompute`, 6 steps of 2 micro-batches, an evaluation (1 batch) every 2
// steps, the final checkpoint under dir/name; cuda_graph and its capture hook as given.
GraphRun train_tiny(const TempDir& dir, const std::string& name, const std::string& recipe, const std::string& routed,
               const std::string& router, bool cuda_graph, bool capture, int64_t inject_nonfinite_step = 0,
               const std::string& recompute = "none") {
  const TrainerConfig cfg = parse_config_args(
      {"--config", test::preset("tiny"), "--recompute.modules", recompute, "--train.steps", "6", "--train.warmup_steps", "1", "--train.grad_accum", "2",
       "--train.non_finite", "skip",
       "--train.eval_interval", "2", "--train.eval_steps", "1", "--train.checkpoint_dir", dir.file(name),
       "--train.cuda_graph", cuda_graph ? "true" : "false", "--recipe.attention", recipe, "--recipe.dense_mlp",
       recipe, "--recipe.shared_experts", recipe, "--recipe.routed_experts", routed, "--moe.router", router,
       "--moe.aux_alpha", router == "v2" ? "0.01" : "0"});
  TrainerOptions o = test::quiet_options();
  o.capture_step_graph = capture;
  o.inject_nonfinite_step = inject_nonfinite_step;
  Trainer trainer(cfg, o);
  GraphRun r;
  r.result = trainer.run();
  r.checkpoint = r.result.last_checkpoint;
  return r;
}

void expect_same_run(const GraphRun& got, const GraphRun& want) {
  ASSERT_EQ(got.result.steps.size(), want.result.steps.size());
  for (size_t i = 0; i < got.result.steps.size(); ++i) {
    const StepRecord &x = got.result.steps[i], &y = want.result.steps[i];
    SCOPED_TRACE("step " + std::to_string(x.step));
    EXPECT_TRUE(same_bits(x.loss, y.loss)) << x.loss << " vs " << y.loss;
    EXPECT_TRUE(same_bits(x.grad_norm, y.grad_norm)) << x.grad_norm << " vs " << y.grad_norm;
    EXPECT_EQ(x.skipped, y.skipped);
  }
  ASSERT_EQ(got.result.evals.size(), want.result.evals.size());
  for (size_t i = 0; i < got.result.evals.size(); ++i)
    EXPECT_TRUE(same_bits(got.result.evals[i].val_loss, want.result.evals[i].val_loss)) << "evaluation " << i;
  ASSERT_FALSE(got.checkpoint.empty());
  ASSERT_FALSE(want.checkpoint.empty());
  const CheckpointReader a(got.checkpoint, 0), b(want.checkpoint, 0);
  ASSERT_EQ(a.entries().size(), b.entries().size());
  for (const CheckpointEntry& e : a.entries()) {
    const CheckpointEntry* f = b.find(e.section, e.name);
    ASSERT_NE(f, nullptr) << e.name;
    EXPECT_EQ(f->crc32, e.crc32) << e.name << " differs at the last step";
  }
}

class TrainGraph
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string, std::string>> {};

TEST_P(TrainGraph, ReplaysGiveTheEagerStepsBitForBit) {
  FP4MOE_REQUIRE_DEVICE();
  const auto [recipe, routed, router, recompute] = GetParam();
  SCOPED_TRACE("recipe " + recipe + ", routed experts " + routed + ", router " + router + ", recompute " + recompute);
  TempDir dir;
  const GraphRun graph = train_tiny(dir, "graph", recipe, routed, router, true, true, 0, recompute);
  const GraphRun eager = train_tiny(dir, "eager", recipe, routed, router, true, false, 0, recompute);
  const GraphRun host = train_tiny(dir, "host", recipe, routed, router, false, false, 0, recompute);

  EXPECT_EQ(graph.result.graph_captures, 1);  // step 2; the evaluations free no buffer
  EXPECT_EQ(graph.result.graph_replays, 4);   // steps 3 to 6
  EXPECT_EQ(eager.result.graph_captures, 0);
  EXPECT_EQ(eager.result.graph_replays, 0);
  EXPECT_EQ(host.result.graph_captures + host.result.graph_replays, 0);
  expect_same_run(graph, eager);

  const std::vector<StepRecord>& g = graph.result.steps;
  const std::vector<StepRecord>& h = host.result.steps;
  ASSERT_EQ(g.size(), 6u);
  ASSERT_EQ(h.size(), 6u);
  EXPECT_LT(std::fabs(g[0].loss - h[0].loss), 1e-3 * std::fabs(h[0].loss))
      << "step 1: " << g[0].loss << " with the graph's mode, " << h[0].loss << " with host synchronisation";
  for (const StepRecord& s : g) EXPECT_TRUE(std::isfinite(s.loss) && std::isfinite(s.grad_norm)) << s.step;
  EXPECT_LT(g[5].loss, g[0].loss) << "the loss did not fall with the graph";
  EXPECT_LT(h[5].loss, h[0].loss) << "the loss did not fall without it";
}

INSTANTIATE_TEST_SUITE_P(RecipesAndRouters, TrainGraph,
                         ::testing::Values(std::make_tuple("bf16", "bf16", "v3", "none"),
                                           std::make_tuple("fp8", "fp8", "v3", "none"),
                                           std::make_tuple("mxfp4", "mxfp4", "v3", "none"),
                                           std::make_tuple("mxfp4", "mxfp4", "v2", "none"),
                                           std::make_tuple("fp8 fprop=mxfp4 wgrad=mxfp4 transform=h16",
                                                           "fp8 fprop=mxfp4 dgrad=mxfp4 transform=h16", "v3", "none"),
                                           std::make_tuple("fp8", "fp8", "v3", "moe"),
                                           std::make_tuple("mxfp4", "mxfp4", "v3", "full")),
                         [](const auto& info) {
                           const std::string& r = std::get<0>(info.param);
                           const std::string& rc = std::get<3>(info.param);
                           return (r.size() > 5 ? std::string("ladder_h16") : r) + "_" + std::get<2>(info.param) +
                                  (rc == "none" ? std::string() : "_recompute_" + rc);
                         });

TEST(TrainGraphNonFinite, SkippedStepAndLaterReplaysMatchTheEagerRun) {
  FP4MOE_REQUIRE_DEVICE();
  TempDir dir;
  const GraphRun graph = train_tiny(dir, "graph", "fp8", "fp8", "v3", true, true, 4);
  const GraphRun eager = train_tiny(dir, "eager", "fp8", "fp8", "v3", true, false, 4);
  EXPECT_EQ(graph.result.skipped, 1);
  EXPECT_EQ(graph.result.optimizer_steps, 5);
  EXPECT_EQ(graph.result.graph_captures, 1);
  EXPECT_EQ(graph.result.graph_replays, 4);  // the skipped step 4 replayed the graph too
  EXPECT_TRUE(std::isnan(graph.result.steps[3].loss));
  EXPECT_TRUE(std::isfinite(graph.result.steps[4].loss) && std::isfinite(graph.result.steps[5].loss));
  expect_same_run(graph, eager);
}


// The loss and every gradient after a StepGraph run, read back.
struct StepSnapshot {
  double loss = 0;
  std::vector<std::vector<float>> grads;
};

StepSnapshot snapshot(Model& model, const StepGraph& graph, cudaStream_t stream) {
  CUDA_CHECK(cudaStreamSynchronize(stream));
  StepSnapshot s;
  s.loss = graph.loss_sum();
  for (const Param& p : model.params().params()) {
    std::vector<float> g(static_cast<size_t>(p.n));
    CUDA_CHECK(cudaMemcpy(g.data(), p.grad, g.size() * sizeof(float), cudaMemcpyDeviceToHost));
    s.grads.push_back(std::move(g));
  }
  return s;
}

void expect_same_step(const StepSnapshot& got, const StepSnapshot& want, const std::string& what) {
  EXPECT_TRUE(same_bits(got.loss, want.loss)) << what << ": loss " << got.loss << " against " << want.loss;
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i)
    EXPECT_EQ(std::memcmp(got.grads[i].data(), want.grads[i].data(), got.grads[i].size() * sizeof(float)), 0)
        << what << ": gradient of parameter " << i << " differs";
}

TEST(StepGraphRuns, AnEvaluationOfFewerRowsDropsTheGraph) {
  FP4MOE_REQUIRE_DEVICE();
  const TrainerConfig cfg =
      parse_config_args({"--config", test::preset("tiny"), "--recipe.attention", "fp8", "--recipe.dense_mlp", "fp8",
                         "--recipe.shared_experts", "fp8", "--recipe.routed_experts", "fp8"});
  const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len, n = B * T;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  int32_t* pinned = nullptr;  // [2][B*T]: tokens, targets
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), static_cast<size_t>(2 * n) * sizeof(int32_t),
                           cudaHostAllocDefault));
  {
    DeviceMemory mem;
    Model model(cfg, mem, stream);
    model.init_weights(cfg.train.seed);
    model.set_host_sync_free(true);
    test::DeviceBuffer<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n));
    StepGraph graph(model, mem, stream, one_f_one_b_schedule(1, 0, 1), true);
    // Batch `seed` into the staging: tokens from 64 ids, targets the next token (each row's last ignored).
    const auto stage = [&](uint32_t seed) {
      std::mt19937 rng(seed);
      for (int64_t m = 0; m < n; ++m) pinned[m] = static_cast<int32_t>(rng() % 64);
      for (int64_t m = 0; m < n; ++m) pinned[n + m] = (m + 1) % T == 0 ? kIgnoreIndex : pinned[m + 1];
    };
    int64_t step = 0;
    const auto run = [&](StepGraph::Pass want, const std::string& what) {
      const StepGraph::Pass got = graph.run({pinned, tokens.ptr, targets.ptr, B, T}, 1.0f, ++step);
      EXPECT_EQ(static_cast<int>(got), static_cast<int>(want)) << what;
      return snapshot(model, graph, stream);
    };
    stage(1);
    run(StepGraph::Pass::eager, "step 1");
    const StepSnapshot captured = run(StepGraph::Pass::captured, "step 2");
    expect_same_step(run(StepGraph::Pass::replayed, "step 3"), captured, "replay");
    const StepSnapshot ref = run(StepGraph::Pass::replayed, "step 4");

    // An evaluation of B - 1 rows of another batch: the quantized Linears' device offsets become {0, (B - 1) T}.
    stage(2);
    CUDA_CHECK(cudaMemcpy(tokens.ptr, pinned, static_cast<size_t>(n) * sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(targets.ptr, pinned + n, static_cast<size_t>(n) * sizeof(int32_t), cudaMemcpyHostToDevice));
    const uint64_t writes = model.device_state_writes(), releases = mem.releases();
    EXPECT_TRUE(std::isfinite(model.forward(tokens.ptr, targets.ptr, B - 1).loss));
    EXPECT_GT(model.device_state_writes(), writes);
    EXPECT_EQ(mem.releases(), releases);  // the drop below is the state writes', not a freed buffer's

    stage(1);
    expect_same_step(run(StepGraph::Pass::eager, "after the evaluation"), ref, "eager step after the evaluation");
    expect_same_step(run(StepGraph::Pass::captured, "captured again"), ref, "captured again");
    expect_same_step(run(StepGraph::Pass::replayed, "replayed again"), ref, "replayed again");
    EXPECT_EQ(graph.captures(), 2);
    EXPECT_EQ(graph.replays(), 3);

    EXPECT_THROW(graph.run({pinned, tokens.ptr, targets.ptr, B, T}, 0.5f, ++step), Error);
    EXPECT_THROW(graph.run({pinned, targets.ptr, tokens.ptr, B, T}, 1.0f, ++step), Error);
    EXPECT_THROW(StepGraph(model, mem, stream, one_f_one_b_schedule(2, 0, 2), true), Error);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  CUDA_CHECK(cudaFreeHost(pinned));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace fp4moe
