#include "kernels/gemm/grouped_gemm.h"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/common/check.h"
#include "kernels/common/offsets.h"
#include "kernels/gemm/group_row_scales.h"
#include "kernels/quant/layouts.h"

namespace fp4moe {

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

size_t out_elem_bytes(GemmOutType t) { return t == GemmOutType::fp32 ? 4 : 2; }
cudaDataType_t out_cuda_type(GemmOutType t) { return t == GemmOutType::fp32 ? CUDA_R_32F : CUDA_R_16BF; }

// Offsets of the scratch regions (16-byte aligned each).
struct ScratchLayout {
  size_t packed_scales = 0, tail_codes = 0, tail_scales = 0, tail_out = 0, total = 0;
  ScratchLayout(int64_t M, int64_t R, int64_t P, int64_t G) {
    auto up16 = [](size_t b) { return (b + 15) / 16 * 16; };
    const int64_t nb = ceil_div(R, kFp8Block);
    packed_scales = 0;
    tail_codes = up16(sizeof(float) * static_cast<size_t>(packed_group_scales_capacity(M, R, G)));
    tail_scales = tail_codes + up16(static_cast<size_t>(4 * R));
    tail_out = tail_scales + up16(sizeof(float) * static_cast<size_t>(4 * nb));
    total = tail_out + up16(sizeof(float) * static_cast<size_t>(4 * P));
  }
};

// Shared argument checks of every entry point; returns M.
int64_t check_common(const char* what, int64_t N, int64_t K, const GroupSplit& split, const GemmOutput& out,
                     bool wgrad) {
  FP4MOE_CHECK(N >= 16 && K >= 16 && N % 16 == 0 && K % 16 == 0,
               "{}: N and K must be positive multiples of 16 (FP8 tensor-core rows), got N={} K={}", what, N, K);
  FP4MOE_CHECK(split.G >= 1 && split.G <= 65535, "{}: expected 1 <= G <= 65535 groups, got G={}", what, split.G);
  FP4MOE_CHECK(split.offsets != nullptr, "{}: device group offsets are null", what);
  FP4MOE_CHECK(split.host_offsets != nullptr,
               "{}: the host copy of the group offsets is null (fetch it once per layer, see grouped_gemm.h)", what);
  const int64_t M = split.host_offsets[split.G];
  validate_group_offsets(split.host_offsets, split.G, M, what);
  FP4MOE_CHECK(out.data != nullptr && aligned16(out.data), "{}: output must be a non-null 16-byte aligned pointer, "
               "got {}", what, out.data);
  FP4MOE_CHECK(!out.accumulate || out.type == GemmOutType::fp32,
               "{}: accumulation needs an FP32 output (the master gradient), got a BF16 output", what);
  FP4MOE_CHECK(!out.accumulate || wgrad,
               "{}: accumulation is only offered for Wgrad (Fprop/Dgrad write their ragged tails in place)", what);
  return M;
}

void check_ptr(const char* what, const char* name, const void* p) {
  FP4MOE_CHECK(p != nullptr && aligned16(p), "{}: {} must be a non-null 16-byte aligned device pointer, got {}", what,
               name, p);
}

LtOutput lt_out(const GemmOutput& out, size_t byte_offset, int64_t ld) {
  LtOutput d;
  d.data = static_cast<char*>(out.data) + byte_offset;
  d.type = out_cuda_type(out.type);
  d.ld = ld;
  d.accumulate = out.accumulate;
  return d;
}

// Empty Wgrad groups: zero, or untouched when accumulating.
void zero_empty_wgrad(const GemmOutput& dw, int64_t g, int64_t N, int64_t K, cudaStream_t stream) {
  if (dw.accumulate) return;
  const size_t bytes = static_cast<size_t>(N * K) * out_elem_bytes(dw.type);
  CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(dw.data) + static_cast<size_t>(g) * bytes, 0, bytes, stream));
}

}  // namespace

GroupedGemm::~GroupedGemm() {
  if (scratch_) cudaFree(scratch_);
}

size_t GroupedGemm::scratch_bytes(int64_t M, int64_t R, int64_t P, int64_t G) {
  return ScratchLayout(M, R, P, G).total;
}

void GroupedGemm::ensure_scratch(size_t bytes) {
  if (bytes <= scratch_capacity_) return;
  if (scratch_) CUDA_CHECK(cudaFree(scratch_));  // synchronises: no queued work still uses the old buffer
  scratch_ = nullptr;
  scratch_capacity_ = 0;
  CUDA_CHECK(cudaMalloc(&scratch_, bytes));
  scratch_capacity_ = bytes;
}

void GroupedGemm::reserve(int64_t M, int64_t R, int64_t P, int64_t G) {
  FP4MOE_CHECK(M >= 0 && R > 0 && P > 0 && G >= 1, "GroupedGemm::reserve: bad bounds M={} R={} P={} G={}", M, R, P,
               G);
  ensure_scratch(scratch_bytes(M, R, P, G));
}

// ---- BF16 --------------------------------------------------------------------------------------------------------

