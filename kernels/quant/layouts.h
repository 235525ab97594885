// Memory layouts of quantized tensors, in one place: kernels, references, GEMMs and tests index through these.
//
// MXFP4 row tensor, logical [M, K] (K % 32 == 0), blocks of 32 along K (OCP MX v1.0):
//   codes  uint8 [M, K/2]   row-major, element 2i in the low nibble of byte i, 2i+1 in the high nibble
//   scales uint8 [M, K/32]  row-major, UE8M0
//
// MXFP4 column tensor over ragged groups (bf16_to_mxfp4_col_ragged), from a row-major [M, K] input split into G
// groups of rows by int32 offsets [G+1] as below: group g is the MXFP4 row tensor of its zero-padded transpose
// [K, L_g], L_g = round_up(M_g, 32), P_g = sum_{h<g} L_h:
//   codes  uint8 at codes + K * P_g / 2, [K, L_g / 2];  scales uint8 UE8M0 at scales + K * P_g / 32, [K, L_g / 32]
//   capacities: codes K * (M + 31 G) / 2 bytes, scales K * (M + 31 G) / 32 bytes, whatever the split.
//
// FP8 1x128 row tensor, logical [R, C], blocks of 128 along C (the last block covers the rest):
//   codes  uint8 (E4M3) [R, C] row-major
//   scales fp32 [ceil(C/128), ld] with ld = round_up(R, 4): scale(r, b) = scales[b * ld + r]
//   (block-major, rows contiguous: the layout of cuBLASLt's VEC128_32F scale tensors). Padding rows hold 1.0.
//
// FP8 column tensor over ragged groups (Wgrad operands), from a row-major [M, K] input split into G groups of
// rows by int32 offsets [G+1] (offsets[0] = 0, non-decreasing, offsets[G] = M; M_g = offsets[g+1] - offsets[g]):
//   group g is the [K, M_g] transpose, blocks of 128 along tokens, stored as
//   codes  uint8 (E4M3) at codes + K * P_g, [K, L_g] row-major with L_g = round_up(M_g, 16) and
//          P_g = sum_{h<g} L_h; columns M_g..L_g-1 are zero (cuBLASLt refuses FP8 reductions of K % 16 != 0)
//   scales fp32 at scales + K * Q_g, [ceil(M_g/128), K] block-major, Q_g = sum_{h<g} ceil(M_h/128)
//   capacities: codes K * (M + 15 G) bytes, scales K * (ceil(M/128) + G) floats, whatever the split.
//
// FP8 128x128 block tensor (weights), logical [N, K]:
//   codes  uint8 (E4M3) [N, K] row-major
//   scales fp32 [ceil(N/128), ld] with ld = round_up(ceil(K/128), 4): scale(nb, kb) = scales[nb * ld + kb].
//   Padding entries hold 1.0.
#pragma once

#include <cstdint>

#include "kernels/formats/formats.h"

namespace fp4moe {

constexpr int kMxBlock = 32;       // elements per MX block (OCP MX v1.0)
constexpr int kFp8Block = 128;     // elements per FP8 1x128 block, and the side of a 128x128 weight block
constexpr int kColAlign = 16;      // token padding of each group in an FP8 column tensor

// Index helpers of the layouts above (shapes >= 0, no checks: callers validate first).
// FP8 1x128 row tensor [rows, cols]: scale leading dimension round_up(rows, 4), scale count, index of scale (r, b).
FP4MOE_HD int64_t fp8_row_scale_ld(int64_t rows) { return (rows + 3) / 4 * 4; }
FP4MOE_HD int64_t fp8_row_scale_count(int64_t rows, int64_t cols) {
  return (cols + kFp8Block - 1) / kFp8Block * fp8_row_scale_ld(rows);
}
FP4MOE_HD int64_t fp8_row_scale_index(int64_t r, int64_t block, int64_t rows) {
  return block * fp8_row_scale_ld(rows) + r;
}

// FP8 column tensor: L_g = round_up(M_g, 16) of one group; code bytes and scale floats to allocate for any split
// of M rows into G groups.
FP4MOE_HD int64_t fp8_col_group_ld(int64_t m_g) { return (m_g + kColAlign - 1) / kColAlign * kColAlign; }
FP4MOE_HD int64_t fp8_col_codes_capacity(int64_t M, int64_t K, int64_t G) { return K * (M + (kColAlign - 1) * G); }
FP4MOE_HD int64_t fp8_col_scales_capacity(int64_t M, int64_t K, int64_t G) {
  return K * ((M + kFp8Block - 1) / kFp8Block + G);
}

// MXFP4 column tensor over ragged groups: L_g = round_up(M_g, 32) of one group; bytes to allocate for any split of
// M rows into G groups.
FP4MOE_HD int64_t mxfp4_col_group_ld(int64_t m_g) { return (m_g + kMxBlock - 1) / kMxBlock * kMxBlock; }
FP4MOE_HD int64_t mxfp4_col_codes_capacity(int64_t M, int64_t K, int64_t G) {
  return K * (M + (kMxBlock - 1) * G) / 2;
}
FP4MOE_HD int64_t mxfp4_col_scales_capacity(int64_t M, int64_t K, int64_t G) {
  return K * ((M + (kMxBlock - 1) * G + kMxBlock - 1) / kMxBlock);
}

// FP8 128x128 block tensor [N, K]: scale leading dimension round_up(ceil(K/128), 4) and scale count.
FP4MOE_HD int64_t fp8_block_scale_ld(int64_t K) { return ((K + kFp8Block - 1) / kFp8Block + 3) / 4 * 4; }
FP4MOE_HD int64_t fp8_block_scale_count(int64_t N, int64_t K) {
  return (N + kFp8Block - 1) / kFp8Block * fp8_block_scale_ld(K);
}

}  // namespace fp4moe
