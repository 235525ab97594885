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

// in_codes [M, K/2], in_scales [M, K/32] (MXFP4 row, layouts.h); out_codes [M, K] E4M3,
// out_scales fp32 [ceil(K/128), round_up(M, 4)] (FP8 1x128 row layout, layouts.h). All device, 16-byte aligned.
// Rejects: M < 0, K <= 0 or K % 32 != 0, null or misaligned pointers.
void mxfp4_row_to_fp8_row(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                          uint8_t* out_codes, float* out_scales, cudaStream_t stream);

void mxfp4_row_to_fp8_row_ref(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                              uint8_t* out_codes, float* out_scales);

}  // namespace fp4moe
