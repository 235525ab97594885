// Direct MXFP4 -> FP8 1x128 row conversion (mxfp4_row_to_fp8_row.h) and the naive two-pass baseline.
// bench_quant times both against the copy ceiling in the same run (results: reports/results/h200/README.md).
//
// One thread block converts a tile of kRowsPerCta rows x one 1x128 group. Grid: groups x row tiles, groups
// fastest so that neighbouring blocks write neighbouring bytes of the same rows; shapes past the grid's limits
// (65535 row tiles, 2^31 - 1 groups) take one launch per grid's worth. No division, no float arithmetic on the
// values.
// Eight threads share a group row; each reads 8 bytes of packed codes (16 elements, half an MX block) and the
// group's four scale bytes for each of its kRowsPerThread rows, all loads issued before the first store. It finds
// the group's largest non-NaN exponent with packed byte maxima (integer operations), converts four codes at a
// time with one byte permute through the per-shift table of e2m1_e4m3_lut.h (sign bits moved into place by
// shifts and masks) and writes 16 E4M3 codes with one 16-byte store. The first thread of each group row writes
// its fp32 scale, so the tile's scales form one contiguous run of floats (the layout is block-major). Loads and
// stores use the default caching (streaming cache hints measured slower).
#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/common/check.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_row_checks.h"
#include "kernels/quant/mxfp4_fp8_direct.cuh"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"
#include "kernels/quant/mxfp4_to_bf16.h"

namespace fp4moe {
namespace {

using detail::convert16_block;
using detail::group_scale_exponent;

constexpr int kThreads = 256;
constexpr int kUnit = 16;                               // elements per thread and row: 8 code bytes in, 16 out
constexpr int kThreadsPerGroup = kFp8Block / kUnit;     // 8 threads per group row
constexpr int kSlots = kThreads / kThreadsPerGroup;     // 32 rows converted at once
constexpr int kRowsPerThread = 4;                       // rows slot, slot + kSlots, ...
constexpr int kRowsPerCta = kSlots * kRowsPerThread;    // 128 rows per tile
constexpr int kBlocksPerGroup = kFp8Block / kMxBlock;   // 4
static_assert(kBlocksPerGroup == 4, "the group's scale bytes are handled as one 32-bit word");
static_assert(kRowsPerCta % 4 == 0, "row tiles cover the scale layout's padding rows");

// Tile (g, tile): rows tile * kRowsPerCta .. + kRowsPerCta - 1 of group g. Thread: u = its unit within the group
// row, slot = its first row; rows slot + kSlots * i. kWholeGroups: K % 128 == 0 and in_scales 4-byte aligned (a
// group's scale bytes are one aligned word).
template <bool kWholeGroups>
__device__ __forceinline__ void convert_tile(const uint8_t* __restrict__ in_codes,
                                             const uint8_t* __restrict__ in_scales, int64_t M, int64_t K, int64_t g,
                                             int64_t tile, uint8_t* __restrict__ out_codes,
                                             float* __restrict__ out_scales) {
  const int u = static_cast<int>(threadIdx.x) % kThreadsPerGroup;
  const int slot = static_cast<int>(threadIdx.x) / kThreadsPerGroup;
  const int64_t row0 = tile * kRowsPerCta + slot;
  const int64_t blocks_per_row = K / kMxBlock;
  const int64_t scale_ld = fp8_row_scale_ld(M);
  const int64_t first_block = g * kBlocksPerGroup;
  const int n_blocks = static_cast<int>(blocks_per_row - first_block < 4 ? blocks_per_row - first_block : 4);
  const bool active = u * kUnit < n_blocks * kMxBlock;  // a short last group has fewer units
  const int own_block = u * kUnit / kMxBlock;

  uint2 codes[kRowsPerThread];
  uint32_t group_scales[kRowsPerThread];  // the group's scale bytes, 0xFF where the group has no block
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t r = row0 + int64_t{kSlots} * i;
    if (r >= M) continue;
    if (active)
      codes[i] = __ldg(reinterpret_cast<const uint2*>(in_codes + r * (K / 2) + g * (kFp8Block / 2) + u * (kUnit / 2)));
    const uint8_t* s = in_scales + r * blocks_per_row + first_block;
    if constexpr (kWholeGroups) {
      group_scales[i] = __ldg(reinterpret_cast<const uint32_t*>(s));
    } else {
      uint32_t word = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) word |= (b < n_blocks ? uint32_t{__ldg(s + b)} : uint32_t{kUE8M0NaN}) << (8 * b);
      group_scales[i] = word;
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t r = row0 + int64_t{kSlots} * i;
    if (r >= M) {
      if (u == 0 && r < scale_ld) out_scales[g * scale_ld + r] = 1.0f;  // padding rows of the scale layout
      continue;
    }
    const int s = group_scale_exponent(group_scales[i]);
    if (active) {
      const uint32_t own = (group_scales[i] >> (8 * own_block)) & 0xFFu;
      auto* dst = reinterpret_cast<uint4*>(out_codes + r * K + g * kFp8Block + u * kUnit);
      *dst = convert16_block(codes[i].x, codes[i].y, own, s);
    }
    if (u == 0) out_scales[g * scale_ld + r] = exp2_exact(s);
  }
}

// Block (x, y) converts tile (group0 + x, tile0 + y).
template <bool kWholeGroups>
__global__ void __launch_bounds__(kThreads)
mxfp4_row_to_fp8_row_kernel(const uint8_t* __restrict__ in_codes, const uint8_t* __restrict__ in_scales, int64_t M,
                            int64_t K, int64_t group0, int64_t tile0, uint8_t* __restrict__ out_codes,
                            float* __restrict__ out_scales) {
  convert_tile<kWholeGroups>(in_codes, in_scales, M, K, group0 + blockIdx.x, tile0 + blockIdx.y, out_codes,
                             out_scales);
}

}  // namespace

