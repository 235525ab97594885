#include "trainer/model/moe.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"
#include "kernels/nn/router.h"
#include "trainer/model/decoder_layer.h"
#include "trainer/model/profile.h"

namespace fp4moe {

float moe_fc2_init_std(const TrainerConfig& cfg) {
  FP4MOE_CHECK(cfg.model.layers >= 1, "MoeLayer: model.layers must be >= 1, got {}", cfg.model.layers);
  return static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(cfg.model.layers)));
}

void check_moe_layer_config(const TrainerConfig& cfg, int64_t max_tokens, const std::string& prefix) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  check_recipe_built(cfg.recipe.routed_experts, "MoeLayer " + prefix + " recipe.routed_experts");
  const int64_t mult = cfg.recipe.routed_experts.mxfp4_input ? 32 : 16;
  const char* why = mult == 32 ? "Group Linear with MX blocks of 32" : "Group Linear";
  FP4MOE_CHECK(m.hidden >= mult && m.hidden % mult == 0,
               "MoeLayer {}: model.hidden must be a positive multiple of {} ({}), got {}", prefix, mult, why, m.hidden);
  FP4MOE_CHECK(e.expert_ffn >= mult && e.expert_ffn % mult == 0,
               "MoeLayer {}: moe.expert_ffn must be a positive multiple of {} ({}), got {}", prefix, mult, why,
               e.expert_ffn);
  FP4MOE_CHECK(m.layers >= 1, "MoeLayer {}: model.layers must be >= 1, got {}", prefix, m.layers);
  FP4MOE_CHECK(e.routed_experts >= 1 && e.routed_experts <= kRouterMaxExperts,
               "MoeLayer {}: moe.routed_experts must be in [1, {}], got {}", prefix, kRouterMaxExperts,
               e.routed_experts);
  FP4MOE_CHECK(e.top_k >= 1 && e.top_k <= e.routed_experts,
               "MoeLayer {}: moe.top_k must be in [1, moe.routed_experts = {}], got {}", prefix, e.routed_experts,
               e.top_k);
  FP4MOE_CHECK(e.shared_experts >= 0, "MoeLayer {}: moe.shared_experts must be >= 0, got {}", prefix,
               e.shared_experts);
  FP4MOE_CHECK(e.routed_scale > 0 && std::isfinite(e.routed_scale),
               "MoeLayer {}: moe.routed_scale must be finite and > 0, got {}", prefix, e.routed_scale);
  FP4MOE_CHECK(e.aux_alpha >= 0, "MoeLayer {}: moe.aux_alpha must be >= 0, got {}", prefix, e.aux_alpha);
  FP4MOE_CHECK(e.bias_update_rate >= 0, "MoeLayer {}: moe.bias_update_rate must be >= 0, got {}", prefix,
               e.bias_update_rate);
  FP4MOE_CHECK(max_tokens >= 0 && max_tokens <= ((int64_t{1} << 31) - 1) / e.top_k,
               "MoeLayer {}: max_tokens must be in [0, (2^31 - 1) / top_k] (int32 row indices), got {} with top_k {}",
               prefix, max_tokens, e.top_k);
}

MoeLayer::MoeLayer(ParamStore& store, const std::string& prefix, const TrainerConfig& cfg, int64_t max_tokens,
                   DeviceMemory& mem)
    : prefix_((check_moe_layer_config(cfg, max_tokens, prefix), prefix)),  // checks before any registration
      d_(cfg.model.hidden),
      k_(cfg.moe.top_k),
      max_tokens_(max_tokens),
      policy_(layer_recompute(cfg.recompute).moe),
      last_M_(mem.slots(), -1),
      router_(store, prefix, cfg, max_tokens, mem),
      experts_(store, prefix, local_routed_experts(cfg), cfg.model.hidden, cfg.moe.expert_ffn, cfg.moe.top_k,
               cfg.recipe.routed_experts, moe_fc2_init_std(cfg), max_tokens, mem, policy_, cfg.parallel.routed_load) {
  if (cfg.moe.shared_experts > 0)
    shared_ = std::make_unique<SwigluMlp>(store, prefix + ".shared", d_, cfg.moe.shared_experts * cfg.moe.expert_ffn,
                                          cfg.recipe.shared_experts, max_tokens, mem, moe_fc2_init_std(cfg),
                                          policy_.shared_experts);
  scratch_ = scratch(cfg, LayerShape::one_gpu(cfg, max_tokens));
}

// The passes below take in this order; every piece stays until the pass ends.
PassScratch MoeLayer::scratch(const TrainerConfig& cfg, const LayerShape& s) {
  const MoeConfig& e = cfg.moe;
  const int64_t d = cfg.model.hidden;
  const MoeRecompute rc = layer_recompute(cfg.recompute).moe;
  const bool shared = s.shared_ffn > 0;
  const PassScratch router = MoeRouter::scratch(s.seq_share, e.routed_experts, e.top_k, s.local_experts);
  const PassScratch experts =
      MoeRoutedExperts::scratch(s.routed_rows, s.local_experts, d, e.expert_ffn, cfg.recipe.routed_experts, rc);
  const PassScratch shared_mlp =
      shared ? SwigluMlp::scratch(s.tokens, d, s.shared_ffn, cfg.recipe.shared_experts, rc.shared_experts)
             : PassScratch{};
  const BufferPlan block = block_buffers(s.seq_share, d, e.top_k, shared);
  auto rounded = [&](const char* t) { return ScratchArena::rounded(static_cast<size_t>(block.at(t).bytes())); };
  PassScratch out;
  out.forward = router.forward + experts.forward + (shared ? rounded("shared experts output") + shared_mlp.forward : 0);
  const size_t own = rounded("routed experts dx") + rounded("dx (FP32)") + rounded("top-k weights grad");
  // The routed experts rerun first (the router never: its routing is kept), then the block's own buffers.
  out.backward = experts.recompute + own + std::max({experts.backward, shared_mlp.backward, router.backward});
  return out;
}

