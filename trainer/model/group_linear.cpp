#include "trainer/model/group_linear.h"

#include <algorithm>
#include <utility>

#include "kernels/common/check.h"
#include "kernels/quant/bf16_to_fp8.h"
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
  require_preset_recipe(recipe, "GroupLinear");
  FP4MOE_CHECK(G >= 1 && N >= 16 && K >= 16 && N % 16 == 0 && K % 16 == 0,
               "GroupLinear: expected G >= 1 and N, K positive multiples of 16, got G={} N={} K={}", G, N, K);
  FP4MOE_CHECK(!recipe.mxfp4_input || K % kMxBlock == 0,
               "GroupLinear: the mxfp4 recipe needs K % 32 == 0 (MX blocks), got K={}", K);
}

GroupLinear::GroupLinear(int64_t G, int64_t N, int64_t K, const Recipe& recipe, CublasLtMatmul* lt,
                         GroupLinearAllocator allocator, Fp8ScaleMode scale_mode)
    : G_(G), N_(N), K_(K), recipe_(recipe), scale_mode_(scale_mode), gemm_(lt), allocator_(std::move(allocator)) {
  check_shape(G, N, K, recipe);
  FP4MOE_CHECK(static_cast<bool>(allocator_.allocate) == static_cast<bool>(allocator_.release),
               "GroupLinear: the allocator needs both allocate and release (or neither, for cudaMalloc/cudaFree)");
  const int64_t slots = allocator_.slots ? allocator_.slots->count() : 1;
  cached_M_.assign(static_cast<size_t>(slots), -1);
  const bool held = !bf16_gemms(recipe) && !recipe.mxfp4_input;  // fp8: X's FP8 columns are held
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
  auto* wc = static_cast<uint8_t*>(w_codes_.ensure(planned(M, "W FP8 codes"), kWeightCopy));
  auto* ws = static_cast<float*>(w_scales_.ensure(planned(M, "W FP8 scales"), kWeightCopy));
  auto* tc = static_cast<uint8_t*>(wt_codes_.ensure(planned(M, "W^T FP8 codes"), kWeightCopy));
  auto* ts = static_cast<float*>(wt_scales_.ensure(planned(M, "W^T FP8 scales"), kWeightCopy));
  for (int64_t g = 0; g < G_; ++g) {
    bf16_to_fp8_block128(w + g * N_ * K_, N_, K_, scale_mode_, false, wc + g * N_ * K_, ws + g * count, nullptr,
                         stream);
    bf16_to_fp8_block128(w + g * N_ * K_, N_, K_, scale_mode_, true, tc + g * N_ * K_, ts + g * count_t, nullptr,
                         stream);
  }
}

BufferPlan GroupLinear::buffers(const Recipe& recipe, int64_t G, int64_t N, int64_t K, int64_t M) {
  require_preset_recipe(recipe, "GroupLinear::buffers");
  FP4MOE_CHECK(G >= 1 && N >= 1 && K >= 1 && M >= 0,
               "GroupLinear::buffers: expected G, N, K >= 1 and M >= 0, got G={} N={} K={} M={}", G, N, K, M);
  BufferPlan p("group_linear");
  if (bf16_gemms(recipe)) return p;
  const bool held = true;
  const Lifetime first = Lifetime::first_forward;
  const MemCategory weights = MemCategory::weights, ws = MemCategory::workspace;
  const MemCategory x_columns = recipe.mxfp4_input ? ws : MemCategory::activations;
  p.add("W FP8 codes", G * N * K, ElemType::e4m3, held, weights, first);
  p.add("W FP8 scales", G * fp8_block_scale_count(N, K), ElemType::fp32, held, weights, first);
  p.add("W^T FP8 codes", G * N * K, ElemType::e4m3, held, weights, first);
  p.add("W^T FP8 scales", G * fp8_block_scale_count(K, N), ElemType::fp32, held, weights, first);
  p.add("X FP8 column codes", fp8_col_codes_capacity(M, K, G), ElemType::e4m3, held, x_columns, first);
  p.add("X FP8 column scales", fp8_col_scales_capacity(M, K, G), ElemType::fp32, held, x_columns, first);
  p.add("row FP8 codes", M * std::max(K, N), ElemType::e4m3, held, ws, first);
  p.add("row FP8 scales", std::max(fp8_row_scale_count(M, K), fp8_row_scale_count(M, N)), ElemType::fp32, held, ws,
        first);
  p.add("dY FP8 column codes", fp8_col_codes_capacity(M, N, G), ElemType::e4m3, held, ws, first);
  p.add("dY FP8 column scales", fp8_col_scales_capacity(M, N, G), ElemType::fp32, held, ws, first);
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
  require_preset_recipe(recipe, "GroupLinear::held_activation_bytes");
  FP4MOE_CHECK(M >= 0 && K >= 1 && G >= 1, "GroupLinear::held_activation_bytes: expected M >= 0, K >= 1, G >= 1, "
               "got M={} K={} G={}", M, K, G);
  if (bf16_gemms(recipe)) return static_cast<size_t>(M * K) * sizeof(bf16);
  if (recipe.mxfp4_input) {
    FP4MOE_CHECK(K % kMxBlock == 0, "GroupLinear::held_activation_bytes: the mxfp4 recipe needs K % 32 == 0, got K={}",
                 K);
    return static_cast<size_t>(M * (K / 2) + M * (K / kMxBlock));
  }
  const BufferPlan p = buffers(recipe, G, 1, K, M);  // fp8: the FP8 column copy of X (N does not enter it)
  return static_cast<size_t>(p.at("X FP8 column codes").bytes() + p.at("X FP8 column scales").bytes());
}

