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
#include "kernels/quant/e2m1_e4m3_lut.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_row_checks.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"
#include "kernels/quant/mxfp4_to_bf16.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kUnit = 16;                               // elements per thread and row: 8 code bytes in, 16 out
constexpr int kThreadsPerGroup = kFp8Block / kUnit;     // 8 threads per group row
constexpr int kSlots = kThreads / kThreadsPerGroup;     // 32 rows converted at once
constexpr int kRowsPerThread = 4;                       // rows slot, slot + kSlots, ...
constexpr int kRowsPerCta = kSlots * kRowsPerThread;    // 128 rows per tile
constexpr int kBlocksPerGroup = kFp8Block / kMxBlock;   // 4
static_assert(kBlocksPerGroup == 4, "the group's scale bytes are handled as one 32-bit word");
static_assert(kRowsPerCta % 4 == 0, "row tiles cover the scale layout's padding rows");

// Sign bits of four E2M1 codes moved to bit 7 of their E4M3 bytes. `dup` holds the two code bytes as
// [b0, b0, b1, b1]: element 0 is b0's low nibble (sign at bit 3), element 1 b0's high nibble (bit 15 of dup),
// element 2 b1's low nibble (bit 19), element 3 b1's high nibble (bit 31).
__device__ __forceinline__ uint32_t e2m1x4_signs_to_e4m3(uint32_t dup) {
  return ((dup << 4) & 0x00800080u) | (dup & 0x80008000u);
}

// 16 E2M1 codes (w0: elements 0..7, w1: 8..15) of one MX block -> 16 E4M3 codes with the block's table.
__device__ __forceinline__ uint4 convert16(uint32_t w0, uint32_t w1, E2M1ToE4M3Lut t) {
  const uint32_t w[2] = {w0, w1};
  uint32_t out[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const uint32_t word = w[h / 2];
    const uint32_t quad = (h & 1) ? (word >> 16) : word;  // four codes in the low 16 bits
    const uint32_t magnitudes = __byte_perm(t.lo, t.hi, quad & 0x7777u);
    out[h] = magnitudes | e2m1x4_signs_to_e4m3(__byte_perm(quad, 0u, 0x1100u));
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// s = direct_group_scale_exponent(E) of a group whose four scale bytes are `group_scales` (byte i = MX block i;
// 0xFF for NaN blocks and for blocks past a short last group), 0 when every block is NaN. Packed byte maxima:
// byte b + 1 (mod 256) puts NaN (0xFF) at 0, below every finite exponent byte (0..254 -> 1..255).
__device__ __forceinline__ int group_scale_exponent(uint32_t group_scales) {
  const uint32_t biased = __vadd4(group_scales, 0x01010101u);
  uint32_t top = __vmaxu4(biased, biased >> 16);
  top = max(top & 0xFFu, (top >> 8) & 0xFFu);
  return top == 0u ? 0 : direct_group_scale_exponent(static_cast<int>(top) - 1 - kUE8M0Bias);
}

// 16 E4M3 codes of 16 E2M1 codes (w0: elements 0..7, w1: 8..15) of an MX block with scale byte `own` in a group
// of scale exponent s: 0x7F everywhere for a NaN block.
__device__ __forceinline__ uint4 convert16_block(uint32_t w0, uint32_t w1, uint32_t own, int s) {
  if (own == kUE8M0NaN) return make_uint4(0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu);
  return convert16(w0, w1, e2m1_to_e4m3_lut(static_cast<int>(own) - kUE8M0Bias - s));
}

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
