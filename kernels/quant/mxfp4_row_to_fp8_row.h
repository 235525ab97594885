// Direct MXFP4 -> FP8 1x128 row conversion (the paper's FP4RowToFP8Row), used for Fprop on the dispatched
// MXFP4 expert input: bit operations only, no BF16 round trip, no float arithmetic on the values.
//
// Rule (DESIGN.md "Direct MXFP4 -> FP8 (row)"): each 1x128 group of a row is made of up to four MX blocks with
// exponents e_i = scale_i - 127 (NaN blocks excluded); E = max e_i; the group scale is S = 2^s with
// s = direct_group_scale_exponent(E) = max(E - 6, -126); each code is e2m1_to_e4m3_shifted(code, e_i - s).
// Never saturates (6 * 2^6 = 384 < 448); exact while E - e_i <= 14, rounds to nearest even beyond.
// A NaN MX block (scale 0xFF) yields 0x7F for its 32 elements only. A group with only NaN blocks gets S = 1.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

// in_codes  [M, K/2] uint8 packed E2M1 (MXFP4 row, layouts.h), device, 16-byte aligned.
// in_scales [M, K/32] uint8 UE8M0, device, any alignment.
// out_codes [M, K] uint8 E4M3, row-major, device, 16-byte aligned.
// out_scales fp32 [ceil(K/128), round_up(M, 4)] (FP8 1x128 row layout, layouts.h), device, 4-byte aligned; the
//   scale of group (m, b) is 2^s (a normal fp32); the padding rows M..round_up(M, 4)-1 are written with 1.0.
// Every output byte is written. Rejects (fp4moe::Error, before any launch): M < 0, K <= 0 or K % 32 != 0 (the
// message names the shape), M * K beyond 2^62, and for M > 0 null or misaligned pointers. M = 0 launches nothing.
void mxfp4_row_to_fp8_row(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                          uint8_t* out_codes, float* out_scales, cudaStream_t stream);

// CPU reference on host memory, same layouts and rejections (alignment aside), element by element from the rule.
void mxfp4_row_to_fp8_row_ref(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                              uint8_t* out_codes, float* out_scales);

// The naive baseline the direct conversion replaces: MXFP4 -> BF16 (mxfp4_to_bf16, into `workspace`) and then
// BF16 -> FP8 1x128 row with pow2 scales (bf16_to_fp8_row, Fp8ScaleMode::pow2). Two launches on `stream`, BF16
// written to and read back from memory. Same inputs and output layout as mxfp4_row_to_fp8_row, but its results
// differ: the group scale follows the group's real amax (2^ceil(log2(amax / 448)), 1 for an all-zero group)
// rather than 2^(E - 6), and a NaN MX block turns its whole 128-element group into NaN (scale NaN, codes 0x7F).
// workspace: BF16 [M, K], device, 16-byte aligned, overwritten.
// Rejects what mxfp4_to_bf16 and bf16_to_fp8_row reject, and a null workspace for M > 0.
void mxfp4_row_to_fp8_row_naive(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                                bf16* workspace, uint8_t* out_codes, float* out_scales, cudaStream_t stream);

}  // namespace fp4moe
