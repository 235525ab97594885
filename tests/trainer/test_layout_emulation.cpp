// One GPU of a parallel layout, emulated (trainer/model/model.h, layout_emulation.h), on the host: the pipeline stage
// a configuration resolves to (pipeline_stage) and its layer range, the local-expert mapping's CPU reference, the
// router's local-routing buffers, the communication buffer plan against the estimator, and the one-line rejections
// of what the emulation does not do (check_emulated_layout, check_trainable).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/estimate_detail.h"
#include "trainer/model/decoder_layer.h"
#include "trainer/model/layout_emulation.h"
#include "trainer/model/model.h"
#include "trainer/model/moe.h"
#include "trainer/model/moe_router.h"
#include "trainer/train/metrics.h"
#include "trainer/train/trainer.h"

namespace fp4moe {
namespace {

using test::expect_error_with;

TrainerConfig tiny(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--config", test::preset("tiny")};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_config_args(args);
}

int64_t comm_bytes(const BufferPlan& plan) {
  int64_t sum = 0;
  for (const PlannedBuffer& b : plan.buffers()) sum += b.bytes();
  return sum;
}

TEST(LayoutEmulation, OneGpuIsTheWholeModel) {
  const TrainerConfig cfg = tiny();
  const PipelineStage s = pipeline_stage(cfg);
  EXPECT_EQ(s.stage, 0);
  EXPECT_EQ(s.pp, 1);
  EXPECT_EQ(s.first_layer, 0);
  EXPECT_EQ(s.layers, cfg.model.layers);
  EXPECT_TRUE(s.first() && s.last());
  EXPECT_FALSE(emulates_layout(cfg));
  EXPECT_EQ(local_routed_experts(cfg), cfg.moe.routed_experts);
  EXPECT_EQ(LayerShape::one_gpu(cfg, 256).local_experts, cfg.moe.routed_experts);
  EXPECT_EQ(comm_bytes(Model::comm_buffers(cfg, 256, 512, 1, 1, true)), 0);  // no communication buffer
}

TEST(LayoutEmulation, StageResolvesToItsLayerRange) {
  // 5 layers over 3 stages: 1, 2, 2 (the last L % pp stages take one more).
  for (int64_t stage : {0, 1, 2}) {
    const TrainerConfig cfg = tiny({"--model.layers", "5", "--parallel.pp", "3", "--parallel.stage",
                                    std::to_string(stage)});
    const PipelineStage s = pipeline_stage(cfg);
    SCOPED_TRACE(stage);
    EXPECT_EQ(s.stage, stage);
    EXPECT_EQ(s.pp, 3);
    EXPECT_EQ(s.first_layer, std::vector<int64_t>({0, 1, 3})[stage]);
    EXPECT_EQ(s.layers, std::vector<int64_t>({1, 2, 2})[stage]);
    EXPECT_EQ(s.first(), stage == 0);
    EXPECT_EQ(s.last(), stage == 2);
    EXPECT_TRUE(emulates_layout(cfg));
    // The estimator evaluates the same stage.
    const MemoryEstimate e = estimate_memory(cfg);
    EXPECT_EQ(e.stage, s.stage);
    EXPECT_EQ(e.first_layer, s.first_layer);
    EXPECT_EQ(e.layers, s.layers);
  }
}

TEST(LayoutEmulation, StageMinusOneIsTheLargestEstimate) {
  const TrainerConfig cfg = tiny({"--model.layers", "4", "--parallel.pp", "2", "--parallel.micro_batches", "2",
                                  "--train.grad_accum", "2"});
  ASSERT_EQ(cfg.parallel.stage, -1);
  const ParallelLayout layout = layout_of(cfg);
  int64_t largest = 0;
  for (int64_t s = 1; s < layout.pp; ++s)
    if (estimate_memory_stage(cfg, layout, s).total() > estimate_memory_stage(cfg, layout, largest).total())
      largest = s;
  EXPECT_EQ(pipeline_stage(cfg).stage, largest);
  EXPECT_EQ(estimate_memory(cfg).stage, largest);
  expect_error_with([&] { pipeline_stage(cfg, layout, 2); }, {"pipeline stage 2 is outside [0, pp = 2)"});
}

TEST(LayoutEmulation, LocalExpertRoutingReference) {
  // Experts 0..7 on E_local = 4: e mod 4; a token may meet one local expert twice (0 and 4), local expert 3 is empty.
  const std::vector<int32_t> topk = {0, 4, 1, 6, 5, 2, 0};
  std::vector<int32_t> local(topk.size()), counts(4), offsets(5);
  local_expert_routing_ref(topk.data(), static_cast<int64_t>(topk.size()), static_cast<int64_t>(topk.size()), 4,
                           local.data(), counts.data(), offsets.data());
  for (size_t a = 0; a < topk.size(); ++a) EXPECT_EQ(local[a], topk[a] % 4) << a;
  std::vector<int32_t> expected_counts(4, 0);
  for (int32_t e : topk) ++expected_counts[e % 4];
  EXPECT_EQ(counts, expected_counts);
  EXPECT_EQ(counts[3], 0);
  EXPECT_EQ(offsets.front(), 0);
  for (int e = 0; e < 4; ++e) EXPECT_EQ(offsets[e + 1] - offsets[e], counts[e]);
  EXPECT_EQ(offsets.back(), static_cast<int32_t>(topk.size()));
  expect_error_with(
      [&] { local_expert_routing_ref(topk.data(), 1, 1, 0, local.data(), counts.data(), offsets.data()); },
      {"E_local in [1, 1024]", "E_local=0"});
  expect_error_with(
      [&] { local_expert_routing_ref(topk.data(), 2, 1, 4, local.data(), counts.data(), offsets.data()); },
      {"n <= rows", "n=2 rows=1"});
  expect_error_with(
      [&] { local_expert_routing_ref(topk.data(), 0, 3, 4, local.data(), counts.data(), offsets.data()); },
      {"rows 0 when n is", "n=0 rows=3"});
  const int32_t negative = -1;
  expect_error_with(
      [&] { local_expert_routing_ref(&negative, 1, 1, 4, local.data(), counts.data(), offsets.data()); },
      {"expert id -1 at assignment 0"});
}

TEST(LayoutEmulation, BalancedRoutingFillsEveryLocalExpertEvenly) {
  // Every expert chosen equally often (a balanced routing) gives each local expert ep times an expert's rows.
  const int64_t E = 16, ep = 4, El = E / ep, k = 2, M = 64;
  std::vector<int32_t> topk(M * k);
  for (int64_t a = 0; a < M * k; ++a) topk[a] = static_cast<int32_t>(a % E);
  std::mt19937 rng(7);
  std::shuffle(topk.begin(), topk.end(), rng);
  std::vector<int32_t> local(M * k), counts(El), offsets(El + 1);
  local_expert_routing_ref(topk.data(), M * k, M * k, El, local.data(), counts.data(), offsets.data());
  for (int64_t e = 0; e < El; ++e) EXPECT_EQ(counts[e], M * k / El) << e;
  EXPECT_EQ(offsets[El], M * k);  // N k rows in all: what balanced expert parallelism delivers
}

TEST(LayoutEmulation, RouterPlansTheLocalRoutingUnderExpertParallelism) {
  const BufferPlan one = MoeRouter::buffers(256, 8, 2, 8, 512);
  for (const char* t : {"local topk_idx", "local counts", "local offsets"}) EXPECT_EQ(one.at(t).elems, 0) << t;
  const BufferPlan ep = MoeRouter::buffers(256, 8, 2, 2, 512);
  EXPECT_EQ(ep.at("local topk_idx").elems, 256 * 2);
  EXPECT_EQ(ep.at("local counts").elems, 2);
  EXPECT_EQ(ep.at("local offsets").elems, 3);
  EXPECT_EQ(ep.counted_bytes(MemCategory::activations) - one.counted_bytes(MemCategory::activations),
            2048 + 256 + 256);
  expect_error_with([] { MoeRouter::buffers(256, 8, 2, 3, 512); }, {"local experts 3", "divide E"});
  expect_error_with([] { MoeRouter::buffers(256, 8, 2, 2, -1); }, {"routed rows must be >= 0, got -1"});
  EXPECT_EQ(MoeRouter::buffers(256, 8, 2, 2, 769).at("local topk_idx").elems, 769);  // a skewed load's R rows
  // The estimator counts them at an ep layout, in the router's activations.
  const TrainerConfig cfg = tiny({"--parallel.ep", "2", "--parallel.dp", "2"});
  EXPECT_EQ(local_routed_experts(cfg), 4);
  EXPECT_EQ(LayerShape::one_gpu(cfg, 256).local_experts, 4);
  bool counted = false;
  for (const MemoryTerm& t : layer_activation_terms(cfg, layout_of(cfg), 1))
    counted = counted || (t.module == "moe.router" && t.tensor == "local topk_idx" && t.bytes == 4 * 256 * 2);
  EXPECT_TRUE(counted);
}

TEST(LayoutEmulation, RoutedRowCountIsTheEstimatorsR) {
  EXPECT_EQ(routed_row_count(512, 1.0), 512);
  EXPECT_EQ(routed_row_count(7, 1.5), 11);  // ceil(10.5)
  EXPECT_EQ(routed_row_count(3, 1.1), 4);
  EXPECT_EQ(routed_row_count(512, 2.0), 1024);
  EXPECT_EQ(routed_row_count(5, 1.0, 2), 3);  // balanced: ceil(5 / 2)
  EXPECT_EQ(routed_row_count(512, 1.5, 2), 384);
  EXPECT_EQ(routed_row_count(0, 2.0), 0);
  expect_error_with([] { routed_row_count(-1, 1.0); }, {"routed_row_count", "balanced_rows >= 0"});
  expect_error_with([] { routed_row_count(4, 0.5); }, {"routed_row_count", "routed_load >= 1", "0.5"});
  expect_error_with([] { routed_row_count(4, std::nan("")); }, {"routed_row_count", "finite routed_load"});
  expect_error_with([] { routed_row_count(4, 1.0, 0); }, {"routed_row_count", "tp >= 1"});
  expect_error_with([] { routed_row_count(int64_t{1} << 62, 3.0); }, {"beyond int64"});
  // The model's one-GPU shape (what it allocates) and the estimator's layer shape read the same R.
  for (const char* load : {"1", "1.3", "2"}) {
    SCOPED_TRACE(load);
    const TrainerConfig cfg = tiny({"--parallel.ep", "2", "--parallel.dp", "2", "--parallel.routed_load", load});
    const int64_t N = cfg.train.micro_batch * cfg.train.seq_len;
    const LayerShape one = LayerShape::one_gpu(cfg, N);
    EXPECT_EQ(one.routed_rows, routed_row_count(N * cfg.moe.top_k, std::stod(load)));
    EXPECT_EQ(mem_detail::layer_shape(cfg, layout_of(cfg)).routed_rows, one.routed_rows);
  }
}

// The skewed local routing's reference on random routings (uneven and empty local experts, non-integer loads): the
// counts and offsets, the token each row copies and its combine weight, against the balanced routing's rows.
TEST(LayoutEmulation, SkewedLocalRoutingReference) {
  std::mt19937 rng(5);
  struct Case {
    int64_t M, k, E, El;
    int32_t used;  // experts drawn from [0, used): used < El leaves local experts empty (before the extra rows)
    double load;
  };
  for (const Case c : {Case{64, 2, 8, 4, 8, 2.0}, Case{37, 3, 12, 4, 12, 1.37}, Case{50, 6, 64, 16, 5, 1.9},
                       Case{1, 1, 8, 8, 8, 3.5}, Case{9, 2, 8, 2, 1, 1.01}, Case{100, 8, 256, 8, 256, 1.0}}) {
    SCOPED_TRACE(testing::Message() << "M " << c.M << " k " << c.k << " E_local " << c.El << " load " << c.load);
    const int64_t n = c.M * c.k, rows = routed_row_count(n, c.load), extra = rows - n;
    EXPECT_EQ(rows, static_cast<int64_t>(std::ceil(static_cast<double>(n) * c.load)));
    std::vector<int32_t> topk(n);
    for (auto& e : topk) e = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.used));
    std::vector<float> w(n);
    for (auto& x : w) x = 0.01f + static_cast<float>(rng() % 1000) * 1e-3f;
    // Balanced (rows = n) and skewed local routings with their rows.
    std::vector<int32_t> bl(n), bc(c.El), bo(c.El + 1), bt(n), sl(rows), sc(c.El), so(c.El + 1), st(rows);
    std::vector<float> bw(n), sw(rows);
    local_expert_routing_ref(topk.data(), n, n, c.El, bl.data(), bc.data(), bo.data());
    skewed_rows_ref(bl.data(), bo.data(), w.data(), n, n, c.k, c.El, bt.data(), bw.data());
    local_expert_routing_ref(topk.data(), n, rows, c.El, sl.data(), sc.data(), so.data());
    skewed_rows_ref(sl.data(), so.data(), w.data(), n, rows, c.k, c.El, st.data(), sw.data());
    EXPECT_EQ(std::vector<int32_t>(sl.begin(), sl.begin() + n), bl);  // the real rows' local experts
    EXPECT_EQ(so.front(), 0);
    EXPECT_EQ(so.back(), rows);
    std::vector<int64_t> tokens_of_extra;  // (j mod n) / k for every extra row j
    for (int64_t j = 0; j < extra; ++j) tokens_of_extra.push_back((j % n) / c.k);
    std::vector<int64_t> seen_extra;
    std::vector<double> weight_per_token(c.M, 0.0), expected_weight(c.M, 0.0);
    for (int64_t a = 0; a < n; ++a) expected_weight[a / c.k] += w[a];
    for (int64_t e = 0; e < c.El; ++e) {
      EXPECT_EQ(so[e + 1] - so[e], sc[e]) << e;
      // Extra rows spread evenly: floor or ceil of extra / E_local per local expert.
      const int64_t extras = sc[e] - bc[e];
      EXPECT_TRUE(extras == extra / c.El || extras == ceil_div(extra, c.El)) << e << ": " << extras;
      // The expert's real rows first, as the balanced routing orders them (tokens and weights), then its extras
      // with weight 0.
      for (int64_t i = 0; i < sc[e]; ++i) {
        const int64_t r = so[e] + i;
        if (i < bc[e]) {
          EXPECT_EQ(st[r], bt[bo[e] + i]) << e << " row " << i;
          EXPECT_EQ(sw[r], bw[bo[e] + i]) << e << " row " << i;
        } else {
          EXPECT_EQ(sw[r], 0.0f) << e << " extra row " << i;
          seen_extra.push_back(st[r]);
        }
        weight_per_token[st[r]] += sw[r];
      }
    }
    std::sort(tokens_of_extra.begin(), tokens_of_extra.end());
    std::sort(seen_extra.begin(), seen_extra.end());
    EXPECT_EQ(seen_extra, tokens_of_extra);  // extra j copies real assignment j mod n
    for (int64_t t = 0; t < c.M; ++t) EXPECT_NEAR(weight_per_token[t], expected_weight[t], 1e-5) << t;
  }
  std::vector<int32_t> local = {0, 1, 5}, offsets = {0, 1, 2}, token(3);
  std::vector<float> w = {1.0f}, weight(3);
  expect_error_with([&] { skewed_rows_ref(local.data(), offsets.data(), w.data(), 1, 3, 1, 2, token.data(),
                                          weight.data()); }, {"local expert 5 of row 2", "[0, 2)"});
  expect_error_with([&] { skewed_rows_ref(local.data(), offsets.data(), w.data(), 0, 3, 1, 2, token.data(),
                                          weight.data()); }, {"skewed_rows_ref", "n=0 rows=3"});
}

