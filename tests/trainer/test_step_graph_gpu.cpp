// A training step's forward and backward without host synchronisation (Model::set_host_sync_free), captured in one
// CUDA graph and replayed, on configs/tiny.toml's shapes (hidden 64, a dense layer and a MoE layer of 8 routed
// experts top-2 and a shared expert; the expert GEMMs, N 32 / K 64 and N 64 / K 32, run on the CUDA-core kernels
// from the device offsets), every layer class in one recipe (bf16, fp8, mxfp4), with the v3 and the v2 router:
//   - an eager step in the mode gives the loss and every parameter's gradient; the graph, captured once (global
//     capture mode: any host synchronisation, synchronous copy or allocation inside fails the capture), replays them
//     bit for bit for the captured batch and for another batch written into the same device arrays (its routing,
//     hence the device offsets, differs; the graph does not), and the two batches give different losses;
//   - the mode's loss is within 1e-3 (relative) of the same step with host synchronisation, whose expert GEMMs run
//     on cuBLASLt (another summation order), on a model with the same weights;
//   - v3: the bias update from the router's device tally equals the one from its host tally, bit for bit, after one
//     eager step, after two eager steps and four replays (the replays count their loads on the device), and after
//     replay, end_step, replay, end_step;
//   - an evaluation forward in the mode still reads its loss and the v2 balance loss on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/nn/cross_entropy.h"
#include "tests/common/gpu_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/model.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

std::string tiny_config_path() {
  const auto p = std::filesystem::path(FP4MOE_SOURCE_DIR) / "configs" / "tiny.toml";
  return std::filesystem::exists(p) ? p.string() : std::string("configs/tiny.toml");
}

// The loss, every parameter's gradient and every state tensor (the v3 bias) after a step, read back.
struct Snapshot {
  float loss = 0;
  std::vector<std::vector<float>> grads, states;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One tiny model on its own stream and memory, with a batch's device arrays that the test rewrites.
struct TinyStep {
  TrainerConfig cfg;
  DeviceMemory mem;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Model> model;
  int64_t B, M;
  DeviceBuffer<int32_t> tokens, targets;

  TinyStep(const std::string& recipe, const std::string& router)
      : cfg(parse_config_args({"--config", tiny_config_path(), "--recipe.attention", recipe, "--recipe.dense_mlp",
                               recipe, "--recipe.shared_experts", recipe, "--recipe.routed_experts", recipe,
                               "--moe.router", router, "--moe.aux_alpha", router == "v2" ? "0.01" : "0"})),
        B(cfg.train.micro_batch),
        M(cfg.train.micro_batch * cfg.train.seq_len),
        tokens(static_cast<size_t>(M)),
        targets(static_cast<size_t>(M)) {
    CUDA_CHECK(cudaStreamCreate(&stream));
    model = std::make_unique<Model>(cfg, mem, stream);
    model->init_weights(cfg.train.seed);
  }
  ~TinyStep() {
    model.reset();
    cudaStreamDestroy(stream);
  }

