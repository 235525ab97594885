// The analytic memory estimator (trainer/memory/estimate.h), no device needed:
//   - configs/tiny.toml on one GPU, by hand: the parameter tensors, weights, grads and optimizer to the byte (and
//     DeviceMemory's 256-byte rounding), the activations of every module from the header's formulas in the bf16,
//     fp8 and mxfp4 routed recipes, the FP8 weight copies;
//   - the `moe` policy on tiny by hand: the routing stays, the routed experts keep row_of and their dispatched input
//     in the recipe's storage format (BF16 xs; fp8: the FP8 row copy beside fc1's FP8 columns; MXFP4 xs), the rest
//     of the block is taken from the shared scratch arena while it is recomputed;
//   - monotonicity: every recompute module lowers the activations it names; the routed experts' kept inputs order
//     mxfp4 < fp8 < bf16 (under moe: mxfp4 < bf16 < fp8, fp8 keeping both its row and column copies of xs), and
//     the expert-parallel buffers mxfp4 < fp8 < bf16;
//   - the production presets: parameters add up to the published totals over the stages, ZeRO-1 shards the
//     optimizer, 1F1B keeps pp - s micro-batches (when a step has at least pp); paper 1's direction: mxfp4
//     activations below fp8's by 5-20% on DeepSeek-V3's layout under moe_act + mla_up_proj and under mla_up_proj (the estimate gives 9.9% and 8.0%),
//     and below under attention + layernorm + experts, by exactly the routed experts' kept dispatched input
//     (MXFP4 xs against fp8's FP8 row and column copies; the numbers are printed);
//   - BF16 AdamW moments (train.moments = "bf16"): 2 B per moment element, on one GPU and under ZeRO-1, the rest
//     unchanged;
//   - the layout checks.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/flops.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/estimate_report.h"
#include "trainer/model/group_linear.h"

namespace fp4moe {
namespace {

using test::expect_error_with;
using test::preset;

TrainerConfig tiny(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--config", preset("tiny")};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_config_args(args);
}

std::map<std::string, int64_t> activations_by_module(const MemoryEstimate& e) {
  std::map<std::string, int64_t> m;
  for (const auto& [module, bytes] : e.activations_by_module()) m[module] = bytes;
  return m;
}

int64_t module_bytes(const MemoryEstimate& e, const std::string& module) {
  const auto m = activations_by_module(e);
  const auto it = m.find(module);
  return it == m.end() ? 0 : it->second;
}

int64_t act(const MemoryEstimate& e) { return e.category(MemCategory::activations); }
int64_t device(const MemoryEstimate& e, MemCategory c) { return e.device_memory[static_cast<int>(c)]; }

// tiny: V 32768, d 64, 2 layers (layer 0 dense FFN 128, layer 1 MoE: 8 experts of 32, top-2, 1 shared), H 4,
// r_q = r_kv = 32, nope = rope = dv = 16; N = 4 x 64 = 256 tokens.
TEST(MemoryEstimate, TinyParametersAreTheModelsTensors) {
  const TrainerConfig cfg = tiny();
  const std::vector<ParamTensor> t = parameter_tensors(cfg, single_gpu_layout(cfg), 0);
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"embed", 32768 * 64},
      {"layers.0.attn_norm", 64},  {"layers.0.attn.q_down", 32 * 64},   {"layers.0.attn.q_norm", 32},
      {"layers.0.attn.q_up", 4 * 32 * 32}, {"layers.0.attn.kv_down", 48 * 64}, {"layers.0.attn.kv_norm", 32},
      {"layers.0.attn.kv_up", 4 * 32 * 32}, {"layers.0.attn.out", 64 * 64},   {"layers.0.ffn_norm", 64},
      {"layers.0.mlp.fc1", 256 * 64},  {"layers.0.mlp.fc2", 64 * 128},
      {"layers.1.attn_norm", 64},  {"layers.1.attn.q_down", 32 * 64},   {"layers.1.attn.q_norm", 32},
      {"layers.1.attn.q_up", 4 * 32 * 32}, {"layers.1.attn.kv_down", 48 * 64}, {"layers.1.attn.kv_norm", 32},
      {"layers.1.attn.kv_up", 4 * 32 * 32}, {"layers.1.attn.out", 64 * 64},   {"layers.1.ffn_norm", 64},
      {"layers.1.moe.router", 8 * 64}, {"layers.1.moe.experts.fc1", 8 * 64 * 64},
      {"layers.1.moe.experts.fc2", 8 * 64 * 32}, {"layers.1.moe.shared.fc1", 64 * 64},
      {"layers.1.moe.shared.fc2", 64 * 32},
      {"norm", 64}, {"lm_head", 32768 * 64}, {"layers.1.moe.router_bias", 8}};
  ASSERT_EQ(t.size(), expected.size());
  int64_t total = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].name, expected[i].first);
    EXPECT_EQ(t[i].n, expected[i].second) << t[i].name;
    EXPECT_EQ(t[i].expert, t[i].name.find("experts.") != std::string::npos) << t[i].name;
    EXPECT_EQ(t[i].state, t[i].name == "layers.1.moe.router_bias");
    total += t[i].n;
  }
  EXPECT_EQ(total, count_parameters(cfg).total);  // flops.h counts the v3 router bias as a parameter
}

