#include "trainer/model/swiglu_mlp.h"

#include "kernels/common/check.h"
#include "kernels/nn/swiglu.h"

namespace fp4moe {

namespace {
constexpr float kInitStd = 0.02f;
}  // namespace

SwigluMlp::SwigluMlp(ParamStore& store, const std::string& prefix, int64_t hidden, int64_t ffn, Recipe recipe,
                     int64_t max_tokens, DeviceMemory& mem, float fc2_init_std, bool recompute)
    : prefix_(prefix),
      hidden_(hidden),
      ffn_(ffn),
      max_tokens_(max_tokens),
      recompute_(recompute),
      fc1_(store, prefix + ".fc1", hidden, 2 * ffn, recipe, kInitStd),
      fc2_(store, prefix + ".fc2", ffn, hidden, recipe, fc2_init_std) {
  FP4MOE_CHECK(max_tokens >= 0, "SwigluMlp {}: max_tokens must be >= 0, got {}", prefix, max_tokens);
  FP4MOE_CHECK(fc2_init_std > 0.0f, "SwigluMlp {}: fc2_init_std must be > 0, got {}", prefix, fc2_init_std);
  keep_a_ = !recompute && fc2_.backward_reads_input();  // a serves backward only as fc2's input
  if (!recompute) h_ = DeviceArray<bf16>(mem, max_tokens * 2 * ffn, MemCategory::activations, prefix + " fc1 output");
  if (keep_a_) a_ = DeviceArray<bf16>(mem, max_tokens * ffn, MemCategory::activations, prefix + " swiglu output");
}

size_t SwigluMlp::forward_bytes() const {
  const auto rows = static_cast<size_t>(max_tokens_);
  return (recompute_ ? ScratchArena::rounded(rows * 2 * ffn_ * sizeof(bf16)) : 0) +
         (keep_a_ ? 0 : ScratchArena::rounded(rows * ffn_ * sizeof(bf16)));
}

size_t SwigluMlp::backward_bytes() const {
  const auto rows = static_cast<size_t>(max_tokens_);
  const size_t h = ScratchArena::rounded(rows * 2 * ffn_ * sizeof(bf16));
  const size_t a = ScratchArena::rounded(rows * ffn_ * sizeof(bf16));
  const size_t rebuilt = recompute_ ? h + (fc2_.backward_reads_input() ? a : 0) : 0;
  return rebuilt + a + h;  // + d a, d h
}

bool SwigluMlp::backward_reads_input() const { return recompute_ || fc1_.backward_reads_input(); }

void SwigluMlp::check_tokens(const char* what, int64_t M) const {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_, "SwigluMlp {} {}: M must be in [0, {}] (max_tokens), got M={}", prefix_,
               what, max_tokens_, M);
}

void SwigluMlp::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  check_tokens("forward", M);
  last_M_ = M;
  if (M == 0) return;
  ScratchArena& arena = scratch_of(ctx, "SwigluMlp " + prefix_);
  ScratchScope scope(arena);
  bf16* h = recompute_ ? arena.take<bf16>(M * 2 * ffn_, "SwiGLU MLP h") : h_.data();
  bf16* a = keep_a_ ? a_.data() : arena.take<bf16>(M * ffn_, "SwiGLU MLP a");
  fc1_.forward(ctx, x, M, h);                        // h [M, 2 ffn]
  swiglu_forward(h, M, ffn_, a, ctx.stream);         // a [M, ffn]
  fc2_.forward(ctx, a, M, y);                        // y [M, hidden]
}

void SwigluMlp::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx) {
  backward(ctx, dy, x, M, LinearGradOut{dx, false, false});
}

void SwigluMlp::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, LinearGradOut dx) {
  check_tokens("backward", M);
  FP4MOE_CHECK(M == last_M_, "SwigluMlp {} backward: expected the last forward's M={}, got M={}", prefix_, last_M_,
               M);
  if (M == 0) return;
  ScratchArena& arena = scratch_of(ctx, "SwigluMlp " + prefix_);
  ScratchScope scope(arena);
  FP4MOE_CHECK(dy && (x || !backward_reads_input()),
               "SwigluMlp {} backward: dy and x (read by this recipe and policy) must not be null", prefix_);
  bf16* h = h_.data();
  bf16* a = a_.data();  // null unless kept: fp8/mxfp4 fc2 reads its own copy
  if (recompute_) {  // h again (and a for a bf16 fc2); fc2's output is not needed
    h = arena.take<bf16>(M * 2 * ffn_, "SwiGLU MLP h (recomputed)");
    fc1_.forward(ctx, x, M, h);
    if (fc2_.backward_reads_input()) {
      a = arena.take<bf16>(M * ffn_, "SwiGLU MLP a (recomputed)");
      swiglu_forward(h, M, ffn_, a, ctx.stream);
    }
  }
  bf16* da = arena.take<bf16>(M * ffn_, "SwiGLU MLP d a");
  bf16* dh = arena.take<bf16>(M * 2 * ffn_, "SwiGLU MLP d h");
  fc2_.backward(ctx, dy, a, M, LinearGradOut{da, false, false});  // da [M, ffn], dW2 +=
  swiglu_backward(da, h, M, ffn_, dh, ctx.stream);                // dh [M, 2 ffn]
  fc1_.backward(ctx, dh, x, M, dx);                               // dx [M, hidden], dW1 +=
}

}  // namespace fp4moe