void GroupedGemm::fprop_bf16(const bf16* x, const bf16* w, int64_t N, int64_t K, const GroupSplit& split,
                             GemmOutput y, cudaStream_t stream) {
  const char* what = "grouped fprop_bf16";
  const int64_t M = check_common(what, N, K, split, y, false);
  check_ptr(what, "x", x);
  check_ptr(what, "w", w);
  (void)M;
  for (int64_t g = 0; g < split.G; ++g) {
    const int64_t off = split.host_offsets[g], Mg = split.host_offsets[g + 1] - off;
    if (Mg == 0) continue;
    // Column-major: Y_g^T [N x M_g] = (W_g stored K x N)^T * (X_g stored K x M_g).
    LtOperand a{w + g * N * K, CUDA_R_16BF, true, K, nullptr, LtScaleMode::none};
    LtOperand b{x + off * K, CUDA_R_16BF, false, K, nullptr, LtScaleMode::none};
    lt_.matmul(N, Mg, K, a, b, lt_out(y, static_cast<size_t>(off * N) * out_elem_bytes(y.type), N), RaggedDim::n,
               stream);
  }
}

void GroupedGemm::dgrad_bf16(const bf16* dy, const bf16* w, int64_t N, int64_t K, const GroupSplit& split,
                             GemmOutput dx, cudaStream_t stream) {
  const char* what = "grouped dgrad_bf16";
  check_common(what, N, K, split, dx, false);
  check_ptr(what, "dy", dy);
  check_ptr(what, "w", w);
  for (int64_t g = 0; g < split.G; ++g) {
    const int64_t off = split.host_offsets[g], Mg = split.host_offsets[g + 1] - off;
    if (Mg == 0) continue;
    // Column-major: dX_g^T [K x M_g] = (W_g stored K x N) * (dY_g stored N x M_g).
    LtOperand a{w + g * N * K, CUDA_R_16BF, false, K, nullptr, LtScaleMode::none};
    LtOperand b{dy + off * N, CUDA_R_16BF, false, N, nullptr, LtScaleMode::none};
    lt_.matmul(K, Mg, N, a, b, lt_out(dx, static_cast<size_t>(off * K) * out_elem_bytes(dx.type), K), RaggedDim::n,
               stream);
  }
}

void GroupedGemm::wgrad_bf16(const bf16* dy, const bf16* x, int64_t N, int64_t K, const GroupSplit& split,
                             GemmOutput dw, cudaStream_t stream) {
  const char* what = "grouped wgrad_bf16";
  check_common(what, N, K, split, dw, true);
  check_ptr(what, "dy", dy);
  check_ptr(what, "x", x);
  for (int64_t g = 0; g < split.G; ++g) {
    const int64_t off = split.host_offsets[g], Mg = split.host_offsets[g + 1] - off;
    if (Mg == 0) {
      zero_empty_wgrad(dw, g, N, K, stream);
      continue;
    }
    // Column-major: dW_g^T [K x N] = (X_g stored K x M_g) * (dY_g stored N x M_g)^T.
    LtOperand a{x + off * K, CUDA_R_16BF, false, K, nullptr, LtScaleMode::none};
    LtOperand b{dy + off * N, CUDA_R_16BF, true, N, nullptr, LtScaleMode::none};
    lt_.matmul(K, N, Mg, a, b, lt_out(dw, static_cast<size_t>(g * N * K) * out_elem_bytes(dw.type), K),
               RaggedDim::k, stream);
  }
}

// ---- FP8 ---------------------------------------------------------------------------------------------------------

