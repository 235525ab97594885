// The layout planner (trainer/memory/plan.h), no device: the cost model's pure functions against hand-computed
// numbers (stage time, 1F1B bubble and tokens/s, recompute reruns, the cost table of tiny over 2 stages and 2 expert
// ranks), the ranking of a fixed cost table, the enumeration (only valid layouts, counted by hand for tiny on 8
// GPUs; DeepSeek-V3 on 256 GPUs includes the preset's layout), and the fit filter (a tiny budget keeps nothing and
// the report says so).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/flops.h"
#include "trainer/memory/estimate_report.h"
#include "trainer/memory/plan.h"

namespace fp4moe {
namespace {

using test::expect_error_with;
using test::preset;

TrainerConfig tiny() { return parse_config_args({"--config", preset("tiny")}); }

PlanHardware hardware(double peak, double mfu, double nvlink, double ib, int64_t per_node) {
  PlanHardware hw;
  hw.peak_flops = peak;
  hw.mfu = mfu;
  hw.nvlink_bytes_per_s = nvlink;
  hw.ib_bytes_per_s = ib;
  hw.gpus_per_node = per_node;
  return hw;
}

TEST(LayoutPlanCost, StageTimeIsFlopsOverEffectivePeakPlusTheSlowerLinkPlusPipeline) {
  const PlanHardware hw = hardware(1e15, 0.5, 450e9, 50e9, 8);
  StageCost c;
  c.flops = 1e12;              // 1e12 / (1e15 x 0.5) = 2 ms
  c.ep_nvlink_bytes = 450e6;   // 1 ms over NVLink
  c.ep_ib_bytes = 100e6;       // 2 ms over InfiniBand: the slower link sets the EP time
  c.pp_bytes = 50e6;           // 1 ms over InfiniBand
  c.pp_over_ib = true;
  const StageTime t = stage_time(c, hw);
  EXPECT_DOUBLE_EQ(t.compute_s, 2e-3);
  EXPECT_DOUBLE_EQ(t.ep_s, 2e-3);
  EXPECT_DOUBLE_EQ(t.pp_s, 1e-3);
  EXPECT_DOUBLE_EQ(t.total(), 5e-3);
  c.pp_over_ib = false;  // 50e6 / 450e9
  EXPECT_DOUBLE_EQ(stage_time(c, hw).pp_s, 50e6 / 450e9);
  expect_error_with([&] { stage_time(c, hardware(1e15, 1.5, 450e9, 50e9, 8)); }, {"mfu", "(0, 1]"});
  expect_error_with([&] { stage_time(c, hardware(1e15, 0.5, 0, 50e9, 8)); }, {"NVLink"});
}

TEST(LayoutPlanCost, OneFOneBStepBubbleAndTokensPerGpu) {
  // Three stages of 1, 3 and 2 ms, 5 micro-batches of 4096 tokens, tp 2: the step is (5 + 3 - 1) x 3 ms = 21 ms,
  // the bubble 2 / 7, and each of the tp x pp = 6 GPUs of a pipeline yields 5 x 4096 / (21 ms x 6) tokens/s.
  auto ms = [](double v) { return StageTime{v * 1e-3, 0, 0}; };
  const StepPrediction p = predict_step({ms(1), ms(3), ms(2)}, 5, 4096, 2);
  EXPECT_EQ(p.slowest_stage, 1);
  EXPECT_DOUBLE_EQ(p.bubble, 2.0 / 7.0);
  EXPECT_DOUBLE_EQ(p.step_s, 21e-3);
  EXPECT_NEAR(p.tokens_per_s_per_gpu, 5.0 * 4096 / (21e-3 * 6), 1e-9 * 162539.7);
  // One stage: no bubble.
  EXPECT_DOUBLE_EQ(predict_step({ms(2)}, 4, 100, 1).bubble, 0.0);
  EXPECT_DOUBLE_EQ(predict_step({ms(2)}, 4, 100, 1).tokens_per_s_per_gpu, 400 / 8e-3);
  expect_error_with([&] { predict_step({}, 1, 1, 1); }, {"at least one stage"});
  expect_error_with([&] { predict_step({ms(1)}, 0, 1, 1); }, {"micro-batches"});
}

TEST(LayoutPlanCost, RecomputeRerunsTheForwardOfTheModulesItNames) {
  LayerFlopsPerToken f;
  f.mla_down = 1;
  f.mla_up = 2;
  f.mla_out = 4;
  f.attention_core = 8;
  f.dense_ffn = 16;
  f.router = 32;
  f.routed_experts = 64;
  f.shared_experts = 128;
  auto rerun = [&](std::vector<std::string> modules) { return recompute_flops_per_token(f, RecomputeConfig{modules}); };
  EXPECT_EQ(rerun({}), 0);
  EXPECT_EQ(rerun({"mla_up_proj"}), 2);
  EXPECT_EQ(rerun({"moe_act", "mla_up_proj"}), 2);             // moe_act: element-wise
  EXPECT_EQ(rerun({"core_attn", "layernorm", "moe"}), 8 + 32 + 64 + 128);
  EXPECT_EQ(rerun({"moe", "shared_experts"}), 32 + 64 + 128);  // not counted twice
  EXPECT_EQ(rerun({"shared_experts"}), 128);
  EXPECT_EQ(rerun({"mlp"}), 16);
  EXPECT_EQ(rerun({"full"}), 255);
}

TEST(LayoutPlanCost, CostTableOfTinyOverTwoStagesAndTwoExpertRanks) {
  TrainerConfig cfg = tiny();  // N = 4 x 64 = 256 tokens, d = 64, top-2, layer 0 dense, layer 1 MoE
  ParallelLayout l = layout_of(cfg);
  l.gpus = 4;
  l.pp = 2;
  l.dp = 2;
  l.ep = 2;
  l.micro_batches = 4;
  const PlanHardware hw = hardware(1e15, 0.5, 450e9, 50e9, 8);
  const std::vector<StageCost> c = stage_costs(cfg, l, hw);
  ASSERT_EQ(c.size(), 2u);
  const double f0 = layer_flops_per_token(cfg, 0, 64).total(), f1 = layer_flops_per_token(cfg, 1, 64).total();
  EXPECT_DOUBLE_EQ(c[0].flops, 256 * 3 * f0);
  EXPECT_DOUBLE_EQ(c[1].flops, 256 * 3 * (f1 + 2.0 * 32768 * 64));  // + the LM head on the last stage
  // EP on the MoE stage: 512 rows sent and 512 received, BF16 rows of 128 bytes each way (dispatch, combine, and
  // both backward exchanges): 512 x (128 + 128) x 2 = 262144 bytes, half of them to the other rank, on the node.
  EXPECT_EQ(c[0].ep_nvlink_bytes + c[0].ep_ib_bytes, 0);
  EXPECT_DOUBLE_EQ(c[1].ep_nvlink_bytes, 131072);
  EXPECT_DOUBLE_EQ(c[1].ep_ib_bytes, 0);
  // The hidden state [256, 64] BF16 forward from stage 0, its gradient backward from stage 1.
  EXPECT_DOUBLE_EQ(c[0].pp_bytes, 32768);
  EXPECT_DOUBLE_EQ(c[1].pp_bytes, 32768);
  EXPECT_FALSE(c[0].pp_over_ib);  // 4 GPUs / 2 stages < 8 per node

  // One GPU per node: every byte leaves the node.
  const std::vector<StageCost> far = stage_costs(cfg, l, hardware(1e15, 0.5, 450e9, 50e9, 1));
  EXPECT_DOUBLE_EQ(far[1].ep_nvlink_bytes, 0);
  EXPECT_DOUBLE_EQ(far[1].ep_ib_bytes, 131072);
  EXPECT_TRUE(far[1].pp_over_ib);

  // mxfp4 routed experts: dispatch d / 2 + d / 32 = 34 bytes, combine 128, backward dy FP8 64 + 4 = 68 (sent rows),
  // backward dx BF16 128 (received rows: summed over the token's slots at its rank).
  cfg.recipe.routed_experts = Recipe::mxfp4;
  EXPECT_DOUBLE_EQ(stage_costs(cfg, l, hw)[1].ep_nvlink_bytes, (512.0 * (34 + 68) + 512.0 * (128 + 128)) / 2);
  // A skewed load doubles the rows received and the routed experts' FLOPs.
  l.routed_load = 2.0;
  cfg.recipe.routed_experts = Recipe::bf16;
  const LayerFlopsPerToken g = layer_flops_per_token(cfg, 1, 64);
  EXPECT_DOUBLE_EQ(stage_costs(cfg, l, hw)[1].flops,
                   256 * 3 * (g.total() + g.routed_experts + 2.0 * 32768 * 64));
  EXPECT_DOUBLE_EQ(stage_costs(cfg, l, hw)[1].ep_nvlink_bytes, (512.0 * 256 + 1024.0 * 256) / 2);
}

TEST(LayoutPlanRank, FixedCostTableRanksByTokensPerGpuThenMemory) {
  // A deep pipeline with few micro-batches loses to shallower ones despite faster stages: 4 stages of 1 ms with
  // m = 4 take 7 ms per step for 4 x 1000 tokens on 4 GPUs (143e3 tokens/s per GPU); 1 stage of 3 ms with m = 4
  // takes 12 ms for 4000 tokens on 1 GPU (333e3); 2 stages of 1 ms with m = 8 take 9 ms for 8000 tokens on 2 GPUs
  // (444e3).
  auto candidate = [](std::vector<double> ms, int64_t m, double gib) {
    std::vector<StageTime> t;
    for (double v : ms) t.push_back(StageTime{v * 1e-3, 0, 0});
    PlanCandidate c;
    c.memory_gib = gib;
    c.step = predict_step(t, m, 1000, 1);
    return c;
  };
  std::vector<PlanCandidate> cs = {candidate({1, 1, 1, 1}, 4, 10), candidate({3}, 4, 50), candidate({3}, 4, 40),
                                   candidate({1, 1}, 8, 30)};
  EXPECT_NEAR(cs[0].step.tokens_per_s_per_gpu, 4000 / (7e-3 * 4), 1e-6);
  EXPECT_NEAR(cs[1].step.tokens_per_s_per_gpu, 4000 / 12e-3, 1e-6);
  EXPECT_NEAR(cs[3].step.tokens_per_s_per_gpu, 8000 / (9e-3 * 2), 1e-6);  // 444e3
  rank_candidates(cs);
  EXPECT_EQ(cs[0].memory_gib, 30);  // 2 stages, m 8: 444e3
  EXPECT_EQ(cs[1].memory_gib, 40);  // 1 stage: 333e3, less memory first
  EXPECT_EQ(cs[2].memory_gib, 50);
  EXPECT_EQ(cs[3].memory_gib, 10);  // 4 stages, m 4: 143e3
}

PlanRequest tiny_request(int64_t gpus, double gib) {
  PlanRequest r;
  r.model = tiny();
  r.title = "tiny";
  r.gpus = gpus;
  r.memory_gib = gib;
  r.micro_batch = 4;
  r.seq_len = 64;
  r.global_batch = 32;
  r.recipes = {Recipe::bf16, Recipe::fp8, Recipe::mxfp4};
  return r;
}

TEST(LayoutPlanEnumerate, OnlyValidLayoutsCountedByHand) {
  // tiny on 8 GPUs: tp in {1, 2, 4} (heads 4), pp in {1, 2} (2 layers); dp = 8 / (tp pp); ep divides
  // gcd(8 experts, dp tp): dp tp = 8 gives ep 1, 2, 4, 8, dp tp = 4 gives 1, 2, 4. Pairs (tp, pp): (1,1) 8,
  // (1,2) 4, (2,1) 8, (2,2) 4, (4,1) 8, (4,2) 4: 3 x 4 + 3 x 3 = 21 layouts.
  const std::vector<ParallelLayout> ls = enumerate_layouts(tiny_request(8, 80));
  EXPECT_EQ(ls.size(), 21u);
  for (const ParallelLayout& l : ls) {
    EXPECT_EQ(l.tp * l.pp * l.dp, 8) << l.name;
    EXPECT_NE(l.tp, 8) << l.name;
    EXPECT_LE(l.pp, 2) << l.name;
    EXPECT_EQ((l.dp * l.tp) % l.ep, 0) << l.name;
    EXPECT_EQ(8 % l.ep, 0) << l.name;
    EXPECT_EQ(l.micro_batches * l.dp * 4, 32) << l.name;
    EXPECT_TRUE(l.zero1);
  }
  // --tp 2 only: (2, 1) with 4 expert-parallel sizes and (2, 2) with 3.
  PlanRequest tp2 = tiny_request(8, 80);
  tp2.tp_values = {2};
  const std::vector<ParallelLayout> two = enumerate_layouts(tp2);
  EXPECT_EQ(two.size(), 7u);
  for (const ParallelLayout& l : two) EXPECT_EQ(l.tp, 2) << l.name;
  // A global batch that 8 replicas of 4 rows cannot split leaves out dp 8.
  PlanRequest odd = tiny_request(8, 80);
  odd.global_batch = 16;
  for (const ParallelLayout& l : enumerate_layouts(odd)) EXPECT_LT(l.dp, 8) << l.name;

  // DeepSeek-V3 on 256 GPUs: the preset's layout is among them, every one validates.
  const ProductionPreset v3 = production_preset("v3");
  PlanRequest r;
  r.model = v3.config;
  r.gpus = 256;
  r.memory_gib = 80;
  r.micro_batch = 1;
  r.seq_len = 4096;
  r.global_batch = v3.global_batch;
  r.recipes = {Recipe::mxfp4};
  const std::vector<ParallelLayout> big = enumerate_layouts(r);
  EXPECT_TRUE(std::any_of(big.begin(), big.end(), [](const ParallelLayout& l) {
    return l.tp == 1 && l.pp == 4 && l.dp == 64 && l.ep == 64 && l.micro_batches == 240;
  }));
  for (const ParallelLayout& l : big) {
    EXPECT_NO_THROW(validate_layout(v3.config, l)) << l.name;
    EXPECT_LE(l.pp, 16);
  }
}

TEST(LayoutPlanFit, TinyBudgetKeepsNothingAndSaysSo) {
  const PlanRequest none = tiny_request(2, 1e-6);
  const PlanResult empty = plan_layouts(none);
  EXPECT_TRUE(empty.fitting.empty());
  EXPECT_EQ(empty.all.size(), static_cast<size_t>(empty.layouts) * 3 * 3);
  const std::string text = format_plan(empty, none, 5);
  EXPECT_NE(text.find("Nothing fits 1e-06 GiB under bf16"), std::string::npos) << text;
  EXPECT_NE(text.find("Nothing fits 1e-06 GiB under mxfp4"), std::string::npos) << text;

  // A roomy budget keeps every candidate, ranked.
  const PlanRequest roomy = tiny_request(2, 1000);
  const PlanResult all = plan_layouts(roomy);
  EXPECT_EQ(all.fitting.size(), all.all.size());
  for (size_t i = 1; i < all.fitting.size(); ++i)
    EXPECT_GE(all.fitting[i - 1].step.tokens_per_s_per_gpu, all.fitting[i].step.tokens_per_s_per_gpu);
  const std::string report = format_plan(all, roomy, 2);
  for (const char* part : {"## bf16", "## fp8", "## mxfp4", "| rank | tp | pp |", "## What mxfp4 buys", "- over fp8",
                           "- over bf16", "## Best tokens/s per GPU by recompute policy",
                           "| recompute policy | bf16 | fp8 | mxfp4 |", "| mla_up_proj only | "})
    EXPECT_NE(report.find(part), std::string::npos) << part << " not in:\n" << report;

  // A budget between the smallest and the largest keeps exactly those at or under it.
  double lo = 1e30, hi = 0;
  for (const PlanCandidate& c : all.all) lo = std::min(lo, c.memory_gib), hi = std::max(hi, c.memory_gib);
  PlanRequest mid = tiny_request(2, (lo + hi) / 2);
  const PlanResult some = plan_layouts(mid);
  size_t under = 0;
  for (const PlanCandidate& c : some.all) under += c.memory_gib <= mid.memory_gib;
  EXPECT_EQ(some.fitting.size(), under);
  EXPECT_GT(under, 0u);
  EXPECT_LT(under, some.all.size());

  // The result table (--out): every candidate in enumeration order, its fit flag against the budget.
  const Table table = plan_table(some, mid);
  ASSERT_EQ(table.rows(), static_cast<int64_t>(some.all.size()));
  int64_t fits = 0;
  for (size_t i = 0; i < some.all.size(); ++i) {
    fits += table.column("fits").i64[i];
    EXPECT_EQ(table.column("fits").i64[i], some.all[i].memory_gib <= mid.memory_gib ? 1 : 0);
    EXPECT_EQ(table.column("tp").i64[i], some.all[i].layout.tp);
    EXPECT_EQ(table.column("recipe").str[i], recipe_name(some.all[i].recipe));
    EXPECT_EQ(table.column("tokens_per_s_per_gpu").f64[i], some.all[i].step.tokens_per_s_per_gpu);
  }
  EXPECT_EQ(fits, static_cast<int64_t>(under));
}

TEST(LayoutPlanFit, RejectsBadRequests) {
  PlanRequest r = tiny_request(0, 80);
  expect_error_with([&] { plan_layouts(r); }, {"--gpus must be in [1, 1048576], got 0"});
  r = tiny_request(int64_t{1} << 40, 80);
  expect_error_with([&] { plan_layouts(r); }, {"--gpus must be in [1, 1048576]"});
  r = tiny_request(8, -1);
  expect_error_with([&] { plan_layouts(r); }, {"--memory-gib"});
  r = tiny_request(8, 80);
  r.recipes.clear();
  expect_error_with([&] { plan_layouts(r); }, {"--recipes"});
  r = tiny_request(8, 80);
  r.tp_values = {3};
  expect_error_with([&] { plan_layouts(r); }, {"--tp 3", "1, 2, 4, 8"});
  expect_error_with([&] { format_plan(PlanResult{}, tiny_request(8, 80), 0); }, {"--top must be >= 1"});
}

}  // namespace
}  // namespace fp4moe