size_t MoeLayer::kept_bytes() const {
  return router_.kept_bytes() + experts_.kept_bytes() + (shared_ ? shared_->kept_bytes() : 0);
}

BufferPlan MoeLayer::block_buffers(int64_t tokens, int64_t d, int64_t k, bool shared) {
  const MemCategory ws = MemCategory::workspace;
  BufferPlan p("moe");
  p.add("shared experts output", shared ? tokens * d : 0, ElemType::bf16, true, ws, Lifetime::forward_scratch);
  p.add("routed experts dx", tokens * d, ElemType::bf16, true, ws, Lifetime::backward_scratch);
  p.add("dx (FP32)", tokens * d, ElemType::fp32, true, ws, Lifetime::backward_scratch);
  p.add("top-k weights grad", tokens * k, ElemType::fp32, true, ws, Lifetime::backward_scratch);
  return p;
}

std::vector<BufferPlan> MoeLayer::buffers(const TrainerConfig& cfg, const LayerShape& s) {
  const MoeConfig& e = cfg.moe;
  const MoeRecompute rc = layer_recompute(cfg.recompute).moe;
  std::vector<BufferPlan> plans;
  plans.push_back(block_buffers(s.seq_share, cfg.model.hidden, e.top_k, s.shared_ffn > 0));
  plans.push_back(MoeRouter::buffers(s.seq_share, e.routed_experts, e.top_k, s.local_experts, s.routed_rows));
  plans.push_back(MoeRoutedExperts::buffers(s.routed_rows, s.local_experts, cfg.model.hidden, e.expert_ffn,
                                            cfg.recipe.routed_experts, rc));
  if (s.shared_ffn > 0)
    plans.push_back(SwigluMlp::buffers("moe.shared", s.tokens, s.seq_share, cfg.model.hidden, s.shared_ffn,
                                       cfg.recipe.shared_experts, rc.shared_experts, true));
  return plans;
}

void MoeLayer::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_, "MoeLayer {} forward: M must be in [0, {}] (max_tokens), got M={}",
               prefix_, max_tokens_, M);
  last_M_.get() = M;
  if (M == 0) {
    router_.forward(ctx, x, 0);  // no device work: empty offsets, aux 0
    return;
  }
  FP4MOE_CHECK(y != nullptr, "MoeLayer {} forward: null y (expected BF16 [M, {}])", prefix_, d_);
  ScratchArena& arena = scratch_of(ctx, "MoeLayer " + prefix_);
  ScratchScope scope(arena);
  router_.forward(ctx, x, M);                       // the layer's one host synchronisation
  {
    ProfileScope profile(ctx, ProfileModule::routed_experts, ProfilePass::forward);
    experts_.forward(ctx, x, router_.routing(), y);  // y = y_routed [M, d]
  }
  if (shared_) {
    bf16* y_shared = take_planned<bf16>(arena, block_buffers(M, d_, k_, true).at("shared experts output"),
                                        "MoE shared experts output");
    {
      ProfileScope profile(ctx, ProfileModule::shared_experts, ProfilePass::forward);
      shared_->forward(ctx, x, M, y_shared);         // y_shared [M, d]
    }
    add_bf16(y, y_shared, M * d_, y, ctx.stream);    // y = y_routed + y_shared
  }
}

void MoeLayer::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx) {
  FP4MOE_CHECK(M == last_M_.get(), "MoeLayer {} backward: expected the last forward's M={}, got M={}", prefix_,
               last_M_.get(), M);
  if (M == 0) {
    router_.backward(ctx, nullptr, x, 0, aux_grad_scale_, nullptr);  // an empty micro-batch counts no tokens
    return;
  }
  FP4MOE_CHECK(dy && x && dx, "MoeLayer {} backward: dy, x and dx [M, {}] must not be null", prefix_, d_);
  ScratchArena& arena = scratch_of(ctx, "MoeLayer " + prefix_);
  ScratchScope scope(arena);
  // moe/full: the experts from their kept dispatched input on the kept routing; moe_act: their swiglu output. The
  // shared experts rerun inside their own backward (shared_experts, moe, full).
  const MoeRouting routing = router_.routing();
  experts_.recompute(ctx, routing);  // its own profile scope, when it reruns anything
  const BufferPlan block = block_buffers(M, d_, k_, shared_ != nullptr);
  bf16* dx_routed = take_planned<bf16>(arena, block.at("routed experts dx"), "MoE routed experts dx");
  float* dx32 = take_planned<float>(arena, block.at("dx (FP32)"), "MoE dx (FP32)");
  float* dweights = take_planned<float>(arena, block.at("top-k weights grad"), "MoE top-k weights grad");
  {
    ProfileScope profile(ctx, ProfileModule::routed_experts, ProfilePass::backward);
    experts_.backward(ctx, dy, routing, dx_routed, dweights);              // dx_routed [M, d], dweights [M, k]
  }
  cast_bf16_to_f32(dx_routed, M * d_, dx32, ctx.stream);                   // dx32 = dx_routed
  if (shared_) {
    ProfileScope profile(ctx, ProfileModule::shared_experts, ProfilePass::backward);
    shared_->backward(ctx, dy, x, M, LinearGradOut{dx32, true, true});     // dx32 += shared
  }
  router_.backward(ctx, dweights, x, M, aux_grad_scale_, dx32);            // dx32 += router
  cast_f32_to_bf16(dx32, M * d_, dx, ctx.stream);
}

}  // namespace fp4moe
