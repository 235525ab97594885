// GPU tests of one GPU of a parallel layout, emulated (trainer/model/model.h, layout_emulation.h):
//   - local_expert_routing equals its CPU reference on fresh random routings, empty local experts and k > E_local
//     included, and permute_map over its local ids follows permute.h's definition with repeated experts; the
//     pipeline stand-ins equal their host formulas bit for bit;
//   - a skewed routed load (non-integer loads included): the local routing's R rows, the token each row copies
//     (permute_map over the R assignments + routed_row_tokens) equal skewed_rows_ref; the combine reads no extra
//     row (combine weight 0) and zero_extra_rows zeroes exactly the extra rows; a MoE layer hands its experts R rows;
//   - a skewed middle and last stage step with the balanced run's loss and gradients (within the GEMMs'
//     accumulation-order tolerance) and their communication buffers at R rows;
//   - a middle and a last pipeline stage of a small layout (with expert parallelism) construct and step: the middle
//     stage has neither embedding nor LM head nor loss, the last has the LM head and a finite loss; every grad
//     stays finite; DeviceMemory's comm category equals the communication plan (Model::comm_buffers);
//   - the last stage of tiny with pp 2 trains: its loss falls over a few dozen steps on synthetic tokens.
//   - a middle stage with fewer local experts than top-k (ep 8 of 8 experts, top-2) steps in bf16, fp8 and mxfp4.
// Run: fp4moe_tests_gpu_trainer --gtest_filter='LayoutEmulation*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "tests/common/moe_test_util.h"
#include "tests/common/temp_dir.h"
#include "tests/common/trainer_test_util.h"
#include "kernels/nn/cross_entropy.h"
#include "kernels/nn/permute.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/decoder_layer.h"
#include "trainer/model/layout_emulation.h"
#include "trainer/model/model.h"
#include "trainer/model/moe.h"
#include "trainer/train/trainer.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

TrainerConfig tiny(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--config", test::preset("tiny")};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_config_args(args);
}