TEST(LayoutEmulation, SkewedLoadSizesTheRoutedRowsBuffersAtR) {
  // tiny, ep 2 (4 local experts) at load 1.5: every buffer the estimator sizes by R holds 1.5 N k rows, the
  // router's local routing included; the router's own (per token) buffers do not change.
  const TrainerConfig balanced = tiny({"--parallel.ep", "2", "--parallel.dp", "2"});
  const TrainerConfig skewed = tiny({"--parallel.ep", "2", "--parallel.dp", "2", "--parallel.routed_load", "1.5"});
  const int64_t N = balanced.train.micro_batch * balanced.train.seq_len, k = balanced.moe.top_k;
  const LayerShape b = LayerShape::one_gpu(balanced, N), s = LayerShape::one_gpu(skewed, N);
  EXPECT_EQ(b.routed_rows, N * k);
  EXPECT_EQ(s.routed_rows, N * k * 3 / 2);
  const std::vector<BufferPlan> pb = MoeLayer::buffers(balanced, b), ps = MoeLayer::buffers(skewed, s);
  ASSERT_EQ(pb.size(), ps.size());
  for (size_t i = 0; i < pb.size(); ++i) {
    SCOPED_TRACE(pb[i].module());
    for (const PlannedBuffer& x : pb[i].buffers()) {
      const PlannedBuffer& y = ps[i].at(x.tensor);
      const bool experts = pb[i].module() == "moe.experts";
      if (experts && x.tensor.starts_with("fc")) continue;  // the Group Linears' own (weight copies, R-sized scratch)
      if (experts || x.tensor == "local topk_idx")
        EXPECT_EQ(y.elems * 2, x.elems * 3) << x.tensor;  // R rows: 1.5 x
      else
        EXPECT_EQ(y.elems, x.elems) << x.tensor;
    }
  }
  EXPECT_GT(comm_bytes(Model::comm_buffers(skewed, N, s.routed_rows, 2, 1, true)),
            comm_bytes(Model::comm_buffers(balanced, N, b.routed_rows, 2, 1, true)));
  // The estimator's activations and comm grow with the load (a larger R), at the same rows as the model's plans.
  const MemoryEstimate eb = estimate_memory(balanced), es = estimate_memory(skewed);
  EXPECT_GT(es.category(MemCategory::activations), eb.category(MemCategory::activations));
  EXPECT_GT(es.category(MemCategory::comm), eb.category(MemCategory::comm));
  EXPECT_EQ(es.category(MemCategory::comm), comm_bytes(Model::comm_buffers(skewed, N, s.routed_rows, 2, 1, true)));
}