TEST(MemoryEstimate, TinyWeightsGradsOptimizerToTheByte) {
  const TrainerConfig cfg = tiny();
  const MemoryEstimate e = estimate_memory(cfg, single_gpu_layout(cfg));
  // Padded to 64 elements per tensor: the four 32-element latent norms take 64 each, everything else is a
  // multiple of 64 already: 4309952 + 4 x 32 = 4310080 elements (count_parameters adds the 8-element v3 bias).
  EXPECT_EQ(count_parameters(cfg).total, 4309952 + 8);
  const int64_t P = 4310080;
  // BF16 block 2P = 8620160 bytes (DeviceMemory rounds it to 8620288), FP32 masters 4P, the v3 bias state 64 x 4.
  EXPECT_EQ(e.category(MemCategory::weights), 2 * P + 4 * P + 256);
  EXPECT_EQ(device(e, MemCategory::weights), 8620288 + 4 * P + 256);
  EXPECT_EQ(e.category(MemCategory::grads), 4 * P);
  EXPECT_EQ(device(e, MemCategory::grads), 4 * P);
  EXPECT_EQ(e.category(MemCategory::optimizer), 8 * P);
  EXPECT_EQ(device(e, MemCategory::optimizer), 8 * P);
  EXPECT_EQ(e.category(MemCategory::comm), 0);
}

TEST(MemoryEstimate, TinyActivationsPerModuleFromTheFormulas) {
  const TrainerConfig cfg = tiny();
  const MemoryEstimate e = estimate_memory(cfg, single_gpu_layout(cfg));
  const int64_t N = 256, d = 64;
  // layer, per layer: h, h_mid, attn_norm out, ffn_norm out 2Nd each; two rstd 4N.
  const int64_t layer = 4 * 2 * N * d + 2 * 4 * N;
  // mla, per layer: c_q, n_q, c_kv, n_kv 2N x 32; q_norm, kv_norm rstd 4N; q, k 2N x 4 x 32; kv 2N x 4 x (16 + 16);
  // o 2N x 4 x 16; lse 4N x 4.
  const int64_t mla = 4 * 2 * N * 32 + 2 * 4 * N + 2 * 2 * N * 128 + 2 * N * 128 + 2 * N * 64 + 4 * N * 4;
  EXPECT_EQ(mla, 301056);
  const int64_t mlp = 4 * N * 128 + 2 * N * 128;  // h [N, 256], a [N, 128] BF16
  // router: probs 4N x 8, topk_idx and topk_weight 4N x 2, counts 4 x 8, offsets 4 x 9, aux 4.
  const int64_t router = 4 * N * 8 + 2 * 4 * N * 2 + 32 + 36 + 4;
  // experts, R = 512 rows: row_of 4R; xs, ys 2R x 64; h 4R x 32; a 2R x 32.
  const int64_t R = 512;
  const int64_t experts = 4 * R + 2 * 2 * R * d + 4 * R * 32 + 2 * R * 32;
  const int64_t shared = 4 * N * 32 + 2 * N * 32;
  // model: h[L], h_out 2Nd; final rstd 4N; LM head statistics 16N; the micro-batch's tokens and targets 4N each.
  const int64_t model = 2 * 2 * N * d + 4 * N + 16 * N + 2 * 4 * N;
  const auto m = activations_by_module(e);
  EXPECT_EQ(m.at("layer"), 2 * layer);
  EXPECT_EQ(m.at("mla"), 2 * mla);
  EXPECT_EQ(m.at("mlp"), mlp);
  EXPECT_EQ(m.at("moe.router"), router);
  EXPECT_EQ(m.at("moe.experts"), experts);
  EXPECT_EQ(m.at("moe.shared"), shared);
  EXPECT_EQ(m.at("model"), model);
  EXPECT_EQ(act(e), 2 * layer + 2 * mla + mlp + router + experts + shared + model);
  EXPECT_EQ(e.layer_activation_bytes,
            (std::vector<int64_t>{layer + mla + mlp, layer + mla + router + experts + shared}));
  // DeviceMemory: counts, offsets and aux take 256 bytes each; the LM head statistics are not its.
  EXPECT_EQ(device(e, MemCategory::activations), act(e) - 16 * N - (32 + 36 + 4) + 3 * 256);
}

