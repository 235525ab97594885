// Elementwise glue of the trainer: residual adds and dtype casts (DESIGN.md "Trainer": the residual stream is
// BF16, gradients that several GEMMs write are summed in FP32 and cast once).
//
//   add_bf16          y[i] = BF16(float(a[i]) + float(b[i]))   one rounding (RNE); y may alias a or b
//   cast_f32_to_bf16  y[i] = BF16(x[i])                         RNE; NaN stays NaN, overflow gives +-Inf
//   cast_bf16_to_f32  y[i] = float(x[i])                        exact
//   add_bf16_into_f32 y[i] = y[i] + float(x[i])                 one FP32 rounding (RNE): a BF16 partial result
//                                                               added into an FP32 sum (Linear's FP32 Dgrad
//                                                               accumulation for the fp8 and mxfp4 recipes)
//
// Flat arrays of n elements on the device; 16-byte aligned pointers take the 8-element vector path, others the
// scalar path (same results). Rejects (fp4moe::Error, before any launch): n < 0, null pointers when n > 0, and
// for the casts and add_bf16_into_f32 overlapping x and y. n = 0 launches nothing. Asynchronous on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

void add_bf16(const bf16* a, const bf16* b, int64_t n, bf16* y, cudaStream_t stream);
void cast_f32_to_bf16(const float* x, int64_t n, bf16* y, cudaStream_t stream);
void cast_bf16_to_f32(const bf16* x, int64_t n, float* y, cudaStream_t stream);
void add_bf16_into_f32(const bf16* x, int64_t n, float* y, cudaStream_t stream);

// CPU references (elementwise_ref.cpp): the same contract on host memory.
void add_bf16_ref(const bf16* a, const bf16* b, int64_t n, bf16* y);
void cast_f32_to_bf16_ref(const float* x, int64_t n, bf16* y);
void add_bf16_into_f32_ref(const bf16* x, int64_t n, float* y);

}  // namespace fp4moe
