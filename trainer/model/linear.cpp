#include "trainer/model/linear.h"

#include "kernels/common/check.h"

namespace fp4moe {

Linear::Linear(ParamStore& store, const std::string& name, int64_t in_features, int64_t out_features, Recipe recipe,
               float init_std)
    : w_(nullptr), K_(in_features), N_(out_features), recipe_(recipe) {
  FP4MOE_CHECK(in_features >= 8 && in_features % 8 == 0 && out_features >= 8 && out_features % 8 == 0,
               "Linear {}: in and out features must be positive multiples of 8 (16-byte BF16 rows), got in={} out={}",
               name, in_features, out_features);
  FP4MOE_CHECK(recipe == Recipe::bf16,
               "Linear {}: recipe {} is not built for dense linear layers yet (only bf16); the routed experts take "
               "fp8 and mxfp4 through Group Linear",
               name, recipe_name(recipe));
  w_ = &store.add(name, {out_features, in_features}, ParamInit::normal, init_std, /*decay=*/true);
}

// Row-major Y [M, N] is column-major Y^T [N, M]: Y^T = W (stored K x N column-major, i.e. W^T op) * X^T.
void Linear::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) const {
  if (M == 0) return;
  FP4MOE_CHECK(x && y, "Linear {} forward: x [M, {}] and y [M, {}] must not be null", w_->name, K_, N_);
  LtOperand a{w_->param, CUDA_R_16BF, true, K_};
  LtOperand b{x, CUDA_R_16BF, false, K_};
  ctx.lt->matmul(N_, M, K_, a, b, LtOutput{y, CUDA_R_16BF, N_, false}, RaggedDim::none, ctx.stream);
}

void Linear::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, LinearGradOut dx) const {
  if (M == 0) return;
  FP4MOE_CHECK(dy && x, "Linear {} backward: dy [M, {}] and x [M, {}] must not be null", w_->name, N_, K_);
  FP4MOE_CHECK(!dx.accumulate || dx.fp32, "Linear {} backward: Dgrad accumulation needs an FP32 output", w_->name);
  if (dx.data) {
    // dX^T (K x M) = (W stored K x N column-major) * (dY stored N x M)
    LtOperand a{w_->param, CUDA_R_16BF, false, K_};
    LtOperand b{dy, CUDA_R_16BF, false, N_};
    LtOutput d{dx.data, dx.fp32 ? CUDA_R_32F : CUDA_R_16BF, K_, dx.accumulate};
    ctx.lt->matmul(K_, M, N_, a, b, d, RaggedDim::none, ctx.stream);
  }
  // dW^T (K x N) += (X stored K x M) * (dY stored N x M)^T
  LtOperand a{x, CUDA_R_16BF, false, K_};
  LtOperand b{dy, CUDA_R_16BF, true, N_};
  ctx.lt->matmul(K_, N_, M, a, b, LtOutput{w_->grad, CUDA_R_32F, K_, true}, RaggedDim::none, ctx.stream);
}

}  // namespace fp4moe
