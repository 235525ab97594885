#include "trainer/model/group_linear.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "kernels/common/check.h"
#include "kernels/gemm/grouped_wgrad_sm90.h"
#include "kernels/gemm/mxfp4_gemm.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/bf16_to_mxfp4_col.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_col.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"

namespace fp4moe {

namespace {
constexpr GroupLinearBuffer kWeightCopy = GroupLinearBuffer::weight_copy;
constexpr GroupLinearBuffer kScratch = GroupLinearBuffer::scratch;

// What the presets differ in here: the bf16 recipe runs BF16 GEMMs on the caller's X; the others FP8 GEMMs, on X
// stored as MXFP4 (mxfp4) or quantized from BF16 by the layer (fp8).
bool bf16_gemms(const Recipe& r) { return r.fprop == GemmPrecision::bf16; }
bool is_fp8(GemmPrecision p) { return p == GemmPrecision::fp8; }
bool is_mx(GemmPrecision p) { return p == GemmPrecision::mxfp4; }
}  // namespace

const char* group_linear_buffer_name(GroupLinearBuffer kind) {
  switch (kind) {
    case GroupLinearBuffer::weight_copy: return "FP8 weight copies";
    case GroupLinearBuffer::held_activation: return "held FP8 column copy of X";
    case GroupLinearBuffer::scratch: return "scratch";
  }
  return "?";
}

// cudaFree synchronises the device, and so does a caller's allocator that frees with it (DeviceMemory): no queued
// work still uses the old buffer.
void GroupLinear::Buffer::release() {
  if (!ptr) return;
  void* p = ptr;
  ptr = nullptr;
  bytes = 0;
  if (alloc->release) alloc->release(p);
  else CUDA_CHECK(cudaFree(p));
}

void* GroupLinear::Buffer::ensure(size_t n, GroupLinearBuffer kind) {
  n = n < 16 ? 16 : n;
  if (n <= bytes) return ptr;
  release();
  if (alloc->allocate) {
    ptr = alloc->allocate(n, kind);
    FP4MOE_CHECK(ptr != nullptr, "GroupLinear: the allocator returned null for {} bytes of {}", n,
                 group_linear_buffer_name(kind));
  } else {
    CUDA_CHECK(cudaMalloc(&ptr, n));
  }
  bytes = n;
  return ptr;
}

GroupLinear::Buffer::~Buffer() {
  try {
    release();
  } catch (...) {  // nothing to do about a failing free in a destructor
  }
}

void GroupLinear::check_shape(int64_t G, int64_t N, int64_t K, const Recipe& recipe) {
  check_recipe_built(recipe, "GroupLinear");
  FP4MOE_CHECK(G >= 1 && N >= 16 && K >= 16 && N % 16 == 0 && K % 16 == 0,
               "GroupLinear: expected G >= 1 and N, K positive multiples of 16, got G={} N={} K={}", G, N, K);
  FP4MOE_CHECK(!needs_mx_blocks_along_k(recipe) || K % kMxBlock == 0,
               "GroupLinear: the recipe {} quantizes along K in MX blocks of 32, got K={}", recipe_name(recipe), K);
  FP4MOE_CHECK(!needs_mx_blocks_along_n(recipe) || N % kMxBlock == 0,
               "GroupLinear: the recipe {} (MXFP4 Dgrad) quantizes along N in MX blocks of 32, got N={}",
               recipe_name(recipe), N);
}

GroupLinear::GroupLinear(int64_t G, int64_t N, int64_t K, const Recipe& recipe, CublasLtMatmul* lt,
                         GroupLinearAllocator allocator, Fp8ScaleMode scale_mode)
    : G_(G), N_(N), K_(K), recipe_(recipe), scale_mode_(scale_mode), gemm_(lt), allocator_(std::move(allocator)) {
  check_shape(G, N, K, recipe);
  FP4MOE_CHECK(static_cast<bool>(allocator_.allocate) == static_cast<bool>(allocator_.release),
               "GroupLinear: the allocator needs both allocate and release (or neither, for cudaMalloc/cudaFree)");
  const int64_t slots = allocator_.slots ? allocator_.slots->count() : 1;
  cached_M_.assign(static_cast<size_t>(slots), -1);
  const bool held = !bf16_gemms(recipe) && !recipe.mxfp4_input;  // X's FP8 or MXFP4 columns are held
  for (int64_t s = 0; s < (held ? slots : 1); ++s) {
    xcol_codes_.push_back(std::make_unique<Buffer>(&allocator_));
    xcol_scales_.push_back(std::make_unique<Buffer>(&allocator_));
  }
}

GroupLinear::~GroupLinear() = default;

void GroupLinear::check_input(const GroupLinearInput& x, const char* what) const {
  const bool mx = recipe_.mxfp4_input;
  FP4MOE_CHECK(mx ? (x.mx_codes && x.mx_scales) : x.x != nullptr, "{}: the {} recipe takes {} input", what,
               recipe_name(recipe_), mx ? "an MXFP4 (codes and scales)" : "a BF16");
}

void GroupLinear::set_weights(const bf16* w, cudaStream_t stream) {
  FP4MOE_CHECK(w != nullptr, "GroupLinear::set_weights: null weights (expected BF16 [G, N, K] = [{}, {}, {}])", G_, N_,
               K_);
  w_ = w;
  if (bf16_gemms(recipe_)) return;
  const int64_t count = fp8_block_scale_count(N_, K_), count_t = fp8_block_scale_count(K_, N_);
  const int64_t M = std::max<int64_t>(plan_M_, 0);  // the weights' buffers do not depend on M
  const bool fx = is_fp8(recipe_.fprop), fd = is_fp8(recipe_.dgrad);
  auto* wc = fx ? static_cast<uint8_t*>(w_codes_.ensure(planned(M, "W FP8 codes"), kWeightCopy)) : nullptr;
  auto* ws = fx ? static_cast<float*>(w_scales_.ensure(planned(M, "W FP8 scales"), kWeightCopy)) : nullptr;
  auto* tc = fd ? static_cast<uint8_t*>(wt_codes_.ensure(planned(M, "W^T FP8 codes"), kWeightCopy)) : nullptr;
  auto* ts = fd ? static_cast<float*>(wt_scales_.ensure(planned(M, "W^T FP8 scales"), kWeightCopy)) : nullptr;
  for (int64_t g = 0; g < G_; ++g) {
    if (fx)
      bf16_to_fp8_block128(w + g * N_ * K_, N_, K_, scale_mode_, false, wc + g * N_ * K_, ws + g * count, nullptr,
                           stream);
    if (fd)
      bf16_to_fp8_block128(w + g * N_ * K_, N_, K_, scale_mode_, true, tc + g * N_ * K_, ts + g * count_t, nullptr,
                           stream);
  }
  // MXFP4 copies (round to nearest even: weights are not gradients): W along K for Fprop, W^T along N for Dgrad.
  const MxQuantConfig weight_cfg = mx_config(Rounding::rne, 0);
  if (is_mx(recipe_.fprop)) {
    auto* mc = static_cast<uint8_t*>(w_mx_codes_.ensure(planned(M, "W MXFP4 codes"), kWeightCopy));
    auto* ms = static_cast<uint8_t*>(w_mx_scales_.ensure(planned(M, "W MXFP4 scales"), kWeightCopy));
    bf16_to_mxfp4_row(w, G_ * N_, K_, mc, ms, weight_cfg, nullptr, stream);
    if (G_ > 1)
      mx_weight_rows(mc, ms, N_, K_, w_rows_codes_, w_rows_scales_, "W FP8 row codes", "W FP8 row scales", stream);
  }
  if (is_mx(recipe_.dgrad)) {
    auto* mc = static_cast<uint8_t*>(wt_mx_codes_.ensure(planned(M, "W^T MXFP4 codes"), kWeightCopy));
    auto* ms = static_cast<uint8_t*>(wt_mx_scales_.ensure(planned(M, "W^T MXFP4 scales"), kWeightCopy));
    for (int64_t g = 0; g < G_; ++g)
      bf16_to_mxfp4_col(w + g * N_ * K_, N_, K_, mc + g * K_ * N_ / 2, ms + g * K_ * N_ / kMxBlock, weight_cfg,
                        nullptr, stream);
    if (G_ > 1)
      mx_weight_rows(mc, ms, K_, N_, wt_rows_codes_, wt_rows_scales_, "W^T FP8 row codes", "W^T FP8 row scales",
                     stream);
  }
}

void GroupLinear::mx_weight_rows(const uint8_t* codes, const uint8_t* scales, int64_t P, int64_t R,
                                 Buffer& out_codes, Buffer& out_scales, const char* codes_name,
                                 const char* scales_name, cudaStream_t stream) {
  const int64_t M = std::max<int64_t>(plan_M_, 0);
  auto* fc = static_cast<uint8_t*>(out_codes.ensure(planned(M, codes_name), kWeightCopy));
  auto* fs = static_cast<float*>(out_scales.ensure(planned(M, scales_name), kWeightCopy));
  const int64_t count = fp8_row_scale_count(P, R);
  for (int64_t g = 0; g < G_; ++g)  // each expert's own scale tensor (GroupedGemm's Fp8RowStack)
    mxfp4_row_to_fp8_row(codes + g * P * R / 2, scales + g * P * (R / kMxBlock), P, R, fc + g * P * R,
                         fs + g * count, stream);
}

void GroupLinear::set_quant_seed(uint64_t seed) {
  if (seed == quant_seed_) return;  // the same step: the micro-batches' backwards keep drawing fresh numbers
  quant_seed_ = seed;
  backward_count_ = 0;
}

MxQuantConfig GroupLinear::mx_config(Rounding rounding, uint64_t stream_id) const {
  MxQuantConfig c;
  c.rounding = rounding;
  c.transform = recipe_.mx.transform;
  c.rht_seed = splitmix64_at(quant_seed_, 0);
  c.seed = splitmix64_at(quant_seed_, stream_id);
  return c;
}

BufferPlan GroupLinear::buffers(const Recipe& recipe, int64_t G, int64_t N, int64_t K, int64_t M) {
  check_recipe_built(recipe, "GroupLinear::buffers");
  FP4MOE_CHECK(G >= 1 && N >= 1 && K >= 1 && M >= 0,
               "GroupLinear::buffers: expected G, N, K >= 1 and M >= 0, got G={} N={} K={} M={}", G, N, K, M);
  BufferPlan p("group_linear");
  if (bf16_gemms(recipe)) return p;
  const bool held = true;
  const Lifetime first = Lifetime::first_forward;
  const MemCategory weights = MemCategory::weights, ws = MemCategory::workspace;
  const MemCategory x_columns = recipe.mxfp4_input ? ws : MemCategory::activations;
  const bool fx = is_fp8(recipe.fprop), fd = is_fp8(recipe.dgrad), fw = is_fp8(recipe.wgrad);
  const auto when = [](bool used, int64_t n) { return used ? n : int64_t{0}; };
  p.add("W FP8 codes", when(fx, G * N * K), ElemType::e4m3, held, weights, first);
  p.add("W FP8 scales", when(fx, G * fp8_block_scale_count(N, K)), ElemType::fp32, held, weights, first);
  p.add("W^T FP8 codes", when(fd, G * N * K), ElemType::e4m3, held, weights, first);
  p.add("W^T FP8 scales", when(fd, G * fp8_block_scale_count(K, N)), ElemType::fp32, held, weights, first);
  p.add("X FP8 column codes", when(fw, fp8_col_codes_capacity(M, K, G)), ElemType::e4m3, held, x_columns, first);
  p.add("X FP8 column scales", when(fw, fp8_col_scales_capacity(M, K, G)), ElemType::fp32, held, x_columns, first);
  // FP8 rows of X (Fprop) and dY (Dgrad): quantized from BF16 (fp8), or converted from MXFP4 rows (mxfp4 over
  // G > 1 groups).
  const bool mf = is_mx(recipe.fprop), md = is_mx(recipe.dgrad), mw = is_mx(recipe.wgrad);
  const bool rows_k = fx || (mf && G > 1), rows_n = fd || (md && G > 1);
  p.add("row FP8 codes", M * std::max(when(rows_k, K), when(rows_n, N)), ElemType::e4m3, held, ws, first);
  p.add("row FP8 scales", std::max(when(rows_k, fp8_row_scale_count(M, K)), when(rows_n, fp8_row_scale_count(M, N))),
        ElemType::fp32, held, ws, first);
  p.add("dY FP8 column codes", when(fw, fp8_col_codes_capacity(M, N, G)), ElemType::e4m3, held, ws, first);
  p.add("dY FP8 column scales", when(fw, fp8_col_scales_capacity(M, N, G)), ElemType::fp32, held, ws, first);
  if (!has_mxfp4_gemm(recipe)) return p;
  // Paper 2's MXFP4 GEMM classes (mxfp4_gemm.h): MXFP4 operands along each class's reduction dimension.
  if (mf) {
    p.add("W MXFP4 codes", G * N * K / 2, ElemType::e2m1x2, held, weights, first);
    p.add("W MXFP4 scales", G * N * (K / kMxBlock), ElemType::ue8m0, held, weights, first);
    p.add("X MXFP4 row codes", M * K / 2, ElemType::e2m1x2, held, ws, first);
    p.add("X MXFP4 row scales", M * (K / kMxBlock), ElemType::ue8m0, held, ws, first);
  }
  if (md) {
    p.add("W^T MXFP4 codes", G * K * N / 2, ElemType::e2m1x2, held, weights, first);
    p.add("W^T MXFP4 scales", G * K * (N / kMxBlock), ElemType::ue8m0, held, weights, first);
    p.add("dY MXFP4 row codes", M * N / 2, ElemType::e2m1x2, held, ws, first);
    p.add("dY MXFP4 row scales", M * (N / kMxBlock), ElemType::ue8m0, held, ws, first);
  }
  if (G > 1) {
    if (mf) {
      p.add("W FP8 row codes", G * N * K, ElemType::e4m3, held, weights, first);
      p.add("W FP8 row scales", G * fp8_row_scale_count(N, K), ElemType::fp32, held, weights, first);
    }
    if (md) {
      p.add("W^T FP8 row codes", G * K * N, ElemType::e4m3, held, weights, first);
      p.add("W^T FP8 row scales", G * fp8_row_scale_count(K, N), ElemType::fp32, held, weights, first);
    }
  } else if (mf || md) {
    const int64_t bytes = std::max(when(mf, static_cast<int64_t>(mxfp4_gemm_workspace_bytes(M, N, K))),
                                   when(md, static_cast<int64_t>(mxfp4_gemm_workspace_bytes(M, K, N))));
    p.add("MXFP4 GEMM workspace", bytes, ElemType::byte, held, ws, first);
  }
  if (mw) {
    p.add("X MXFP4 column codes", mxfp4_col_codes_capacity(M, K, G), ElemType::byte, held, MemCategory::activations,
          first);
    p.add("X MXFP4 column scales", mxfp4_col_scales_capacity(M, K, G), ElemType::ue8m0, held,
          MemCategory::activations, first);
    p.add("dY MXFP4 column codes", mxfp4_col_codes_capacity(M, N, G), ElemType::byte, held, ws, first);
    p.add("dY MXFP4 column scales", mxfp4_col_scales_capacity(M, N, G), ElemType::ue8m0, held, ws, first);
    p.add("MXFP4 Wgrad workspace", static_cast<int64_t>(mxfp4_wgrad_workspace_bytes(M, N, K, G)), ElemType::byte,
          held, ws, first);
  }
  return p;
}

const BufferPlan& GroupLinear::plan_for(int64_t M) {
  if (M != plan_M_) {
    plan_ = buffers(recipe_, G_, N_, K_, M);
    plan_M_ = M;
  }
  return plan_;
}

size_t GroupLinear::held_activation_bytes(const Recipe& recipe, int64_t M, int64_t K, int64_t G) {
  check_recipe_built(recipe, "GroupLinear::held_activation_bytes");
  FP4MOE_CHECK(M >= 0 && K >= 1 && G >= 1, "GroupLinear::held_activation_bytes: expected M >= 0, K >= 1, G >= 1, "
               "got M={} K={} G={}", M, K, G);
  if (bf16_gemms(recipe)) return static_cast<size_t>(M * K) * sizeof(bf16);
  if (recipe.mxfp4_input) {
    FP4MOE_CHECK(K % kMxBlock == 0, "GroupLinear::held_activation_bytes: the mxfp4 recipe needs K % 32 == 0, got K={}",
                 K);
    return static_cast<size_t>(M * (K / 2) + M * (K / kMxBlock));
  }
  // The column copy of X that Wgrad reads (N does not enter it): FP8 for an fp8 Wgrad, MXFP4 for an mxfp4 one.
  const BufferPlan p = buffers(recipe, G, 1, K, M);
  const char* kind = is_mx(recipe.wgrad) ? "MXFP4" : "FP8";
  return static_cast<size_t>(p.at(fmt::format("X {} column codes", kind)).bytes() +
                             p.at(fmt::format("X {} column scales", kind)).bytes());
}

size_t GroupLinear::held_activation_bytes() const {
  const int64_t M = cached_M_[slot()];
  FP4MOE_CHECK(M >= 0, "GroupLinear::held_activation_bytes: no forward yet (nothing is held)");
  return held_activation_bytes(recipe_, M, K_, G_);
}

size_t GroupLinear::weight_copy_bytes(const Recipe& recipe, int64_t G, int64_t N, int64_t K) {
  check_recipe_built(recipe, "GroupLinear::weight_copy_bytes");
  FP4MOE_CHECK(G >= 1 && N >= 1 && K >= 1, "GroupLinear::weight_copy_bytes: expected G, N, K >= 1, got {} {} {}", G,
               N, K);
  if (bf16_gemms(recipe)) return 0;
  const BufferPlan p = buffers(recipe, G, N, K, 0);
  size_t sum = 0;
  for (const PlannedBuffer& b : p.buffers())
    if (b.category == MemCategory::weights) sum += static_cast<size_t>(b.bytes());
  return sum;
}

int64_t GroupLinear::split_tokens(const GroupSplit& split, const char* what) const {
  FP4MOE_CHECK(split.G == G_, "{}: expected a split of {} groups, got G={}", what, G_, split.G);
  if (split.host_offsets != nullptr) return split.host_offsets[G_];
  // Without the host copy every expert GEMM reads the device offsets (the Hopper kernels where they take the
  // problem, else the CUDA-core kernels: kernels/gemm/grouped_gemm.h "Without a host copy") but paper 2's MXFP4
  // Wgrad, which converts each group on the host's counts: refused here, before any launch.
  FP4MOE_CHECK(!is_mx(recipe_.wgrad),
               "{}: a split without the host copy of its offsets needs expert GEMMs that read the counts on the "
               "device, but recipe {} has an MXFP4 Wgrad (converted per expert from the host counts)",
               what, recipe_name(recipe_));
  FP4MOE_CHECK(split.rows >= 0 && split.rows <= kWgradSm90MaxTokens,
               "{}: a split without the host copy of its offsets must give its token count (rows in [0, 2^30]), "
               "got rows={}",
               what, split.rows);
  FP4MOE_CHECK(G_ <= 1024,
               "{}: a split without the host copy of its offsets takes at most 1024 experts (the column quantizers "
               "and the device-offset GEMMs), got G={}",
               what, G_);
  return split.rows;
}

void GroupLinear::forward(const GroupLinearInput& x, const GroupSplit& split, bf16* y, cudaStream_t stream) {
  const char* what = "GroupLinear::forward";
  FP4MOE_CHECK(w_ != nullptr, "{}: set_weights was not called", what);
  const int64_t M = split_tokens(split, what);
  check_input(x, what);
  const bool mx = recipe_.mxfp4_input;
  const GemmOutput out{y, GemmOutType::bf16, false};
  cached_M_[slot()] = M;
  if (bf16_gemms(recipe_)) {
    gemm_.fprop_bf16(x.x, w_, N_, K_, split, out, stream);
    return;
  }
  if (is_mx(recipe_.fprop) && G_ > 1) {  // X and W along K; ragged groups on 1x128 FP8 operands
    auto* xc = static_cast<uint8_t*>(mx_row_codes_.ensure(planned(M, "X MXFP4 row codes"), kScratch));
    auto* xs = static_cast<uint8_t*>(mx_row_scales_.ensure(planned(M, "X MXFP4 row scales"), kScratch));
    const Fp8RowOperand rows = mx_rows_as_fp8(x.x, M, K_, xc, xs, mx_config(Rounding::rne, 0), stream);
    gemm_.fprop_fp8_row_weights(
        rows, Fp8RowStack{static_cast<uint8_t*>(w_rows_codes_.ptr), static_cast<float*>(w_rows_scales_.ptr)}, N_, K_,
        split, out, stream);
  } else if (is_mx(recipe_.fprop)) {  // G = 1: X and W along K, one MXFP4 GEMM
    check_mx_tokens(M, "Fprop");
    auto* xc = static_cast<uint8_t*>(mx_row_codes_.ensure(planned(M, "X MXFP4 row codes"), kScratch));
    auto* xs = static_cast<uint8_t*>(mx_row_scales_.ensure(planned(M, "X MXFP4 row scales"), kScratch));
    void* wsp = mx_workspace_.ensure(planned(M, "MXFP4 GEMM workspace"), kScratch);
    if (M > 0) {
      bf16_to_mxfp4_row(x.x, M, K_, xc, xs, mx_config(Rounding::rne, 0), nullptr, stream);
      mxfp4_gemm(gemm_.lt(), {xc, xs},
                 {static_cast<uint8_t*>(w_mx_codes_.ptr), static_cast<uint8_t*>(w_mx_scales_.ptr)}, M, N_, K_, wsp,
                 mx_workspace_.bytes, out, stream);
    }
  } else {
    auto* rc = static_cast<uint8_t*>(row_codes_.ensure(planned(M, "row FP8 codes"), kScratch));
    auto* rs = static_cast<float*>(row_scales_.ensure(planned(M, "row FP8 scales"), kScratch));
    if (mx) {
      if (M > 0) mxfp4_row_to_fp8_row(x.mx_codes, x.mx_scales, M, K_, rc, rs, stream);
    } else if (M > 0) {
      bf16_to_fp8_row(x.x, M, K_, scale_mode_, rc, rs, nullptr, stream);
    }
    gemm_.fprop_fp8({rc, rs}, {static_cast<uint8_t*>(w_codes_.ptr), static_cast<float*>(w_scales_.ptr)}, N_, K_,
                    split, out, stream);
  }
  if (!mx) {
    // X is cached as the column copy Wgrad reads (FP8 for an fp8 Wgrad, MXFP4 along tokens for an mxfp4 one, with
    // the Wgrad transform and RNE), not as BF16; every slot's copy grows together (all allocated by the first
    // forward).
    constexpr GroupLinearBuffer held = GroupLinearBuffer::held_activation;
    const bool mw = is_mx(recipe_.wgrad);
    const char* codes_name = mw ? "X MXFP4 column codes" : "X FP8 column codes";
    const char* scales_name = mw ? "X MXFP4 column scales" : "X FP8 column scales";
    for (size_t s = 0; s < xcol_codes_.size(); ++s) {
      xcol_codes_[s]->ensure(planned(M, codes_name), held);
      xcol_scales_[s]->ensure(planned(M, scales_name), held);
    }
    auto* cc = static_cast<uint8_t*>(xcol_codes().ptr);
    if (mw)
      bf16_to_mxfp4_col_ragged(x.x, M, K_, split.offsets, G_, split.host_offsets, cc,
                               static_cast<uint8_t*>(xcol_scales().ptr), mx_config(Rounding::rne, 0), nullptr, stream);
    else
      bf16_to_fp8_col(x.x, M, K_, split.offsets, G_, split.host_offsets, scale_mode_, cc,
                      static_cast<float*>(xcol_scales().ptr), nullptr, stream);
  }
}

Fp8RowOperand GroupLinear::mx_rows_as_fp8(const bf16* in, int64_t M, int64_t C, uint8_t* mx_codes, uint8_t* mx_scales,
                                          const MxQuantConfig& cfg, cudaStream_t stream) {
  auto* rc = static_cast<uint8_t*>(row_codes_.ensure(planned(M, "row FP8 codes"), kScratch));
  auto* rs = static_cast<float*>(row_scales_.ensure(planned(M, "row FP8 scales"), kScratch));
  if (M > 0) {
    bf16_to_mxfp4_row(in, M, C, mx_codes, mx_scales, cfg, nullptr, stream);
    mxfp4_row_to_fp8_row(mx_codes, mx_scales, M, C, rc, rs, stream);
  }
  return Fp8RowOperand{rc, rs};
}

void GroupLinear::check_mx_tokens(int64_t M, const char* gemm) const {
  FP4MOE_CHECK(M % 4 == 0,
               "GroupLinear: an MXFP4 {} (recipe {}) multiplies M x 1x128 FP8 rows through cuBLASLt, which needs the "
               "token count M % 4 == 0, got M={}",
               gemm, recipe_name(recipe_), M);
}

void GroupLinear::fprop_fp8_rows(Fp8RowOperand x, const GroupSplit& split, bf16* y, cudaStream_t stream) {
  const char* what = "GroupLinear::fprop_fp8_rows";
  FP4MOE_CHECK(quantizes_bf16_input(recipe_) && is_fp8(recipe_.fprop),
               "{}: only an fp8 Fprop of a BF16 input takes an FP8 row copy of X, this layer is {}", what,
               recipe_name(recipe_));
  FP4MOE_CHECK(w_ != nullptr, "{}: set_weights was not called", what);
  split_tokens(split, what);
  FP4MOE_CHECK(x.codes != nullptr && x.scales != nullptr,
               "{}: null codes or scales (expected an FP8 1x128 row tensor [M, {}], layouts.h)", what, K_);
  gemm_.fprop_fp8(x, {static_cast<uint8_t*>(w_codes_.ptr), static_cast<float*>(w_scales_.ptr)}, N_, K_, split,
                  GemmOutput{y, GemmOutType::bf16, false}, stream);
}

void GroupLinear::backward(const GroupLinearInput& x, const bf16* dy, const GroupSplit& split, bf16* dx,
                           float* dw_master, cudaStream_t stream) {
  const char* what = "GroupLinear::backward";
  const int64_t M = cached_M_[slot()];  // the active slot's forward
  FP4MOE_CHECK(M >= 0, "{}: no forward to differentiate", what);
  FP4MOE_CHECK(dy != nullptr, "{}: null dY (expected BF16 [M, N])", what);
  FP4MOE_CHECK(split.G == G_ && split_tokens(split, what) == M,
               "{}: the split must be the forward's ({} groups, {} tokens)", what, G_, M);
  const bool reads_x = recipe_.mxfp4_input || bf16_gemms(recipe_);  // fp8: its own column copy
  if (dw_master && reads_x) check_input(x, what);
  if (bf16_gemms(recipe_)) {
    if (dx) gemm_.dgrad_bf16(dy, w_, N_, K_, split, GemmOutput{dx, GemmOutType::bf16, false}, stream);
    if (dw_master) gemm_.wgrad_bf16(dy, x.x, N_, K_, split, GemmOutput{dw_master, GemmOutType::fp32, true}, stream);
    return;
  }
  // Stochastic rounding of the gradient operands: a fresh stream of random numbers per backward (the quantizer
  // keys them by element index), Dgrad's dY and Wgrad's dY apart.
  const uint64_t sr_stream = 1 + 2 * backward_count_++;
  if (dx && is_mx(recipe_.dgrad) && G_ > 1) {  // dY and W^T along N; ragged groups on 1x128 FP8 operands
    auto* dc = static_cast<uint8_t*>(mx_row_codes_.ensure(planned(M, "dY MXFP4 row codes"), kScratch));
    auto* ds = static_cast<uint8_t*>(mx_row_scales_.ensure(planned(M, "dY MXFP4 row scales"), kScratch));
    const Fp8RowOperand rows = mx_rows_as_fp8(dy, M, N_, dc, ds, mx_config(recipe_.mx.rounding, sr_stream), stream);
    gemm_.dgrad_fp8_row_weights(
        rows, Fp8RowStack{static_cast<uint8_t*>(wt_rows_codes_.ptr), static_cast<float*>(wt_rows_scales_.ptr)}, N_,
        K_, split, GemmOutput{dx, GemmOutType::bf16, false}, stream);
  } else if (dx && is_mx(recipe_.dgrad)) {  // G = 1: dY along N, W^T (set_weights) along N, one MXFP4 GEMM
    check_mx_tokens(M, "Dgrad");
    auto* dc = static_cast<uint8_t*>(mx_row_codes_.ensure(planned(M, "dY MXFP4 row codes"), kScratch));
    auto* ds = static_cast<uint8_t*>(mx_row_scales_.ensure(planned(M, "dY MXFP4 row scales"), kScratch));
    void* wsp = mx_workspace_.ensure(planned(M, "MXFP4 GEMM workspace"), kScratch);
    if (M > 0) {
      bf16_to_mxfp4_row(dy, M, N_, dc, ds, mx_config(recipe_.mx.rounding, sr_stream), nullptr, stream);
      mxfp4_gemm(gemm_.lt(), {dc, ds},
                 {static_cast<uint8_t*>(wt_mx_codes_.ptr), static_cast<uint8_t*>(wt_mx_scales_.ptr)}, M, K_, N_, wsp,
                 mx_workspace_.bytes, GemmOutput{dx, GemmOutType::bf16, false}, stream);
    }
  } else if (dx) {
    auto* rc = static_cast<uint8_t*>(row_codes_.ensure(planned(M, "row FP8 codes"), kScratch));
    auto* rs = static_cast<float*>(row_scales_.ensure(planned(M, "row FP8 scales"), kScratch));
    if (M > 0) bf16_to_fp8_row(dy, M, N_, scale_mode_, rc, rs, nullptr, stream);
    gemm_.dgrad_fp8({rc, rs}, {static_cast<uint8_t*>(wt_codes_.ptr), static_cast<float*>(wt_scales_.ptr)}, N_, K_,
                    split, GemmOutput{dx, GemmOutType::bf16, false}, stream);
  }
  if (dw_master && is_mx(recipe_.wgrad)) {  // dY and X (held since forward) along tokens, ragged per expert
    auto* dc = static_cast<uint8_t*>(dycol_codes_.ensure(planned(M, "dY MXFP4 column codes"), kScratch));
    auto* ds = static_cast<uint8_t*>(dycol_scales_.ensure(planned(M, "dY MXFP4 column scales"), kScratch));
    void* wsp = mx_wgrad_workspace_.ensure(planned(M, "MXFP4 Wgrad workspace"), kScratch);
    bf16_to_mxfp4_col_ragged(dy, M, N_, split.offsets, G_, split.host_offsets, dc, ds,
                             mx_config(recipe_.mx.rounding, sr_stream + 1), nullptr, stream);
    mxfp4_wgrad_grouped(gemm_, {dc, ds},
                        {static_cast<uint8_t*>(xcol_codes().ptr), static_cast<uint8_t*>(xcol_scales().ptr)}, N_, K_,
                        split, wsp, mx_wgrad_workspace_.bytes, GemmOutput{dw_master, GemmOutType::fp32, true},
                        stream);
  } else if (dw_master) {
    auto* dc = static_cast<uint8_t*>(dycol_codes_.ensure(planned(M, "dY FP8 column codes"), kScratch));
    auto* ds = static_cast<float*>(dycol_scales_.ensure(planned(M, "dY FP8 column scales"), kScratch));
    bf16_to_fp8_col(dy, M, N_, split.offsets, G_, split.host_offsets, scale_mode_, dc, ds, nullptr, stream);
    if (recipe_.mxfp4_input) {
      auto* cc = static_cast<uint8_t*>(xcol_codes().ensure(planned(M, "X FP8 column codes"), kScratch));
      auto* cs = static_cast<float*>(xcol_scales().ensure(planned(M, "X FP8 column scales"), kScratch));
      mxfp4_row_to_fp8_col(x.mx_codes, x.mx_scales, M, K_, split.offsets, G_, split.host_offsets, cc, cs,
                           stream);
    }
    gemm_.wgrad_fp8({dc, ds}, {static_cast<uint8_t*>(xcol_codes().ptr), static_cast<float*>(xcol_scales().ptr)},
                    N_, K_, split, GemmOutput{dw_master, GemmOutType::fp32, true}, stream);
  }
}

}  // namespace fp4moe