// The buckets of Model::layer_memory for tiny's MoE layer (bf16, no policy), each buffer rounded up to 256 bytes.
TEST(MemoryEstimate, TinyLayerBucketsAsTheModelReportsThem) {
  const TrainerConfig cfg = tiny();
  const LayerActivationBuckets b = layer_activation_buckets(cfg, single_gpu_layout(cfg), 1);
  const int64_t N = 256, d = 64, R = 512;
  EXPECT_EQ(b.residual, 2 * 2 * N * d);                                    // h, h_mid
  EXPECT_EQ(b.norms, 2 * 2 * N * d + 4 * 4 * N + 2 * 2 * N * 32);         // a_in, f_in; four rstd; n_q, n_kv
  EXPECT_EQ(b.attn, 2 * N * 32 + 2 * N * 32 + 3 * 2 * N * 128 + 2 * N * 64 + 4 * N * 4);  // c_q, c_kv, q k kv, o, lse
  const int64_t router = 4 * N * 8 + 2 * 4 * N * 2 + 3 * 256;  // counts, offsets and aux take 256 bytes each
  const int64_t experts = 4 * R + 2 * 2 * R * d + 4 * R * 32 + 2 * R * 32;
  EXPECT_EQ(b.routed_experts, experts);
  EXPECT_EQ(b.ffn, router + experts + 6 * N * 32);
  const MemoryEstimate e = estimate_memory(cfg, single_gpu_layout(cfg));
  const LayerActivationBuckets b0 = layer_activation_buckets(cfg, single_gpu_layout(cfg), 0);
  EXPECT_EQ(b0.routed_experts, 0);
  // + h[L], h_out, rstd, the tokens and targets
  EXPECT_EQ(b0.kept() + b.kept() + 2 * 2 * N * d + 4 * N + 2 * 4 * N, device(e, MemCategory::activations));
}

TEST(MemoryEstimate, TinyRoutedRecipesKeepTheirOwnCopies) {
  const int64_t R = 512, d = 64, f = 32, E = 8;
  const MemoryEstimate bf16 = estimate_memory(tiny(), single_gpu_layout(tiny()));
  const int64_t maps = 4 * R, h = 4 * R * f, ys = 2 * R * d;
  {
    const TrainerConfig cfg = tiny({"--recipe.routed_experts", "mxfp4"});
    const MemoryEstimate e = estimate_memory(cfg, single_gpu_layout(cfg));
    // MXFP4 xs: d/2 code + d/32 scale bytes per row; a: f/2 + f/32. No BF16 copies kept.
    EXPECT_EQ(module_bytes(e, "moe.experts"), maps + R * (32 + 2) + h + R * (16 + 1) + ys);
    // FP8 weight copies (the GEMMs run in FP8): per expert W [N, K] and W^T as E4M3 (2NK) + 4 + 4 FP32 block
    // scales (leading dimension padded to 4): exactly fc1 8 x (8192 + 32) and fc2 8 x (4096 + 32) bytes; as four
    // buffers each rounded up to 256: 2 x 32768 + 2 x 256 and 2 x 16384 + 2 x 256.
    EXPECT_EQ(GroupLinear::weight_copy_bytes(Recipe::mxfp4, E, 2 * f, d) +
                  GroupLinear::weight_copy_bytes(Recipe::mxfp4, E, d, f),
              8u * (8192 + 32) + 8u * (4096 + 32));
    EXPECT_EQ(e.category(MemCategory::weights) - bf16.category(MemCategory::weights),
              2 * 32768 + 2 * 256 + 2 * 16384 + 2 * 256);
  }
  {
    const TrainerConfig cfg = tiny({"--recipe.routed_experts", "fp8"});
    const MemoryEstimate e = estimate_memory(cfg, single_gpu_layout(cfg));
    // FP8 column copies (layouts.h): codes K (R + 15 E), scales 4 K (ceil(R / 128) + E).
    const int64_t xs_cols = d * (R + 15 * E) + 4 * d * (4 + E);  // 40448 + 3072
    const int64_t a_cols = f * (R + 15 * E) + 4 * f * (4 + E);   // 20224 + 1536
    EXPECT_EQ(module_bytes(e, "moe.experts"), maps + xs_cols + h + a_cols + ys);
    // Group Linear keeps them instead of BF16 xs and a (all multiples of 256 bytes), from its first forward.
    EXPECT_EQ(device(e, MemCategory::activations),
              device(bf16, MemCategory::activations) - 2 * R * d - 2 * R * f + xs_cols + a_cols);
    int64_t first_forward = 0;
    for (const MemoryTerm& t : e.terms)
      if (t.first_forward && t.category == MemCategory::activations) first_forward += t.total();
    EXPECT_EQ(first_forward, xs_cols + a_cols);
  }
}

