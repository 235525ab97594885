// MXFP4 x MXFP4 GEMMs on FP8 tensor cores (paper 2's MXFP4 Fprop, Dgrad and Wgrad, ../shared/PAPER-NUMBERS.md P2,
// on Hopper, which has no FP4 tensor cores): both operands are given as MXFP4 along the reduction dimension
// (OCP MX v1.0: E2M1 codes and one UE8M0 scale per 32 elements), converted by the direct MXFP4 -> FP8 rule to
// 1x128 groups on both sides (mxfp4_row_to_fp8_row.h: bit operations, no BF16 round trip) and multiplied by
// cuBLASLt with VEC128_32F x VEC128_32F scales (cublaslt_matmul.h), FP32 accumulation.
//
// Where the product is NOT exactly the product of the dequantized MXFP4 operands:
//   1. Conversion: a 128-group takes the scale 2^(E - 6), E the largest of its four block exponents; a block with
//      exponent e keeps its values exactly while E - e <= 14 and is rounded to nearest even (E4M3 subnormals,
//      smallest 2^-9 of the group scale) beyond: an exponent spread > 14 within a 128-group (formats.h
//      e2m1_to_e4m3_shifted). At E - e >= 19 every value of the block (|code| <= 6) rounds to zero.
//      mxfp4_gemm_fp8_ref below gives the product of the converted operands, that deviation included.
//   2. Accumulation: the tensor cores add the products of a 128-group in their own order with a reduced-precision
//      accumulator (DeepSeek-V3 report sec. 3.3.2: about 14 bits on Hopper's FP8 MMA), cuBLASLt then scales and
//      adds the groups in FP32; the output is rounded to BF16 or FP32 once. The GPU tests bound the difference to
//      the FP64 product by (2^-10 + K 2^-24) sum_k |a_k b_k|, plus the output rounding.
// Exact otherwise: E4M3 x E4M3 products (4-bit significands) and the power-of-two scales are exact in FP32 while
// the results stay in FP32's normal range.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gemm/cublaslt_matmul.h"
#include "kernels/gemm/grouped_gemm.h"

