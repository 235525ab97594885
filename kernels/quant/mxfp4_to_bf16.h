// MXFP4 -> BF16 dequantization: v = e2m1(code) * 2^(scale - 127), rounded to nearest even into BF16 (exact
// unless it overflows, which only a scale byte above 252 can cause). A NaN scale (0xFF) gives NaN elements.
// Used by the naive MXFP4 -> BF16 -> FP8 path and by the CLI to report errors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

// codes [M, K/2] uint8 packed E2M1, scales [M, K/32] UE8M0 (layouts.h), y [M, K] BF16; all device, 16-byte aligned.
// Rejects: M < 0, K <= 0 or K % 32 != 0, null or misaligned pointers.
void mxfp4_to_bf16(const uint8_t* codes, const uint8_t* scales, int64_t M, int64_t K, bf16* y,
                   cudaStream_t stream);

void mxfp4_to_bf16_ref(const uint8_t* codes, const uint8_t* scales, int64_t M, int64_t K, bf16* y);

}  // namespace fp4moe