// tiny under `moe`: the router keeps everything (it does not rerun), the routed experts their permutation and
// dispatched input only; h, a and ys (and the recipe's copies of a) are workspace while they are recomputed.
TEST(MemoryEstimate, TinyMoePolicyKeepsTheRoutingAndTheDispatchedInput) {
  const int64_t N = 256, R = 512, d = 64, f = 32, E = 8;
  const int64_t router = 4 * N * 8 + 2 * 4 * N * 2 + 32 + 36 + 4;  // probs, topk_idx, topk_weight, counts, ...
  const int64_t xs_cols = d * (R + 15 * E) + 4 * d * (4 + E);      // fp8 fc1's FP8 column copy (layouts.h)
  const int64_t xs_rows = R * d + 4 * 1 * R;                       // FP8 row copy: codes, 1 block x 512 FP32 scales
  const int64_t a_cols = f * (R + 15 * E) + 4 * f * (4 + E);        // fp8 fc2's FP8 column copy, held by its Group
                                                                     // Linear although the rerun of fc2 rebuilds it
  const struct {
    const char* recipe;
    int64_t experts;
  } cases[] = {{"bf16", 4 * R + 2 * R * d},
               {"fp8", 4 * R + xs_cols + xs_rows + a_cols},
               {"mxfp4", 4 * R + R * (d / 2) + R * (d / 32)}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.recipe);
    const TrainerConfig none_cfg = tiny({"--recipe.routed_experts", c.recipe});
    TrainerConfig cfg = none_cfg;
    cfg.recompute.modules = {"moe"};
    const MemoryEstimate none = estimate_memory(none_cfg, single_gpu_layout(cfg));
    const MemoryEstimate e = estimate_memory(cfg, single_gpu_layout(cfg));
    EXPECT_EQ(module_bytes(e, "moe.router"), router);
    EXPECT_EQ(module_bytes(e, "moe.router"), module_bytes(none, "moe.router")) << "the router does not rerun";
    EXPECT_EQ(module_bytes(e, "moe.experts"), c.experts);
    EXPECT_EQ(module_bytes(e, "moe.shared"), 0) << "the shared experts rerun under moe";
    EXPECT_EQ(module_bytes(e, "layer"), module_bytes(none, "layer")) << "the block input (ffn_norm out) stays";
    EXPECT_EQ(module_bytes(e, "mla"), module_bytes(none, "mla"));
    // What the experts rerun is not kept (the estimate counts it as scratch): h [R, 2f] and ys [R, d].
    int64_t rerun = 0;
    for (const MemoryTerm& t : layer_activation_terms(cfg, single_gpu_layout(cfg), 1))
      if (t.module == "moe.experts" && (t.tensor == "h" || t.tensor == "ys")) {
        EXPECT_FALSE(t.kept) << t.tensor;
        rerun += t.bytes;
      }
    EXPECT_EQ(rerun, 4 * R * f + 2 * R * d);
  }
  // With layernorm as well, the block input is recomputed by ffn_norm: the layer keeps neither norm output.
  TrainerConfig cfg = tiny({"--recipe.routed_experts", "mxfp4"});
  cfg.recompute.modules = {"moe", "layernorm"};
  const MemoryEstimate e = estimate_memory(cfg, single_gpu_layout(cfg));
  EXPECT_EQ(module_bytes(e, "layer"), 2 * 2 * 2 * N * d) << "h and h_mid of both layers only";
  EXPECT_EQ(module_bytes(e, "moe.experts"), 4 * R + R * (d / 2) + R * (d / 32));
}

TEST(MemoryEstimate, WorkspaceIsTheArenaPlusTheModelsBuffers) {
  const TrainerConfig cfg = tiny();
  const MemoryEstimate e = estimate_memory(cfg, single_gpu_layout(cfg));
  int64_t model = 0, arena = 0;
  for (const MemoryTerm& t : e.terms) {
    if (t.category != MemCategory::workspace) continue;
    if (t.tensor == kScratchArenaTerm) arena += t.total();
    else if (t.module == "model" || t.module == "trainer") model += t.total();
  }
  EXPECT_GT(arena, 0);
  EXPECT_EQ(e.category(MemCategory::workspace), arena + model);  // bf16: no Linear holds scratch of its own
  EXPECT_GT(e.workspace_all_layers, e.category(MemCategory::workspace));  // two layers' scratch and the model's
  EXPECT_LT(e.workspace_all_layers - model, 3 * arena + 1);              // each at most the arena
}

// A pass's scratch (MLA's "d o", taken from the shared arena by every layer's backward in turn) is in the arena, which
// is counted once, not held per layer beside it; the Linears' own scratch (Lifetime::first_forward) is held by every
// layer. Under fp8 both kinds are present.
TEST(MemoryEstimate, PassScratchInTheArenaLinearsOwnScratchPerLayer) {
  const TrainerConfig cfg = tiny({"--recipe.attention", "fp8"});
  const MemoryEstimate e = estimate_memory(cfg, single_gpu_layout(cfg));
  int64_t d_o_instances = 0, arena_instances = 0, own_instances = 0;
  for (const MemoryTerm& t : e.terms) {
    if (t.category != MemCategory::workspace) continue;
    if (t.tensor == "d o") d_o_instances += t.instances;
    if (t.tensor == kScratchArenaTerm) arena_instances += t.instances;
    if (t.module == "mla" && t.tensor == "q_up row FP8 codes") {
      EXPECT_TRUE(t.first_forward);
      own_instances += t.instances;
    }
  }
  EXPECT_EQ(d_o_instances, 0);                     // in the arena
  EXPECT_EQ(arena_instances, 1);                   // one arena for every layer's passes
  EXPECT_EQ(own_instances, cfg.model.layers);      // every layer's q_up holds its own
}