TEST(LayoutEmulation, SkewedRowsBeyondInt32AreRefusedBeforeAnythingIsRegistered) {
  // N k fits int32 row indices, the skewed load's 2 N k does not.
  const TrainerConfig cfg = tiny({"--parallel.ep", "2", "--parallel.dp", "2", "--parallel.routed_load", "2"});
  const int64_t max_tokens = ((int64_t{1} << 31) - 1) / cfg.moe.top_k;
  DeviceMemory mem;  // nothing is allocated: the checks come first
  ParamStore store;
  expect_error_with([&] { MoeRouter router(store, "layers.1.moe", cfg, max_tokens, mem); },
                    {"layers.1.moe", "parallel.routed_load 2", "routed rows, beyond int32"});
  expect_error_with([&] {
    MoeRoutedExperts experts(store, "layers.1.moe", 4, 64, 32, cfg.moe.top_k, cfg.recipe.routed_experts, 0.01f,
                             max_tokens, mem, MoeRecompute{}, 2.0);
  }, {"layers.1.moe", "routed_load 2) beyond int32"});
  EXPECT_TRUE(store.params().empty());
  EXPECT_EQ(mem.current_total(), 0u);
}

TEST(LayoutEmulation, CommPlanIsTheEstimatorsCommCategory) {
  // pp 2 x dp 2 with ep 2: the MoE stage (1) holds the EP and the PP buffers, the dense stage (0) the PP ones.
  for (const char* recipe : {"bf16", "fp8", "mxfp4"}) {
    SCOPED_TRACE(recipe);
    const TrainerConfig cfg = tiny({"--parallel.pp", "2", "--parallel.dp", "2", "--parallel.ep", "2",
                                    "--recipe.routed_experts", recipe});
    const ParallelLayout layout = layout_of(cfg);
    const int64_t N = 4 * 64, d = 64, k = 2;
    for (int64_t stage : {0, 1}) {
      const bool moe = stage == 1;
      const BufferPlan plan = Model::comm_buffers(cfg, N, N * k, 2, 2, moe);
      const MemoryEstimate e = estimate_memory_stage(cfg, layout, stage);
      EXPECT_EQ(e.category(MemCategory::comm), comm_bytes(plan)) << stage;
      EXPECT_EQ(e.device_memory[static_cast<int>(MemCategory::comm)], plan.counted_bytes(MemCategory::comm)) << stage;
      EXPECT_EQ(plan.at(Model::kPipelineSend).bytes(), 2 * N * d);
      EXPECT_EQ(plan.at(Model::kPipelineReceive).bytes(), 2 * N * d);
      const ExpertParallelRowBytes row = expert_parallel_row_bytes(cfg.recipe.routed_experts, d);
      const int64_t ep_bytes = moe ? 2 * N * k * std::max(row.dispatch + row.combine, row.backward_dispatch + row.backward_combine) : 0;
      EXPECT_EQ(comm_bytes(plan), 4 * N * d + ep_bytes) << stage;
    }
  }
  expect_error_with([] { Model::comm_buffers(tiny(), 256, 512, 0, 1, true); }, {"ep, pp >= 1"});
}

