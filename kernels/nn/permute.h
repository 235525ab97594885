// MoE token permutation: tokens [T, D] with top-k assignments [T, k] -> expert-sorted rows [T*k, D] in the order
// of the group offsets [E+1] (router.h), and the weighted combine back to [T, D] (unpermute), forward and backward.
// Dropless: every assignment gets a row (no capacity factor).
//
// The map (permute_map): assignment a = t * k + j (token t, slot j) goes to row
//     row_of[a] = offsets[e] + #{assignments a' < a with expert e},   e = topk_idx[a],
// i.e. rows are grouped by expert in expert order and, within an expert, in token order (stable); and its inverse
// assignment_of[r] = a (token = a / k). Both int32 [T*k]. An expert with no tokens owns an empty range.
//
//   permute forward:    xs[r, :] = x[assignment_of[r] / k, :]                          (a copy, exact)
//   permute backward:   dx[t, :] = bf16( sum_j dxs[row_of[t*k+j], :] )                  (FP32 sum, j order)
//   unpermute forward:  y[t, :]  = bf16( sum_j w[t, j] * ys[row_of[t*k+j], :] )         (FP32, j order)
//   unpermute backward: dys[row_of[t*k+j], :] = bf16( w[t, j] * dy[t, :] )
//                       dw[t, j] = sum_d dy[t, d] * ys[row_of[t*k+j], d]                (FP32)
// The FP32 sums over j run in slot order with one rounding per product and per sum (no FMA), so the GPU results
// equal the CPU reference bit for bit, except dw, a reduction over D whose order differs (fixed on the GPU:
// results repeat run to run). No atomics anywhere: every output element is written by one thread.
//
// Types: x, xs, ys, y, dy, dxs, dx, dys BF16 row-major; w, dw FP32 [T, k]; maps int32. topk_idx entries must lie
// in [0, E) and be distinct within a token (the router guarantees it; the CPU reference checks, the device does
// not), except on the device, whose map and passes follow the definitions above when a token repeats an expert
// (so k > E is allowed there): the expert-parallel emulation's local routing does (trainer/model/layout_emulation.h).
// Shapes: T >= 0, 1 <= k <= E (device: 1 <= k, E >= 1), D >= 1, T * k < 2^31.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/check.h"
#include "kernels/common/types.h"

namespace fp4moe {

namespace detail {
inline void check_permute_shape(const char* what, int64_t T, int64_t k, int64_t D) {
  FP4MOE_CHECK(T >= 0, "{}: token count T must be >= 0, got T={}", what, T);
  FP4MOE_CHECK(k >= 1, "{}: top-k must be >= 1, got k={}", what, k);
  FP4MOE_CHECK(D >= 1, "{}: hidden size D must be >= 1, got D={}", what, D);
  FP4MOE_CHECK(T <= (int64_t{1} << 31) / k - 1, "{}: T * k must fit in int32 (row indices), got T={} k={}", what, T,
               k);
}
}  // namespace detail

// ---- device (permute.cu), asynchronous on `stream`; pointers are device memory; T = 0 launches nothing -------

// topk_idx [T, k], offsets [E+1] (from expert_counts_and_offsets on the same topk_idx) -> row_of [T*k],
// assignment_of [T*k]. One block per expert scans the assignments in order (a block prefix sum of matches):
// deterministic, no atomics, E * T * k int32 reads (mostly from L2). Rejects (before any launch): bad shapes,
// E < 1, null pointers.
void permute_map(const int32_t* topk_idx, const int32_t* offsets, int64_t T, int64_t k, int64_t E, int32_t* row_of,
                 int32_t* assignment_of, cudaStream_t stream);

// The four passes below reject (fp4moe::Error, before any launch) the shape rules above (T < 0, k < 1, D < 1,
// T * k beyond int32) and, for T > 0, null pointers. Row maps come from permute_map on the same topk_idx.
// x [T, D] -> xs [T*k, D].
void permute_forward(const bf16* x, const int32_t* assignment_of, int64_t T, int64_t k, int64_t D, bf16* xs,
                     cudaStream_t stream);
// dxs [T*k, D] -> dx [T, D].
void permute_backward(const bf16* dxs, const int32_t* row_of, int64_t T, int64_t k, int64_t D, bf16* dx,
                      cudaStream_t stream);
// ys [T*k, D], w [T, k] -> y [T, D].
void unpermute_forward(const bf16* ys, const float* w, const int32_t* row_of, int64_t T, int64_t k, int64_t D,
                       bf16* y, cudaStream_t stream);
// dy [T, D], ys [T*k, D] (the forward's input), w [T, k] -> dys [T*k, D], dw [T, k].
void unpermute_backward(const bf16* dy, const bf16* ys, const float* w, const int32_t* row_of, int64_t T, int64_t k,
                        int64_t D, bf16* dys, float* dw, cudaStream_t stream);

// ---- CPU references (permute_ref.cpp), host memory ------------------------------------------------------------
// The map, from the definition above; rejects entries of topk_idx outside [0, E) or repeated within a token.
// Writes counts [E] and offsets [E+1] too (expert_counts_and_offsets_ref).
void permute_map_ref(const int32_t* topk_idx, int64_t T, int64_t k, int64_t E, int32_t* counts, int32_t* offsets,
                     int32_t* row_of, int32_t* assignment_of);

// The four passes in Real = float or double arithmetic on Real tensors (same layouts). With Real = float the
// GPU's BF16 results are these outputs rounded to BF16 (round to nearest even), inputs widened from BF16.
template <typename Real>
void permute_forward_ref(const Real* x, const int32_t* assignment_of, int64_t T, int64_t k, int64_t D, Real* xs);
template <typename Real>
void permute_backward_ref(const Real* dxs, const int32_t* row_of, int64_t T, int64_t k, int64_t D, Real* dx);
template <typename Real>
void unpermute_forward_ref(const Real* ys, const Real* w, const int32_t* row_of, int64_t T, int64_t k, int64_t D,
                           Real* y);
// dys: w[t, j] * dy[t, :] (for Real = float the GPU rounds it to BF16); dw in index order over d.
template <typename Real>
void unpermute_backward_ref(const Real* dy, const Real* ys, const Real* w, const int32_t* row_of, int64_t T,
                            int64_t k, int64_t D, Real* dys, Real* dw);

}  // namespace fp4moe