// Activations of stage 0 (where the dense layers are and the most micro-batches wait).
int64_t stage0_activations(TrainerConfig cfg, const ParallelLayout& layout, std::vector<std::string> modules) {
  cfg.recompute.modules = std::move(modules);
  return act(estimate_memory_stage(cfg, layout, 0));
}

TEST(MemoryEstimate, EveryRecomputeModuleLowersActivations) {
  const ProductionPreset v3 = production_preset("v3");
  const struct {
    const char* name;
    TrainerConfig cfg;
    ParallelLayout layout;
  } cases[] = {{"tiny", tiny(), single_gpu_layout(tiny())},
               {"tiny mxfp4", tiny({"--recipe.routed_experts", "mxfp4"}), single_gpu_layout(tiny())},
               {"v3", v3.config, v3.layout}};
  for (const auto& c : cases) {
    for (Recipe r : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4}) {
      TrainerConfig cfg = c.cfg;
      if (std::string(c.name) == "v3") cfg.recipe = paper_recipe(r);
      const int64_t none = stage0_activations(cfg, c.layout, {});
      // moe_act under the fp8 routed recipe: Group Linear's FP8 column copy of a stays (recompute.h).
      const bool fp8_act = cfg.recipe.routed_experts == Recipe::fp8;
      for (const std::string& m : recompute_module_names()) {
        const int64_t with = stage0_activations(cfg, c.layout, {m});
        if (m == "moe_act" && fp8_act) EXPECT_EQ(with, none) << c.name;
        else EXPECT_LT(with, none) << c.name << " " << recipe_name(r) << " recompute " << m;
        EXPECT_GE(with, stage0_activations(cfg, c.layout, {"full"})) << c.name << " " << m;
      }
      // Modules add up: the paper's heavier policy keeps less than mla_up_proj alone.
      const int64_t both = stage0_activations(cfg, c.layout, {"moe_act", "mla_up_proj"});
      const int64_t up = stage0_activations(cfg, c.layout, {"mla_up_proj"});
      if (fp8_act) EXPECT_EQ(both, up) << c.name;
      else EXPECT_LT(both, up) << c.name;
    }
  }
}

TEST(MemoryEstimate, RoutedExpertInputsOrderMxfp4BelowFp8BelowBf16) {
  const ProductionPreset v3 = production_preset("v3");
  for (const std::vector<std::string>& policy : {std::vector<std::string>{}, {"mla_up_proj"}, {"moe_act"}}) {
    for (bool production : {false, true}) {
      int64_t experts[3], comm[3];
      int i = 0;
      for (Recipe r : {Recipe::mxfp4, Recipe::fp8, Recipe::bf16}) {
        TrainerConfig cfg = production ? v3.config : tiny();
        cfg.recipe.routed_experts = r;
        cfg.recompute.modules = policy;
        const ParallelLayout layout = production ? v3.layout : single_gpu_layout(cfg);
        const MemoryEstimate e = estimate_memory_stage(cfg, layout, 0);
        experts[i] = module_bytes(e, "moe.experts");
        comm[i++] = e.category(MemCategory::comm);
      }
      EXPECT_LT(experts[0], experts[1]) << (production ? "v3" : "tiny");
      EXPECT_LT(experts[1], experts[2]) << (production ? "v3" : "tiny");
      if (production) {
        // The buffers hold the larger of the forward's and the backward's exchanges: for fp8 and mxfp4 that is the
        // backward (dy in FP8, dx in BF16), the same for both; the forward's MXFP4 dispatch buys no buffer memory.
        EXPECT_EQ(comm[0], comm[1]);
        EXPECT_LT(comm[1], comm[2]);
      }
    }
  }
  // Under moe only the dispatched input stays: MXFP4 codes + scales (17 d / 32 per row) < BF16 xs (2 d) < fp8's
  // FP8 row copy for the rerun of Fprop (d + 4 ceil(d/128)) beside fc1's FP8 columns for Wgrad (about d + d/32).
  for (bool production : {false, true}) {
    int64_t experts[3];
    int i = 0;
    for (Recipe r : {Recipe::mxfp4, Recipe::bf16, Recipe::fp8}) {
      TrainerConfig cfg = production ? v3.config : tiny();
      cfg.recipe.routed_experts = r;
      cfg.recompute.modules = {"moe"};
      const ParallelLayout layout = production ? v3.layout : single_gpu_layout(cfg);
      experts[i++] = module_bytes(estimate_memory_stage(cfg, layout, 0), "moe.experts");
    }
    EXPECT_LT(experts[0], experts[1]) << (production ? "v3" : "tiny");
    EXPECT_LT(experts[1], experts[2]) << (production ? "v3" : "tiny");
  }
}

