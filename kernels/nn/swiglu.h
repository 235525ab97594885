// SwiGLU activation (Shazeer 2020) of the DeepSeek-V3 FFNs and experts, w2(silu(w1 x) * w3 x): the gate and up
// projections come out of one GEMM as a packed [M, 2F] tensor, gate in columns 0..F-1, up in F..2F-1 of each row
// (the fused fc1 layout of Megatron-Core's gated linear unit).
//
//   y[m, f]            = silu(gate) * up,  gate = in[m, f], up = in[m, F + f],  silu(g) = g * sigmoid(g)
// Backward, with s = sigmoid(gate):
//   dinput[m, f]       = dy * up * s * (1 + gate * (1 - s))      (d gate)
//   dinput[m, F + f]   = dy * silu(gate)                         (d up)
// Computed in FP32 (sigmoid = 1 / (1 + exp(-g)) with the accurate expf), each output rounded once to BF16 (RNE).
//
// Layouts: input, dinput [M, 2F] BF16 row-major; y, dy [M, F] BF16 row-major. M = tokens, F = FFN width.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

// input [M, 2F] -> y [M, F]. Device pointers; F % 8 == 0 with 16-byte aligned pointers takes the 16-byte vector
// path, anything else the scalar path (same results). y must not overlap input.
// Rejects (fp4moe::Error, before any launch): M < 0, F < 1, M * 2F beyond 2^62, and for M > 0 null or
// misaligned (2 bytes) pointers. M = 0 launches nothing. Asynchronous on `stream`.
void swiglu_forward(const bf16* input, int64_t M, int64_t F, bf16* y, cudaStream_t stream);

// dy [M, F], input [M, 2F] (the forward's input) -> dinput [M, 2F] (overwritten; must not overlap input or dy).
// Same rejections and paths as swiglu_forward.
void swiglu_backward(const bf16* dy, const bf16* input, int64_t M, int64_t F, bf16* dinput, cudaStream_t stream);

// ---- CPU references (swiglu_ref.cpp) -------------------------------------------------------------------------

// Same contract on host memory, computed in double and rounded once to BF16. Same rejections (alignment aside).
void swiglu_forward_ref(const bf16* input, int64_t M, int64_t F, bf16* y);
void swiglu_backward_ref(const bf16* dy, const bf16* input, int64_t M, int64_t F, bf16* dinput);

// The same formulas in double, for finite-difference checks.
void swiglu_forward_f64(const double* input, int64_t M, int64_t F, double* y);
void swiglu_backward_f64(const double* dy, const double* input, int64_t M, int64_t F, double* dinput);

}  // namespace fp4moe
