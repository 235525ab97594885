#include "trainer/model/rms_norm.h"

#include "kernels/common/check.h"
#include "kernels/nn/rmsnorm.h"

namespace fp4moe {

RmsNorm::RmsNorm(ParamStore& store, const std::string& name, int64_t C, float eps, int64_t max_tokens,
                 DeviceMemory& mem, bool keep_rstd)
    : name_(name), C_(C), max_tokens_(max_tokens), eps_(eps), keep_rstd_(keep_rstd), w_(nullptr),
      last_M_(mem.slots(), -1) {
  FP4MOE_CHECK(C >= 1 && max_tokens >= 0 && eps > 0.0f,
               "RmsNorm {}: expected C >= 1, max_tokens >= 0 and eps > 0, got C={} max_tokens={} eps={}", name, C,
               max_tokens, eps);
  w_ = &store.add(name, {C}, ParamInit::ones, 0.0f, /*decay=*/false);
  rstd_ = buffers(max_tokens, C, keep_rstd).allocate_kept<float>(mem, "rstd", name);
}

BufferPlan RmsNorm::buffers(int64_t tokens, int64_t C, bool keep_rstd) {
  FP4MOE_CHECK(tokens >= 0 && C >= 1, "RmsNorm::buffers: expected tokens >= 0 and C >= 1, got {} {}", tokens, C);
  BufferPlan p("norm");
  p.add("rstd", tokens, ElemType::fp32, keep_rstd);
  p.add("dweight partials", tokens > 0 ? rmsnorm_backward_workspace_floats(tokens, C) : 0, ElemType::fp32, true,
        MemCategory::workspace, Lifetime::backward_scratch);
  return p;
}

PassScratch RmsNorm::scratch(int64_t tokens, int64_t C, bool keep_rstd) {
  const BufferPlan p = buffers(tokens, C, keep_rstd);
  PassScratch s;
  s.recompute = keep_rstd ? 0 : ScratchArena::rounded(static_cast<size_t>(p.at("rstd").bytes()));
  s.backward = ScratchArena::rounded(static_cast<size_t>(p.at("dweight partials").bytes()));
  s.backward_after_recompute = s.backward;
  return s;
}

void RmsNorm::run(ModelContext& ctx, const bf16* x, int64_t M, bf16* y, float* rstd, ProfilePass pass) {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_, "RmsNorm {} forward: M must be in [0, {}] (max_tokens), got M={}", name_,
               max_tokens_, M);
  last_M_.get() = M;
  recomputed_rstd_ = keep_rstd_ ? nullptr : rstd;
  rstd_stamp_ = 0;
  if (M == 0) return;
  ProfileScope profile(ctx, ProfileModule::rmsnorm, pass);
  rmsnorm_forward(x, w_->param, M, C_, eps_, y, rstd, ctx.stream);
}

void RmsNorm::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  run(ctx, x, M, y, keep_rstd_ ? rstd_.data() : nullptr, ProfilePass::forward);
}

void RmsNorm::recompute(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  if (keep_rstd_ || M <= 0) return run(ctx, x, M, y, keep_rstd_ ? rstd_.data() : nullptr, ProfilePass::recompute);
  ScratchArena& arena = scratch_of(ctx, "RmsNorm " + name_ + " recompute");
  FP4MOE_CHECK(M <= max_tokens_, "RmsNorm {} recompute: M must be in [0, {}] (max_tokens), got M={}", name_,
               max_tokens_, M);
  float* rstd = take_planned<float>(arena, buffers(M, C_, false).at("rstd"), "RmsNorm rstd (recomputed)");
  run(ctx, x, M, y, rstd, ProfilePass::recompute);
  rstd_stamp_ = arena.stamp();
}

void RmsNorm::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx) {
  FP4MOE_CHECK(M == last_M_.get(), "RmsNorm {} backward: expected the last forward's M={}, got M={}", name_,
               last_M_.get(), M);
  if (M == 0) return;
  ScratchArena& arena = scratch_of(ctx, "RmsNorm " + name_ + " backward");
  FP4MOE_CHECK(keep_rstd_ || (recomputed_rstd_ != nullptr && arena.alive(rstd_stamp_)),
               "RmsNorm {} backward: rstd is not kept (layernorm/full recompute) and no recompute() of this norm is "
               "alive in the current scratch scope",
               name_);
  ScratchScope scope(arena);
  const BufferPlan plan = buffers(M, C_, keep_rstd_);
  float* ws = take_planned<float>(arena, plan.at("dweight partials"), "RmsNorm dweight partial sums");
  const float* rstd = keep_rstd_ ? rstd_.data() : recomputed_rstd_;  // the active slot's kept rstd
  ProfileScope profile(ctx, ProfileModule::rmsnorm, ProfilePass::backward);
  rmsnorm_backward(dy, x, w_->param, rstd, M, C_, dx, w_->grad, /*accumulate_dweight=*/true, ws, ctx.stream);
}

}  // namespace fp4moe