void mxfp4_row_to_fp8_row(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                          uint8_t* out_codes, float* out_scales, cudaStream_t stream) {
  const char* what = "mxfp4_row_to_fp8_row";
  detail::check_mx_row_shape(what, M, K);
  if (M == 0) return;
  detail::check_mx_pointer(what, "in_codes", in_codes, 16);
  detail::check_mx_pointer(what, "in_scales", in_scales, 1);
  detail::check_mx_pointer(what, "out_codes", out_codes, 16);
  detail::check_mx_pointer(what, "out_scales", out_scales, 4);

  // Row tiles cover the scale layout's padding rows too (kRowsPerCta is a multiple of 4). One launch unless the
  // tiles exceed the grid's limits (65535 row tiles: M > 8388480; 2^31 - 1 groups), then one per grid's worth.
  const int64_t row_tiles = ceil_div(M, int64_t{kRowsPerCta});
  const int64_t groups = ceil_div(K, int64_t{kFp8Block});
  constexpr int64_t kMaxGridX = INT_MAX, kMaxGridY = 65535;
  const bool whole_groups = K % kFp8Block == 0 && (reinterpret_cast<uintptr_t>(in_scales) & 3u) == 0;
  for (int64_t tile0 = 0; tile0 < row_tiles; tile0 += kMaxGridY) {
    for (int64_t group0 = 0; group0 < groups; group0 += kMaxGridX) {
      const dim3 grid(static_cast<unsigned>(std::min(groups - group0, kMaxGridX)),
                      static_cast<unsigned>(std::min(row_tiles - tile0, kMaxGridY)));
      if (whole_groups)
        mxfp4_row_to_fp8_row_kernel<true>
            <<<grid, kThreads, 0, stream>>>(in_codes, in_scales, M, K, group0, tile0, out_codes, out_scales);
      else
        mxfp4_row_to_fp8_row_kernel<false>
            <<<grid, kThreads, 0, stream>>>(in_codes, in_scales, M, K, group0, tile0, out_codes, out_scales);
    }
  }
  CUDA_CHECK_LAUNCH();
}

void mxfp4_row_to_fp8_row_naive(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                                bf16* workspace, uint8_t* out_codes, float* out_scales, cudaStream_t stream) {
  const char* what = "mxfp4_row_to_fp8_row_naive";
  detail::check_mx_row_shape(what, M, K);
  if (M == 0) return;
  detail::check_mx_pointer(what, "workspace", workspace, 16);
  // Everything the second launch needs is checked before the first one runs.
  detail::check_mx_pointer(what, "out_codes", out_codes, 16);
  detail::check_mx_pointer(what, "out_scales", out_scales, 16);
  mxfp4_to_bf16(in_codes, in_scales, M, K, workspace, stream);
  bf16_to_fp8_row(workspace, M, K, Fp8ScaleMode::pow2, out_codes, out_scales, nullptr, stream);
}

}  // namespace fp4moe
