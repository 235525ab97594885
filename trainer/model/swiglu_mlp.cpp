#include "trainer/model/swiglu_mlp.h"

#include "kernels/common/check.h"
#include "kernels/nn/swiglu.h"

namespace fp4moe {

namespace {
constexpr float kInitStd = 0.02f;
}  // namespace

SwigluMlp::SwigluMlp(ParamStore& store, const std::string& prefix, int64_t hidden, int64_t ffn, Recipe recipe,
                     int64_t max_tokens, DeviceMemory& mem, float fc2_init_std)
    : prefix_(prefix),
      hidden_(hidden),
      ffn_(ffn),
      max_tokens_(max_tokens),
      fc1_(store, prefix + ".fc1", hidden, 2 * ffn, recipe, kInitStd),
      fc2_(store, prefix + ".fc2", ffn, hidden, recipe, fc2_init_std) {
  FP4MOE_CHECK(max_tokens >= 0, "SwigluMlp {}: max_tokens must be >= 0, got {}", prefix, max_tokens);
  FP4MOE_CHECK(fc2_init_std > 0.0f, "SwigluMlp {}: fc2_init_std must be > 0, got {}", prefix, fc2_init_std);
  h_ = DeviceArray<bf16>(mem, max_tokens * 2 * ffn, MemCategory::activations, prefix + " fc1 output");
  a_ = DeviceArray<bf16>(mem, max_tokens * ffn, MemCategory::activations, prefix + " swiglu output");
  da_ = DeviceArray<bf16>(mem, max_tokens * ffn, MemCategory::workspace, prefix + " swiglu output grad");
  dh_ = DeviceArray<bf16>(mem, max_tokens * 2 * ffn, MemCategory::workspace, prefix + " fc1 output grad");
}

void SwigluMlp::check_tokens(const char* what, int64_t M) const {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_, "SwigluMlp {} {}: M must be in [0, {}] (max_tokens), got M={}", prefix_,
               what, max_tokens_, M);
}

void SwigluMlp::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  check_tokens("forward", M);
  last_M_ = M;
  if (M == 0) return;
  fc1_.forward(ctx, x, M, h_.data());                        // h [M, 2 ffn]
  swiglu_forward(h_.data(), M, ffn_, a_.data(), ctx.stream);  // a [M, ffn]
  fc2_.forward(ctx, a_.data(), M, y);                        // y [M, hidden]
}

void SwigluMlp::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx) {
  backward(ctx, dy, x, M, LinearGradOut{dx, false, false});
}

void SwigluMlp::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, LinearGradOut dx) {
  check_tokens("backward", M);
  FP4MOE_CHECK(M == last_M_, "SwigluMlp {} backward: expected the last forward's M={}, got M={}", prefix_, last_M_,
               M);
  if (M == 0) return;
  fc2_.backward(ctx, dy, a_.data(), M, LinearGradOut{da_.data(), false, false});  // da [M, ffn], dW2 +=
  swiglu_backward(da_.data(), h_.data(), M, ffn_, dh_.data(), ctx.stream);       // dh [M, 2 ffn]
  fc1_.backward(ctx, dh_.data(), x, M, dx);                                        // dx [M, hidden], dW1 +=
}

}  // namespace fp4moe