TEST(MemoryEstimate, ProductionPresetsHoldTheWholeModelOverTheirStages) {
  for (const char* name : {"v3", "v2"}) {
    const ProductionPreset p = production_preset(name);
    const ParallelLayout& l = p.layout;
    EXPECT_EQ(l.gpus, l.tp * l.pp * l.dp) << name;
    int64_t total = 0, layers = 0;
    for (int64_t s = 0; s < l.pp; ++s) {
      for (const ParamTensor& t : parameter_tensors(p.config, l, s))
        total += t.expert ? t.n * l.ep : t.n;  // tp = 1: only the experts are split
      layers += stage_layer_counts(p.config, l)[s];
    }
    EXPECT_EQ(total, count_parameters(p.config).total) << name;
    EXPECT_EQ(layers, p.config.model.layers) << name;
  }
  const ProductionPreset v3 = production_preset("v3");
  EXPECT_NEAR(static_cast<double>(count_parameters(v3.config).total), 671e9, 0.01 * 671e9);
  EXPECT_EQ(stage_layer_counts(v3.config, v3.layout), (std::vector<int64_t>{15, 15, 15, 16}));
  EXPECT_NEAR(static_cast<double>(count_parameters(production_preset("v2").config).total), 236e9, 0.01 * 236e9);
}

TEST(MemoryEstimate, Zero1ShardsMastersAndMomentsNotGrads) {
  const ProductionPreset v3 = production_preset("v3");
  ParallelLayout unsharded = v3.layout;
  unsharded.zero1 = false;
  const MemoryEstimate a = estimate_memory_stage(v3.config, v3.layout, 1);
  const MemoryEstimate b = estimate_memory_stage(v3.config, unsharded, 1);
  EXPECT_EQ(a.category(MemCategory::grads), b.category(MemCategory::grads));
  // Stage 1: 15 MoE layers; the experts' expert_dp is 64 x 1 / 64 = 1, the rest is sharded 64 ways.
  int64_t dense = 0, expert = 0;
  for (const ParamTensor& t : parameter_tensors(v3.config, v3.layout, 1))
    if (!t.state) (t.expert ? expert : dense) += (t.n + 63) / 64 * 64;
  EXPECT_EQ(b.category(MemCategory::optimizer), 8 * (dense + expert));
  // The shard rule (trainer/model/param_shard.h): round_up(ceil(dense / 64), 64) elements of the flat block.
  EXPECT_EQ(a.category(MemCategory::optimizer), 8 * (((dense + 63) / 64 + 63) / 64 * 64 + expert));
  EXPECT_EQ(b.category(MemCategory::grads), 4 * (dense + expert));
}

TEST(MemoryEstimate, GradBytesSetsTheGradientPrecision) {
  const ProductionPreset v3 = production_preset("v3");
  ParallelLayout bf16 = v3.layout;
  bf16.grad_bytes = 2;
  const MemoryEstimate a = estimate_memory_stage(v3.config, v3.layout, 1);
  const MemoryEstimate b = estimate_memory_stage(v3.config, bf16, 1);
  int64_t params = 0;
  for (const ParamTensor& t : parameter_tensors(v3.config, v3.layout, 1))
    if (!t.state) params += (t.n + 63) / 64 * 64;
  EXPECT_EQ(a.category(MemCategory::grads), 4 * params);
  EXPECT_EQ(b.category(MemCategory::grads), 2 * params);
  for (MemCategory c : {MemCategory::weights, MemCategory::optimizer, MemCategory::activations,
                        MemCategory::workspace, MemCategory::comm})
    EXPECT_EQ(a.category(c), b.category(c)) << mem_category_name(c);
  bool named = false;
  for (const MemoryTerm& t : b.terms) named = named || t.tensor == "BF16 gradients";
  EXPECT_TRUE(named);
  bf16.grad_bytes = 3;
  expect_error_with([&] { estimate_memory(v3.config, bf16); },
                    {"grad_bytes must be 4 (FP32 gradients) or 2 (BF16), got 3"});
}