TEST(LayoutEmulation, RunFileAttributesRecordTheLayoutAndStage) {
  const TrainerConfig one = tiny();
  EXPECT_TRUE(layout_attributes(one, pipeline_stage(one)).empty());  // one GPU: nothing added
  const TrainerConfig cfg = tiny({"--model.layers", "5", "--parallel.pp", "3", "--parallel.dp", "2", "--parallel.ep",
                                  "2", "--parallel.micro_batches", "4", "--train.grad_accum", "4", "--parallel.stage",
                                  "1"});
  const Attributes a = layout_attributes(cfg, pipeline_stage(cfg));
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"parallel.tp", 1}, {"parallel.pp", 3}, {"parallel.dp", 2}, {"parallel.ep", 2}, {"parallel.micro_batches", 4},
      {"parallel.zero1", 0}, {"stage", 1}, {"stage.first_layer", 1}, {"stage.layers", 2}, {"loss_absent", 1}};
  ASSERT_EQ(a.size(), expected.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, expected[i].first);
    EXPECT_EQ(std::get<int64_t>(a[i].second), expected[i].second) << expected[i].first;
  }
  const TrainerConfig last = tiny({"--parallel.pp", "2", "--parallel.stage", "1"});
  EXPECT_EQ(std::get<int64_t>(layout_attributes(last, pipeline_stage(last)).back().second), 0);  // loss_absent
}

