#include "trainer/model/rms_norm.h"

#include "kernels/common/check.h"
#include "kernels/nn/rmsnorm.h"

namespace fp4moe {

RmsNorm::RmsNorm(ParamStore& store, const std::string& name, int64_t C, float eps, int64_t max_tokens,
                 DeviceMemory& mem)
    : name_(name), C_(C), max_tokens_(max_tokens), eps_(eps), w_(nullptr) {
  FP4MOE_CHECK(C >= 1 && max_tokens >= 0 && eps > 0.0f,
               "RmsNorm {}: expected C >= 1, max_tokens >= 0 and eps > 0, got C={} max_tokens={} eps={}", name, C,
               max_tokens, eps);
  w_ = &store.add(name, {C}, ParamInit::ones, 0.0f, /*decay=*/false);
  rstd_ = DeviceArray<float>(mem, max_tokens, MemCategory::activations, name + " rstd");
  if (max_tokens > 0)
    workspace_ = DeviceArray<float>(mem, rmsnorm_backward_workspace_floats(max_tokens, C), MemCategory::workspace,
                                    name + " dweight partial sums");
}

void RmsNorm::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_, "RmsNorm {} forward: M must be in [0, {}] (max_tokens), got M={}", name_,
               max_tokens_, M);
  last_M_ = M;
  if (M == 0) return;
  rmsnorm_forward(x, w_->param, M, C_, eps_, y, rstd_.data(), ctx.stream);
}

void RmsNorm::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx) {
  FP4MOE_CHECK(M == last_M_, "RmsNorm {} backward: expected the last forward's M={}, got M={}", name_, last_M_, M);
  if (M == 0) return;
  FP4MOE_CHECK(rmsnorm_backward_workspace_floats(M, C_) <= workspace_.size(),
               "RmsNorm {} backward: workspace of {} floats is below the {} needed for M={}", name_,
               workspace_.size(), rmsnorm_backward_workspace_floats(M, C_), M);
  rmsnorm_backward(dy, x, w_->param, rstd_.data(), M, C_, dx, w_->grad, /*accumulate_dweight=*/true,
                   workspace_.data(), ctx.stream);
}

}  // namespace fp4moe
