// GPU tests of one GPU of a parallel layout, emulated (trainer/model/model.h, layout_emulation.h):
//   - local_expert_routing equals its CPU reference on fresh random routings, empty local experts and k > E_local
//     included, and permute_map over its local ids follows permute.h's definition with repeated experts; the
//     pipeline stand-ins equal their host formulas bit for bit;
//   - a middle and a last pipeline stage of a small layout (with expert parallelism) construct and step: the middle
//     stage has neither embedding nor LM head nor loss, the last has the LM head and a finite loss; every grad
//     stays finite; DeviceMemory's comm category equals the communication plan (Model::comm_buffers);
//   - the last stage of tiny with pp 2 trains: its loss falls over a few dozen steps on synthetic tokens.
// Run: fp4moe_tests_gpu_trainer --gtest_filter='LayoutEmulation*'
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "tests/common/temp_dir.h"
#include "tests/common/trainer_test_util.h"
#include "kernels/nn/cross_entropy.h"
#include "kernels/nn/permute.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/layout_emulation.h"
#include "trainer/model/model.h"
#include "trainer/train/trainer.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

TrainerConfig tiny(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--config", test::preset("tiny")};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_config_args(args);
}

TEST(LayoutEmulationGpu, LocalExpertRoutingMatchesTheReference) {
  FP4MOE_REQUIRE_DEVICE();
  std::mt19937 rng(11);
  struct Case {
    int64_t M, k, E, El;
    int32_t used;  // experts drawn from [0, used): used < El leaves local experts empty
  };
  for (const Case c : {Case{1, 1, 8, 8, 8}, Case{256, 2, 8, 4, 8}, Case{300, 8, 256, 4, 256}, Case{77, 6, 64, 16, 5},
                       Case{0, 2, 8, 2, 8}, Case{513, 3, 12, 1, 12}}) {
    SCOPED_TRACE(testing::Message() << "M " << c.M << " k " << c.k << " E " << c.E << " E_local " << c.El);
    const int64_t n = c.M * c.k;
    std::vector<int32_t> topk(n);
    for (auto& e : topk) e = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.used));
    std::vector<int32_t> local(n), counts(c.El), offsets(c.El + 1);
    local_expert_routing_ref(topk.data(), n, c.El, local.data(), counts.data(), offsets.data());
    DeviceBuffer<int32_t> d_topk(n), d_local(n), d_counts(c.El), d_offsets(c.El + 1);
    if (n) d_topk.upload(topk);
    d_local.poison();
    d_counts.poison();
    d_offsets.poison();
    local_expert_routing(d_topk.ptr, n, c.El, d_local.ptr, d_counts.ptr, d_offsets.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(d_local.download(), local);
    EXPECT_EQ(d_counts.download(), counts);
    EXPECT_EQ(d_offsets.download(), offsets);
    // The routed experts' permutation over the local ids, where a token may repeat a local expert (k > E_local
    // included): row_of[a] = offsets[e] + #{a' < a with local expert e} (kernels/nn/permute.h), and its inverse.
    if (n == 0) continue;
    DeviceBuffer<int32_t> row_of(n), assignment_of(n);
    permute_map(d_local.ptr, d_offsets.ptr, c.M, c.k, c.El, row_of.ptr, assignment_of.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> expected_row(n), expected_assignment(n), seen(c.El, 0);
    for (int64_t a = 0; a < n; ++a) {
      expected_row[a] = offsets[local[a]] + seen[local[a]]++;
      expected_assignment[expected_row[a]] = static_cast<int32_t>(a);
    }
    EXPECT_EQ(row_of.download(), expected_row);
    EXPECT_EQ(assignment_of.download(), expected_assignment);
  }
}

