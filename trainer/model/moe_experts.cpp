#include "trainer/model/moe_experts.h"

#include "kernels/common/check.h"
#include "kernels/nn/permute.h"
#include "kernels/nn/swiglu.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"

namespace fp4moe {

namespace {
constexpr float kInitStd = 0.02f;
}  // namespace

GroupLinearRecipe group_linear_recipe(Recipe r) {
  switch (r) {
    case Recipe::bf16: return GroupLinearRecipe::bf16;
    case Recipe::fp8: return GroupLinearRecipe::fp8;
    case Recipe::mxfp4: return GroupLinearRecipe::mxfp4;
  }
  FP4MOE_CHECK(false, "group_linear_recipe: unknown recipe {}", static_cast<int>(r));
  return GroupLinearRecipe::bf16;
}

MoeRoutedExperts::MoeRoutedExperts(ParamStore& store, const std::string& prefix, int64_t E, int64_t d, int64_t f,
                                   int64_t k, Recipe recipe, float fc2_init_std, int64_t max_tokens,
                                   DeviceMemory& mem)
    : prefix_(prefix),
      E_(E),
      d_(d),
      f_(f),
      k_(k),
      max_tokens_(max_tokens),
      recipe_(recipe),
      w1_(nullptr),
      w2_(nullptr),
      fc1_(E, 2 * f, d, group_linear_recipe(recipe)),  // checks E, d, f before anything is registered
      fc2_(E, d, f, group_linear_recipe(recipe)) {
  FP4MOE_CHECK(max_tokens >= 0 && k >= 1 && k <= E,
               "MoeRoutedExperts {}: expected max_tokens >= 0 and 1 <= top_k <= E, got max_tokens={} k={} E={}",
               prefix, max_tokens, k, E);
  FP4MOE_CHECK(fc2_init_std > 0.0f, "MoeRoutedExperts {}: fc2_init_std must be > 0, got {}", prefix, fc2_init_std);
  w1_ = &store.add(prefix + ".experts.fc1", {E, 2 * f, d}, ParamInit::normal, kInitStd, /*decay=*/true);
  w2_ = &store.add(prefix + ".experts.fc2", {E, d, f}, ParamInit::normal, fc2_init_std, /*decay=*/true);
  const int64_t R = max_tokens * k;
  const bool bf16_kept = recipe == Recipe::bf16, mx = recipe == Recipe::mxfp4;
  const MemCategory kept = bf16_kept ? MemCategory::activations : MemCategory::workspace;
  const MemCategory act = MemCategory::activations, ws = MemCategory::workspace;
  row_of_ = DeviceArray<int32_t>(mem, R, act, prefix + " experts row_of");
  assignment_of_ = DeviceArray<int32_t>(mem, R, act, prefix + " experts assignment_of");
  xs_ = DeviceArray<bf16>(mem, R * d, kept, prefix + " experts permuted input");
  h_ = DeviceArray<bf16>(mem, R * 2 * f, act, prefix + " experts fc1 output");
  a_ = DeviceArray<bf16>(mem, R * f, kept, prefix + " experts swiglu output");
  ys_ = DeviceArray<bf16>(mem, R * d, act, prefix + " experts fc2 output");
  if (mx) {
    xs_codes_ = DeviceArray<uint8_t>(mem, R * d / 2, act, prefix + " experts permuted input MXFP4 codes");
    xs_scales_ = DeviceArray<uint8_t>(mem, R * d / kMxBlock, act, prefix + " experts permuted input MXFP4 scales");
    a_codes_ = DeviceArray<uint8_t>(mem, R * f / 2, act, prefix + " experts swiglu output MXFP4 codes");
    a_scales_ = DeviceArray<uint8_t>(mem, R * f / kMxBlock, act, prefix + " experts swiglu output MXFP4 scales");
  }
  drows_ = DeviceArray<bf16>(mem, R * d, ws, prefix + " experts row grads");
  da_ = DeviceArray<bf16>(mem, R * f, ws, prefix + " experts swiglu output grad");
  dh_ = DeviceArray<bf16>(mem, R * 2 * f, ws, prefix + " experts fc1 output grad");
}

DispatchBytes MoeRoutedExperts::dispatch_bytes() const {
  const int64_t R = max_tokens_ * k_;
  if (R == 0) return {};
  const double rows = static_cast<double>(R);
  switch (recipe_) {
    case Recipe::bf16: return {static_cast<double>(xs_.bytes()) / rows, 0.0};
    case Recipe::fp8:  // the size of fc1's FP8 row buffer for R rows (GroupLinear::forward, group_linear.cpp)
      return {static_cast<double>(R * d_) / rows,
              static_cast<double>(sizeof(float) * static_cast<size_t>(fp8_row_scale_count(R, d_))) / rows};
    case Recipe::mxfp4:
      return {static_cast<double>(xs_codes_.bytes()) / rows, static_cast<double>(xs_scales_.bytes()) / rows};
  }
  FP4MOE_CHECK(false, "MoeRoutedExperts {}: unknown recipe {}", prefix_, static_cast<int>(recipe_));
  return {};
}

GroupLinearInput MoeRoutedExperts::quantized_input(const bf16* rows, int64_t R, int64_t K, uint8_t* codes,
                                                   uint8_t* scales, cudaStream_t stream) const {
  if (recipe_ != Recipe::mxfp4) return GroupLinearInput{rows, nullptr, nullptr};
  bf16_to_mxfp4_row(rows, R, K, codes, scales, MxQuantConfig{}, nullptr, stream);
  return GroupLinearInput{nullptr, codes, scales};
}

void MoeRoutedExperts::forward(ModelContext& ctx, const bf16* x, const MoeRouting& r, bf16* y) {
  const int64_t M = r.M, R = M * k_;
  FP4MOE_CHECK(M >= 1 && M <= max_tokens_ && r.E == E_ && r.k == k_,
               "MoeRoutedExperts {} forward: expected 1 <= M <= {} with E={} k={}, got M={} E={} k={}", prefix_,
               max_tokens_, E_, k_, M, r.E, r.k);
  FP4MOE_CHECK(x && y, "MoeRoutedExperts {} forward: x [M, {}] and y [M, {}] must not be null", prefix_, d_, d_);
  last_M_ = M;
  const GroupSplit split{r.offsets, r.host_offsets, E_};
  cudaStream_t s = ctx.stream;
  permute_map(r.topk_idx, r.offsets, M, k_, E_, row_of_.data(), assignment_of_.data(), s);
  permute_forward(x, assignment_of_.data(), M, k_, d_, xs_.data(), s);  // xs [R, d]
  fc1_.set_weights(w1_->param, s);
  fc2_.set_weights(w2_->param, s);
  fc1_.forward(quantized_input(xs_.data(), R, d_, xs_codes_.data(), xs_scales_.data(), s), split, h_.data(), s);
  swiglu_forward(h_.data(), R, f_, a_.data(), s);  // a [R, f]
  fc2_.forward(quantized_input(a_.data(), R, f_, a_codes_.data(), a_scales_.data(), s), split, ys_.data(), s);
  unpermute_forward(ys_.data(), r.topk_weight, row_of_.data(), M, k_, d_, y, s);  // y [M, d]
}

void MoeRoutedExperts::backward(ModelContext& ctx, const bf16* dy, const MoeRouting& r, bf16* dx, float* dweights) {
  const int64_t M = r.M, R = M * k_;
  FP4MOE_CHECK(M == last_M_, "MoeRoutedExperts {} backward: expected the last forward's M={}, got M={}", prefix_,
               last_M_, M);
  FP4MOE_CHECK(dy && dx && dweights, "MoeRoutedExperts {} backward: dy, dx [M, {}] and dweights [M, {}] must not "
               "be null", prefix_, d_, k_);
  const GroupSplit split{r.offsets, r.host_offsets, E_};
  cudaStream_t s = ctx.stream;
  bf16* drows = drows_.data();
  unpermute_backward(dy, ys_.data(), r.topk_weight, row_of_.data(), M, k_, d_, drows, dweights, s);  // dys [R, d]
  fc2_.backward(drows, split, da_.data(), w2_->grad, s);                                             // da [R, f]
  swiglu_backward(da_.data(), h_.data(), R, f_, dh_.data(), s);                                      // dh [R, 2f]
  fc1_.backward(dh_.data(), split, drows, w1_->grad, s);                                             // dxs [R, d]
  permute_backward(drows, row_of_.data(), M, k_, d_, dx, s);                                         // dx [M, d]
}

}  // namespace fp4moe
