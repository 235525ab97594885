// BF16 -> FP8 E4M3 quantization, the TransformerEngine Float8BlockScaling-like baseline of the fp8 recipe:
// 1x128 blocks for activations and gradients (row and column copies), 128x128 blocks for weights.
//
// Rules (DESIGN.md "FP8 1x128 block"; TransformerEngine's Float8BlockScaling with power-of-two scales, the
// DeepSeek-V3 tile/block quantization), fp8_block_scale.h: amax = max |v| over the block; pow2 scale
// s = 2^fp8_pow2_scale_exponent(amax), code = E4M3(v * 2^-p) (exact power-of-two product, then RNE with
// saturation); fp32 scale s = amax / 448, code = E4M3(v * (448 / amax)) with two fp32 round-to-nearest operations,
// and the pow2 floor s = 2^-126 (code = E4M3(v * 2^126)) for amax < 448 * 2^-126 (formats.h, Fp8ScaleMode).
// amax = 0 -> s = 1 and zero codes (a -0 keeps its sign bit: 0x80).
// A block holding NaN/Inf -> s = NaN (0x7FC00000), all its codes 0x7F, counted; other blocks are unaffected.
// The dequantized value is e4m3(code) * s. A short last block (K % 128 != 0) covers the remaining elements.
// GPU and CPU agree bit for bit (codes and scales). nonfinite_blocks (optional device counter) is incremented by
// the number of such blocks, never reset. All launches are asynchronous on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"
#include "kernels/formats/formats.h"

namespace fp4moe {

// x [M, K] BF16 row-major -> FP8 1x128 row tensor: codes [M, K], scales [ceil(K/128), round_up(M, 4)] with the
// padding rows set to 1.0 (layouts.h). All device, 16-byte aligned (may be null when M = 0).
// Rejects: M < 0 or M >= 2^31, K <= 0 or K % 16 != 0 (the message names [M, K]), null or misaligned pointers.
// The CPU reference returns the number of NaN/Inf blocks.
void bf16_to_fp8_row(const bf16* x, int64_t M, int64_t K, Fp8ScaleMode mode, uint8_t* codes, float* scales,
                     unsigned long long* nonfinite_blocks, cudaStream_t stream);
int64_t bf16_to_fp8_row_ref(const bf16* x, int64_t M, int64_t K, Fp8ScaleMode mode, uint8_t* codes,
                            float* scales);

// x [M, K] BF16 row-major split into ragged groups by int32 offsets [G+1] (device, read by the kernel: no host
// sync; 1 <= G <= 1024; host_offsets optional, a host copy validated before the launch) -> FP8 column tensor over
// ragged groups (layouts.h): group g is [K, M_g] at codes + K * P_g with 1x128 blocks along tokens, padded with
// zero columns to round_up(M_g, 16), scales [ceil(M_g/128), K] at scales + K * Q_g. Capacities
// fp8_col_codes_capacity / fp8_col_scales_capacity; only the layout's extent is written. Device offsets that are
// not a valid split of M make the kernel write nothing. x and codes 16-byte aligned; x may be null when M = 0.
// Rejects: M < 0 or M >= 2^31, K <= 0 or K % 16 != 0, G outside [1, 1024], null or misaligned pointers, invalid
// host_offsets (not starting at 0, decreasing, not ending at M). The CPU reference accepts any G >= 1.
void bf16_to_fp8_col(const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                     const int32_t* host_offsets, Fp8ScaleMode mode, uint8_t* codes, float* scales,
                     unsigned long long* nonfinite_blocks, cudaStream_t stream);
int64_t bf16_to_fp8_col_ref(const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                            Fp8ScaleMode mode, uint8_t* codes, float* scales);

// w [N, K] BF16 row-major -> FP8 128x128 block tensor (layouts.h): codes [N, K], scales
// [ceil(N/128), round_up(ceil(K/128), 4)] with padding entries 1.0. transpose = true writes W^T instead (for
// Dgrad): codes [K, N] and scales [ceil(K/128), round_up(ceil(N/128), 4)], the same blocks and scales transposed.
// Edge blocks (N or K not a multiple of 128) cover what remains. All device, 16-byte aligned.
// Rejects: N <= 0, K <= 0, N % 16 != 0 or K % 16 != 0 (the message names [N, K]), null or misaligned pointers.
void bf16_to_fp8_block128(const bf16* w, int64_t N, int64_t K, Fp8ScaleMode mode, bool transpose,
                          uint8_t* codes, float* scales, unsigned long long* nonfinite_blocks,
                          cudaStream_t stream);
int64_t bf16_to_fp8_block128_ref(const bf16* w, int64_t N, int64_t K, Fp8ScaleMode mode, bool transpose,
                                 uint8_t* codes, float* scales);

// Host dequantization of the three FP8 layouts (layouts.h) to fp32: value = e4m3(code) * scale (NaN codes and
// NaN scales give NaN). Used by tests, the CLI and error reports. Row: y [M, K]. Column: y is [M, K] row-major
// again (the inverse of the transpose; offsets [G+1] on the host, validated), padding columns ignored.
// block128: y [N, K]; with transpose = true it reads W^T codes [K, N] (and their scales) and writes W^T [K, N].
// Rejects the same shapes as the quantizers (K % 16, N % 16 for block128) and null pointers.
void fp8_row_dequantize_ref(const uint8_t* codes, const float* scales, int64_t M, int64_t K, float* y);
void fp8_col_dequantize_ref(const uint8_t* codes, const float* scales, int64_t M, int64_t K, const int32_t* offsets,
                            int64_t G, float* y);
void fp8_block128_dequantize_ref(const uint8_t* codes, const float* scales, int64_t N, int64_t K, bool transpose,
                                 float* y);

}  // namespace fp4moe
