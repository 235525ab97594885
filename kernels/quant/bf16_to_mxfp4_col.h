// BF16 -> MXFP4 column quantization: X [M, K] quantized along M (blocks of 32 consecutive rows of one column),
// written as the MXFP4 row tensor of X^T. The quantizer of paper 2's Wgrad operands (dY and X along tokens, the
// reduction dimension of dW = dY^T X, ragged per expert) and of W^T for Dgrad (along N). Source of the format:
// OCP MX v1.0 sec. 6.3; of the ladder: ../shared/PAPER-NUMBERS.md P2.
//
// Rule: that of bf16_to_mxfp4_row.h applied to the rows of X^T (for the ragged form: of each group's zero-padded
// X_g^T), with the same MxQuantConfig:
//   - transform (none, h16, h32, rht) along M, in FP32, rounded to BF16 before the block rule; rht's sign s_j
//     belongs to position j of the row of X^T (j = m for the dense form, the token's index within its group for
//     the ragged form), so each output row is exactly what bf16_to_mxfp4_row gives for that row of X^T (a launch
//     over a row range with row_offset > 0 transforms within that range, its signs starting at j = 0);
//   - stochastic rounding keyed by the element's index in X: element (m, k) draws
//     mx_sr_uniform(seed, (row_offset + m) * K + k), whatever the launch shape, the split or the padding
//     (padding elements are zero and round to zero).
// Both operands of a GEMM quantized along the same reduction dimension with the same transform give the exact
// product of the untransformed operands, up to the MXFP4 rounding (mx_transform.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"

namespace fp4moe {

// Largest K (columns of X) the column quantizers take: 65535 tiles of 32 columns (the grid's second dimension).
constexpr int64_t kMxColMaxK = int64_t{65535} * 32;

// Dense form.
// x      [M, K] BF16, row-major, device, 16-byte aligned. M % 32 == 0 (the MX block runs along M).
// codes  [K, M/2] uint8 packed E2M1 = the MXFP4 row layout of X^T (layouts.h), device, 16-byte aligned.
// scales [K, M/32] uint8 UE8M0, device, any alignment.
// nonfinite_blocks: optional device counter (8-byte aligned) incremented by the NaN/Inf blocks; caller zeroes it.
// Rejects (fp4moe::Error, before any launch): M < 0 or M % 32 != 0, K <= 0 or K % 8 != 0 (16-byte row loads),
// M >= 2^31, K > kMxColMaxK, an unknown scale mode, rounding or transform, row_offset < 0, and for M > 0 null or
// misaligned pointers. M = 0 launches nothing. Asynchronous on `stream`.
void bf16_to_mxfp4_col(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                       const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream);

// Ragged form over row groups (experts; tokens are the reduction dimension of Wgrad): offsets int32 [G+1],
// offsets[0] = 0, non-decreasing, offsets[G] = M (kernels/common/offsets.h), 1 <= G <= 1024, on the device (read
// by the kernel: no host sync); host_offsets (optional, the same values on the host) is validated before the
// launch. Blocks never cross a group boundary: group g (M_g = offsets[g+1] - offsets[g] rows) is padded with zero
// rows to L_g = round_up(M_g, 32) and written as the MXFP4 row tensor of its [K, L_g] transpose
// (layouts.h "MXFP4 column tensor over ragged groups"): codes at codes + K * P_g / 2 as [K, L_g / 2], scales at
// scales + K * P_g / 32 as [K, L_g / 32], P_g = sum_{h<g} L_h. The zero padding leaves every product over tokens
// unchanged (the other operand is padded alike). Capacities: mxfp4_col_codes_capacity and
// mxfp4_col_scales_capacity (layouts.h), whatever the split; only the layout's extent is written.
// Downstream the FP8 conversion (mxfp4_row_to_fp8_row on each group's [K, L_g]) makes 1x128 groups along
// tokens: the last one of a group covers L_g - 128 * floor((L_g - 1) / 128) tokens, the rest padding zeros.
// Device offsets that are not a valid split of M make the kernel write nothing.
// Rejects what the dense form rejects (M % 32 aside: any M in [0, 2^31)), G outside [1, 1024], null device
// offsets, and invalid host_offsets.
void bf16_to_mxfp4_col_ragged(const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                              const int32_t* host_offsets, uint8_t* codes, uint8_t* scales,
                              const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream);

// CPU references on host memory, same layouts and rejections (alignment aside; any G >= 1); offsets on the host.
// Return the number of NaN/Inf blocks. Written from the rule above with the row quantizer's reference; the GPU
// kernels must match them bit for bit.
int64_t bf16_to_mxfp4_col_ref(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                              const MxQuantConfig& cfg);
int64_t bf16_to_mxfp4_col_ragged_ref(const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                                     uint8_t* codes, uint8_t* scales, const MxQuantConfig& cfg);

namespace detail {
// The argument checks of the column quantizers (`what` names the caller; `ragged`: any M, else M % 32 == 0).
void check_mx_col_config(const char* what, int64_t M, int64_t K, bool ragged, const MxQuantConfig& cfg);

// The four kernels behind the column quantizers (bf16_to_mxfp4_col.cu), which give the same bits:
// block_per_thread (mx_col_block.cuh: each thread quantizes one MX block of 4 adjacent columns, the block rule once
// per block, no transpose, and stores its own codes and scales), block_staged (the same, the thread block's outputs
// gathered in shared memory and stored as whole runs per row of X^T), register_tile (each thread loads 8 rows x 8
// columns and transposes them in registers, the block rule per chunk of 8 over shuffles) and shared_tile (the
// earliest: 128 x 32 tiles transposed through shared memory). bf16_to_mxfp4_col and bf16_to_mxfp4_col_ragged run
// mx_col_default_kernel(rounding, transform); bench_quant and the GPU tests run all four. Same arguments and
// rejections as the public forms.
enum class MxColKernel : int { register_tile = 0, shared_tile = 1, block_per_thread = 2, block_staged = 3 };
MxColKernel mx_col_default_kernel(Rounding rounding, HadamardTransform transform);
void bf16_to_mxfp4_col_using(MxColKernel kernel, const bf16* x, int64_t M, int64_t K, uint8_t* codes,
                             uint8_t* scales, const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks,
                             cudaStream_t stream);
void bf16_to_mxfp4_col_ragged_using(MxColKernel kernel, const bf16* x, int64_t M, int64_t K, const int32_t* offsets,
                                    int64_t G, const int32_t* host_offsets, uint8_t* codes, uint8_t* scales,
                                    const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks,
                                    cudaStream_t stream);
}  // namespace detail

}  // namespace fp4moe
