#include "trainer/model/linear.h"

#include "kernels/common/check.h"
#include "kernels/quant/layouts.h"
#include "trainer/model/group_linear.h"
#include "trainer/model/linear_quantized.h"

namespace fp4moe {

Linear::Linear(ParamStore& store, const std::string& name, int64_t in_features, int64_t out_features,
               const Recipe& recipe, float init_std)
    : w_(nullptr), K_(in_features), N_(out_features), recipe_(recipe) {
  check_recipe_built(recipe, "Linear " + name);
  const bool bf16_gemm = recipe == Recipe::bf16;
  const int64_t mult = bf16_gemm ? 8 : 16;
  FP4MOE_CHECK(in_features >= mult && in_features % mult == 0 && out_features >= mult && out_features % mult == 0,
               "Linear {}: in and out features must be positive multiples of {} for the {} recipe ({}), got in={} "
               "out={}",
               name, mult, recipe_name(recipe), bf16_gemm ? "16-byte BF16 rows" : "the FP8 GEMMs take 16-byte rows",
               in_features, out_features);
  FP4MOE_CHECK(!needs_mx_blocks_along_k(recipe) || in_features % kMxBlock == 0,
               "Linear {}: the recipe {} quantizes X in MX blocks of 32 along in_features, got in={}", name,
               recipe_name(recipe), in_features);
  FP4MOE_CHECK(!needs_mx_blocks_along_n(recipe) || out_features % kMxBlock == 0,
               "Linear {}: the recipe {} (MXFP4 Dgrad) quantizes dY and W in MX blocks of 32 along out_features, got "
               "out={}",
               name, recipe_name(recipe), out_features);
  if (!bf16_gemm) q_ = std::make_unique<LinearQuantized>(name, in_features, out_features, recipe);
  w_ = &store.add(name, {out_features, in_features}, ParamInit::normal, init_std, /*decay=*/true);
}

Linear::~Linear() = default;
Linear::Linear(Linear&&) noexcept = default;
Linear& Linear::operator=(Linear&&) noexcept = default;

size_t Linear::held_activation_bytes(const Recipe& recipe, int64_t M, int64_t K) {
  FP4MOE_CHECK(M >= 0 && K >= 1, "Linear::held_activation_bytes: expected M >= 0 and K >= 1, got M={} K={}", M, K);
  return GroupLinear::held_activation_bytes(recipe, M, K, 1);
}

size_t Linear::weight_copy_bytes(const Recipe& recipe, int64_t N, int64_t K) {
  return GroupLinear::weight_copy_bytes(recipe, 1, N, K);
}

BufferPlan Linear::buffers(const Recipe& recipe, int64_t M, int64_t N, int64_t K, bool fp32_dgrad) {
  BufferPlan p("linear");
  check_recipe_built(recipe, "Linear::buffers");
  if (recipe == Recipe::bf16) return p;
  p.append(GroupLinear::buffers(recipe, 1, N, K, M));
  const Lifetime first = Lifetime::first_forward;
  p.add("token offsets", 2, ElemType::int32, true, MemCategory::workspace, first);
  if (recipe.mxfp4_input) {
    FP4MOE_CHECK(K % kMxBlock == 0, "Linear::buffers: the mxfp4 recipe needs K % 32 == 0, got K={}", K);
    p.add("X MXFP4 codes", M * K / 2, ElemType::e2m1x2, true, MemCategory::activations, first);
    p.add("X MXFP4 scales", M * K / kMxBlock, ElemType::ue8m0, true, MemCategory::activations, first);
  }
  p.add("BF16 Dgrad before FP32", fp32_dgrad ? M * K : 0, ElemType::bf16, true, MemCategory::workspace, first);
  return p;
}

// bf16: row-major Y [M, N] is column-major Y^T [N, M]: Y^T = W (stored K x N column-major, i.e. W^T op) * X^T.
void Linear::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) const {
  if (M == 0) return;
  FP4MOE_CHECK(M > 0, "Linear {} forward: M must be >= 0, got {}", w_->name, M);
  FP4MOE_CHECK(x && y, "Linear {} forward: x [M, {}] and y [M, {}] must not be null", w_->name, K_, N_);
  ProfileScope profile(ctx, profile_module_);
  if (q_) {
    q_->forward(ctx, w_->param, x, M, y);
    return;
  }
  LtOperand a{w_->param, CUDA_R_16BF, true, K_};
  LtOperand b{x, CUDA_R_16BF, false, K_};
  ctx.lt->matmul(N_, M, K_, a, b, LtOutput{y, CUDA_R_16BF, N_, false}, RaggedDim::none, ctx.stream);
}

void Linear::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, LinearGradOut dx) const {
  if (M == 0) return;
  FP4MOE_CHECK(M > 0, "Linear {} backward: M must be >= 0, got {}", w_->name, M);
  FP4MOE_CHECK(dy != nullptr, "Linear {} backward: dy [M, {}] must not be null", w_->name, N_);
  FP4MOE_CHECK(!dx.accumulate || dx.fp32, "Linear {} backward: Dgrad accumulation needs an FP32 output", w_->name);
  ProfileScope profile(ctx, profile_module_);
  if (q_) {
    q_->backward(ctx, dy, M, dx, w_->grad);
    return;
  }
  FP4MOE_CHECK(x != nullptr, "Linear {} backward: the bf16 recipe reads the forward's x [M, {}], which is null",
               w_->name, K_);
  backward_bf16(ctx, dy, x, M, dx);
}

void Linear::backward_bf16(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, LinearGradOut dx) const {
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
