// Fused MXFP4 -> FP8 column conversion for Wgrad (the paper's FP4RowToFP8Col): dequantize, transpose and
// requantize in one pass through shared memory, over ragged expert groups, without padding the cached tensor.
//
// Rule (DESIGN.md "Direct MXFP4 -> FP8 (column)"): the input is the cached MXFP4 row tensor [M, K]; group g
// (rows offsets[g] .. offsets[g+1]-1) becomes a [K, M_g] E4M3 matrix with 1x128 blocks along tokens. Within a
// block (one feature k, up to 128 consecutive tokens of the group), each element keeps its own row's MX
// exponent e_t; E = max e_t over the block's non-NaN elements, s = max(E - 6, -126), and each code is
// e2m1_to_e4m3_shifted(code, e_t - s). Elements of NaN MX blocks become 0x7F. Bit operations only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

// in_codes [M, K/2], in_scales [M, K/32]: MXFP4 row (layouts.h), device.
// offsets: int32 [G+1] on the device, offsets[0] = 0, non-decreasing, offsets[G] = M. Read by the kernel;
//   the host never waits for them. host_offsets (optional, [G+1] host copy) is validated before the launch.
// out_codes: E4M3 column tensor over ragged groups, capacity fp8_col_codes_capacity(M, K, G) bytes.
// out_scales: fp32, capacity fp8_col_scales_capacity(M, K, G) floats (layouts.h).
// Groups of 0 rows and of any size (not multiples of 32 or 128) are fine; only the layout's padding columns
// beyond M_g are written with zeros; nothing past a group's extent is written.
// Rejects: M < 0, K <= 0 or K % 32 != 0, G < 1, null pointers, and (when host_offsets is given) offsets that do
// not start at 0, decrease or do not end at M.
void mxfp4_row_to_fp8_col(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                          const int32_t* offsets, int64_t G, const int32_t* host_offsets, uint8_t* out_codes,
                          float* out_scales, cudaStream_t stream);

// CPU reference (offsets on the host; validated the same way).
void mxfp4_row_to_fp8_col_ref(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                              const int32_t* offsets, int64_t G, uint8_t* out_codes, float* out_scales);

}  // namespace fp4moe
