// Fused MXFP4 -> FP8 column conversion for Wgrad (the paper's FP4RowToFP8Col): dequantize, transpose and
// requantize in one pass through shared memory, over ragged expert groups, without padding the cached tensor.
//
// Rule (DESIGN.md "Direct MXFP4 -> FP8 (column)"; the paper's FP4RowToFP8Col): the input is the cached MXFP4 row
// tensor [M, K]; group g (rows offsets[g] .. offsets[g+1]-1) becomes a [K, M_g] E4M3 matrix with 1x128 blocks
// along tokens. Within a block (one feature k, up to 128 consecutive tokens of the group), each element keeps its
// own row's MX exponent e_t = scale byte - 127; E = max e_t over the block's non-NaN elements,
// s = direct_group_scale_exponent(E) = max(E - 6, -126), the block's fp32 scale is 2^s and each code is
// e2m1_to_e4m3_shifted(code, e_t - s): never saturates, exact while E - e_t <= 14, RNE beyond (formats.h).
// Elements of NaN MX blocks (scale byte 0xFF) become 0x7F; a block with only NaN elements gets scale 1.
// An all-zero MX block (scale byte 0, codes 0) takes part in E with e_t = -127 and gives zero codes.
// Bit operations only, no float arithmetic on values.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

// in_codes [M, K/2] uint8 packed E2M1, in_scales [M, K/32] uint8 UE8M0: MXFP4 row (layouts.h), device;
//   in_codes 16-byte aligned; both may be null when M = 0.
// offsets: int32 [G+1] on the device, offsets[0] = 0, non-decreasing, offsets[G] = M, 1 <= G <= 1024. Read by
//   the kernel itself (no host sync, no per-expert launch): the grid has ceil(M/128) + G token-block slots and each
//   thread block finds its group from the offsets. Device offsets that are not a valid split of M make the kernel
//   write nothing at all (never out of bounds); host_offsets (optional, a host copy [G+1]) is validated before the
//   launch and then rejected with a message instead.
// out_codes: E4M3 column tensor over ragged groups (layouts.h), 16-byte aligned, capacity
//   fp8_col_codes_capacity(M, K, G) bytes; group g at K * P_g as [K, round_up(M_g, 16)], padding columns zero.
// out_scales: fp32, capacity fp8_col_scales_capacity(M, K, G) floats; group g at K * Q_g as [ceil(M_g/128), K].
// Only the layout's extent is written (K * sum_g round_up(M_g, 16) codes, K * sum_g ceil(M_g/128) scales); the
// rest of the capacity is left as it was. Groups of 0 rows and of any size (not multiples of 16 or 128) are fine.
// Asynchronous on `stream`.
// Rejects (fp4moe::Error, before any launch): M < 0 or M >= 2^31, K <= 0 or K % 32 != 0 (the message names
// [M, K]), G outside [1, 1024], null or misaligned pointers, and (when host_offsets is given) offsets that do not
// start at 0, decrease or do not end at M.
void mxfp4_row_to_fp8_col(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                          const int32_t* offsets, int64_t G, const int32_t* host_offsets, uint8_t* out_codes,
                          float* out_scales, cudaStream_t stream);

// CPU reference: the same layouts in host memory, offsets on the host (validated the same way; any G >= 1).
// Writes exactly the layout's extent.
void mxfp4_row_to_fp8_col_ref(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                              const int32_t* offsets, int64_t G, uint8_t* out_codes, float* out_scales);

}  // namespace fp4moe
