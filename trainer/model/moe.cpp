#include "trainer/model/moe.h"

#include <cmath>

#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"
#include "kernels/nn/router.h"

namespace fp4moe {

float moe_fc2_init_std(const TrainerConfig& cfg) {
  FP4MOE_CHECK(cfg.model.layers >= 1, "MoeLayer: model.layers must be >= 1, got {}", cfg.model.layers);
  return static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(cfg.model.layers)));
}

void check_moe_layer_config(const TrainerConfig& cfg, int64_t max_tokens, const std::string& prefix) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  const int64_t mult = cfg.recipe.routed_experts == Recipe::mxfp4 ? 32 : 16;
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
      router_(store, prefix, cfg, max_tokens, mem),
      experts_(store, prefix, cfg.moe.routed_experts, cfg.model.hidden, cfg.moe.expert_ffn, cfg.moe.top_k,
               cfg.recipe.routed_experts, moe_fc2_init_std(cfg), max_tokens, mem) {
  if (cfg.moe.shared_experts > 0)
    shared_ = std::make_unique<SwigluMlp>(store, prefix + ".shared", d_, cfg.moe.shared_experts * cfg.moe.expert_ffn,
                                          cfg.recipe.shared_experts, max_tokens, mem, moe_fc2_init_std(cfg));
  scratch_ = DeviceArray<bf16>(mem, max_tokens * d_, MemCategory::workspace, prefix + " moe scratch");
  dx32_ = DeviceArray<float>(mem, max_tokens * d_, MemCategory::workspace, prefix + " moe dx (FP32)");
  dweights_ = DeviceArray<float>(mem, max_tokens * k_, MemCategory::workspace, prefix + " moe dweights");
}

void MoeLayer::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_, "MoeLayer {} forward: M must be in [0, {}] (max_tokens), got M={}",
               prefix_, max_tokens_, M);
  last_M_ = M;
  router_.forward(ctx, x, M);  // the layer's one host synchronisation
  if (M == 0) return;
  FP4MOE_CHECK(y != nullptr, "MoeLayer {} forward: null y (expected BF16 [M, {}])", prefix_, d_);
  experts_.forward(ctx, x, router_.routing(), y);  // y = y_routed [M, d]
  if (shared_) {
    shared_->forward(ctx, x, M, scratch_.data());              // y_shared [M, d]
    add_bf16(y, scratch_.data(), M * d_, y, ctx.stream);        // y = y_routed + y_shared
  }
}

void MoeLayer::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx) {
  FP4MOE_CHECK(M == last_M_, "MoeLayer {} backward: expected the last forward's M={}, got M={}", prefix_, last_M_, M);
  if (M == 0) {
    router_.backward(ctx, nullptr, x, 0, aux_grad_scale_, nullptr);  // an empty micro-batch counts no tokens
    return;
  }
  FP4MOE_CHECK(dy && x && dx, "MoeLayer {} backward: dy, x and dx [M, {}] must not be null", prefix_, d_);
  const MoeRouting routing = router_.routing();
  bf16* dx_routed = scratch_.data();
  experts_.backward(ctx, dy, routing, dx_routed, dweights_.data());     // dx_routed [M, d], dweights [M, k]
  cast_bf16_to_f32(dx_routed, M * d_, dx32_.data(), ctx.stream);         // dx32 = dx_routed
  if (shared_) shared_->backward(ctx, dy, x, M, LinearGradOut{dx32_.data(), true, true});  // dx32 += shared
  router_.backward(ctx, dweights_.data(), x, M, aux_grad_scale_, dx32_.data());             // dx32 += router
  cast_f32_to_bf16(dx32_.data(), M * d_, dx, ctx.stream);
}

}  // namespace fp4moe
