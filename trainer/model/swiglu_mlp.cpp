#include "trainer/model/swiglu_mlp.h"

#include "kernels/common/check.h"
#include "kernels/nn/swiglu.h"
#include "trainer/model/profile.h"

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
      recipe_(recipe),
      recompute_(recompute),
      fc1_(store, prefix + ".fc1", hidden, 2 * ffn, recipe, kInitStd),
      fc2_(store, prefix + ".fc2", ffn, hidden, recipe, fc2_init_std),
      last_M_(mem.slots(), -1) {
  FP4MOE_CHECK(max_tokens >= 0, "SwigluMlp {}: max_tokens must be >= 0, got {}", prefix, max_tokens);
  FP4MOE_CHECK(fc2_init_std > 0.0f, "SwigluMlp {}: fc2_init_std must be > 0, got {}", prefix, fc2_init_std);
  const BufferPlan p = plan();
  keep_a_ = p.at("a").held;
  h_ = p.allocate_kept<bf16>(mem, "h", prefix);
  a_ = p.allocate_kept<bf16>(mem, "a", prefix);
}

BufferPlan SwigluMlp::buffers(const std::string& module, int64_t tokens, int64_t fc1_tokens, int64_t hidden,
                              int64_t ffn, const Recipe& recipe, bool recompute, bool fp32_dgrad) {
  FP4MOE_CHECK(tokens >= 0 && fc1_tokens >= 0 && hidden >= 1 && ffn >= 1,
               "SwigluMlp::buffers: expected tokens, fc1_tokens >= 0 and hidden, ffn >= 1, got {} {} {} {}", tokens,
               fc1_tokens, hidden, ffn);
  BufferPlan p(module);
  p.add("h", tokens * 2 * ffn, ElemType::bf16, !recompute);
  p.add("a", tokens * ffn, ElemType::bf16, !recompute && recipe == Recipe::bf16);  // a serves backward as fc2's input
  p.add("d a", tokens * ffn, ElemType::bf16, true, MemCategory::workspace, Lifetime::backward_scratch);
  p.add("d h", tokens * 2 * ffn, ElemType::bf16, true, MemCategory::workspace, Lifetime::backward_scratch);
  p.append(Linear::buffers(recipe, fc1_tokens, 2 * ffn, hidden, fp32_dgrad), "fc1 ");
  p.append(Linear::buffers(recipe, tokens, hidden, ffn, false), "fc2 ");
  return p;
}

size_t SwigluMlp::kept_bytes() const {
  return static_cast<size_t>(plan().counted_bytes(MemCategory::activations, Lifetime::construction));
}

PassScratch SwigluMlp::scratch(int64_t tokens, int64_t hidden, int64_t ffn, const Recipe& recipe, bool recompute) {
  const BufferPlan p = buffers("mlp", tokens, tokens, hidden, ffn, recipe, recompute, false);
  auto bytes = [&](const char* t) { return ScratchArena::rounded(static_cast<size_t>(p.at(t).bytes())); };
  auto unless_held = [&](const char* t) { return p.at(t).held ? size_t{0} : bytes(t); };
  PassScratch s;
  s.forward = unless_held("h") + unless_held("a");
  const bool fc2_reads_a = recipe == Recipe::bf16;  // Linear::backward_reads_input
  const size_t rebuilt = recompute ? bytes("h") + (fc2_reads_a ? bytes("a") : 0) : 0;
  s.backward = rebuilt + bytes("d a") + bytes("d h");
  return s;
}

const BufferPlan& SwigluMlp::plan_for(int64_t M) {
  if (M != pass_M_) {
    pass_plan_ = buffers("mlp", M, M, hidden_, ffn_, recipe_, recompute_, false);
    pass_M_ = M;
  }
  return pass_plan_;
}

bool SwigluMlp::backward_reads_input() const { return recompute_ || fc1_.backward_reads_input(); }

void SwigluMlp::check_tokens(const char* what, int64_t M) const {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_, "SwigluMlp {} {}: M must be in [0, {}] (max_tokens), got M={}", prefix_,
               what, max_tokens_, M);
}

void SwigluMlp::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  check_tokens("forward", M);
  last_M_.get() = M;
  if (M == 0) return;
  ScratchArena& arena = scratch_of(ctx, "SwigluMlp " + prefix_);
  ScratchScope scope(arena);
  const BufferPlan& p = plan_for(M);
  bf16* h = recompute_ ? take_planned<bf16>(arena, p.at("h"), "SwiGLU MLP h") : h_.data();
  bf16* a = keep_a_ ? a_.data() : take_planned<bf16>(arena, p.at("a"), "SwiGLU MLP a");
  fc1_.forward(ctx, x, M, h);                        // h [M, 2 ffn]
  swiglu_forward(h, M, ffn_, a, ctx.stream);         // a [M, ffn]
  fc2_.forward(ctx, a, M, y);                        // y [M, hidden]
}

void SwigluMlp::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx) {
  backward(ctx, dy, x, M, LinearGradOut{dx, false, false});
}

void SwigluMlp::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, LinearGradOut dx) {
  check_tokens("backward", M);
  FP4MOE_CHECK(M == last_M_.get(), "SwigluMlp {} backward: expected the last forward's M={}, got M={}", prefix_,
               last_M_.get(), M);
  if (M == 0) return;
  ScratchArena& arena = scratch_of(ctx, "SwigluMlp " + prefix_);
  ScratchScope scope(arena);
  FP4MOE_CHECK(dy && (x || !backward_reads_input()),
               "SwigluMlp {} backward: dy and x (read by this recipe and policy) must not be null", prefix_);
  const BufferPlan& p = plan_for(M);
  bf16* h = h_.data();
  bf16* a = a_.data();  // null unless kept: fp8/mxfp4 fc2 reads its own copy
  if (recompute_) {  // h again (and a for a bf16 fc2); fc2's output is not needed
    ProfileScope rerun(ctx, ProfileModule::inherit, ProfilePass::recompute);  // the caller's module
    h = take_planned<bf16>(arena, p.at("h"), "SwiGLU MLP h (recomputed)");
    fc1_.forward(ctx, x, M, h);
    if (fc2_.backward_reads_input()) {
      a = take_planned<bf16>(arena, p.at("a"), "SwiGLU MLP a (recomputed)");
      swiglu_forward(h, M, ffn_, a, ctx.stream);
    }
  }
  bf16* da = take_planned<bf16>(arena, p.at("d a"), "SwiGLU MLP d a");
  bf16* dh = take_planned<bf16>(arena, p.at("d h"), "SwiGLU MLP d h");
  fc2_.backward(ctx, dy, a, M, LinearGradOut{da, false, false});  // da [M, ffn], dW2 +=
  swiglu_backward(da, h, M, ffn_, dh, ctx.stream);                // dh [M, 2 ffn]
  fc1_.backward(ctx, dh, x, M, dx);                               // dx [M, hidden], dW1 +=
}

}  // namespace fp4moe
