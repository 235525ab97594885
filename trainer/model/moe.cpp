#include "trainer/model/moe.h"

#include <cmath>

#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"

namespace fp4moe {

namespace {
// N(0, (0.02 / sqrt(2 L))^2) for the projections that write into the residual stream.
float residual_init_std(const TrainerConfig& cfg) {
  FP4MOE_CHECK(cfg.model.layers >= 1, "MoeLayer: model.layers must be >= 1, got {}", cfg.model.layers);
  return static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(cfg.model.layers)));
}
}  // namespace

MoeLayer::MoeLayer(ParamStore& store, const std::string& prefix, const TrainerConfig& cfg, int64_t max_tokens,
                   DeviceMemory& mem)
    : prefix_(prefix),
      d_(cfg.model.hidden),
      k_(cfg.moe.top_k),
      max_tokens_(max_tokens),
      router_(store, prefix, cfg, max_tokens, mem),
      experts_(store, prefix, cfg.moe.routed_experts, cfg.model.hidden, cfg.moe.expert_ffn, cfg.moe.top_k,
               cfg.recipe.routed_experts, residual_init_std(cfg), max_tokens, mem) {
  FP4MOE_CHECK(cfg.moe.shared_experts >= 0, "MoeLayer {}: moe.shared_experts must be >= 0, got {}", prefix,
               cfg.moe.shared_experts);
  if (cfg.moe.shared_experts > 0)
    shared_ = std::make_unique<SwigluMlp>(store, prefix + ".shared", d_, cfg.moe.shared_experts * cfg.moe.expert_ffn,
                                          cfg.recipe.shared_experts, max_tokens, mem, residual_init_std(cfg));
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