TEST(LayoutEmulationGpu, StandInsMatchTheirHostFormulas) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 37, d = 64, n = M * d;
  std::vector<int32_t> tokens(M);
  for (int64_t m = 0; m < M; ++m) tokens[m] = static_cast<int32_t>((m * 7919) % 32768);
  DeviceBuffer<int32_t> d_tokens(M);
  d_tokens.upload(tokens);
  DeviceBuffer<bf16> h(n), dh(n);
  standin_input(d_tokens.ptr, M, d, h.ptr, nullptr);
  standin_output_grad(1234, 5, n, 0.25f, dh.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<bf16> got_h = h.download(), got_dh = dh.download();
  double sum2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = standin_input_value(tokens[i / d], i % d);
    sum2 += static_cast<double>(x) * x;
    ASSERT_EQ(bf16_bits(got_h[i]), bf16_bits(__float2bfloat16_rn(x))) << i;
    const float g = standin_output_grad_value(1234, 5, i, 0.25f);
    ASSERT_LE(std::fabs(g), 0.25f);
    ASSERT_EQ(bf16_bits(got_dh[i]), bf16_bits(__float2bfloat16_rn(g))) << i;
  }
  EXPECT_NEAR(std::sqrt(sum2 / static_cast<double>(n)), 0.02, 0.002);  // the embedding init's std
  // A function of the token alone; another micro-batch draws another gradient.
  EXPECT_EQ(standin_input_value(42, 3), standin_input_value(42, 3));
  EXPECT_NE(standin_output_grad_value(1234, 5, 0, 1.0f), standin_output_grad_value(1234, 6, 0, 1.0f));
}

// One stage of a 3-layer model on pp 3 x dp 2 with ep 2: construct, initialise, one forward_backward.
struct StageRun {
  explicit StageRun(int64_t stage)
      : cfg(tiny({"--model.layers", "3", "--parallel.pp", "3", "--parallel.dp", "2", "--parallel.ep", "2",
                  "--parallel.stage", std::to_string(stage)})) {
    CUDA_CHECK(cudaStreamCreate(&stream));
    model = std::make_unique<Model>(cfg, mem, stream);
    model->init_weights(cfg.train.seed);
    const int64_t M = cfg.train.micro_batch * cfg.train.seq_len;
    std::mt19937 rng(3);
    std::vector<int32_t> tok(M), tgt(M);
    for (auto& t : tok) t = static_cast<int32_t>(rng() % 32768);
    for (int64_t m = 0; m < M; ++m) tgt[m] = (m + 1) % cfg.train.seq_len == 0 ? kIgnoreIndex : tok[m + 1];
    tokens = std::make_unique<DeviceBuffer<int32_t>>(M);
    targets = std::make_unique<DeviceBuffer<int32_t>>(M);
    tokens->upload(tok);
    targets->upload(tgt);
  }
  ~StageRun() {
    model.reset();
    cudaStreamDestroy(stream);
  }
  bool grads_finite() {
    for (const Param& p : model->params().params()) {
      std::vector<float> g(static_cast<size_t>(p.n));
      CUDA_CHECK(cudaMemcpy(g.data(), p.grad, g.size() * sizeof(float), cudaMemcpyDeviceToHost));
      for (float x : g)
        if (!std::isfinite(x)) return false;
    }
    return true;
  }
  TrainerConfig cfg;
  DeviceMemory mem;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Model> model;
  std::unique_ptr<DeviceBuffer<int32_t>> tokens, targets;
};

void expect_comm_is_the_plan(const StageRun& r, bool has_moe) {
  const int64_t N = r.cfg.train.micro_batch * r.cfg.train.seq_len;
  const BufferPlan plan = Model::comm_buffers(r.cfg, N, N * r.cfg.moe.top_k, 2, 3, has_moe);
  EXPECT_EQ(static_cast<int64_t>(r.mem.current(MemCategory::comm)), plan.counted_bytes(MemCategory::comm));
  EXPECT_GT(plan.counted_bytes(MemCategory::comm), 0);
}

