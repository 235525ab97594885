#include "trainer/model/moe_experts.h"

#include <type_traits>
#include <utility>

#include "kernels/common/check.h"
#include "kernels/nn/permute.h"
#include "kernels/nn/swiglu.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "trainer/model/layout_emulation.h"
#include "trainer/model/linear_quantized.h"
#include "trainer/model/profile.h"

namespace fp4moe {

namespace {
constexpr float kInitStd = 0.02f;
}  // namespace

MoeRoutedExperts::MoeRoutedExperts(ParamStore& store, const std::string& prefix, int64_t E, int64_t d, int64_t f,
                                   int64_t k, const Recipe& recipe, float fc2_init_std, int64_t max_tokens,
                                   DeviceMemory& mem, MoeRecompute recompute, double routed_load)
    : prefix_(prefix),
      E_(E),
      d_(d),
      f_(f),
      k_(k),
      max_tokens_(max_tokens),
      max_rows_(0),
      recipe_(recipe),
      whole_(recompute.whole),
      act_(recompute.act),
      w1_(nullptr),
      w2_(nullptr),
      mem_(&mem),
      last_M_(mem.slots(), -1),
      last_rows_(mem.slots(), -1) {
  GroupLinear::check_shape(E, 2 * f, d, recipe);  // fc1, fc2: before anything is registered
  GroupLinear::check_shape(E, d, f, recipe);
  // k may exceed E: an emulated expert-parallel rank's E = E_global / ep local experts (layout_emulation.h), where
  // several of a token's slots land on one local expert (permute.h's device passes allow it).
  FP4MOE_CHECK(max_tokens >= 0 && k >= 1 && E >= 1,
               "MoeRoutedExperts {}: expected max_tokens >= 0, top_k >= 1 and E >= 1, got max_tokens={} k={} E={}",
               prefix, max_tokens, k, E);
  FP4MOE_CHECK(fc2_init_std > 0.0f, "MoeRoutedExperts {}: fc2_init_std must be > 0, got {}", prefix, fc2_init_std);
  max_rows_ = routed_row_count(max_tokens * k, routed_load);  // N k, or the skewed load's R (layout_emulation.h)
  FP4MOE_CHECK(max_rows_ <= (int64_t{1} << 31) - 1, "MoeRoutedExperts {}: {} routed rows (max_tokens {} x top-{} x "
               "routed_load {}) beyond int32", prefix, max_rows_, max_tokens, k, routed_load);
  w1_ = &store.add(prefix + ".experts.fc1", {E, 2 * f, d}, ParamInit::normal, kInitStd, /*decay=*/true);
  w2_ = &store.add(prefix + ".experts.fc2", {E, d, f}, ParamInit::normal, fc2_init_std, /*decay=*/true);
  const int64_t R = max_rows_;
  plan_ = buffers(R, E, d, f, recipe, recompute);
  auto kept = [&](auto tag, const char* tensor) {
    using T = decltype(tag);
    return plan_.allocate_kept<T>(mem, tensor, prefix + " experts");
  };
  row_of_ = kept(int32_t{}, "row_of");
  xs_ = kept(bf16{}, "xs");
  xs_codes_ = kept(uint8_t{}, "xs MXFP4 codes");
  xs_scales_ = kept(uint8_t{}, "xs MXFP4 scales");
  xs_fp8_codes_ = kept(uint8_t{}, "xs FP8 row codes");
  xs_fp8_scales_ = kept(float{}, "xs FP8 row scales");
  h_ = kept(bf16{}, "h");
  a_ = kept(bf16{}, "a");
  ys_ = kept(bf16{}, "ys");
  a_codes_ = kept(uint8_t{}, "a MXFP4 codes");
  a_scales_ = kept(uint8_t{}, "a MXFP4 scales");

  scratch_ = scratch(R, E, d, f, recipe, recompute);
}

// The passes' binding code on a measuring arena.
PassScratch MoeRoutedExperts::scratch(int64_t R, int64_t E_local, int64_t d, int64_t f, const Recipe& recipe,
                                      const MoeRecompute& recompute) {
  const BufferPlan p = buffers(R, E_local, d, f, recipe, recompute);
  PassScratch s;
  ScratchArena m;
  Tensors t = take_forward(m, p, recipe, Tensors{});
  s.forward = m.used();
  m.release(ScratchArena::Mark{});
  if (needs_recompute(recipe, recompute.whole, recompute.act)) {
    take_recompute(m, p, recipe, recompute.whole, t);
    s.recompute = m.used();
  }
  auto rounded = [&](const char* tensor) { return ScratchArena::rounded(static_cast<size_t>(p.at(tensor).bytes())); };
  s.backward = rounded("d rows") + rounded("d a") + rounded("d h");
  s.backward_after_recompute = s.backward;
  return s;
}

size_t MoeRoutedExperts::kept_bytes() const {
  return static_cast<size_t>(plan_.counted_bytes(MemCategory::activations, Lifetime::construction));
}

BufferPlan MoeRoutedExperts::buffers(int64_t R, int64_t E_local, int64_t d, int64_t f, const Recipe& recipe,
                                     const MoeRecompute& rc) {
  FP4MOE_CHECK(R >= 0, "MoeRoutedExperts::buffers: R must be >= 0, got {}", R);
  const bool bf = recipe == Recipe::bf16, mx = recipe == Recipe::mxfp4, f8 = quantizes_bf16_input(recipe);
  // fp8 Fprop of a BF16 input: the rerun reads a kept FP8 row copy; an MXFP4 Fprop (paper 2's ladder) reruns from
  // the kept BF16 xs, which its quantizer turns into the same MXFP4 rows again.
  const bool f8_rows = f8 && recipe.fprop == GemmPrecision::fp8, f8_mx = f8 && !f8_rows;
  const bool keep = !rc.whole, keep_a = keep && !rc.act;
  BufferPlan p("moe.experts");
  p.add("row_of", R, ElemType::int32);                      // the permutation, under every policy
  p.add("xs", R * d, ElemType::bf16, bf || (f8_mx && rc.whole));  // the dispatched input as the recipe stores it
  // Tensors the recipe or the policy does not make at all have no elements; those with elements that are not held
  // are taken from the scratch by the passes that need them.
  const int64_t R_mx = mx ? R : 0, R_row = f8_rows && rc.whole ? R : 0;
  p.add("xs MXFP4 codes", R_mx * d / 2, ElemType::e2m1x2);
  p.add("xs MXFP4 scales", R_mx * d / kMxBlock, ElemType::ue8m0);
  p.add("xs FP8 row codes", R_row * d, ElemType::e4m3);  // fp8 under moe/full: fc1's Fprop operand, for its rerun
  p.add("xs FP8 row scales", fp8_row_scale_count(R_row, d), ElemType::fp32);
  p.add("h", R * 2 * f, ElemType::bf16, keep);
  p.add("a", R * f, ElemType::bf16, keep_a && bf);
  p.add("ys", R * d, ElemType::bf16, keep);
  p.add("a MXFP4 codes", R_mx * f / 2, ElemType::e2m1x2, keep_a);
  p.add("a MXFP4 scales", R_mx * f / kMxBlock, ElemType::ue8m0, keep_a);
  const MemCategory ws = MemCategory::workspace;
  p.add("assignment_of", R, ElemType::int32, true, ws, Lifetime::forward_scratch);  // permute_forward's map
  p.add("d rows", R * d, ElemType::bf16, true, ws, Lifetime::backward_scratch);     // dys, then dxs
  p.add("d a", R * f, ElemType::bf16, true, ws, Lifetime::backward_scratch);
  p.add("d h", R * 2 * f, ElemType::bf16, true, ws, Lifetime::backward_scratch);
  p.append(GroupLinear::buffers(recipe, E_local, 2 * f, d, R), "fc1 ");
  p.append(GroupLinear::buffers(recipe, E_local, d, f, R), "fc2 ");
  return p;
}

// The sizes the permuted-input buffers hold per row in the recipe's format (bf16 xs, mxfp4 xs codes and scales,
// fp8 the FP8 row copy of xs that fc1 also makes for its Fprop), whether or not the recompute policy keeps them.
DispatchBytes MoeRoutedExperts::dispatch_bytes() const {
  const int64_t R = max_rows_;
  if (R == 0) return {};
  const double rows = static_cast<double>(R);
  auto per_row = [&](const char* tensor) { return static_cast<double>(plan_.at(tensor).bytes()) / rows; };
  if (recipe_ == Recipe::bf16) return {per_row("xs"), 0.0};
  if (recipe_ == Recipe::mxfp4) return {per_row("xs MXFP4 codes"), per_row("xs MXFP4 scales")};
  // fp8 and paper 2's ladder: an FP8 1x128 row per dispatched row (expert_parallel_row_bytes), as the fp8 preset's
  // kept row copy holds it.
  const BufferPlan fp8_rows = buffers(R, E_, d_, f_, Recipe::fp8, MoeRecompute{true, true, true});
  auto fp8_per_row = [&](const char* tensor) { return static_cast<double>(fp8_rows.at(tensor).bytes()) / rows; };
  return {fp8_per_row("xs FP8 row codes"), fp8_per_row("xs FP8 row scales")};
}

MoeRoutedExperts::Tensors MoeRoutedExperts::take_forward(ScratchArena& a, const BufferPlan& p, const Recipe& recipe,
                                                         const Tensors& kept) {
  // The kept buffer when the plan holds it, else its planned size from the scratch.
  auto pick = [&](auto* kept_ptr, const char* tensor, const char* what) {
    using T = std::remove_pointer_t<decltype(kept_ptr)>;
    const PlannedBuffer& b = p.at(tensor);
    return b.held ? kept_ptr : take_planned<T>(a, b, what);
  };
  Tensors t;
  t.row_of = kept.row_of;
  t.assignment_of = take_planned<int32_t>(a, p.at("assignment_of"), "experts assignment_of");
  t.xs = pick(kept.xs, "xs", "experts permuted input");
  t.h = pick(kept.h, "h", "experts fc1 output");
  t.a = pick(kept.a, "a", "experts swiglu output");
  t.ys = pick(kept.ys, "ys", "experts fc2 output");
  if (recipe == Recipe::mxfp4) {
    t.xs_codes = kept.xs_codes;
    t.xs_scales = kept.xs_scales;
    t.a_codes = pick(kept.a_codes, "a MXFP4 codes", "experts swiglu output MXFP4 codes");
    t.a_scales = pick(kept.a_scales, "a MXFP4 scales", "experts swiglu output MXFP4 scales");
  }
  t.xs_fp8_codes = kept.xs_fp8_codes;  // null unless fp8 under whole
  t.xs_fp8_scales = kept.xs_fp8_scales;
  return t;
}

MoeRoutedExperts::Tensors MoeRoutedExperts::kept_tensors() const {
  Tensors t;
  t.row_of = row_of_.data();
  t.xs = xs_.data();
  t.h = h_.data();
  t.a = a_.data();
  t.ys = ys_.data();
  t.xs_codes = xs_codes_.data();
  t.xs_scales = xs_scales_.data();
  t.a_codes = a_codes_.data();
  t.a_scales = a_scales_.data();
  t.xs_fp8_codes = xs_fp8_codes_.data();
  t.xs_fp8_scales = xs_fp8_scales_.data();
  return t;
}

void MoeRoutedExperts::bind_kept(Tensors& t) const {
  auto kept = [&](auto*& field, const auto& buffer, const char* tensor) {
    if (plan_.at(tensor).held) field = buffer.data();
  };
  kept(t.row_of, row_of_, "row_of");
  kept(t.xs, xs_, "xs");
  kept(t.h, h_, "h");
  kept(t.a, a_, "a");
  kept(t.ys, ys_, "ys");
  if (recipe_ == Recipe::mxfp4) {
    kept(t.xs_codes, xs_codes_, "xs MXFP4 codes");
    kept(t.xs_scales, xs_scales_, "xs MXFP4 scales");
    kept(t.a_codes, a_codes_, "a MXFP4 codes");
    kept(t.a_scales, a_scales_, "a MXFP4 scales");
  }
  kept(t.xs_fp8_codes, xs_fp8_codes_, "xs FP8 row codes");
  kept(t.xs_fp8_scales, xs_fp8_scales_, "xs FP8 row scales");
}

void MoeRoutedExperts::take_recompute(ScratchArena& a, const BufferPlan& p, const Recipe& recipe, bool whole,
                                      Tensors& t) {
  if (whole) t.h = take_planned<bf16>(a, p.at("h"), "experts fc1 output (recomputed)");
  t.a = take_planned<bf16>(a, p.at("a"), "experts swiglu output (recomputed)");
  if (recipe == Recipe::mxfp4) {
    t.a_codes = take_planned<uint8_t>(a, p.at("a MXFP4 codes"), "experts swiglu output MXFP4 codes (recomputed)");
    t.a_scales = take_planned<uint8_t>(a, p.at("a MXFP4 scales"), "experts swiglu output MXFP4 scales (recomputed)");
  }
  if (whole) t.ys = take_planned<bf16>(a, p.at("ys"), "experts fc2 output (recomputed)");
}

const BufferPlan& MoeRoutedExperts::plan_for(int64_t R) {
  if (R != pass_R_) {
    pass_plan_ = buffers(R, E_, d_, f_, recipe_, MoeRecompute{whole_, act_, false});
    pass_R_ = R;
  }
  return pass_plan_;
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
  FP4MOE_CHECK(r.rows >= M * k_ && r.rows <= max_rows_,
               "MoeRoutedExperts {} forward: expected M k = {} <= rows <= {} (the routed rows at max_tokens), got {}",
               prefix_, M * k_, max_rows_, r.rows);
  FP4MOE_CHECK(x && y, "MoeRoutedExperts {} forward: x [M, {}] and y [M, {}] must not be null", prefix_, d_, d_);
  begin_forward(ctx, r.rows);
  last_M_.get() = M;
  run_to_ys(ctx, x, r, t_);
  ProfileScope unpermute(ctx, ProfileModule::moe_permute);
  unpermute_forward(t_.ys, r.topk_weight, t_.row_of, M, k_, d_, y, ctx.stream);  // y [M, d]
  stamp_ = scratch_of(ctx, "MoeRoutedExperts " + prefix_).stamp();
}

void MoeRoutedExperts::begin_forward(ModelContext& ctx, int64_t R) {
  bind(ctx);
  ScratchArena& arena = scratch_of(ctx, "MoeRoutedExperts " + prefix_);  // takes stay in the caller's scope
  t_ = bind_forward(arena, R);
  fc1_->set_quant_seed(layer_quant_seed(ctx.quant_seed, w1_->name));
  fc2_->set_quant_seed(layer_quant_seed(ctx.quant_seed, w2_->name));
  fc1_->set_weights(w1_->param, ctx.stream);
  fc2_->set_weights(w2_->param, ctx.stream);
}

GroupLinearInput MoeRoutedExperts::kept_input() const {
  if (recipe_ == Recipe::bf16) return GroupLinearInput{xs_.data(), nullptr, nullptr};
  if (recipe_ == Recipe::mxfp4) return GroupLinearInput{nullptr, xs_codes_.data(), xs_scales_.data()};
  return GroupLinearInput{};
}

int64_t MoeRoutedExperts::check_rows_split(const GroupSplit& split, const char* what) const {
  FP4MOE_CHECK(!needs_recompute(), "MoeRoutedExperts {} {}: the rows entry is not built for a recompute policy that "
               "drops the experts' tensors (moe, full, moe_act)", prefix_, what);
  FP4MOE_CHECK(split.G == E_ && split.host_offsets != nullptr,
               "MoeRoutedExperts {} {}: expected a split over the {} local experts with a host copy, got G={}{}",
               prefix_, what, E_, split.G, split.host_offsets ? "" : " without host offsets");
  const int64_t R = split.host_offsets[E_];
  FP4MOE_CHECK(R >= 0 && R <= max_tokens_ * k_, "MoeRoutedExperts {} {}: {} rows, expected [0, {}] (max_tokens k)",
               prefix_, what, R, max_tokens_ * k_);
  return R;
}

const bf16* MoeRoutedExperts::forward_rows(ModelContext& ctx, const GroupLinearInput& x, const GroupSplit& split) {
  const int64_t R = check_rows_split(split, "forward_rows");
  last_rows_.get() = R;
  if (R == 0) return nullptr;
  begin_forward(ctx, R);
  fc1_->forward(x, split, t_.h, ctx.stream);  // h [R, 2f]
  run_from_h(ctx, split, R, t_);              // a, ys [R, d]
  stamp_ = scratch_of(ctx, "MoeRoutedExperts " + prefix_).stamp();
  return t_.ys;
}

void MoeRoutedExperts::backward_rows(ModelContext& ctx, const GroupLinearInput& x, const bf16* dys,
                                     const GroupSplit& split, bf16* dxs) {
  const int64_t R = check_rows_split(split, "backward_rows");
  FP4MOE_CHECK(R == last_rows_.get(), "MoeRoutedExperts {} backward_rows: expected the forward's {} rows, got {}",
               prefix_, last_rows_.get(), R);
  if (R == 0) return;
  FP4MOE_CHECK(dys && dxs, "MoeRoutedExperts {} backward_rows: dys and dxs [R, {}] must not be null", prefix_, d_);
  ScratchArena& arena = scratch_of(ctx, "MoeRoutedExperts " + prefix_);
  bind_kept(t_);
  ScratchScope scope(arena);
  backward_from_rows(ctx, x, dys, split, R, dxs);
}

void MoeRoutedExperts::backward_from_rows(ModelContext& ctx, const GroupLinearInput& x, const bf16* dys,
                                          const GroupSplit& split, int64_t R, bf16* dxs) {
  ScratchArena& arena = scratch_of(ctx, "MoeRoutedExperts " + prefix_);
  const BufferPlan& p = plan_for(R);
  bf16* da = take_planned<bf16>(arena, p.at("d a"), "experts d a");
  bf16* dh = take_planned<bf16>(arena, p.at("d h"), "experts d h");
  cudaStream_t s = ctx.stream;
  fc2_->backward(input_of(t_.a, t_.a_codes, t_.a_scales), dys, split, da, w2_->grad, s);  // da [R, f]
  swiglu_backward(da, t_.h, R, f_, dh, s);                                              // dh [R, 2f]
  fc1_->backward(x, dh, split, dxs, w1_->grad, s);                                      // dxs [R, d]
}

void MoeRoutedExperts::run_to_ys(ModelContext& ctx, const bf16* x, const MoeRouting& r, const Tensors& t) {
  const int64_t M = r.M, R = r.rows;
  const GroupSplit split{r.offsets, r.host_offsets, E_, R};
  cudaStream_t s = ctx.stream;
  ProfileScope permute(ctx, ProfileModule::moe_permute);
  if (R == M * k_) {
    permute_map(r.topk_idx, r.offsets, M, k_, E_, t.row_of, t.assignment_of, s);
    permute_forward(x, t.assignment_of, M, k_, d_, t.xs, s);  // xs [R, d]
  } else {  // a skewed load (layout_emulation.h): the R assignments as R tokens of top-1; an extra row copies a token
    permute_map(r.topk_idx, r.offsets, R, 1, E_, t.row_of, t.assignment_of, s);
    routed_row_tokens(t.assignment_of, R, M * k_, k_, t.assignment_of, s);  // assignment -> the token it copies
    permute_forward(x, t.assignment_of, R, 1, d_, t.xs, s);  // xs [R, d]
  }
  permute.end();
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
  const int64_t M = r.M, R = r.rows;
  FP4MOE_CHECK(M == last_M_.get() && r.E == E_ && r.k == k_,
               "MoeRoutedExperts {} recompute: expected the last forward's M={} (E={} k={}), got M={} E={} k={}",
               prefix_, last_M_.get(), E_, k_, M, r.E, r.k);
  ScratchArena& arena = scratch_of(ctx, "MoeRoutedExperts " + prefix_);
  if (ready(arena)) return;
  ProfileScope profile(ctx, ProfileModule::routed_experts, ProfilePass::recompute);
  bind_kept(t_);  // the active slot's kept input (the last forward may have been another slot's)
  bind_recompute(arena, R, t_);
  cudaStream_t s = ctx.stream;
  if (whole_) {  // the experts from the kept dispatched input (the weights' FP8 copies of this step are in fc1_, fc2_)
    const GroupSplit split{r.offsets, r.host_offsets, E_, R};
    if (t_.xs_fp8_codes)  // fp8 Fprop of a BF16 input: the kept FP8 row copy
      fc1_->fprop_fp8_rows(Fp8RowOperand{t_.xs_fp8_codes, t_.xs_fp8_scales}, split, t_.h, s);
    else
      fc1_->forward(input_of(t_.xs, t_.xs_codes, t_.xs_scales), split, t_.h, s);  // bf16, mxfp4, MXFP4 Fprop
    run_from_h(ctx, split, R, t_);  // a (and its copy, where fc2's Wgrad reads it), ys
  } else {  // moe_act: a = swiglu(h) again (and its MXFP4 copy), where fc2's Wgrad will read it
    swiglu_forward(t_.h, R, f_, t_.a, s);
    quantized_input(t_.a, R, f_, t_.a_codes, t_.a_scales, s);  // mxfp4: the copy backward gives fc2's Wgrad
  }
  stamp_ = arena.stamp();
}

void MoeRoutedExperts::backward(ModelContext& ctx, const bf16* dy, const MoeRouting& r, bf16* dx, float* dweights) {
  const int64_t M = r.M, R = r.rows;
  FP4MOE_CHECK(M == last_M_.get(), "MoeRoutedExperts {} backward: expected the last forward's M={}, got M={}",
               prefix_, last_M_.get(), M);
  FP4MOE_CHECK(dy && dx && dweights, "MoeRoutedExperts {} backward: dy, dx [M, {}] and dweights [M, {}] must not "
               "be null", prefix_, d_, k_);
  ScratchArena& arena = scratch_of(ctx, "MoeRoutedExperts " + prefix_);
  FP4MOE_CHECK(ready(arena), "MoeRoutedExperts {} backward: the tensors the recompute policy does not keep are gone "
               "(call recompute() in the backward's scratch scope first)", prefix_);
  bind_kept(t_);  // the active slot's kept tensors; a recompute's scratch stays
  ScratchScope scope(arena);
  const BufferPlan& p = plan_for(R);
  bf16* drows = take_planned<bf16>(arena, p.at("d rows"), "experts d rows");
  const GroupSplit split{r.offsets, r.host_offsets, E_, R};
  cudaStream_t s = ctx.stream;
  ProfileScope unpermute(ctx, ProfileModule::moe_permute);
  unpermute_backward(dy, t_.ys, r.topk_weight, t_.row_of, M, k_, d_, drows, dweights, s);  // dys of the M k rows
  zero_extra_rows(t_.row_of, M * k_, R, d_, drows, s);  // a skewed load's extra rows: weight 0, dys 0 (no-op if none)
  unpermute.end();
  backward_from_rows(ctx, input_of(t_.xs, t_.xs_codes, t_.xs_scales), drows, split, R, drows);  // dxs [R, d]
  ProfileScope permute(ctx, ProfileModule::moe_permute);
  permute_backward(drows, t_.row_of, M, k_, d_, dx, s);                                   // dx [M, d]
}

}  // namespace fp4moe