  // Batch `seed`: tokens drawn from 64 ids, targets the next token (the last of each row ignored); in range.
  void upload_batch(uint32_t seed) {
    std::mt19937 rng(seed);
    const int64_t T = cfg.train.seq_len;
    std::vector<int32_t> tok(static_cast<size_t>(M)), tgt(static_cast<size_t>(M));
    for (auto& t : tok) t = static_cast<int32_t>(rng() % 64);
    for (int64_t m = 0; m < M; ++m) tgt[m] = (m + 1) % T == 0 ? kIgnoreIndex : tok[m + 1];
    tokens.upload(tok);
    targets.upload(tgt);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Zeroed gradients, one micro-batch forward and backward (all queued on the model's stream).
  void step() {
    model->params().zero_grads(stream);
    model->begin_step(1);
    model->forward_in_slot(0, tokens.ptr, targets.ptr, B);
    model->backward_in_slot(0, 1.0f);
  }
  Snapshot snapshot() {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    Snapshot s;
    CUDA_CHECK(cudaMemcpy(&s.loss, model->loss_device(), sizeof(float), cudaMemcpyDeviceToHost));
    for (const Param& p : model->params().params()) {
      std::vector<float> g(static_cast<size_t>(p.n));
      CUDA_CHECK(cudaMemcpy(g.data(), p.grad, g.size() * sizeof(float), cudaMemcpyDeviceToHost));
      s.grads.push_back(std::move(g));
    }
    for (const StateTensor& t : model->params().states()) {
      std::vector<float> v(static_cast<size_t>(t.n));
      CUDA_CHECK(cudaMemcpy(v.data(), t.data, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
      s.states.push_back(std::move(v));
    }
    return s;
  }
};

void expect_same(const Snapshot& got, const Snapshot& want, const std::string& what) {
  EXPECT_EQ(std::memcmp(&got.loss, &want.loss, sizeof(float)), 0)
      << what << ": loss " << got.loss << " against " << want.loss;
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i)
    EXPECT_TRUE(same_bits(got.grads[i], want.grads[i])) << what << ": gradient of parameter " << i << " differs";
}

class StepGraph : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(StepGraph, CapturedStepReplaysTheEagerLossAndGradients) {
  FP4MOE_REQUIRE_DEVICE();
  const auto [recipe, router] = GetParam();
  SCOPED_TRACE("recipe " + recipe + ", router " + router);
  // With host synchronisation: the reference loss, and the v3 bias after the step's update from the host tally.
  TinyStep host(recipe, router);
  host.upload_batch(1);
  host.step();
  const Snapshot host_a = host.snapshot();
  host.model->end_step();
  const Snapshot host_updated = host.snapshot();

  TinyStep sf(recipe, router);
  sf.model->set_host_sync_free(true);
  sf.upload_batch(1);
  sf.step();
  const Snapshot first = sf.snapshot();
  EXPECT_TRUE(std::isfinite(first.loss));
  EXPECT_LT(std::fabs(first.loss - host_a.loss), 1e-3 * std::fabs(host_a.loss))
      << "loss without host synchronisation " << first.loss << ", with it " << host_a.loss;
  sf.model->end_step();  // the bias update from the device tally
  const Snapshot updated = sf.snapshot();
  ASSERT_EQ(updated.states.size(), host_updated.states.size());
  for (size_t i = 0; i < updated.states.size(); ++i)
    EXPECT_TRUE(same_bits(updated.states[i], host_updated.states[i]))
        << "state tensor " << i << " (the v3 bias) after end_step differs from the host tally's update";

  // The eager references of the two batches, with the weights and bias the graph will see.
  sf.step();
  const Snapshot eager_a = sf.snapshot();
  sf.upload_batch(2);
  sf.step();
  const Snapshot eager_b = sf.snapshot();
  EXPECT_NE(eager_a.loss, eager_b.loss) << "batches 1 and 2 gave the same loss: the replay check below cannot fail";

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(sf.stream, cudaStreamCaptureModeGlobal));
  try {
    sf.step();
  } catch (const std::exception& e) {
    cudaStreamEndCapture(sf.stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    FAIL() << "the step could not be captured: " << e.what();
  }
  CUDA_CHECK(cudaStreamEndCapture(sf.stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 2; ++round) {
    sf.upload_batch(1);
    CUDA_CHECK(cudaGraphLaunch(exec, sf.stream));
    expect_same(sf.snapshot(), eager_a, "replay " + std::to_string(round) + ", batch 1");
    sf.upload_batch(2);
    CUDA_CHECK(cudaGraphLaunch(exec, sf.stream));
    expect_same(sf.snapshot(), eager_b, "replay " + std::to_string(round) + ", batch 2");
  }
  // v3: the device tally counted the two eager steps and the four replays; the host model runs the same six
  // micro-batches eagerly: the same bias after end_step.
  for (int i = 0; i < 3; ++i) {
    host.upload_batch(1);
    host.step();
    host.upload_batch(2);
    host.step();
  }
  host.model->end_step();
  sf.model->end_step();
  const Snapshot host_six = host.snapshot(), sf_six = sf.snapshot();
  for (size_t i = 0; i < sf_six.states.size(); ++i)
    EXPECT_TRUE(same_bits(sf_six.states[i], host_six.states[i]))
        << "state tensor " << i << " (the v3 bias) after two eager steps and four replays differs from six eager "
           "steps with host synchronisation";
  // Replays between optimizer steps (replay, end_step, replay, end_step): each update counts its replay's loads.
  for (uint32_t batch : {1u, 2u}) {
    sf.upload_batch(batch);
    CUDA_CHECK(cudaGraphLaunch(exec, sf.stream));
    sf.model->end_step();
    host.upload_batch(batch);
    host.step();
    host.model->end_step();
  }
  const Snapshot host_two = host.snapshot(), sf_two = sf.snapshot();
  for (size_t i = 0; i < sf_two.states.size(); ++i)
    EXPECT_TRUE(same_bits(sf_two.states[i], host_two.states[i]))
        << "state tensor " << i << " (the v3 bias) after replay, end_step, replay, end_step differs";
  const StepStats eval = sf.model->forward(sf.tokens.ptr, sf.targets.ptr, sf.B);
  EXPECT_TRUE(std::isfinite(eval.loss) && std::isfinite(eval.aux_loss) && eval.tokens > 0)
      << "evaluation in the mode: loss " << eval.loss << ", aux " << eval.aux_loss << ", tokens " << eval.tokens;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

INSTANTIATE_TEST_SUITE_P(Recipes, StepGraph,
                         ::testing::Combine(::testing::Values("bf16", "fp8", "mxfp4"), ::testing::Values("v3", "v2")),
                         [](const ::testing::TestParamInfo<StepGraph::ParamType>& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

TEST(StepGraph, RefusesToSwitchWithAMicroBatchInFlight) {
  FP4MOE_REQUIRE_DEVICE();
  TinyStep t("bf16", "v3");
  t.upload_batch(1);
  t.model->forward_in_slot(0, t.tokens.ptr, t.targets.ptr, t.B);
  EXPECT_THROW(t.model->set_host_sync_free(true), Error);
  t.model->backward_in_slot(0, 1.0f);
  EXPECT_NO_THROW(t.model->set_host_sync_free(true));
}

}  // namespace
}  // namespace fp4moe
