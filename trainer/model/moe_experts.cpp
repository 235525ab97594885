#include "trainer/model/moe_experts.h"

#include <type_traits>
#include <utility>

#include "kernels/common/check.h"
#include "kernels/nn/permute.h"
#include "kernels/nn/swiglu.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "trainer/model/linear_quantized.h"

namespace fp4moe {

namespace {
constexpr float kInitStd = 0.02f;
}  // namespace

MoeRoutedExperts::MoeRoutedExperts(ParamStore& store, const std::string& prefix, int64_t E, int64_t d, int64_t f,
                                   int64_t k, const Recipe& recipe, float fc2_init_std, int64_t max_tokens,
                                   DeviceMemory& mem, MoeRecompute recompute)
    : prefix_(prefix),
      E_(E),
      d_(d),
      f_(f),
      k_(k),
      max_tokens_(max_tokens),
      recipe_(recipe),
      whole_(recompute.whole),
      act_(recompute.act),
      w1_(nullptr),
      w2_(nullptr),
      mem_(&mem) {
  GroupLinear::check_shape(E, 2 * f, d, recipe);  // fc1, fc2: before anything is registered
  GroupLinear::check_shape(E, d, f, recipe);
  FP4MOE_CHECK(max_tokens >= 0 && k >= 1 && k <= E,
               "MoeRoutedExperts {}: expected max_tokens >= 0 and 1 <= top_k <= E, got max_tokens={} k={} E={}",
               prefix, max_tokens, k, E);
  FP4MOE_CHECK(fc2_init_std > 0.0f, "MoeRoutedExperts {}: fc2_init_std must be > 0, got {}", prefix, fc2_init_std);
  w1_ = &store.add(prefix + ".experts.fc1", {E, 2 * f, d}, ParamInit::normal, kInitStd, /*decay=*/true);
  w2_ = &store.add(prefix + ".experts.fc2", {E, d, f}, ParamInit::normal, fc2_init_std, /*decay=*/true);
  const int64_t R = max_tokens * k;
  const bool bf = recipe == Recipe::bf16, mx = recipe == Recipe::mxfp4, f8 = recipe == Recipe::fp8;
  const bool keep = !whole_, keep_a = keep && !act_;
  auto kept = [&](auto tag, bool on, int64_t n, const std::string& what) {
    using T = decltype(tag);
    return on ? DeviceArray<T>(mem, n, MemCategory::activations, prefix + " experts " + what) : DeviceArray<T>();
  };
  row_of_ = kept(int32_t{}, true, R, "row_of");
  xs_ = kept(bf16{}, bf, R * d, "permuted input");
  xs_codes_ = kept(uint8_t{}, mx, R * d / 2, "permuted input MXFP4 codes");
  xs_scales_ = kept(uint8_t{}, mx, R * d / kMxBlock, "permuted input MXFP4 scales");
  xs_fp8_codes_ = kept(uint8_t{}, f8 && whole_, R * d, "permuted input FP8 row codes");
  xs_fp8_scales_ = kept(float{}, f8 && whole_, fp8_row_scale_count(R, d), "permuted input FP8 row scales");
  h_ = kept(bf16{}, keep, R * 2 * f, "fc1 output");
  a_ = kept(bf16{}, keep_a && bf, R * f, "swiglu output");
  ys_ = kept(bf16{}, keep, R * d, "fc2 output");
  a_codes_ = kept(uint8_t{}, keep_a && mx, R * f / 2, "swiglu output MXFP4 codes");
  a_scales_ = kept(uint8_t{}, keep_a && mx, R * f / kMxBlock, "swiglu output MXFP4 scales");

  ScratchArena m;  // the passes' binding code on a measuring arena, for R = R_max
  Tensors t = bind_forward(m, R);
  fwd_bytes_ = m.used();
  m.release(ScratchArena::Mark{});
  if (needs_recompute()) {
    bind_recompute(m, R, t);
    recompute_bytes_ = m.used();
  }
  bwd_bytes_ = ScratchArena::rounded(static_cast<size_t>(R * d) * sizeof(bf16)) +
               ScratchArena::rounded(static_cast<size_t>(R * f) * sizeof(bf16)) +
               ScratchArena::rounded(static_cast<size_t>(R * 2 * f) * sizeof(bf16));
}

size_t MoeRoutedExperts::kept_bytes() const {
  return counted_bytes(row_of_) + counted_bytes(xs_) + counted_bytes(xs_codes_) + counted_bytes(xs_scales_) +
         counted_bytes(xs_fp8_codes_) + counted_bytes(xs_fp8_scales_) + counted_bytes(h_) + counted_bytes(a_) +
         counted_bytes(ys_) + counted_bytes(a_codes_) + counted_bytes(a_scales_);
}

// From the recipe's row layout: the sizes the permuted-input buffers hold per row (bf16 xs, mxfp4 xs codes and
// scales, fp8 fc1's FP8 row buffer), whether or not the recompute policy keeps them.
DispatchBytes MoeRoutedExperts::dispatch_bytes() const {
  const int64_t R = max_tokens_ * k_;
  if (R == 0) return {};
  const double rows = static_cast<double>(R);
  if (recipe_ == Recipe::bf16) return {static_cast<double>(R * d_ * static_cast<int64_t>(sizeof(bf16))) / rows, 0.0};
  if (recipe_ == Recipe::mxfp4)
    return {static_cast<double>(R * d_ / 2) / rows, static_cast<double>(R * d_ / kMxBlock) / rows};
  // fp8: the size of fc1's FP8 row buffer for R rows (GroupLinear::forward, group_linear.cpp)
  return {static_cast<double>(R * d_) / rows,
          static_cast<double>(sizeof(float) * static_cast<size_t>(fp8_row_scale_count(R, d_))) / rows};
}

MoeRoutedExperts::Tensors MoeRoutedExperts::bind_forward(ScratchArena& a, int64_t R) {
  const bool bf = recipe_ == Recipe::bf16, mx = recipe_ == Recipe::mxfp4, keep = !whole_, keep_a = keep && !act_;
  auto pick = [&](auto* kept_ptr, bool on, int64_t n, const char* what) {
    using T = std::remove_pointer_t<decltype(kept_ptr)>;
    return on ? kept_ptr : a.take<T>(n, what);
  };
  Tensors t;
  t.row_of = row_of_.data();
  t.assignment_of = a.take<int32_t>(R, "experts assignment_of");
  t.xs = pick(xs_.data(), bf, R * d_, "experts permuted input");
  t.h = pick(h_.data(), keep, R * 2 * f_, "experts fc1 output");
  t.a = pick(a_.data(), keep_a && bf, R * f_, "experts swiglu output");
  t.ys = pick(ys_.data(), keep, R * d_, "experts fc2 output");
  if (mx) {
    t.xs_codes = xs_codes_.data();
    t.xs_scales = xs_scales_.data();
    t.a_codes = pick(a_codes_.data(), keep_a, R * f_ / 2, "experts swiglu output MXFP4 codes");
    t.a_scales = pick(a_scales_.data(), keep_a, R * f_ / kMxBlock, "experts swiglu output MXFP4 scales");
  }
  t.xs_fp8_codes = xs_fp8_codes_.data();  // null unless fp8 under whole
  t.xs_fp8_scales = xs_fp8_scales_.data();
  return t;
}

void MoeRoutedExperts::bind_recompute(ScratchArena& a, int64_t R, Tensors& t) {
  if (whole_) t.h = a.take<bf16>(R * 2 * f_, "experts fc1 output (recomputed)");
  t.a = a.take<bf16>(R * f_, "experts swiglu output (recomputed)");
  if (recipe_ == Recipe::mxfp4) {
    t.a_codes = a.take<uint8_t>(R * f_ / 2, "experts swiglu output MXFP4 codes (recomputed)");
    t.a_scales = a.take<uint8_t>(R * f_ / kMxBlock, "experts swiglu output MXFP4 scales (recomputed)");
  }
  if (whole_) t.ys = a.take<bf16>(R * d_, "experts fc2 output (recomputed)");
}

GroupLinearInput MoeRoutedExperts::quantized_input(const bf16* rows, int64_t R, int64_t K, uint8_t* codes,
                                                   uint8_t* scales, cudaStream_t stream) const {
  if (recipe_ != Recipe::mxfp4) return GroupLinearInput{rows, nullptr, nullptr};
  bf16_to_mxfp4_row(rows, R, K, codes, scales, MxQuantConfig{}, nullptr, stream);
  return GroupLinearInput{nullptr, codes, scales};
}

GroupLinearInput MoeRoutedExperts::input_of(const bf16* rows, const uint8_t* codes, const uint8_t* scales) const {
  return recipe_ == Recipe::mxfp4 ? GroupLinearInput{nullptr, codes, scales} : GroupLinearInput{rows, nullptr, nullptr};
}

void MoeRoutedExperts::bind(const ModelContext& ctx) {
  if (!fc1_) {  // the model's one cuBLASLt workspace (ctx.lt), not one per Group Linear
    fc1_.emplace(E_, 2 * f_, d_, recipe_, ctx.lt, counted_allocator(*mem_, w1_->name));
    fc2_.emplace(E_, d_, f_, recipe_, ctx.lt, counted_allocator(*mem_, w2_->name));
    lt_ = ctx.lt;
  }
  FP4MOE_CHECK(ctx.lt == lt_,
               "MoeRoutedExperts {}: ctx.lt is not the cuBLASLt object of the first forward, which fc1 and fc2 use",
               prefix_);
}

void MoeRoutedExperts::forward(ModelContext& ctx, const bf16* x, const MoeRouting& r, bf16* y) {
  const int64_t M = r.M;
  FP4MOE_CHECK(M >= 1 && M <= max_tokens_ && r.E == E_ && r.k == k_,
               "MoeRoutedExperts {} forward: expected 1 <= M <= {} with E={} k={}, got M={} E={} k={}", prefix_,
               max_tokens_, E_, k_, M, r.E, r.k);
  FP4MOE_CHECK(x && y, "MoeRoutedExperts {} forward: x [M, {}] and y [M, {}] must not be null", prefix_, d_, d_);
  bind(ctx);
  last_M_ = M;
  ScratchArena& arena = scratch_of(ctx, "MoeRoutedExperts " + prefix_);  // takes stay in the caller's scope
  t_ = bind_forward(arena, M * k_);
  fc1_->set_weights(w1_->param, ctx.stream);
  fc2_->set_weights(w2_->param, ctx.stream);
  run_to_ys(ctx, x, r, t_);
  unpermute_forward(t_.ys, r.topk_weight, t_.row_of, M, k_, d_, y, ctx.stream);  // y [M, d]
  stamp_ = arena.stamp();
}

void MoeRoutedExperts::run_to_ys(ModelContext& ctx, const bf16* x, const MoeRouting& r, const Tensors& t) {
  const int64_t M = r.M, R = M * k_;
  const GroupSplit split{r.offsets, r.host_offsets, E_};
  cudaStream_t s = ctx.stream;
  permute_map(r.topk_idx, r.offsets, M, k_, E_, t.row_of, t.assignment_of, s);
  permute_forward(x, t.assignment_of, M, k_, d_, t.xs, s);  // xs [R, d]
  // fp8 under whole: the kept FP8 row copy of xs, the same call (rows, scale mode) by which fc1 quantizes xs for
  // its Fprop below, so that the recompute's Fprop reads the same operand.
  if (t.xs_fp8_codes) bf16_to_fp8_row(t.xs, R, d_, fc1_->scale_mode(), t.xs_fp8_codes, t.xs_fp8_scales, nullptr, s);
  fc1_->forward(quantized_input(t.xs, R, d_, t.xs_codes, t.xs_scales, s), split, t.h, s);  // h [R, 2f]
  run_from_h(ctx, split, R, t);
}

void MoeRoutedExperts::run_from_h(ModelContext& ctx, const GroupSplit& split, int64_t R, const Tensors& t) {
  cudaStream_t s = ctx.stream;
  swiglu_forward(t.h, R, f_, t.a, s);  // a [R, f]
  fc2_->forward(quantized_input(t.a, R, f_, t.a_codes, t.a_scales, s), split, t.ys, s);  // ys [R, d]
}

void MoeRoutedExperts::recompute(ModelContext& ctx, const MoeRouting& r) {
  const int64_t M = r.M, R = M * k_;
  FP4MOE_CHECK(M == last_M_ && r.E == E_ && r.k == k_,
               "MoeRoutedExperts {} recompute: expected the last forward's M={} (E={} k={}), got M={} E={} k={}",
               prefix_, last_M_, E_, k_, M, r.E, r.k);
  ScratchArena& arena = scratch_of(ctx, "MoeRoutedExperts " + prefix_);
  if (ready(arena)) return;
  bind_recompute(arena, R, t_);
  cudaStream_t s = ctx.stream;
  if (whole_) {  // the experts from the kept dispatched input (the weights' FP8 copies of this step are in fc1_, fc2_)
    const GroupSplit split{r.offsets, r.host_offsets, E_};
    if (recipe_ == Recipe::fp8)
      fc1_->fprop_fp8_rows(Fp8RowOperand{t_.xs_fp8_codes, t_.xs_fp8_scales}, split, t_.h, s);
    else
      fc1_->forward(input_of(t_.xs, t_.xs_codes, t_.xs_scales), split, t_.h, s);  // bf16, mxfp4
    run_from_h(ctx, split, R, t_);  // a (and its copy, where fc2's Wgrad reads it), ys
  } else {  // moe_act: a = swiglu(h) again (and its MXFP4 copy), where fc2's Wgrad will read it
    swiglu_forward(t_.h, R, f_, t_.a, s);
    quantized_input(t_.a, R, f_, t_.a_codes, t_.a_scales, s);  // mxfp4: the copy backward gives fc2's Wgrad
  }
  stamp_ = arena.stamp();
}

void MoeRoutedExperts::backward(ModelContext& ctx, const bf16* dy, const MoeRouting& r, bf16* dx, float* dweights) {
  const int64_t M = r.M, R = M * k_;
  FP4MOE_CHECK(M == last_M_, "MoeRoutedExperts {} backward: expected the last forward's M={}, got M={}", prefix_,
               last_M_, M);
  FP4MOE_CHECK(dy && dx && dweights, "MoeRoutedExperts {} backward: dy, dx [M, {}] and dweights [M, {}] must not "
               "be null", prefix_, d_, k_);
  ScratchArena& arena = scratch_of(ctx, "MoeRoutedExperts " + prefix_);
  FP4MOE_CHECK(ready(arena), "MoeRoutedExperts {} backward: the tensors the recompute policy does not keep are gone "
               "(call recompute() in the backward's scratch scope first)", prefix_);
  ScratchScope scope(arena);
  bf16* drows = arena.take<bf16>(R * d_, "experts d rows");
  bf16* da = arena.take<bf16>(R * f_, "experts d a");
  bf16* dh = arena.take<bf16>(R * 2 * f_, "experts d h");
  const GroupSplit split{r.offsets, r.host_offsets, E_};
  cudaStream_t s = ctx.stream;
  unpermute_backward(dy, t_.ys, r.topk_weight, t_.row_of, M, k_, d_, drows, dweights, s);  // dys [R, d]
  fc2_->backward(input_of(t_.a, t_.a_codes, t_.a_scales), drows, split, da, w2_->grad, s);     // da [R, f]
  swiglu_backward(da, t_.h, R, f_, dh, s);                                                   // dh [R, 2f]
  fc1_->backward(input_of(t_.xs, t_.xs_codes, t_.xs_scales), dh, split, drows, w1_->grad, s);  // dxs [R, d]
  permute_backward(drows, t_.row_of, M, k_, d_, dx, s);                                   // dx [M, d]
}

}  // namespace fp4moe
