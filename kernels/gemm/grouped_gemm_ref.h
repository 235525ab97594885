// CPU reference of the grouped expert GEMMs (grouped_gemm.h): FP32 operands (the exact dequantized values of the
// BF16 or FP8 operands the GPU saw), products summed in double, each result rounded once to fp32.
//
//   Fprop  y[r, n]     = sum_k x[r, k]  w[g, n, k]       for rows r of group g
//   Dgrad  dx[r, k]    = sum_n dy[r, n] w[g, n, k]
//   Wgrad  dw[g, n, k] = sum_{r in g} dy[r, n] x[r, k]   (0 for an empty group)
// x [M, K], w [G, N, K], dy [M, N], y [M, N], dx [M, K], dw [G, N, K]: host, row-major fp32.
// offsets: host int32 [G+1] (validated: starts at 0, non-decreasing, ends at M; fp4moe::Error otherwise).
//
// rows: which output rows to compute (token rows of y/dx for Fprop/Dgrad, rows n of every dw_g for Wgrad);
// empty means all. Rows not listed are left untouched, so a test can check a sample of a large output.
// Work is spread over the machine's hardware threads (results do not depend on their number).
// Rejects: M < 0, N < 1, K < 1, null pointers (the operands may be null when M = 0, and so may the output of Fprop
// and Dgrad, which is then empty; Wgrad's [G, N, K] output may not), rows out of range.
#pragma once

#include <cstdint>
#include <span>

namespace fp4moe {

void grouped_fprop_ref(const float* x, const float* w, int64_t M, int64_t N, int64_t K, const int32_t* offsets,
                       int64_t G, float* y, std::span<const int64_t> rows = {});

void grouped_dgrad_ref(const float* dy, const float* w, int64_t M, int64_t N, int64_t K, const int32_t* offsets,
                       int64_t G, float* dx, std::span<const int64_t> rows = {});

void grouped_wgrad_ref(const float* dy, const float* x, int64_t M, int64_t N, int64_t K, const int32_t* offsets,
                       int64_t G, float* dw, std::span<const int64_t> rows = {});

// Relative L2 error ||got - want|| / ||want|| over n values (in double); 0 when both are all zeros, +inf when
// want is all zeros and got is not, NaN when got holds a NaN or Inf (an unwritten, poisoned element).
double relative_l2_error(const float* got, const float* want, int64_t n);

}  // namespace fp4moe
