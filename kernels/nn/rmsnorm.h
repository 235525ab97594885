// RMSNorm (Zhang & Sennrich 2019), the normalization of every DeepSeek-V3 block (attention input, FFN/MoE input,
// the q and kv latent norms of MLA, the final norm; eps 1e-6 in DeepSeek-V3's configuration):
//
//   rstd[n]    = 1 / sqrt(mean_c x[n, c]^2 + eps)          FP32 statistics, saved for backward
//   y[n, c]    = x[n, c] * rstd[n] * weight[c]             computed in FP32, rounded once to BF16 (RNE)
//
// Backward, with xhat = x * rstd and g = dy * weight:
//   dx[n, c]   = rstd[n] * (g[n, c] - xhat[n, c] * mean_c(g[n, c] * xhat[n, c]))
//   dweight[c] = sum_n dy[n, c] * xhat[n, c]                FP32, summed in a fixed order (deterministic)
//
// Layouts: x, y, dy, dx are [N, C] BF16 row-major (row n at n * C); weight [C] BF16; rstd [N] FP32;
// dweight [C] FP32. N = tokens (rows), C = features.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

// x [N, C] BF16, weight [C] BF16 -> y [N, C] BF16 and rstd [N] FP32 (rstd may be null: not saved, e.g. recompute).
// Device pointers; 16-byte aligned pointers with C % 8 == 0 take the 16-byte vector path, any other shape or
// 2-byte alignment the scalar path (same results). In place (y == x) is allowed.
// Rejects (fp4moe::Error, before any launch): N < 0, C < 1, N * C beyond 2^62, eps not finite or <= 0, and for
// N > 0 null or misaligned x, weight, y. N = 0 launches nothing. Asynchronous on `stream`.
void rmsnorm_forward(const bf16* x, const bf16* weight, int64_t N, int64_t C, float eps, bf16* y, float* rstd,
                     cudaStream_t stream);

// FP32 elements of the workspace that rmsnorm_backward needs for N x C: the per-split partial sums of dweight.
int64_t rmsnorm_backward_workspace_floats(int64_t N, int64_t C);

// dy [N, C] BF16, x [N, C] BF16, weight [C] BF16, rstd [N] FP32 (from rmsnorm_forward)
//   -> dx [N, C] BF16 (overwritten) and dweight [C] FP32 (overwritten, or added to when accumulate_dweight, as in
//      gradient accumulation over micro-batches).
// workspace: device FP32 buffer of rmsnorm_backward_workspace_floats(N, C) elements, contents ignored.
// dx may alias dy (in place). The result is deterministic (no atomics; fixed summation order for a given N, C).
// Rejects: as rmsnorm_forward, plus null rstd, dweight, workspace. N = 0 leaves dx alone and sets dweight to 0
// (or leaves it unchanged when accumulating).
void rmsnorm_backward(const bf16* dy, const bf16* x, const bf16* weight, const float* rstd, int64_t N, int64_t C,
                      bf16* dx, float* dweight, bool accumulate_dweight, float* workspace, cudaStream_t stream);

// ---- CPU references (rmsnorm_ref.cpp) ------------------------------------------------------------------------

// Same contract on host memory, computed in double and rounded once to the output type; the GPU kernels must agree
// within FP32 rounding (tests/nn/test_nn_rmsnorm_gpu.cpp states the tolerances). Same rejections (alignment aside).
void rmsnorm_forward_ref(const bf16* x, const bf16* weight, int64_t N, int64_t C, float eps, bf16* y, float* rstd);
void rmsnorm_backward_ref(const bf16* dy, const bf16* x, const bf16* weight, const float* rstd, int64_t N, int64_t C,
                          bf16* dx, float* dweight, bool accumulate_dweight);

// The same formulas entirely in double (rstd computed from x), for finite-difference checks of the backward pass.
// rstd may be null in forward. dweight is overwritten.
void rmsnorm_forward_f64(const double* x, const double* weight, int64_t N, int64_t C, double eps, double* y,
                         double* rstd);
void rmsnorm_backward_f64(const double* dy, const double* x, const double* weight, const double* rstd, int64_t N,
                          int64_t C, double* dx, double* dweight);

}  // namespace fp4moe