TEST(MemoryEstimate, Bf16MomentsTakeTwoBytesPerMomentElement) {
  const TrainerConfig cfg = tiny({"--train.moments", "bf16"});
  const MemoryEstimate e = estimate_memory(cfg, single_gpu_layout(cfg));
  const MemoryEstimate f = estimate_memory(tiny(), single_gpu_layout(tiny()));
  const int64_t P = 4310080;  // padded elements (TinyWeightsGradsOptimizerToTheByte)
  EXPECT_EQ(e.category(MemCategory::optimizer), 4 * P);
  // m and v each 2P = 8620160 bytes, each rounded by DeviceMemory to 8620288.
  EXPECT_EQ(device(e, MemCategory::optimizer), 2 * 8620288);
  for (MemCategory c : {MemCategory::weights, MemCategory::grads, MemCategory::activations, MemCategory::workspace,
                        MemCategory::comm})
    EXPECT_EQ(e.category(c), f.category(c)) << mem_category_name(c);
  std::vector<std::string> names;
  for (const MemoryTerm& t : e.terms)
    if (t.category == MemCategory::optimizer) names.push_back(t.tensor);
  EXPECT_EQ(names, (std::vector<std::string>{"AdamW m (BF16)", "AdamW v (BF16)"}));

  // ZeRO-1 on the V3 production layout's stage 1: the shard at 4 B per element instead of 8.
  ProductionPreset v3 = production_preset("v3");
  const MemoryEstimate fp32 = estimate_memory_stage(v3.config, v3.layout, 1);
  v3.config.train.moments = MomentDtype::bf16;
  const MemoryEstimate bf16 = estimate_memory_stage(v3.config, v3.layout, 1);
  EXPECT_TRUE(v3.layout.zero1);
  EXPECT_EQ(2 * bf16.category(MemCategory::optimizer), fp32.category(MemCategory::optimizer));
  EXPECT_EQ(bf16.category(MemCategory::weights), fp32.category(MemCategory::weights));
  EXPECT_EQ(bf16.category(MemCategory::grads), fp32.category(MemCategory::grads));
}

TEST(MemoryEstimate, OneFOneBKeepsPipelineDepthMinusStageMicroBatches) {
  const TrainerConfig cfg = tiny();
  ParallelLayout two = single_gpu_layout(cfg);
  two.name = "2 stages";
  two.gpus = two.pp = 2;
  two.micro_batches = 2;  // 1F1B keeps min(pp - s, micro_batches): test_parallel_config.cpp has fewer
  const MemoryEstimate s0 = estimate_memory_stage(cfg, two, 0), s1 = estimate_memory_stage(cfg, two, 1);
  const MemoryEstimate one = estimate_memory(cfg, single_gpu_layout(cfg));
  EXPECT_EQ(s0.in_flight, 2);
  EXPECT_EQ(s1.in_flight, 1);
  const int64_t tokens = 4 * 256;  // the model's copy of a micro-batch's tokens (first stage) or targets (last)
  EXPECT_EQ(act(s0), 2 * (one.layer_activation_bytes[0] + tokens));
  EXPECT_EQ(act(s1), one.layer_activation_bytes[1] + module_bytes(one, "model") - tokens);
  // The pipeline's hidden-state buffers: send and receive [N, d] BF16.
  EXPECT_EQ(s0.category(MemCategory::comm), 2 * 2 * 256 * 64);
}

TEST(MemoryEstimate, PaperDirectionMxfp4BelowFp8OnDeepSeekV3) {
  const ProductionPreset v3 = production_preset("v3");
  const std::vector<PolicyRecipeCell> cells = paper_policy_table(v3);
  ASSERT_EQ(cells.size(), 9u);
  for (const PaperPolicy& p : paper_recompute_policies()) {
    const MemoryEstimate *fp8 = nullptr, *mx = nullptr, *bf = nullptr;
    for (const PolicyRecipeCell& c : cells)
      if (c.policy == p.label) (c.recipe == Recipe::fp8 ? fp8 : c.recipe == Recipe::mxfp4 ? mx : bf) = &c.estimate;
    ASSERT_TRUE(fp8 && mx && bf);
    const double cut = 1.0 - static_cast<double>(act(*mx)) / static_cast<double>(act(*fp8));
    std::printf("[ v3 %-32s ] activations GiB: bf16 %.2f fp8 %.2f mxfp4 %.2f; mxfp4 vs fp8 -%.1f%% (%.2f GiB); "
                "totals GiB: bf16 %.1f fp8 %.1f mxfp4 %.1f\n",
                p.label.c_str(), bf->gib(MemCategory::activations), fp8->gib(MemCategory::activations),
                mx->gib(MemCategory::activations), 100.0 * cut,
                fp8->gib(MemCategory::activations) - mx->gib(MemCategory::activations), bf->total_gib(),
                fp8->total_gib(), mx->total_gib());
    if (p.modules == std::vector<std::string>{"core_attn", "layernorm", "moe"}) {
      // `moe` keeps the routing and the dispatched expert input in the routed recipe's storage format
      // (recompute.h): the recipes differ by exactly that input, MXFP4 xs against fp8's FP8 row copy (for the
      // rerun of fc1's Fprop) and fc1's FP8 column copy (for its Wgrad); every other module is fp8 in both.
      EXPECT_LT(act(*mx), act(*fp8));
      EXPECT_GT(cut, 0.0);
      EXPECT_EQ(act(*fp8) - act(*mx), module_bytes(*fp8, "moe.experts") - module_bytes(*mx, "moe.experts"));
      EXPECT_LT(mx->total(), fp8->total());
    } else {
      EXPECT_GE(cut, 0.05) << p.label;
      EXPECT_LE(cut, 0.20) << p.label;
    }
  }
  const std::string table = format_paper_policy_table(cells, v3);
  EXPECT_NE(table.find("| attention + layernorm + experts | core_attn layernorm moe | mxfp4 |"), std::string::npos)
      << table;
  EXPECT_NE(table.find("59.40%"), std::string::npos);
}