// A skewed load's rows on the device (the routed experts' forward: permute_map over the R assignments as R tokens of
// top-1, routed_row_tokens) against skewed_rows_ref; the combine of random expert outputs reads no extra row; the
// output gradient of the extra rows is zeroed and nothing else.
void expect_skewed_rows_match_the_reference(const DeviceBuffer<int32_t>& d_local,
                                            const DeviceBuffer<int32_t>& d_offsets, const std::vector<int32_t>& local,
                                            const std::vector<int32_t>& offsets, int64_t M, int64_t k, int64_t El,
                                            int64_t rows, std::mt19937& rng) {
  const int64_t n = M * k, D = 16;
  std::vector<float> w(n);
  for (auto& x : w) x = 0.01f + static_cast<float>(rng() % 1000) * 1e-3f;
  std::vector<int32_t> token(rows);
  std::vector<float> weight(rows);
  skewed_rows_ref(local.data(), offsets.data(), w.data(), n, rows, k, El, token.data(), weight.data());
  DeviceBuffer<int32_t> row_of(rows), source(rows);
  row_of.poison();
  source.poison();
  permute_map(d_local.ptr, d_offsets.ptr, rows, 1, El, row_of.ptr, source.ptr, nullptr);
  routed_row_tokens(source.ptr, rows, n, k, source.ptr, nullptr);  // in place, as the routed experts call it
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(source.download(), token);
  // The combine (unpermute_forward over the n real assignments) gives the same bits whatever the extra rows hold.
  std::vector<int32_t> host_row_of = row_of.download();
  std::vector<bf16> ys(rows * D);
  for (auto& x : ys) x = __float2bfloat16_rn(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-3f);
  DeviceBuffer<bf16> d_ys(rows * D), y1(M * D), y2(M * D);
  DeviceBuffer<float> d_w(n);
  d_w.upload(w);
  d_ys.upload(ys);
  unpermute_forward(d_ys.ptr, d_w.ptr, row_of.ptr, M, k, D, y1.ptr, nullptr);
  std::vector<bool> extra_row(rows, false);
  for (int64_t a = n; a < rows; ++a) {
    extra_row[host_row_of[a]] = true;
    EXPECT_EQ(weight[host_row_of[a]], 0.0f) << "row " << host_row_of[a];  // the reference's combine weight 0
  }
  for (int64_t r = 0; r < rows; ++r)
    if (extra_row[r])
      for (int64_t c = 0; c < D; ++c) ys[r * D + c] = __float2bfloat16_rn(3.0e38f);
  d_ys.upload(ys);
  unpermute_forward(d_ys.ptr, d_w.ptr, row_of.ptr, M, k, D, y2.ptr, nullptr);
  // zero_extra_rows on the rows: the extra ones become 0, the real ones keep their bits.
  zero_extra_rows(row_of.ptr, n, rows, D, d_ys.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<bf16> a = y1.download(), b = y2.download(), zeroed = d_ys.download();
  for (int64_t i = 0; i < M * D; ++i) ASSERT_EQ(bf16_bits(a[i]), bf16_bits(b[i])) << i;
  for (int64_t i = 0; i < rows * D; ++i)
    ASSERT_EQ(bf16_bits(zeroed[i]), extra_row[i / D] ? bf16_bits(__float2bfloat16_rn(0.0f)) : bf16_bits(ys[i])) << i;
}

TEST(LayoutEmulationGpu, LocalExpertRoutingMatchesTheReference) {
  FP4MOE_REQUIRE_DEVICE();
  std::mt19937 rng(11);
  struct Case {
    int64_t M, k, E, El;
    int32_t used;  // experts drawn from [0, used): used < El leaves local experts empty
    double load;   // parallel.routed_load: R = ceil(M k load) rows
  };
  for (const Case c : {Case{1, 1, 8, 8, 8, 1.0}, Case{256, 2, 8, 4, 8, 1.0}, Case{300, 8, 256, 4, 256, 1.0},
                       Case{77, 6, 64, 16, 5, 1.0}, Case{0, 2, 8, 2, 8, 1.0}, Case{513, 3, 12, 1, 12, 1.0},
                       Case{256, 2, 8, 4, 8, 2.0}, Case{300, 8, 256, 4, 256, 1.37}, Case{77, 6, 64, 16, 5, 3.9},
                       Case{1, 1, 8, 8, 8, 5.5}, Case{0, 2, 8, 2, 8, 2.0}, Case{1000, 8, 2048, 1024, 2048, 1.01}}) {
    SCOPED_TRACE(testing::Message() << "M " << c.M << " k " << c.k << " E " << c.E << " E_local " << c.El
                                    << " load " << c.load);
    const int64_t n = c.M * c.k, rows = routed_row_count(n, c.load);
    std::vector<int32_t> topk(n);
    for (auto& e : topk) e = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.used));
    std::vector<int32_t> local(rows), counts(c.El), offsets(c.El + 1);
    local_expert_routing_ref(topk.data(), n, rows, c.El, local.data(), counts.data(), offsets.data());
    DeviceBuffer<int32_t> d_topk(n), d_local(rows), d_counts(c.El), d_offsets(c.El + 1);
    if (n) d_topk.upload(topk);
    d_local.poison();
    d_counts.poison();
    d_offsets.poison();
    local_expert_routing(d_topk.ptr, n, rows, c.El, d_local.ptr, d_counts.ptr, d_offsets.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(d_local.download(), local);
    EXPECT_EQ(d_counts.download(), counts);
    EXPECT_EQ(d_offsets.download(), offsets);
    if (n == 0) continue;
    if (rows > n) {
      expect_skewed_rows_match_the_reference(d_local, d_offsets, local, offsets, c.M, c.k, c.El, rows, rng);
      continue;
    }
    // The routed experts' permutation over the local ids, where a token may repeat a local expert (k > E_local
    // included): row_of[a] = offsets[e] + #{a' < a with local expert e} (kernels/nn/permute.h), and its inverse.
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

std::vector<std::string> stage_args(int64_t stage, std::vector<std::string> extra) {
  std::vector<std::string> args = {"--model.layers", "3", "--parallel.pp", "3", "--parallel.dp", "2", "--parallel.ep",
                                   "2", "--parallel.stage", std::to_string(stage)};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// One stage of a 3-layer model on pp 3 x dp 2 with ep 2 (and `extra` options): construct, initialise, one
// forward_backward.
struct StageRun {
  explicit StageRun(int64_t stage, std::vector<std::string> extra = {}) : StageRun(tiny(stage_args(stage, extra))) {}
  explicit StageRun(const TrainerConfig& c) : cfg(c) {
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

// The squared L2 norm of a parameter's FP32 gradient.
double grad_norm_sq(const Param& p) {
  std::vector<float> g(static_cast<size_t>(p.n));
  CUDA_CHECK(cudaMemcpy(g.data(), p.grad, g.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double norm = 0;
  for (float x : g) norm += static_cast<double>(x) * x;
  return norm;
}

void expect_comm_is_the_plan(const StageRun& r, bool has_moe) {
  const int64_t N = r.cfg.train.micro_batch * r.cfg.train.seq_len;
  const int64_t R = routed_row_count(N * r.cfg.moe.top_k, r.cfg.parallel.routed_load);
  ASSERT_EQ(LayerShape::one_gpu(r.cfg, N).routed_rows, R);
  const BufferPlan plan = Model::comm_buffers(r.cfg, N, R, 2, 3, has_moe);
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
  EXPECT_GT(grad_norm_sq(*fc1), 0);  // the stand-in gradient reached the layer
  r.model->end_step();
}

TEST(LayoutEmulationGpu, FewerLocalExpertsThanTopKStep) {
  // ep 8 of tiny's 8 experts: one local expert per MoE layer, fewer than top-2, so both slots of every token land
  // on it (the layouts of V3 at ep 64 and 128, 4 and 2 local experts under top-8). The middle stage steps with
  // finite, non-zero expert gradients and the planned communication buffers.
  FP4MOE_REQUIRE_DEVICE();
  for (const char* recipe : {"bf16", "fp8", "mxfp4"}) {
    SCOPED_TRACE(recipe);
    StageRun r(tiny({"--model.layers", "3", "--parallel.pp", "3", "--parallel.dp", "8", "--parallel.ep", "8",
                     "--parallel.stage", "1", "--recipe.routed_experts", recipe}));
    ASSERT_LT(r.cfg.moe.routed_experts / r.cfg.parallel.ep, r.cfg.moe.top_k);
    const Param* fc1 = r.model->params().find("layers.1.moe.experts.fc1");
    ASSERT_TRUE(fc1);
    EXPECT_EQ(fc1->shape.front(), 1);
    expect_comm_is_the_plan(r, true);
    r.model->params().zero_grads(r.stream);
    r.model->forward_backward(r.tokens->ptr, r.targets->ptr, r.cfg.train.micro_batch, 1.0f);
    CUDA_CHECK(cudaStreamSynchronize(r.stream));
    EXPECT_TRUE(r.grads_finite());
    EXPECT_GT(grad_norm_sq(*fc1), 0);
    r.model->end_step();
  }
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

// A skewed routed load's extra rows carry no weight: one step of stage `stage` under `load` gives the balanced run's
// loss and gradients, within the tolerance of the expert GEMMs' accumulation over more rows (BF16 outputs).
void expect_skew_matches_balanced(int64_t stage, const std::string& load) {
  SCOPED_TRACE(testing::Message() << "stage " << stage << ", routed_load " << load);
  StageRun balanced(stage), skewed(stage, {"--parallel.routed_load", load});
  ASSERT_EQ(skewed.cfg.parallel.routed_load, std::stod(load));
  expect_comm_is_the_plan(skewed, true);
  EXPECT_GT(skewed.mem.current(MemCategory::comm), balanced.mem.current(MemCategory::comm));
  EXPECT_GT(skewed.mem.current(MemCategory::activations), balanced.mem.current(MemCategory::activations));
  const auto& pb = balanced.model->params().params();
  const auto& ps = skewed.model->params().params();
  ASSERT_EQ(pb.size(), ps.size());
  StepStats st[2];
  int i = 0;
  for (StageRun* r : {&balanced, &skewed}) {
    r->model->params().zero_grads(r->stream);
    st[i++] = r->model->forward_backward(r->tokens->ptr, r->targets->ptr, r->cfg.train.micro_batch, 1.0f);
    CUDA_CHECK(cudaStreamSynchronize(r->stream));
  }
  EXPECT_EQ(st[0].has_loss, st[1].has_loss);
  if (st[0].has_loss) {
    EXPECT_NEAR(st[1].loss, st[0].loss, 1e-4 * std::fabs(st[0].loss));
    std::printf("  loss: balanced %.7f, skewed %.7f\n", st[0].loss, st[1].loss);
  }
  for (size_t p = 0; p < pb.size(); ++p) {
    ASSERT_EQ(pb[p].name, ps[p].name);
    ASSERT_EQ(pb[p].n, ps[p].n);
    std::vector<float> gb(static_cast<size_t>(pb[p].n)), gs(gb.size());
    std::vector<bf16> wb(gb.size()), ws(gb.size());
    CUDA_CHECK(cudaMemcpy(gb.data(), pb[p].grad, gb.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(gs.data(), ps[p].grad, gs.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(wb.data(), pb[p].param, wb.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(ws.data(), ps[p].param, ws.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    double diff = 0, norm = 0;
    for (size_t j = 0; j < gb.size(); ++j) {
      ASSERT_EQ(bf16_bits(wb[j]), bf16_bits(ws[j])) << pb[p].name << " " << j;  // the same initial weights
      ASSERT_TRUE(std::isfinite(gs[j])) << pb[p].name << " " << j;
      diff += (static_cast<double>(gs[j]) - gb[j]) * (static_cast<double>(gs[j]) - gb[j]);
      norm += static_cast<double>(gb[j]) * gb[j];
    }
    std::printf("  %-36s grad relative L2 difference %.3e\n", pb[p].name.c_str(),
                norm > 0 ? std::sqrt(diff / norm) : 0.0);
    EXPECT_LE(std::sqrt(diff), 1e-2 * std::sqrt(norm) + 1e-12) << pb[p].name;
  }
}

TEST(LayoutEmulationGpu, SkewedMiddleStageHasTheBalancedGradients) {
  FP4MOE_REQUIRE_DEVICE();
  expect_skew_matches_balanced(1, "2");
  expect_skew_matches_balanced(1, "1.37");
}

TEST(LayoutEmulationGpu, SkewedLastStageHasTheBalancedLossAndGradients) {
  FP4MOE_REQUIRE_DEVICE();
  expect_skew_matches_balanced(2, "2");
  expect_skew_matches_balanced(2, "1.6");
}

// A MoE layer under a skewed load hands its routed experts R = ceil(M k load) rows, the extra ones spread over the
// local experts (the router's own counts stay the M k real rows'); its output is the balanced layer's (the same
// weights), within the expert GEMMs' accumulation order over more rows.
struct EmulatedMoeLayer {
  explicit EmulatedMoeLayer(const TrainerConfig& c) : cfg(c) {
    layer = std::make_unique<MoeLayer>(h.store, "layers.1.moe", cfg, 256, h.mem);
    h.fit_scratch(layer->scratch_bytes());
    h.store.allocate(h.mem);
    h.store.init(7, h.stream);
  }
  std::vector<bf16> forward(const std::vector<bf16>& x, int64_t M) {
    DeviceBuffer<bf16> d_x(M * cfg.model.hidden), d_y(M * cfg.model.hidden);
    d_x.upload(x);
    d_y.poison();
    layer->forward(h.ctx, d_x.ptr, M, d_y.ptr);
    h.sync();
    return d_y.download();
  }
  test::LayerHarness h;  // first: outlives the layer
  TrainerConfig cfg;
  std::unique_ptr<MoeLayer> layer;
};

TEST(LayoutEmulationGpu, SkewedMoeLayerRoutesRRows) {
  FP4MOE_REQUIRE_DEVICE();
  const TrainerConfig cfg = tiny({"--parallel.dp", "2", "--parallel.ep", "2", "--parallel.routed_load", "1.5"});
  const int64_t El = cfg.moe.routed_experts / 2, k = cfg.moe.top_k;
  EmulatedMoeLayer skewed(cfg), balanced(tiny({"--parallel.dp", "2", "--parallel.ep", "2"}));
  const MoeLayer& layer = *skewed.layer;
  for (const int64_t M : {int64_t{256}, int64_t{37}}) {
    SCOPED_TRACE(M);
    std::mt19937 rng(static_cast<uint32_t>(M));
    std::vector<bf16> x(M * cfg.model.hidden);
    for (auto& v : x) v = __float2bfloat16_rn(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-3f);
    const std::vector<bf16> y = skewed.forward(x, M), y_balanced = balanced.forward(x, M);
    double diff = 0, norm = 0;
    int64_t differing = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double a = __bfloat162float(y[i]), b = __bfloat162float(y_balanced[i]);
      ASSERT_TRUE(std::isfinite(a)) << i;
      diff += (a - b) * (a - b);
      norm += b * b;
      differing += bf16_bits(y[i]) != bf16_bits(y_balanced[i]);
    }
    std::printf("  M %ld: y differs from the balanced layer's in %ld of %zu elements, relative L2 %.3e\n",
                static_cast<long>(M), static_cast<long>(differing), y.size(), std::sqrt(diff / norm));
    EXPECT_LE(std::sqrt(diff), 1e-2 * std::sqrt(norm));
    const MoeRouting r = layer.router().routing();
    const int64_t R = routed_row_count(M * k, 1.5);
    EXPECT_EQ(r.M, M);
    EXPECT_EQ(r.E, El);
    EXPECT_EQ(r.rows, R);
    EXPECT_EQ(R, (M * k * 3 + 1) / 2);
    EXPECT_EQ(r.host_offsets[0], 0);
    EXPECT_EQ(r.host_offsets[El], R);  // the grouped GEMMs' rows
    std::vector<int32_t> local(R);
    CUDA_CHECK(cudaMemcpy(local.data(), r.topk_idx, R * sizeof(int32_t), cudaMemcpyDeviceToHost));
    for (int64_t j = 0; j < R - M * k; ++j) ASSERT_EQ(local[M * k + j], j % El) << j;  // spread evenly
  }
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
