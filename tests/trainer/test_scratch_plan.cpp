// The layers' static scratch functions (PassScratch, trainer/memory/scratch.h) and the shared arena the model and
// the memory estimator size from them, no device needed:
//   - DecoderLayer::scratch at one GPU's LayerShape equals, on configs/tiny.toml and configs/small.toml under every
//     routed recipe and recompute policy (and q_proj, the v2 router, an expert-parallel share), the numbers the
//     layers' constructors computed before the static functions existed (kept below as the reference: the binding
//     code of MLA and the routed experts restated as sums over their buffer plans, and the old formulas of the
//     norms, the FFNs, the router, the MoE block and the decoder layer);
//   - a few of them by hand on tiny (router, dense FFN, MLA);
//   - the estimator's workspace is that arena (Model::scratch_arena_bytes) plus the held buffers, with no pass's
//     scratch counted beside it, on one GPU and on a production layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/attention/flash_attention.h"
#include "kernels/nn/rmsnorm.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/estimate_detail.h"
#include "trainer/memory/estimate_report.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/decoder_layer.h"
#include "trainer/model/model.h"

namespace fp4moe {
namespace {

using test::preset;

TrainerConfig load(const std::string& name, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--config", preset(name)};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_config_args(args);
}

// ---- The reference: the layers' constructors before the static functions (one GPU, M = max_tokens) -----------

size_t bytes(const BufferPlan& p, const std::string& t) {
  return ScratchArena::rounded(static_cast<size_t>(p.at(t).bytes()));
}
size_t unless_held(const BufferPlan& p, const std::string& t) { return p.at(t).held ? 0 : bytes(p, t); }

struct OldNorm {
  size_t recompute, backward;
};
OldNorm old_norm(int64_t M, int64_t C, bool keep_rstd) {
  const BufferPlan p = RmsNorm::buffers(M, C, keep_rstd);
  return {keep_rstd ? 0 : bytes(p, "rstd"), bytes(p, "dweight partials")};
}

struct OldMla {
  size_t fwd, recompute, bwd, bwd_ready;
};
// MlaAttention::plan_scratch: bind_acts (whole: forward_only; some: a backward's rebuild) and bind_grads.
OldMla old_mla(const TrainerConfig& cfg, const MlaRecompute& rc, int64_t M) {
  const ModelConfig& m = cfg.model;
  const BufferPlan p = MlaAttention::buffers(m, cfg.recipe.attention, rc, M, M, m.heads, cfg.train.seq_len);
  size_t common = 0;
  for (const char* t : {"c_q", "q", "c_kv", "kv", "k", "o", "lse"}) common += unless_held(p, t);
  const size_t n = unless_held(p, "n_q") + unless_held(p, "n_kv");
  const size_t whole = common + n + unless_held(p, "k_pe") + bytes(p, "kvd (kv_down output)");
  const size_t some = common + (rc.norms ? n : 0);
  size_t grads = 0;
  for (const char* t : {"d o", "d q", "d k", "d kv", "d kvd", "d latent", "dx (FP32)", "attention backward workspace"})
    grads += bytes(p, t);
  const bool keep = !(rc.norms || rc.whole);
  const OldNorm q = m.q_lora_rank > 0 ? old_norm(M, m.q_lora_rank, keep) : OldNorm{0, 0};
  const OldNorm kv = old_norm(M, m.kv_lora_rank, keep);
  const size_t rstd = q.recompute + kv.recompute, norm_bwd = std::max(q.backward, kv.backward);
  const size_t rebuilt = !rc.any() ? 0 : (rc.whole ? whole : some) + rstd;
  return {whole, whole + rstd, rebuilt + grads + norm_bwd, grads + norm_bwd};
}

struct OldPass {
  size_t fwd, bwd;
};
// SwigluMlp::forward_bytes / backward_bytes.
OldPass old_mlp(int64_t M, int64_t d, int64_t ffn, Recipe r, bool recompute) {
  const BufferPlan p = SwigluMlp::buffers("mlp", M, M, d, ffn, r, recompute, false);
  const size_t rebuilt = recompute ? bytes(p, "h") + (r == Recipe::bf16 ? bytes(p, "a") : 0) : 0;
  return {unless_held(p, "h") + unless_held(p, "a"), rebuilt + bytes(p, "d a") + bytes(p, "d h")};
}

// MoeLayer's constructor over MoeRouter's and MoeRoutedExperts' (bind_forward, bind_recompute).
OldPass old_moe(const TrainerConfig& cfg, int64_t M) {
  const MoeConfig& e = cfg.moe;
  const int64_t d = cfg.model.hidden, k = e.top_k, El = local_routed_experts(cfg);
  const MoeRecompute rc = layer_recompute(cfg.recompute).moe;
  const BufferPlan router = MoeRouter::buffers(M, e.routed_experts, k, El, M * k);
  const Recipe routed = cfg.recipe.routed_experts;
  const BufferPlan x = MoeRoutedExperts::buffers(M * k, El, d, e.expert_ffn, routed, rc);
  const bool mx = routed == Recipe::mxfp4;
  size_t experts_fwd = bytes(x, "assignment_of");
  for (const char* t : {"xs", "h", "a", "ys"}) experts_fwd += unless_held(x, t);
  if (mx) experts_fwd += unless_held(x, "a MXFP4 codes") + unless_held(x, "a MXFP4 scales");
  size_t experts_rerun = 0;
  if (rc.whole || (rc.act && routed != Recipe::fp8))
    experts_rerun = (rc.whole ? bytes(x, "h") + bytes(x, "ys") : 0) + bytes(x, "a") +
                    (mx ? bytes(x, "a MXFP4 codes") + bytes(x, "a MXFP4 scales") : 0);
  const size_t experts_bwd = bytes(x, "d rows") + bytes(x, "d a") + bytes(x, "d h");
  const bool shared = e.shared_experts > 0;
  const OldPass s =
      shared ? old_mlp(M, d, e.shared_experts * e.expert_ffn, cfg.recipe.shared_experts, rc.shared_experts)
             : OldPass{0, 0};
  const BufferPlan block = MoeLayer::block_buffers(M, d, k, shared);
  const size_t fwd = bytes(router, "logits (FP32)") + experts_fwd +
                     (shared ? bytes(block, "shared experts output") + s.fwd : 0);
  const size_t own = bytes(block, "routed experts dx") + bytes(block, "dx (FP32)") + bytes(block, "top-k weights grad");
  const size_t router_bwd = bytes(router, "dlogits (FP32)") + bytes(router, "dlogits (BF16)");
  return {fwd, experts_rerun + own + std::max({experts_bwd, s.bwd, router_bwd})};
}

// DecoderLayer::plan_scratch.
OldPass old_layer(const TrainerConfig& cfg, int64_t l) {
  const int64_t M = cfg.train.micro_batch * cfg.train.seq_len, d = cfg.model.hidden;
  const LayerRecompute rc = layer_recompute(cfg.recompute);
  const BufferPlan own = DecoderLayer::buffers(cfg, l, LayerShape::one_gpu(cfg, M)).front();
  const bool keep_a = own.at("attn_norm out").held, keep_f = own.at("ffn_norm out").held;
  const size_t n = bytes(own, "h_mid");
  const OldNorm norm = old_norm(M, d, !rc.norms);
  const OldMla attn = old_mla(cfg, rc.mla, M);
  const OldPass ffn = cfg.is_moe_layer(l) ? old_moe(cfg, M)
                                          : old_mlp(M, d, cfg.model.dense_ffn, cfg.recipe.dense_mlp, rc.dense_mlp);
  const size_t fwd = (rc.full ? n : 0) + std::max((keep_a ? 0 : n) + attn.fwd, (keep_f ? 0 : n) + ffn.fwd);
  const size_t base = rc.full ? n + norm.recompute + attn.recompute + n : 0;
  const size_t ffn_half = (rc.norms ? n + norm.recompute : 0) + std::max(ffn.bwd, norm.backward);
  const size_t attn_half =
      (rc.norms && !rc.full ? n + norm.recompute : 0) + std::max(rc.full ? attn.bwd_ready : attn.bwd, norm.backward);
  return {fwd, base + std::max(ffn_half, attn_half)};
}

// ---- Tests ------------------------------------------------------------------------------------------------------

const std::vector<std::vector<std::string>>& policies() {
  static const std::vector<std::vector<std::string>> p = {
      {},          {"mla_up_proj"}, {"core_attn"}, {"layernorm"},      {"moe_act"},
      {"moe"},     {"mlp"},         {"shared_experts"}, {"full"},     {"mla_up_proj", "core_attn", "layernorm", "moe"},
      {"moe_act", "mla_up_proj"}};
  return p;
}

std::string text(const std::vector<std::string>& modules) {
  std::string s;
  for (const std::string& m : modules) s += (s.empty() ? "" : " ") + m;
  return s.empty() ? "none" : s;
}

void expect_layers_match_reference(const std::string& name, const std::vector<std::string>& extra) {
  for (const char* routed : {"bf16", "fp8", "mxfp4"}) {
    for (const std::vector<std::string>& modules : policies()) {
      std::vector<std::string> args = extra;
      args.insert(args.end(), {"--recipe.routed_experts", routed});
      TrainerConfig cfg = load(name, args);
      cfg.recompute.modules = modules;
      const int64_t M = cfg.train.micro_batch * cfg.train.seq_len;
      for (int64_t l : {int64_t{0}, int64_t{1}}) {  // the dense layer and the first MoE layer
        SCOPED_TRACE(name + " routed " + routed + ", recompute " + text(modules) + ", layer " + std::to_string(l));
        const PassScratch s = DecoderLayer::scratch(cfg, l, LayerShape::one_gpu(cfg, M));
        const OldPass ref = old_layer(cfg, l);
        EXPECT_EQ(s.forward, ref.fwd);
        EXPECT_EQ(s.backward, ref.bwd);
        EXPECT_EQ(s.high_water(), std::max(ref.fwd, ref.bwd));
        EXPECT_GT(s.backward, 0u);
      }
      const MlaRecompute rc = layer_recompute(cfg.recompute).mla;
      const PassScratch mla = MlaAttention::scratch(cfg.model, cfg.recipe.attention, rc, M, cfg.model.heads,
                                                    cfg.train.seq_len);
      const OldMla ref = old_mla(cfg, rc, M);
      EXPECT_EQ(mla.forward, ref.fwd);
      EXPECT_EQ(mla.recompute, ref.recompute);
      EXPECT_EQ(mla.backward, ref.bwd);
      EXPECT_EQ(mla.backward_after_recompute, ref.bwd_ready);
    }
  }
}

TEST(ScratchPlan, DecoderLayersEqualTheConstructorsNumbersOnTiny) {
  expect_layers_match_reference("tiny", {});
  expect_layers_match_reference("tiny", {"--recipe.attention", "fp8", "--recipe.dense_mlp", "mxfp4",
                                         "--recipe.shared_experts", "fp8"});
  expect_layers_match_reference("tiny", {"--model.q_lora_rank", "0", "--moe.router", "v2", "--moe.aux_alpha",
                                         "0.003", "--moe.bias_update_rate", "0"});
  expect_layers_match_reference("tiny", {"--parallel.ep", "4", "--parallel.dp", "4"});  // 2 of 8 experts
}

TEST(ScratchPlan, DecoderLayersEqualTheConstructorsNumbersOnSmall) {
  expect_layers_match_reference("small", {"--model.layers", "2"});
  expect_layers_match_reference("small", {"--model.layers", "2", "--recipe.attention", "fp8", "--recipe.dense_mlp",
                                          "fp8", "--recipe.shared_experts", "fp8"});
}

// tiny (d 64, H 4, r_q = r_kv = 32, nope = rope = dv = 16, dense FFN 128, 8 experts of 32, top-2, N = 256), bf16.
TEST(ScratchPlan, TinyPassesByHand) {
  const TrainerConfig cfg = load("tiny");
  const int64_t N = 256;
  // The router's logits [N, 8] FP32 in forward; dlogits FP32 and BF16 in backward.
  const PassScratch router = MoeRouter::scratch(N, 8, 2, 8);
  EXPECT_EQ(router.forward, 8192u);
  EXPECT_EQ(router.backward, 8192u + 4096u);
  // The dense FFN keeps h and a (bf16): no forward scratch; backward d a [N, 128] and d h [N, 256] BF16. Under mlp
  // it rebuilds h and a first.
  EXPECT_EQ(SwigluMlp::scratch(N, 64, 128, Recipe::bf16, false).forward, 0u);
  EXPECT_EQ(SwigluMlp::scratch(N, 64, 128, Recipe::bf16, false).backward, 65536u + 131072u);
  EXPECT_EQ(SwigluMlp::scratch(N, 64, 128, Recipe::bf16, true).forward, 131072u + 65536u);
  EXPECT_EQ(SwigluMlp::scratch(N, 64, 128, Recipe::bf16, true).backward, 2 * (131072u + 65536u));
  // MLA without a policy: forward kvd [N, 48] and k_pe [N, 16] BF16; backward d o [N, 64], d q, d k, d kv [N, 128]
  // BF16, d kvd [N, 48], d latent [N, 32] BF16, dx [N, 64] FP32, the attention workspace, and the larger norm
  // backward (both [32] wide).
  const PassScratch mla = MlaAttention::scratch(cfg.model, Recipe::bf16, MlaRecompute{}, N, 4, 64);
  EXPECT_EQ(mla.forward, 24576u + 8192u);
  const size_t attn_ws = ScratchArena::rounded(static_cast<size_t>(
      flash_attention_backward_workspace_bytes(AttentionShape{4, 64, 4, 32, 16, 1.0f / std::sqrt(32.0f)})));
  const size_t norm_ws = ScratchArena::rounded(static_cast<size_t>(4 * rmsnorm_backward_workspace_floats(N, 32)));
  EXPECT_EQ(mla.backward, 32768u + 3 * 65536u + 24576u + 16384u + 65536u + attn_ws + norm_ws);
  EXPECT_EQ(mla.backward_after_recompute, mla.backward);
  EXPECT_EQ(mla.recompute, mla.forward);  // the norms keep their rstd
  // Under full every tensor is taken: recompute_forward leaves them with the two norms' rstd [N] FP32; a backward
  // after it takes the gradients and the norm backward; a backward alone rebuilds first.
  MlaRecompute full;
  full.whole = true;
  const PassScratch rerun = MlaAttention::scratch(cfg.model, Recipe::bf16, full, N, 4, 64);
  EXPECT_GT(rerun.forward, mla.forward);
  EXPECT_EQ(rerun.recompute, rerun.forward + 2 * 1024u);
  EXPECT_EQ(rerun.backward_after_recompute, mla.backward);
  EXPECT_EQ(rerun.backward, rerun.recompute + rerun.backward_after_recompute);
  EXPECT_EQ(rerun.high_water(), rerun.backward);
  // RmsNorm: rstd [N] FP32 left by a recompute without keep_rstd.
  EXPECT_EQ(RmsNorm::scratch(N, 64, false).recompute, 1024u);
  EXPECT_EQ(RmsNorm::scratch(N, 64, true).recompute, 0u);
}

int64_t workspace_term(const MemoryEstimate& e, const std::string& tensor) {
  int64_t sum = 0;
  for (const MemoryTerm& t : e.terms)
    if (t.category == MemCategory::workspace && t.tensor == tensor) sum += t.total();
  return sum;
}

// The workspace is the arena the model allocates plus the buffers held beside it: no pass's scratch twice.
void expect_workspace_is_the_arena(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t stage) {
  const MemoryEstimate e = estimate_memory_stage(cfg, layout, stage);
  const PipelineStage ps = pipeline_stage(cfg, layout, stage);
  const LayerShape shape = mem_detail::layer_shape(cfg, layout);  // one GPU's, as the estimator derives it
  const auto arena = static_cast<int64_t>(Model::scratch_arena_bytes(cfg, ps, shape, 0));
  EXPECT_EQ(workspace_term(e, kScratchArenaTerm), arena);
  int64_t largest = 0, summed = 0;
  for (int64_t l = ps.first_layer; l < ps.first_layer + ps.layers; ++l) {
    const auto h = static_cast<int64_t>(DecoderLayer::scratch(cfg, l, shape).high_water());
    largest = std::max(largest, h);
    summed += h;
  }
  const auto head = static_cast<int64_t>(Model::head_scratch_bytes(cfg, ps, shape.seq_share, 0));
  EXPECT_EQ(arena, std::max(largest, head));
  int64_t held = 0;
  for (const MemoryTerm& m : e.terms) {
    if (m.category != MemCategory::workspace || m.tensor == kScratchArenaTerm) continue;
    EXPECT_TRUE(m.first_forward || m.module == "model" || m.module == "trainer") << m.module << " " << m.tensor;
    EXPECT_NE(m.tensor, "LM head Dgrad (FP32)");
    EXPECT_NE(m.tensor, "embedding backward workspace");
    held += m.total();
  }
  EXPECT_EQ(e.category(MemCategory::workspace), arena + held);
  EXPECT_EQ(e.workspace_all_layers, held + summed + head);
}

TEST(ScratchPlan, EstimatorWorkspaceIsTheModelsArena) {
  for (const std::vector<std::string>& modules : policies()) {
    SCOPED_TRACE(text(modules));
    TrainerConfig cfg = load("tiny", {"--recipe.attention", "fp8", "--recipe.routed_experts", "mxfp4"});
    cfg.recompute.modules = modules;
    expect_workspace_is_the_arena(cfg, single_gpu_layout(cfg), 0);
  }
  // A production layout, tensor parallel: every stage of DeepSeek-V3's.
  const ProductionPreset v3 = production_preset("v3");
  for (int64_t s : {int64_t{0}, int64_t{1}, v3.layout.pp - 1}) {
    SCOPED_TRACE("v3 stage " + std::to_string(s));
    expect_workspace_is_the_arena(v3.config, v3.layout, s);
  }
}

// One GPU of configs/v3_671b.toml's layout, its last-but-one kind of stage (4 MoE layers), under the paper's heavier
// policy: the arena is the largest layer's backward, well below the old sum of every scratch term of that layer.
TEST(ScratchPlan, V3StageArenaIsOneLayersLargestPass) {
  TrainerConfig cfg = load("v3_671b", {"--recipe.routed_experts", "mxfp4"});
  cfg.recompute.modules = {"mla_up_proj", "core_attn", "layernorm", "moe"};
  const ParallelLayout layout = layout_of(cfg);
  const MemoryEstimate e = estimate_memory_stage(cfg, layout, 3);
  const int64_t arena = workspace_term(e, kScratchArenaTerm);
  EXPECT_GT(arena, 0);
  std::printf("[ v3_671b stage 3, mxfp4, mla_up_proj core_attn layernorm moe ] workspace %.3f GiB, arena %.3f GiB, "
              "every layer's summed %.3f GiB\n",
              e.gib(MemCategory::workspace), static_cast<double>(arena) / 1073741824.0,
              static_cast<double>(e.workspace_all_layers) / 1073741824.0);
  EXPECT_LT(e.category(MemCategory::workspace), e.workspace_all_layers);
}

}  // namespace
}  // namespace fp4moe