TEST(MemoryEstimate, FormatsTheDryRunText) {
  const TrainerConfig cfg = tiny();
  const std::string s = format_memory_estimate(estimate_memory(cfg, single_gpu_layout(cfg)), cfg);
  for (const char* part : {"memory estimate, 1 GPU", "weights", "grads", "optimizer", "activations", "comm",
                           "workspace", "% of an 80 GiB card", "% of a 141 GiB card", "DeviceMemory's count"})
    EXPECT_NE(s.find(part), std::string::npos) << part << " not in:\n" << s;
  const ProductionPreset v2 = production_preset("v2");
  const TrainerConfig prod = with_production_shape(cfg, v2);
  EXPECT_EQ(prod.model.layers, 60);
  EXPECT_EQ(prod.train.seq_len, 4096);
  EXPECT_EQ(prod.recipe.routed_experts, cfg.recipe.routed_experts);
  const std::string p = format_memory_estimate(estimate_memory(prod, v2.layout), prod);
  EXPECT_NE(p.find("128 GPUs"), std::string::npos) << p;
  // V2's layout is tp 1: the trainer emulates one of its GPUs, which DeviceMemory counts as the estimate says.
  EXPECT_NE(p.find("DeviceMemory's count"), std::string::npos) << p;
}

TEST(MemoryEstimate, DryRunCountsDeviceMemoryWhereTheTrainerRunsTheGpu) {
  // What the allocator would hold is printed where the trainer runs the layout's GPU (one GPU, or one emulated GPU
  // of a tp 1 layout), whatever the GPU count, and not where it cannot (tensor parallelism).
  const std::vector<std::vector<std::string>> emulated = {
      {}, {"--parallel.dp", "2", "--parallel.ep", "2"}, {"--parallel.pp", "2", "--parallel.stage", "1"},
      {"--parallel.dp", "2", "--parallel.ep", "2", "--parallel.routed_load", "1.5"}};
  for (const std::vector<std::string>& extra : emulated) {
    const TrainerConfig cfg = tiny(extra);
    const std::string s = format_memory_estimate(estimate_memory(cfg), cfg);
    EXPECT_NE(s.find("DeviceMemory's count when the trainer runs this GPU"), std::string::npos) << s;
  }
  const TrainerConfig tp = tiny({"--parallel.tp", "2"});
  const std::string s = format_memory_estimate(estimate_memory(tp), tp);
  EXPECT_NE(s.find("tp 2"), std::string::npos) << s;
  EXPECT_EQ(s.find("DeviceMemory's count"), std::string::npos) << s;
}

TEST(MemoryEstimate, RejectsLayoutsThatCannotHoldTheModel) {
  const TrainerConfig cfg = tiny();
  auto with = [&](auto change) {
    ParallelLayout l = single_gpu_layout(cfg);
    change(l);
    return [cfg, l] { estimate_memory(cfg, l); };
  };
  expect_error_with(with([](ParallelLayout& l) { l.gpus = 2; }), {"gpus = 2", "tp x pp x dp"});
  expect_error_with(with([](ParallelLayout& l) { l.gpus = l.dp = 2; l.ep = 4; }), {"ep = 4", "dp x tp"});
  expect_error_with(with([](ParallelLayout& l) { l.gpus = l.dp = l.ep = 3; }), {"ep = 3", "moe.routed_experts = 8"});
  expect_error_with(with([](ParallelLayout& l) { l.gpus = l.tp = 3; }), {"tp = 3", "model.heads = 4"});
  expect_error_with(with([](ParallelLayout& l) { l.gpus = l.pp = 3; }), {"pp = 3", "model.layers = 2"});
  expect_error_with(with([](ParallelLayout& l) { l.seq_len = 0; }), {"seq_len must be >= 1"});
  expect_error_with(with([](ParallelLayout& l) { l.routed_load = 0.5; }), {"routed_load"});
  expect_error_with(with([](ParallelLayout& l) { l.gpus = l.pp = 2; l.stage_layers = {2, 0}; }), {"every stage"});
  expect_error_with(with([](ParallelLayout& l) { l.stage_layers = {3}; }), {"sum to 3", "model.layers = 2"});
  expect_error_with([&] { estimate_memory_stage(cfg, single_gpu_layout(cfg), 1); }, {"stage 1", "pp = 1"});
  expect_error_with([] { production_preset("v4"); }, {"'v4'", "v3", "v2"});
}

}  // namespace
}  // namespace fp4moe
