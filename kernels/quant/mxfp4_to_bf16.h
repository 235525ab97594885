// MXFP4 -> BF16 dequantization (OCP MX v1.0 sec. 6.1): v = e2m1(code) * 2^(scale - 127), rounded to nearest even
// into BF16. Exact (BF16 subnormals reach 2^-133, below the smallest MXFP4 value 0.5 * 2^-127) unless it
// overflows, which only a scale byte above 252 can cause: then +-Inf. Code 8 (-0) gives -0. A NaN scale (0xFF)
// gives the quiet NaN 0x7FC0 for all 32 elements of its block, whatever their codes.
// Used by the naive MXFP4 -> BF16 -> FP8 path and by the CLI to report errors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

// codes [M, K/2] uint8 packed E2M1 (layouts.h), device, 16-byte aligned.
// scales [M, K/32] uint8 UE8M0 (layouts.h), device, any alignment.
// y [M, K] BF16 row-major, device, 16-byte aligned; every element is written.
// Rejects (fp4moe::Error, before any launch): M < 0, K <= 0 or K % 32 != 0 (the message names the shape),
// M * K beyond 2^62, and for M > 0 null or misaligned pointers. M = 0 launches nothing.
void mxfp4_to_bf16(const uint8_t* codes, const uint8_t* scales, int64_t M, int64_t K, bf16* y,
                   cudaStream_t stream);

// CPU reference on host memory, same rejections (alignment aside).
void mxfp4_to_bf16_ref(const uint8_t* codes, const uint8_t* scales, int64_t M, int64_t K, bf16* y);

}  // namespace fp4moe