void GroupedGemm::row_times_blocks_fp8(const char* what, Fp8RowOperand rows, Fp8BlockStack blocks, int64_t P,
                                       int64_t R, const GroupSplit& split, GemmOutput out, cudaStream_t stream) {
  const int64_t M = split.host_offsets[split.G];
  check_ptr(what, "row codes", rows.codes);
  check_ptr(what, "row scales", rows.scales);
  check_ptr(what, "block codes", blocks.codes);
  check_ptr(what, "block scales", blocks.scales);
  if (M == 0) return;

  int64_t max_rows = 0;
  for (int64_t g = 0; g < split.G; ++g)
    max_rows = std::max<int64_t>(max_rows, split.host_offsets[g + 1] - split.host_offsets[g]);
  const ScratchLayout sl(M, R, P, split.G);
  ensure_scratch(sl.total);
  char* scratch = static_cast<char*>(scratch_);
  float* packed = reinterpret_cast<float*>(scratch + sl.packed_scales);
  uint8_t* tail_codes = reinterpret_cast<uint8_t*>(scratch + sl.tail_codes);
  float* tail_scales = reinterpret_cast<float*>(scratch + sl.tail_scales);
  void* tail_out = scratch + sl.tail_out;

  pack_group_row_scales(rows.scales, M, R, split.offsets, split.G, max_rows, packed, stream);

  const int64_t nb = ceil_div(R, kFp8Block);
  const int64_t block_scale_count = fp8_block_scale_count(P, R);
  const size_t es = out_elem_bytes(out.type);
  int64_t packed_rows = 0;  // sum of group_main_rows over the groups before g
  for (int64_t g = 0; g < split.G; ++g) {
    const int64_t off = split.host_offsets[g], Mg = split.host_offsets[g + 1] - off;
    if (Mg == 0) continue;
    const int64_t n_main = group_main_rows(off, Mg, M);
    // Column-major: out_g^T [P x n] = (block codes stored R x P)^T * (row codes stored R x n).
    LtOperand a{blocks.codes + g * P * R, CUDA_R_8F_E4M3, true, R, blocks.scales + g * block_scale_count,
                LtScaleMode::blk128x128};
    if (n_main > 0) {
      LtOperand b{rows.codes + off * R, CUDA_R_8F_E4M3, false, R, packed + nb * packed_rows, LtScaleMode::vec128};
      lt_.matmul(P, n_main, R, a, b, lt_out(out, static_cast<size_t>(off * P) * es, P), RaggedDim::n, stream);
    }
    packed_rows += n_main;
    const int64_t tail = Mg - n_main;
    if (tail <= 0) continue;
    // The last 1..3 rows at the end of the tensor: a zero-padded 4-row copy, computed in scratch, copied out.
    const int64_t first = off + n_main;
    CUDA_CHECK(cudaMemsetAsync(tail_codes, 0, static_cast<size_t>(4 * R), stream));
    CUDA_CHECK(cudaMemcpyAsync(tail_codes, rows.codes + first * R, static_cast<size_t>(tail * R),
                               cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemsetAsync(tail_scales, 0, sizeof(float) * static_cast<size_t>(4 * nb), stream));
    CUDA_CHECK(cudaMemcpy2DAsync(tail_scales, 4 * sizeof(float), rows.scales + first,
                                 sizeof(float) * static_cast<size_t>(fp8_row_scale_ld(M)),
                                 sizeof(float) * static_cast<size_t>(tail), static_cast<size_t>(nb),
                                 cudaMemcpyDeviceToDevice, stream));
    LtOperand b{tail_codes, CUDA_R_8F_E4M3, false, R, tail_scales, LtScaleMode::vec128};
    GemmOutput scratch_out{tail_out, out.type, false};
    lt_.matmul(P, 4, R, a, b, lt_out(scratch_out, 0, P), RaggedDim::none, stream);
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(out.data) + static_cast<size_t>(first * P) * es, tail_out,
                               static_cast<size_t>(tail * P) * es, cudaMemcpyDeviceToDevice, stream));
  }
}

void GroupedGemm::fprop_fp8(Fp8RowOperand x, Fp8BlockStack w, int64_t N, int64_t K, const GroupSplit& split,
                            GemmOutput y, cudaStream_t stream) {
  const char* what = "grouped fprop_fp8";
  check_common(what, N, K, split, y, false);
  row_times_blocks_fp8(what, x, w, N, K, split, y, stream);
}

void GroupedGemm::dgrad_fp8(Fp8RowOperand dy, Fp8BlockStack w_t, int64_t N, int64_t K, const GroupSplit& split,
                            GemmOutput dx, cudaStream_t stream) {
  const char* what = "grouped dgrad_fp8";
  check_common(what, N, K, split, dx, false);
  row_times_blocks_fp8(what, dy, w_t, K, N, split, dx, stream);
}

void GroupedGemm::wgrad_fp8(Fp8ColOperand dy, Fp8ColOperand x, int64_t N, int64_t K, const GroupSplit& split,
                            GemmOutput dw, cudaStream_t stream) {
  const char* what = "grouped wgrad_fp8";
  check_common(what, N, K, split, dw, true);
  check_ptr(what, "dy codes", dy.codes);
  check_ptr(what, "dy scales", dy.scales);
  check_ptr(what, "x codes", x.codes);
  check_ptr(what, "x scales", x.scales);
  const size_t es = out_elem_bytes(dw.type);
  int64_t P = 0, Q = 0;  // padded tokens and 128-token blocks of the groups before g (layouts.h)
  for (int64_t g = 0; g < split.G; ++g) {
    const int64_t Mg = split.host_offsets[g + 1] - split.host_offsets[g];
    if (Mg == 0) {
      zero_empty_wgrad(dw, g, N, K, stream);
      continue;
    }
    const int64_t L = fp8_col_group_ld(Mg);
    // Column-major: dW_g^T [K x N] = (X_g^T stored L x K)^T * (dY_g^T stored L x N); k = L (zero tail).
    LtOperand a{x.codes + K * P, CUDA_R_8F_E4M3, true, L, x.scales + K * Q, LtScaleMode::vec128};
    LtOperand b{dy.codes + N * P, CUDA_R_8F_E4M3, false, L, dy.scales + N * Q, LtScaleMode::vec128};
    lt_.matmul(K, N, L, a, b, lt_out(dw, static_cast<size_t>(g * N * K) * es, K), RaggedDim::k, stream);
    P += L;
    Q += ceil_div(Mg, kFp8Block);
  }
}

}  // namespace fp4moe
