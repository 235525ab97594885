#include "trainer/model/rms_norm.h"

#include "kernels/common/check.h"
#include "kernels/nn/rmsnorm.h"

namespace fp4moe {

RmsNorm::RmsNorm(ParamStore& store, const std::string& name, int64_t C, float eps, int64_t max_tokens,
                 DeviceMemory& mem, bool keep_rstd)
    : name_(name), C_(C), max_tokens_(max_tokens), eps_(eps), keep_rstd_(keep_rstd), w_(nullptr) {
  FP4MOE_CHECK(C >= 1 && max_tokens >= 0 && eps > 0.0f,
               "RmsNorm {}: expected C >= 1, max_tokens >= 0 and eps > 0, got C={} max_tokens={} eps={}", name, C,
               max_tokens, eps);
  w_ = &store.add(name, {C}, ParamInit::ones, 0.0f, /*decay=*/false);
  if (keep_rstd) rstd_ = DeviceArray<float>(mem, max_tokens, MemCategory::activations, name + " rstd");
}

size_t RmsNorm::recompute_bytes() const {
  return keep_rstd_ ? 0 : ScratchArena::rounded(static_cast<size_t>(max_tokens_) * sizeof(float));
}

size_t RmsNorm::backward_bytes() const {
  if (max_tokens_ == 0) return 0;
  return ScratchArena::rounded(static_cast<size_t>(rmsnorm_backward_workspace_floats(max_tokens_, C_)) *
                               sizeof(float));
}

void RmsNorm::run(ModelContext& ctx, const bf16* x, int64_t M, bf16* y, float* rstd) {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_, "RmsNorm {} forward: M must be in [0, {}] (max_tokens), got M={}", name_,
               max_tokens_, M);
  last_M_ = M;
  rstd_ptr_ = rstd;
  rstd_stamp_ = 0;
  if (M == 0) return;
  rmsnorm_forward(x, w_->param, M, C_, eps_, y, rstd, ctx.stream);
}

void RmsNorm::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  run(ctx, x, M, y, keep_rstd_ ? rstd_.data() : nullptr);
}

void RmsNorm::recompute(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  if (keep_rstd_ || M <= 0) return forward(ctx, x, M, y);
  ScratchArena& arena = scratch_of(ctx, "RmsNorm " + name_ + " recompute");
  FP4MOE_CHECK(M <= max_tokens_, "RmsNorm {} recompute: M must be in [0, {}] (max_tokens), got M={}", name_,
               max_tokens_, M);
  float* rstd = arena.take<float>(M, "RmsNorm rstd (recomputed)");
  run(ctx, x, M, y, rstd);
  rstd_stamp_ = arena.stamp();
}

void RmsNorm::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx) {
  FP4MOE_CHECK(M == last_M_, "RmsNorm {} backward: expected the last forward's M={}, got M={}", name_, last_M_, M);
  if (M == 0) return;
  ScratchArena& arena = scratch_of(ctx, "RmsNorm " + name_ + " backward");
  FP4MOE_CHECK(keep_rstd_ || (rstd_ptr_ != nullptr && arena.alive(rstd_stamp_)),
               "RmsNorm {} backward: rstd is not kept (layernorm/full recompute) and no recompute() of this norm is "
               "alive in the current scratch scope",
               name_);
  ScratchScope scope(arena);
  const int64_t ws_floats = rmsnorm_backward_workspace_floats(M, C_);
  float* ws = arena.take<float>(ws_floats, "RmsNorm dweight partial sums");
  rmsnorm_backward(dy, x, w_->param, rstd_ptr_, M, C_, dx, w_->grad, /*accumulate_dweight=*/true, ws, ctx.stream);
}

}  // namespace fp4moe