TEST(LayoutEmulation, WhatIsNotEmulatedIsRejectedInOneLine) {
  expect_error_with([] { check_emulated_layout(tiny({"--parallel.tp", "2"})); },
                    {"parallel.tp = 2", "tensor parallelism is not emulated"});
  // A skewed routed load is emulated (layout_emulation.h); tensor parallelism alone is not.
  EXPECT_NO_THROW(
      check_emulated_layout(tiny({"--parallel.ep", "2", "--parallel.dp", "2", "--parallel.routed_load", "1.5"})));
  EXPECT_TRUE(layout_is_emulated(layout_of(tiny({"--parallel.ep", "2", "--parallel.dp", "2",
                                                 "--parallel.routed_load", "2"}))));
  EXPECT_FALSE(layout_is_emulated(layout_of(tiny({"--parallel.tp", "2"}))));
  EXPECT_NO_THROW(check_emulated_layout(tiny({"--parallel.pp", "2", "--parallel.ep", "2", "--parallel.dp", "2"})));

  TrainerOptions opts;
  // The last stage trains and evaluates; the first has no loss to evaluate.
  EXPECT_NO_THROW(check_trainable(tiny({"--parallel.pp", "2", "--parallel.stage", "1"}), opts));
  expect_error_with([&] { check_trainable(tiny({"--parallel.pp", "2", "--parallel.stage", "0"}), opts); },
                    {"train.eval_interval = 10", "stage 0", "no LM head"});
  EXPECT_NO_THROW(check_trainable(
      tiny({"--parallel.pp", "2", "--parallel.stage", "0", "--train.eval_interval", "0"}), opts));
  expect_error_with([&] {
    check_trainable(tiny({"--parallel.pp", "2", "--parallel.stage", "1", "--train.checkpoint_dir", "c",
                          "--train.checkpoint_interval", "5"}), opts);
  }, {"train.checkpoint_dir = 'c'", "emulated layout (tp 1 pp 2 dp 1 ep 1)"});
  TrainerOptions resume;
  resume.resume_path = "x.ckpt";
  expect_error_with([&] { check_trainable(tiny({"--parallel.pp", "2", "--parallel.stage", "1"}), resume); },
                    {"--resume", "emulated layout"});
  expect_error_with([&] { check_trainable(tiny({"--parallel.tp", "2"}), opts); }, {"parallel.tp = 2"});
  expect_error_with([&] { check_trainable(tiny({"--parallel.ep", "2", "--parallel.dp", "2"}), resume); },
                    {"--resume", "emulated layout (tp 1 pp 1 dp 2 ep 2)"});
  // One GPU, and a data-parallel replica (the whole model), keep checkpoints and resumption.
  EXPECT_NO_THROW(check_trainable(tiny({"--train.checkpoint_dir", "c", "--train.checkpoint_interval", "5"}), resume));
  EXPECT_NO_THROW(check_trainable(tiny({"--parallel.dp", "2", "--train.checkpoint_dir", "c"}), resume));
}

}  // namespace
}  // namespace fp4moe
