// The 1F1B schedule's in-flight micro-batches on the device (DESIGN.md "Memory"): the activation slots of
// trainer/memory/device_memory.h, Model::forward_in_slot / backward_in_slot and the stage's order
// (trainer/train/pipeline_schedule.h). Stage 0 of a [parallel] layout keeps k micro-batches in flight (pp 2 with 3
// micro-batches: k = 2, order F0 F1 B0 F2 B1 B2 over slots 0 1 0; pp 3: k = 3, F0 F1 F2 B0 B1 B2); it is compared
// with the same stage under one micro-batch per step (k = 1), on configs/tiny.toml with 2 x pp layers so that stage
// 0 holds the dense layer and a MoE layer (bf16; fp8 and mxfp4 routed experts; fp8 attention with mxfp4 dense and
// shared experts under mla_up_proj; the moe recompute policy; the v2 router). Stage 0 has the embedding and no LM
// head: its backward starts from the stand-in output gradient (trainer/model/layout_emulation.h), keyed by the count
// of backwards, which both orders run in micro-batch order.
//   - the same three micro-batches (each uploaded into ONE input buffer right before its forward, so the backward
//     must read the model's own copy of the tokens) give every parameter gradient and, after Model::end_step, the v3
//     router bias bit for bit as forward_backward one micro-batch at a time; neither has a loss (NaN, has_loss false);
//   - DeviceMemory's activations after construction and the first forward (the lazily allocated input copies of
//     the quantized Linears and Group Linears included) are k times the model's per-micro-batch report
//     (layer_memory + head_activation_bytes, the sums of the layers' buffer plans), and stay there through the step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/nn/cross_entropy.h"
#include "tests/common/gpu_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/model.h"
#include "trainer/train/pipeline_schedule.h"