namespace fp4moe {

// MXFP4 row tensor [R, K] (layouts.h): codes uint8 [R, K/2] (16-byte aligned), scales uint8 UE8M0 [R, K/32].
struct Mxfp4RowOperand {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
};

// MXFP4 column tensor over ragged groups (layouts.h; bf16_to_mxfp4_col_ragged): codes 16-byte aligned.
struct Mxfp4ColOperand {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
};

// ---- Dense: Y [M, N] = A [M, K] B [N, K]^T -----------------------------------------------------------------------
// Fprop: A = X, B = W (both along K); Dgrad: A = dY along N, B = W^T along N (bf16_to_mxfp4_col of W).
// Workspace (device, 256-byte aligned, caller-owned, overwritten): A and B as FP8 1x128 row tensors,
// mxfp4_gemm_workspace_bytes(M, N, K) bytes: codes M K + N K bytes, scales 4 (ceil(K/128) (M + N)) bytes, each
// part starting at a multiple of 256 bytes.
size_t mxfp4_gemm_workspace_bytes(int64_t M, int64_t N, int64_t K);

// y: [M, N] row-major, BF16 or FP32 (accumulate: FP32 only, y += product). Two conversions and one cuBLASLt call
// on `stream` through `lt` (which serves that stream).
// Rejects (fp4moe::Error, before any launch): M <= 0 or M % 4 != 0, N <= 0 or N % 16 != 0 (cuBLASLt's block-scaled
// FP8 shapes, the 16-byte output rows), K <= 0 or K % 32 != 0, null or misaligned operand, output or workspace
// pointers, a workspace smaller than mxfp4_gemm_workspace_bytes, accumulation into BF16.
void mxfp4_gemm(CublasLtMatmul& lt, Mxfp4RowOperand a, Mxfp4RowOperand b, int64_t M, int64_t N, int64_t K,
                void* workspace, size_t workspace_bytes, GemmOutput y, cudaStream_t stream);

// The converted operands inside such a workspace (after a mxfp4_gemm call on the same M, N, K): A and B as FP8
// 1x128 row tensors, for callers (benchmarks) that time the GEMM step alone.
struct Fp8RowPair {
  Fp8RowOperand a, b;
};
Fp8RowPair mxfp4_gemm_fp8_operands(void* workspace, int64_t M, int64_t N, int64_t K);

// The GEMM step alone: Y = A B^T for A [M, K] and B [N, K] as FP8 1x128 row tensors (layouts.h), VEC128 x VEC128.
// Same shape rules and rejections as mxfp4_gemm (workspace aside). Also cuBLASLt's plain FP8 GEMM of that shape.
void fp8_row_gemm(CublasLtMatmul& lt, Fp8RowOperand a, Fp8RowOperand b, int64_t M, int64_t N, int64_t K,
                  GemmOutput y, cudaStream_t stream);

// ---- Grouped Wgrad: dW_g [N, K] = dY_g^T X_g per expert, tokens the reduction dimension ---------------------------
// dy: MXFP4 column tensor of dY [M, N], x: of X [M, K], both over `split` (bf16_to_mxfp4_col_ragged, groups padded
// to L_g = round_up(M_g, 32) zero tokens). Each non-empty group's [N, L_g] and [K, L_g] are converted by
// mxfp4_row_to_fp8_row (one launch per group and operand; the host offsets place them) into the workspace as FP8
// column tensors padded to 32 tokens (scales [ceil(M_g/128), N] per group, as layouts.h's FP8 column tensor), then
// multiplied by GroupedGemm::wgrad_fp8 with token_pad 32. dw: [G, N, K] (BF16 or FP32, accumulate as there; an
// empty group gives dW_g = 0 or leaves it when accumulating).
// Workspace (device, 256-byte aligned): mxfp4_wgrad_workspace_bytes(M, N, K, G): codes (N + K)(M + 31 G) bytes,
// scales 4 (N + K)(ceil(M/128) + G) bytes.
// Rejects: N or K not positive multiples of 16, what GroupedGemm::wgrad_fp8 rejects (split, output), null or
// misaligned pointers, a small workspace.
size_t mxfp4_wgrad_workspace_bytes(int64_t M, int64_t N, int64_t K, int64_t G);
// The converted operands inside such a workspace (after a mxfp4_wgrad_grouped call on the same split): FP8 column
// tensors padded to 32 tokens, for GroupedGemm::wgrad_fp8 with token_pad 32.
struct Fp8ColPair {
  Fp8ColOperand dy, x;
};
Fp8ColPair mxfp4_wgrad_fp8_operands(void* workspace, int64_t M, int64_t N, int64_t K, int64_t G);
void mxfp4_wgrad_grouped(GroupedGemm& gg, Mxfp4ColOperand dy, Mxfp4ColOperand x, int64_t N, int64_t K,
                         const GroupSplit& split, void* workspace, size_t workspace_bytes, GemmOutput dw,
                         cudaStream_t stream);

// ---- CPU references (host memory; same shape rules as mxfp4_gemm) -----------------------------------------------
// y [M, N] row-major FP64: the exact product of the dequantized MXFP4 operands (e2m1 x 2^(scale - 127); a NaN
// scale makes its values NaN).
void mxfp4_gemm_exact_ref(Mxfp4RowOperand a, Mxfp4RowOperand b, int64_t M, int64_t N, int64_t K, double* y);
// y [M, N] FP64: the exact product of the FP8 operands the GPU multiplies (mxfp4_row_to_fp8_row_ref of A and B):
// equal to mxfp4_gemm_exact_ref where no 128-group has an exponent spread > 14, the conversion's rounding else.
void mxfp4_gemm_fp8_ref(Mxfp4RowOperand a, Mxfp4RowOperand b, int64_t M, int64_t N, int64_t K, double* y);
// The MXFP4 row tensor [R, K] dequantized into FP64 (the values above), r-major.
void mxfp4_dequantize_f64_ref(Mxfp4RowOperand t, int64_t R, int64_t K, double* out);

}  // namespace fp4moe
