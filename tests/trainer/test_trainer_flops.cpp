// Parameter counts, model FLOPs and MFU (trainer/flops.h): DeepSeek-V3's and V2's published totals from their
// production shapes (the v3/v2 presets with the production layer, expert and vocabulary counts), the causal
// attention term against a brute-force count of (query, key) pairs, and how counts move with the shape.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/flops.h"

namespace fp4moe {
namespace {

using test::preset;

// DeepSeek-V3 as published: 61 layers (3 dense), 256 routed experts, vocabulary 129280 (V3 report, sec. 4.2).
TrainerConfig v3_production() {
  return parse_config_args({"--config", preset("v3"), "--model.layers", "61", "--model.n_dense_layers", "3",
                            "--moe.routed_experts", "256", "--model.vocab_size", "129280"});
}
// DeepSeek-V2: 60 layers (1 dense), 160 routed experts, vocabulary 102400 (V2 report, sec. 3.1.2).
TrainerConfig v2_production() {
  return parse_config_args({"--config", preset("v2"), "--model.layers", "60", "--model.n_dense_layers", "1",
                            "--moe.routed_experts", "160", "--model.vocab_size", "102400"});
}

TEST(TrainerFlops, DeepSeekV3ProductionShapeGivesThePublishedTotals) {
  const ParameterCounts c = count_parameters(v3_production());
  // 671B total: within 1% (the count lands within 0.01%).
  EXPECT_NEAR(static_cast<double>(c.total), 671e9, 0.01 * 671e9);
  // 37B activated, published to two digits: the count must round to 37B (|x - 37e9| < 0.5e9). It is 36.63e9, 1.01%
  // below 37e9; counting the whole embedding table instead of one row would give 37.55e9, which rounds to 38B.
  EXPECT_NEAR(static_cast<double>(c.activated), 37e9, 0.5e9);
  EXPECT_GT(static_cast<double>(c.activated + c.embedding), 37.5e9);
  EXPECT_EQ(c.total, c.embedding + c.attention + c.norms + c.dense_ffn + c.router + c.routed_experts +
                         c.shared_experts + c.lm_head);
}

TEST(TrainerFlops, DeepSeekV2ProductionShapeGivesThePublishedTotals) {
  const ParameterCounts c = count_parameters(v2_production());
  EXPECT_NEAR(static_cast<double>(c.total), 236e9, 0.01 * 236e9);      // 236B total
  EXPECT_NEAR(static_cast<double>(c.activated), 21e9, 0.5e9);           // 21B activated, published to two digits
  EXPECT_EQ(c.router, 59 * 160 * 5120);                                 // v2: softmax router, no bias
}

// DeepSeek's published training compute per token at sequence length 4096 ("Insights into DeepSeek-V3", ISCA
// 2025, table 2): 250 GFLOPs for V3 and 155 GFLOPs for V2; both count causal attention as half the T x T work.
TEST(TrainerFlops, TrainingFlopsPerTokenMatchDeepSeeksPublishedFigures) {
  EXPECT_NEAR(model_flops_per_token(v3_production(), 4096).training, 250e9, 0.01 * 250e9);
  EXPECT_NEAR(model_flops_per_token(v2_production(), 4096).training, 155e9, 0.01 * 155e9);
  // Counting the full T x T square instead would overshoot both by more than 10%.
  const TrainerConfig v3 = v3_production();
  const double square = model_flops_per_token(v3, 4096).training +
                        3.0 * v3.model.layers * attention_flops_per_token(v3.model, 4096) * (4096.0 / 4097.0);
  EXPECT_GT(square, 1.1 * 250e9);
}

// The per-layer breakdown the planner uses (layer_flops_per_token, lm_head_flops_per_token) adds up to the model's
// forward FLOPs, the router's GEMM included, for both shapes and one without a query down-projection.
TEST(TrainerFlops, LayerBreakdownSumsToTheModelForward) {
  TrainerConfig direct_q = v2_production();
  direct_q.model.q_lora_rank = 0;
  for (const TrainerConfig& cfg : {v3_production(), v2_production(), direct_q}) {
    double sum = lm_head_flops_per_token(cfg.model);
    for (int64_t l = 0; l < cfg.model.layers; ++l) sum += layer_flops_per_token(cfg, l, 4096).total();
    EXPECT_NEAR(sum, model_flops_per_token(cfg, 4096).forward, 1e-9 * sum) << cfg.model.name;
  }
  const TrainerConfig v3 = v3_production();
  const LayerFlopsPerToken dense = layer_flops_per_token(v3, 0, 4096), moe = layer_flops_per_token(v3, 3, 4096);
  EXPECT_EQ(dense.dense_ffn, 6.0 * 7168 * 18432);
  EXPECT_EQ(dense.routed_experts, 0.0);
  EXPECT_EQ(moe.routed_experts, 8 * 6.0 * 7168 * 2048);
  EXPECT_EQ(moe.mla_up, 2.0 * (1536.0 * 128 * 192 + 512.0 * 128 * (128 + 128)));
  EXPECT_EQ(moe.router, 2.0 * 256 * 7168);
}

TEST(TrainerFlops, CountsMoveWithTheShapeAsTheFormulasSay) {
  const TrainerConfig base = parse_config_args({"--config", preset("small")});
  const ParameterCounts c0 = count_parameters(base);
  const int64_t moe_layers = base.model.layers - base.model.n_dense_layers;
  const int64_t expert = 3 * base.model.hidden * base.moe.expert_ffn;

  // One more routed expert: total grows by an expert and a router row (plus a bias) per MoE layer, the activated
  // count by the router row only.
  TrainerConfig more = base;
  more.moe.routed_experts += 1;
  const ParameterCounts c1 = count_parameters(more);
  EXPECT_EQ(c1.total - c0.total, moe_layers * (expert + base.model.hidden + 1));
  EXPECT_EQ(c1.activated - c0.activated, moe_layers * (base.model.hidden + 1));
  // One more selected expert: the activated count grows by an expert per MoE layer, the total not at all.
  TrainerConfig wider = base;
  wider.moe.top_k += 1;
  const ParameterCounts c2 = count_parameters(wider);
  EXPECT_EQ(c2.total, c0.total);
  EXPECT_EQ(c2.activated - c0.activated, moe_layers * expert);
  // With every expert selected, the activated parameters are all but the embedding table minus one row.
  TrainerConfig all = base;
  all.moe.top_k = all.moe.routed_experts;
  const ParameterCounts c3 = count_parameters(all);
  EXPECT_EQ(c3.activated, c3.total - c3.embedding + base.model.hidden);
  // Without a query down-projection, q is a direct d x H dq projection and the q norm disappears.
  TrainerConfig direct = base;
  direct.model.q_lora_rank = 0;
  const ModelConfig& m = base.model;
  EXPECT_EQ(count_parameters(direct).attention - c0.attention,
            m.layers * (m.hidden * m.heads * m.qk_head_dim() -
                        (m.hidden * m.q_lora_rank + m.q_lora_rank * m.heads * m.qk_head_dim() + m.q_lora_rank)));
}

TEST(TrainerFlops, CausalAttentionMatchesABruteForcePairCount) {
  const TrainerConfig cfg = parse_config_args({"--config", preset("tiny")});
  const ModelConfig& m = cfg.model;
  for (int64_t T : {1, 2, 7, 64, 4096}) {
    double pairs = 0;  // (query, key) pairs with key position <= query position
    for (int64_t q = 0; q < T; ++q)
      for (int64_t k = 0; k <= q; ++k) pairs += 1;
    const double per_pair = 2.0 * m.heads * m.qk_head_dim() + 2.0 * m.heads * m.v_head_dim;  // QK^T and PV
    EXPECT_DOUBLE_EQ(attention_flops_per_token(m, T), pairs * per_pair / static_cast<double>(T)) << "T=" << T;
  }
  const FlopsPerToken f = model_flops_per_token(cfg, 64);
  const ParameterCounts c = count_parameters(cfg);
  EXPECT_DOUBLE_EQ(f.attention, m.layers * attention_flops_per_token(m, 64));
  EXPECT_DOUBLE_EQ(f.forward, 2.0 * static_cast<double>(c.activated_matmul) + f.attention);
  EXPECT_DOUBLE_EQ(f.training, 3.0 * f.forward);
  EXPECT_LT(c.activated_matmul, c.activated);  // norms and the embedding row are not GEMM weights
}

TEST(TrainerFlops, MfuIsAchievedOverPeak) {
  const TrainerConfig cfg = v3_production();
  const double per_token = model_flops_per_token(cfg, 4096).training;
  // DeepSeek-V3 trains at about 6 x 37e9 FLOPs per token plus attention.
  EXPECT_GT(per_token, 6 * 36e9);
  EXPECT_LT(per_token, 6 * 36e9 * 1.3);
  const double half_peak_rate = 0.5 * kH100H200DenseBf16Flops / per_token;
  EXPECT_NEAR(model_flops_utilization(cfg, 4096, half_peak_rate, kH100H200DenseBf16Flops), 0.5, 1e-12);
  EXPECT_EQ(model_flops_utilization(cfg, 4096, 0.0, kH100H200DenseBf16Flops), 0.0);
  test::expect_error_with([&] { model_flops_utilization(cfg, 4096, 1.0, 0.0); }, {"peak FLOP/s must be > 0"});
  test::expect_error_with([&] { model_flops_utilization(cfg, 4096, -1.0, 1e15); }, {"tokens per second"});
  test::expect_error_with([&] { attention_flops_per_token(cfg.model, 0); }, {"seq_len must be >= 1"});
}

}  // namespace
}  // namespace fp4moe