namespace fp4moe {
namespace {

constexpr int64_t kMicroBatches = 3;

std::string config_path(const std::string& name) {
  const auto p = std::filesystem::path(FP4MOE_SOURCE_DIR) / "configs" / (name + ".toml");
  return std::filesystem::exists(p) ? p.string() : "configs/" + name + ".toml";
}

TrainerConfig load(const std::vector<std::string>& overrides) {
  std::vector<std::string> args = {"--config", config_path("tiny")};
  args.insert(args.end(), overrides.begin(), overrides.end());
  return parse_config_args(args);
}

// A model on its own stream and allocator, and one device buffer for the inputs of every micro-batch.
struct Built {
  explicit Built(const TrainerConfig& c) : cfg(c), M(c.train.micro_batch * c.train.seq_len), tokens(M), targets(M) {
    CUDA_CHECK(cudaStreamCreate(&stream));
    model = std::make_unique<Model>(cfg, mem, stream);
    model->init_weights(cfg.train.seed);
    model->params().zero_grads(stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  ~Built() {
    model.reset();
    cudaStreamDestroy(stream);
  }
  // Micro-batch j's tokens (random ids, its own seed) and targets (the next token; the last of a row ignored), into
  // the one input buffer, after everything queued so far.
  void upload(int64_t j) {
    const int64_t T = cfg.train.seq_len;
    std::mt19937 rng(static_cast<uint32_t>(1000 + j));
    std::vector<int32_t> tok(static_cast<size_t>(M)), tgt(static_cast<size_t>(M));
    for (auto& t : tok) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(cfg.model.vocab_size));
    for (int64_t m = 0; m < M; ++m) tgt[m] = (m + 1) % T == 0 ? kIgnoreIndex : tok[m + 1];
    CUDA_CHECK(cudaStreamSynchronize(stream));
    tokens.upload(tok);
    targets.upload(tgt);
  }
  // Activations of one micro-batch as the model reports them (its layers' and its own buffer plans).
  int64_t per_micro_batch() const {
    int64_t sum = static_cast<int64_t>(model->head_activation_bytes());
    for (const LayerMemory& l : model->layer_memory()) sum += static_cast<int64_t>(l.kept() + l.quantized_copies);
    return sum;
  }
  int64_t activations() const { return static_cast<int64_t>(mem.current(MemCategory::activations)); }

  // Every parameter's FP32 gradient, and every FP32 state (the v3 router bias), in the store's order.
  std::vector<float> grads() {
    std::vector<float> out;
    for (const Param& p : model->params().params()) append(out, p.grad, p.n);
    return out;
  }
  std::vector<float> states() {
    std::vector<float> out;
    for (const StateTensor& t : model->params().states()) append(out, t.data, t.n);
    return out;
  }
  static void append(std::vector<float>& out, const float* device, int64_t n) {
    std::vector<float> h(static_cast<size_t>(n));
    CUDA_CHECK(cudaMemcpy(h.data(), device, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    out.insert(out.end(), h.begin(), h.end());
  }

  TrainerConfig cfg;
  int64_t M;
  DeviceMemory mem;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Model> model;
  test::DeviceBuffer<int32_t> tokens, targets;
};

// Bitwise equality of two float vectors, reporting the first difference.
void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " elements differ, the first at " << first << " ("
                        << (differ ? a[first] : 0.0f) << " vs " << (differ ? b[first] : 0.0f) << ")";
}

// pp stages (stage 0 runs) over kMicroBatches micro-batches, against one slot.
void expect_in_flight_matches_one_slot(const std::string& name, int64_t pp, const std::vector<std::string>& overrides) {
  SCOPED_TRACE(name + ", pp " + std::to_string(pp));
  auto staged = [&](int64_t micro_batches) {
    std::vector<std::string> args = overrides;
    const std::string m = std::to_string(micro_batches);
    args.insert(args.end(), {"--model.layers", std::to_string(2 * pp), "--parallel.pp", std::to_string(pp),
                             "--parallel.stage", "0", "--parallel.micro_batches", m, "--train.grad_accum", m});
    return load(args);
  };
  Built one(staged(1)), many(staged(kMicroBatches));
  const int64_t k = std::min(pp, kMicroBatches);
  ASSERT_EQ(one.model->position().in_flight, 1);
  ASSERT_EQ(many.model->position().in_flight, k);
  ASSERT_EQ(many.model->position().stages, pp);
  const int64_t built = many.activations();
  const float scale = 1.0f / static_cast<float>(kMicroBatches);
  const int64_t B = one.cfg.train.micro_batch;

  // One slot: F0 B0 F1 B1 F2 B2.
  std::vector<float> one_losses;
  for (int64_t j = 0; j < kMicroBatches; ++j) {
    one.upload(j);
    one_losses.push_back(one.model->forward_backward(one.tokens.ptr, one.targets.ptr, B, scale).loss);
  }
  EXPECT_EQ(one.activations(), one.per_micro_batch()) << "one slot: one copy";

  // k slots, in the stage's 1F1B order.
  const std::vector<PipelineStep> order = one_f_one_b_schedule(pp, 0, kMicroBatches);
  std::printf("[ %s, pp %ld ] %s\n", name.c_str(), static_cast<long>(pp), schedule_text(order).c_str());
  std::vector<float> many_losses;
  bool first_forward = true;
  for (const PipelineStep& op : order) {
    if (op.pass == PipelinePass::forward) {
      many.upload(op.micro_batch);
      const StepStats s = many.model->forward_in_slot(op.slot, many.tokens.ptr, many.targets.ptr, B);
      EXPECT_EQ(s.loss, 0.0f) << "the loss comes with the backward";
      if (first_forward) {  // construction + first forward: every slot's copy exists
        EXPECT_EQ(many.activations(), k * many.per_micro_batch())
            << "activations after the first forward, k = " << k << " (after construction: " << built << ")";
        first_forward = false;
      }
    } else {
      many_losses.push_back(many.model->backward_in_slot(op.slot, scale).loss);
    }
  }
  EXPECT_EQ(many.activations(), k * many.per_micro_batch()) << "after the step";
  EXPECT_EQ(static_cast<int64_t>(many.mem.peak(MemCategory::activations)), k * many.per_micro_batch())
      << "the activations' peak";
  ASSERT_EQ(many_losses.size(), one_losses.size());
  for (size_t j = 0; j < one_losses.size(); ++j)
    EXPECT_TRUE(std::isnan(many_losses[j]) && std::isnan(one_losses[j])) << "stage 0 has no loss, micro-batch " << j;
  expect_bitwise(many.grads(), one.grads(), "parameter gradients");
  one.model->end_step();
  many.model->end_step();
  expect_bitwise(many.states(), one.states(), "router bias after end_step (the step's expert counts)");
}

TEST(InFlightMicroBatches, TinyBf16) {
  FP4MOE_REQUIRE_DEVICE();
  expect_in_flight_matches_one_slot("tiny bf16", 2, {});
  expect_in_flight_matches_one_slot("tiny bf16", 3, {});
}

TEST(InFlightMicroBatches, TinyRoutedFp8AndMxfp4) {
  FP4MOE_REQUIRE_DEVICE();
  for (const char* recipe : {"fp8", "mxfp4"}) {
    expect_in_flight_matches_one_slot(std::string("tiny routed ") + recipe, 2, {"--recipe.routed_experts", recipe});
    expect_in_flight_matches_one_slot(std::string("tiny routed ") + recipe, 3, {"--recipe.routed_experts", recipe});
  }
}

TEST(InFlightMicroBatches, TinyQuantizedLinearsAndRecomputePolicies) {
  FP4MOE_REQUIRE_DEVICE();
  expect_in_flight_matches_one_slot("tiny fp8 attention, mxfp4 dense and shared, mla_up_proj", 2,
                                    {"--recipe.attention", "fp8", "--recipe.dense_mlp", "mxfp4",
                                     "--recipe.shared_experts", "mxfp4", "--recompute.modules", "mla_up_proj"});
  for (const char* recipe : {"fp8", "mxfp4"})
    expect_in_flight_matches_one_slot(std::string("tiny routed ") + recipe + ", recompute moe", 2,
                                      {"--recipe.routed_experts", recipe, "--recompute.modules", "moe"});
  expect_in_flight_matches_one_slot(
      "tiny, recompute moe_act and layernorm", 2,
      {"--recipe.routed_experts", "mxfp4", "--recompute.modules", "moe_act", "layernorm"});
}

TEST(InFlightMicroBatches, TinyV2Router) {
  FP4MOE_REQUIRE_DEVICE();
  expect_in_flight_matches_one_slot("tiny v2 router", 2,
                                    {"--moe.router", "v2", "--moe.aux_alpha", "0.003", "--moe.bias_update_rate", "0"});
}

// The slots' rules: a slot in flight is not written again, a backward needs its forward, evaluation waits for the
// in-flight micro-batches, in-flight micro-batches share one size.
TEST(InFlightMicroBatches, SlotRules) {
  FP4MOE_REQUIRE_DEVICE();
  Built b(load({"--parallel.pp", "2", "--parallel.stage", "0", "--parallel.micro_batches", "2", "--train.grad_accum",
                "2"}));
  const int64_t B = b.cfg.train.micro_batch;
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  b.upload(0);
  EXPECT_NE(message([&] { b.model->backward_in_slot(0, 1.0f); }).find("holds no micro-batch"), std::string::npos);
  EXPECT_NE(message([&] { b.model->forward_in_slot(2, b.tokens.ptr, b.targets.ptr, B); }).find("outside [0, 2)"),
            std::string::npos);
  b.model->forward_in_slot(0, b.tokens.ptr, b.targets.ptr, B);
  EXPECT_NE(message([&] { b.model->forward_in_slot(0, b.tokens.ptr, b.targets.ptr, B); }).find("still holds"),
            std::string::npos);
  EXPECT_NE(message([&] { b.model->forward(b.tokens.ptr, b.targets.ptr, B); }).find("slot 0 holds"),
            std::string::npos);
  if (B > 1) {
    EXPECT_NE(message([&] { b.model->forward_in_slot(1, b.tokens.ptr, b.targets.ptr, B - 1); }).find("share one size"),
              std::string::npos);
  }
  const StepStats s = b.model->backward_in_slot(0, 1.0f);  // stage 0: no LM head, no loss
  EXPECT_FALSE(s.has_loss);
  EXPECT_TRUE(std::isnan(s.loss));
  EXPECT_NE(message([&] { b.model->backward_in_slot(0, 1.0f); }).find("holds no micro-batch"), std::string::npos);
  EXPECT_FALSE(b.model->forward(b.tokens.ptr, b.targets.ptr, B).has_loss);
}

}  // namespace
}  // namespace fp4moe