TEST(LayoutEmulationGpu, MiddleStageStepsWithStandIns) {
  FP4MOE_REQUIRE_DEVICE();
  StageRun r(1);  // layer 1 of 0..2: MoE (tiny's n_dense_layers = 1), neither embedding nor LM head
  const PipelineStage& s = r.model->stage();
  EXPECT_EQ(s.first_layer, 1);
  EXPECT_EQ(s.layers, 1);
  EXPECT_FALSE(r.model->params().find("embed"));
  EXPECT_FALSE(r.model->params().find("lm_head"));
  EXPECT_TRUE(r.model->params().find("layers.1.moe.router"));
  const Param* fc1 = r.model->params().find("layers.1.moe.experts.fc1");
  ASSERT_TRUE(fc1);
  EXPECT_EQ(fc1->shape.front(), r.cfg.moe.routed_experts / 2);  // E / ep local experts
  EXPECT_EQ(r.model->params().find("layers.1.moe.router")->shape.front(), r.cfg.moe.routed_experts);
  expect_comm_is_the_plan(r, true);
  r.model->params().zero_grads(r.stream);
  const StepStats st = r.model->forward_backward(r.tokens->ptr, r.targets->ptr, r.cfg.train.micro_batch, 1.0f);
  EXPECT_FALSE(st.has_loss);
  EXPECT_TRUE(std::isnan(st.loss));
  EXPECT_TRUE(r.grads_finite());
  // The stand-in gradient reached the layer: its grads are not all zero.
  std::vector<float> g(static_cast<size_t>(fc1->n));
  CUDA_CHECK(cudaMemcpy(g.data(), fc1->grad, g.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double norm = 0;
  for (float x : g) norm += static_cast<double>(x) * x;
  EXPECT_GT(norm, 0);
  r.model->end_step();
}

TEST(LayoutEmulationGpu, LastStageStepsWithTheLoss) {
  FP4MOE_REQUIRE_DEVICE();
  StageRun r(2);
  const PipelineStage& s = r.model->stage();
  EXPECT_EQ(s.first_layer, 2);
  EXPECT_TRUE(s.last());
  EXPECT_FALSE(r.model->params().find("embed"));
  EXPECT_TRUE(r.model->params().find("lm_head"));
  expect_comm_is_the_plan(r, true);
  r.model->params().zero_grads(r.stream);
  const StepStats st = r.model->forward_backward(r.tokens->ptr, r.targets->ptr, r.cfg.train.micro_batch, 1.0f);
  EXPECT_TRUE(st.has_loss);
  EXPECT_NEAR(st.loss, std::log(32768.0), 0.5);
  EXPECT_TRUE(r.grads_finite());
  const StepStats eval = r.model->forward(r.tokens->ptr, r.targets->ptr, r.cfg.train.micro_batch);
  EXPECT_EQ(eval.loss, st.loss);  // the stand-in input is deterministic
}

TEST(LayoutEmulationGpu, FirstStageOfTinyWithoutMoeHoldsOnlyThePipelineBuffers) {
  FP4MOE_REQUIRE_DEVICE();
  const TrainerConfig cfg = tiny({"--parallel.pp", "2", "--parallel.stage", "0", "--parallel.ep", "2",
                                  "--parallel.dp", "2"});
  DeviceMemory mem;
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  {
    Model model(cfg, mem, stream);
    const int64_t N = cfg.train.micro_batch * cfg.train.seq_len;
    EXPECT_EQ(static_cast<int64_t>(mem.current(MemCategory::comm)), 2 * 2 * N * cfg.model.hidden);
    EXPECT_TRUE(model.params().find("embed"));
    EXPECT_FALSE(model.params().find("norm"));
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(LayoutEmulationGpu, LastStageOfTinyTrains) {
  FP4MOE_REQUIRE_DEVICE();
  test::TempDir dir;
  const TrainerConfig cfg = tiny({"--parallel.pp", "2", "--parallel.stage", "1", "--train.steps", "40",
                                  "--train.eval_interval", "0"});
  TrainerOptions o;
  o.synthetic_data = true;
  o.log = nullptr;
  o.handle_signals = false;
  o.run_name = "tiny";
  o.out_path = dir.file("run.h5");
  Trainer trainer(cfg, o);
  EXPECT_EQ(trainer.model().stage().first_layer, 1);
  const TrainResult r = trainer.run();
  ASSERT_EQ(r.steps.size(), 40u);
  EXPECT_EQ(r.skipped, 0);
  for (const StepRecord& s : r.steps) {
    EXPECT_TRUE(std::isfinite(s.loss)) << s.step;
    EXPECT_GT(s.tokens_per_s, 0);
  }
  const double first = r.steps[0].loss;
  const double last = (r.steps[37].loss + r.steps[38].loss + r.steps[39].loss) / 3;
  EXPECT_LT(last, first - 0.25) << "first loss " << first << ", mean of the last three " << last;
}

}  // namespace
}  // namespace fp4moe