size_t GroupLinear::held_activation_bytes() const {
  const int64_t M = cached_M_[slot()];
  FP4MOE_CHECK(M >= 0, "GroupLinear::held_activation_bytes: no forward yet (nothing is held)");
  return held_activation_bytes(recipe_, M, K_, G_);
}

size_t GroupLinear::weight_copy_bytes(const Recipe& recipe, int64_t G, int64_t N, int64_t K) {
  require_preset_recipe(recipe, "GroupLinear::weight_copy_bytes");
  FP4MOE_CHECK(G >= 1 && N >= 1 && K >= 1, "GroupLinear::weight_copy_bytes: expected G, N, K >= 1, got {} {} {}", G,
               N, K);
  if (bf16_gemms(recipe)) return 0;
  const BufferPlan p = buffers(recipe, G, N, K, 0);
  size_t sum = 0;
  for (const PlannedBuffer& b : p.buffers())
    if (b.category == MemCategory::weights) sum += static_cast<size_t>(b.bytes());
  return sum;
}

void GroupLinear::forward(const GroupLinearInput& x, const GroupSplit& split, bf16* y, cudaStream_t stream) {
  const char* what = "GroupLinear::forward";
  FP4MOE_CHECK(w_ != nullptr, "{}: set_weights was not called", what);
  FP4MOE_CHECK(split.G == G_ && split.host_offsets != nullptr,
               "{}: expected a split of {} groups with its host copy of the offsets, got G={}", what, G_, split.G);
  check_input(x, what);
  const bool mx = recipe_.mxfp4_input;
  const int64_t M = split.host_offsets[G_];
  const GemmOutput out{y, GemmOutType::bf16, false};
  cached_M_[slot()] = M;
  if (bf16_gemms(recipe_)) {
    gemm_.fprop_bf16(x.x, w_, N_, K_, split, out, stream);
    return;
  }
  auto* rc = static_cast<uint8_t*>(row_codes_.ensure(planned(M, "row FP8 codes"), kScratch));
  auto* rs = static_cast<float*>(row_scales_.ensure(planned(M, "row FP8 scales"), kScratch));
  if (mx) {
    if (M > 0) mxfp4_row_to_fp8_row(x.mx_codes, x.mx_scales, M, K_, rc, rs, stream);
  } else if (M > 0) {
    bf16_to_fp8_row(x.x, M, K_, scale_mode_, rc, rs, nullptr, stream);
  }
  gemm_.fprop_fp8({rc, rs}, {static_cast<uint8_t*>(w_codes_.ptr), static_cast<float*>(w_scales_.ptr)}, N_, K_, split,
                  out, stream);
  if (!mx) {
    // The fp8 recipe caches X as its FP8 column copy (what Wgrad reads), not as BF16; every slot's copy grows
    // together (all allocated by the first forward).
    constexpr GroupLinearBuffer held = GroupLinearBuffer::held_activation;
    for (size_t s = 0; s < xcol_codes_.size(); ++s) {
      xcol_codes_[s]->ensure(planned(M, "X FP8 column codes"), held);
      xcol_scales_[s]->ensure(planned(M, "X FP8 column scales"), held);
    }
    auto* cc = static_cast<uint8_t*>(xcol_codes().ptr);
    auto* cs = static_cast<float*>(xcol_scales().ptr);
    bf16_to_fp8_col(x.x, M, K_, split.offsets, G_, split.host_offsets, scale_mode_, cc, cs, nullptr, stream);
  }
}

void GroupLinear::fprop_fp8_rows(Fp8RowOperand x, const GroupSplit& split, bf16* y, cudaStream_t stream) {
  const char* what = "GroupLinear::fprop_fp8_rows";
  FP4MOE_CHECK(recipe_ == Recipe::fp8, "{}: only the fp8 recipe takes an FP8 row copy of X, this layer is {}", what,
               recipe_name(recipe_));
  FP4MOE_CHECK(w_ != nullptr, "{}: set_weights was not called", what);
  FP4MOE_CHECK(split.G == G_ && split.host_offsets != nullptr,
               "{}: expected a split of {} groups with its host copy of the offsets, got G={}", what, G_, split.G);
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
  FP4MOE_CHECK(split.G == G_ && split.host_offsets != nullptr && split.host_offsets[G_] == M,
               "{}: the split must be the forward's ({} groups, {} tokens)", what, G_, M);
  const bool reads_x = recipe_.mxfp4_input || bf16_gemms(recipe_);  // fp8: its own column copy
  if (dw_master && reads_x) check_input(x, what);
  if (bf16_gemms(recipe_)) {
    if (dx) gemm_.dgrad_bf16(dy, w_, N_, K_, split, GemmOutput{dx, GemmOutType::bf16, false}, stream);
    if (dw_master) gemm_.wgrad_bf16(dy, x.x, N_, K_, split, GemmOutput{dw_master, GemmOutType::fp32, true}, stream);
    return;
  }
  if (dx) {
    auto* rc = static_cast<uint8_t*>(row_codes_.ensure(planned(M, "row FP8 codes"), kScratch));
    auto* rs = static_cast<float*>(row_scales_.ensure(planned(M, "row FP8 scales"), kScratch));
    if (M > 0) bf16_to_fp8_row(dy, M, N_, scale_mode_, rc, rs, nullptr, stream);
    gemm_.dgrad_fp8({rc, rs}, {static_cast<uint8_t*>(wt_codes_.ptr), static_cast<float*>(wt_scales_.ptr)}, N_, K_,
                    split, GemmOutput{dx, GemmOutType::bf16, false}, stream);
  }
  if (dw_master) {
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
