// BF16 -> FP8 E4M3 quantization, the TransformerEngine Float8BlockScaling-like baseline of the fp8 recipe:
// 1x128 blocks for activations and gradients (row and column copies), 128x128 blocks for weights.
//
// Rules (DESIGN.md "FP8 1x128 block"): amax over the block; pow2 scale s = 2^fp8_pow2_scale_exponent(amax),
// code = E4M3(v * 2^-p) (exact power-of-two product, then RNE with saturation); fp32 scale s = amax / 448,
// code = E4M3(v * (448 / amax)) with two fp32 round-to-nearest operations (448/amax saturated to FLT_MAX).
// amax = 0 -> s = 1, codes 0. A block holding NaN/Inf -> s = NaN, codes 0x7F, counted.
// The dequantized value is e4m3(code) * s.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"
#include "kernels/formats/formats.h"

namespace fp4moe {

// x [M, K] BF16 row-major -> FP8 1x128 row tensor: codes [M, K], scales [ceil(K/128), round_up(M, 4)]
// (layouts.h). All device, 16-byte aligned. nonfinite_blocks: optional device counter.
// Rejects: M < 0, K <= 0 or K % 16 != 0, null or misaligned pointers.
void bf16_to_fp8_row(const bf16* x, int64_t M, int64_t K, Fp8ScaleMode mode, uint8_t* codes, float* scales,
                     unsigned long long* nonfinite_blocks, cudaStream_t stream);
int64_t bf16_to_fp8_row_ref(const bf16* x, int64_t M, int64_t K, Fp8ScaleMode mode, uint8_t* codes,
                            float* scales);

// x [M, K] BF16 row-major split into ragged groups by int32 offsets [G+1] (device; host_offsets optional, for
// validation before launch) -> FP8 column tensor over ragged groups (layouts.h): group g is [K, M_g] with 1x128
// blocks along tokens, padded with zero columns to round_up(M_g, 16).
// Rejects: M < 0, K <= 0 or K % 16 != 0, G < 1, null pointers, invalid host_offsets.
void bf16_to_fp8_col(const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                     const int32_t* host_offsets, Fp8ScaleMode mode, uint8_t* codes, float* scales,
                     unsigned long long* nonfinite_blocks, cudaStream_t stream);
int64_t bf16_to_fp8_col_ref(const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                            Fp8ScaleMode mode, uint8_t* codes, float* scales);

// w [N, K] BF16 row-major -> FP8 128x128 block tensor (layouts.h). transpose = true writes W^T instead:
// codes [K, N] and scales [ceil(K/128), round_up(ceil(N/128), 4)] (the same blocks, for Dgrad).
// Rejects: N <= 0, K <= 0, N % 16 != 0 or K % 16 != 0, null or misaligned pointers.
void bf16_to_fp8_block128(const bf16* w, int64_t N, int64_t K, Fp8ScaleMode mode, bool transpose,
                          uint8_t* codes, float* scales, unsigned long long* nonfinite_blocks,
                          cudaStream_t stream);
int64_t bf16_to_fp8_block128_ref(const bf16* w, int64_t N, int64_t K, Fp8ScaleMode mode, bool transpose,
                                 uint8_t* codes, float* scales);

// Host dequantization of the three FP8 layouts (layouts.h) to fp32: value = e4m3(code) * scale. Used by tests,
// the CLI and error reports. Column output y is [M, K] row-major again (the inverse of the transpose); padding
// columns are ignored. block128 with transpose = true reads W^T codes and writes W^T [K, N].
void fp8_row_dequantize_ref(const uint8_t* codes, const float* scales, int64_t M, int64_t K, float* y);
void fp8_col_dequantize_ref(const uint8_t* codes, const float* scales, int64_t M, int64_t K, const int32_t* offsets,
                            int64_t G, float* y);
void fp8_block128_dequantize_ref(const uint8_t* codes, const float* scales, int64_t N, int64_t K, bool transpose,
                                 float* y);

}  // namespace fp4moe
