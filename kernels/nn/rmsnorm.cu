// RMSNorm forward and backward kernels (rmsnorm.h). Memory-bound: one warp per row for the row statistics (forward
// sum of squares, backward dot product), kVec = 8 BF16 per 16-byte access when C % 8 == 0 and the pointers are
// 16-byte aligned, else kVec = 1. Each row is read twice by its warp (statistic, then output); the second read
// mostly hits L2. dweight is a column reduction over rows: blocks own a 32 * kVec column tile and one of S row
// splits, and write per-split partial sums that a second kernel adds in split order (no atomics: deterministic).
#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/nn/nn_checks.h"
#include "kernels/nn/nn_vec.cuh"
#include "kernels/nn/rmsnorm.h"

namespace fp4moe {
namespace {

using nn_detail::load_bf16;
using nn_detail::store_bf16;
using nn_detail::warp_sum;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 32 == 0, "whole warps: the row sums shuffle across all lanes");

// x [N, C] -> y [N, C], rstd [N]. One warp per row; lanes take the row's kVec-element chunks in turn.
// x is not __restrict__: y may be x (each lane reads its chunk before writing it).
template <int kVec>
__global__ void __launch_bounds__(kThreads)
rmsnorm_forward_kernel(const bf16* x, const bf16* __restrict__ weight, int64_t N, int64_t C, float eps,
                       bf16* y, float* __restrict__ rstd) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  if (row >= N) return;  // whole warps leave together
  const bf16* xr = x + row * C;
  bf16* yr = y + row * C;
  float sum_sq = 0.0f;
  for (int64_t c = int64_t{lane} * kVec; c < C; c += 32 * kVec) {
    float v[kVec];
    load_bf16<kVec>(xr + c, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum_sq += v[i] * v[i];
  }
  sum_sq = warp_sum(sum_sq);
  const float r = 1.0f / sqrtf(sum_sq / static_cast<float>(C) + eps);
  if (rstd != nullptr && lane == 0) rstd[row] = r;
  for (int64_t c = int64_t{lane} * kVec; c < C; c += 32 * kVec) {
    float v[kVec], w[kVec];
    load_bf16<kVec>(xr + c, v);
    load_bf16<kVec>(weight + c, w);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = v[i] * r * w[i];
    store_bf16<kVec>(yr + c, v);
  }
}

// dy, x [N, C], rstd [N] -> dx [N, C]. One warp per row: the dot product sum_c g * xhat, then dx.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
rmsnorm_backward_dx_kernel(const bf16* dy, const bf16* __restrict__ x, const bf16* __restrict__ weight,
                           const float* __restrict__ rstd, int64_t N, int64_t C, bf16* dx) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  if (row >= N) return;
  const bf16* dyr = dy + row * C;
  const bf16* xr = x + row * C;
  const float r = rstd[row];
  float dot = 0.0f;
  for (int64_t c = int64_t{lane} * kVec; c < C; c += 32 * kVec) {
    float g[kVec], v[kVec], w[kVec];
    load_bf16<kVec>(dyr + c, g);
    load_bf16<kVec>(xr + c, v);
    load_bf16<kVec>(weight + c, w);
#pragma unroll
    for (int i = 0; i < kVec; ++i) dot += (g[i] * w[i]) * (v[i] * r);
  }
  const float mean = warp_sum(dot) / static_cast<float>(C);
  bf16* dxr = dx + row * C;
  for (int64_t c = int64_t{lane} * kVec; c < C; c += 32 * kVec) {
    float g[kVec], v[kVec], w[kVec];
    load_bf16<kVec>(dyr + c, g);
    load_bf16<kVec>(xr + c, v);
    load_bf16<kVec>(weight + c, w);
#pragma unroll
    for (int i = 0; i < kVec; ++i) g[i] = r * (g[i] * w[i] - (v[i] * r) * mean);
    store_bf16<kVec>(dxr + c, g);  // in place (dx == dy) is safe: this lane read these elements above
  }
}

// Row splits of the dweight reduction: a function of N only, so that the summation order (and the result) does not
// depend on the device. About 256 rows per split, at most 64 splits.
constexpr int64_t kRowsPerSplit = 256, kMaxSplits = 64;
int64_t dweight_splits(int64_t N) { return std::clamp<int64_t>(ceil_div(N, kRowsPerSplit), 1, kMaxSplits); }

// dy, x [N, C], rstd [N] -> partial [S, C]: partial[s, c] = sum over the rows of split s of dy * x * rstd.
// Grid (column tiles of 32 * kVec, S). Warp w of the block takes rows w, w + 8, ... of the split; the 8 warp sums
// are added in warp order through shared memory.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
rmsnorm_backward_dweight_partial_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                        const float* __restrict__ rstd, int64_t N, int64_t C, int64_t rows_per_split,
                                        float* __restrict__ partial) {
  __shared__ float sums[kWarps][32 * kVec];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c0 = int64_t{blockIdx.x} * 32 * kVec + int64_t{lane} * kVec;
  const int64_t row_begin = int64_t{blockIdx.y} * rows_per_split;
  const int64_t row_end = N < row_begin + rows_per_split ? N : row_begin + rows_per_split;
  float acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
  if (c0 < C) {
    for (int64_t row = row_begin + warp; row < row_end; row += kWarps) {
      float g[kVec], v[kVec];
      load_bf16<kVec>(dy + row * C + c0, g);
      load_bf16<kVec>(x + row * C + c0, v);
      const float r = rstd[row];
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] += g[i] * (v[i] * r);
    }
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) sums[warp][lane * kVec + i] = acc[i];
  __syncthreads();
  for (int j = threadIdx.x; j < 32 * kVec; j += kThreads) {
    const int64_t c = int64_t{blockIdx.x} * 32 * kVec + j;
    if (c >= C) continue;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += sums[w][j];
    partial[int64_t{blockIdx.y} * C + c] = s;
  }
}

// partial [S, C] -> dweight [C] (= or +=), splits added in order.
__global__ void __launch_bounds__(kThreads)
rmsnorm_backward_dweight_finish_kernel(const float* __restrict__ partial, int64_t S, int64_t C, bool accumulate,
                                       float* __restrict__ dweight) {
  for (int64_t c = int64_t{blockIdx.x} * kThreads + threadIdx.x; c < C; c += int64_t{gridDim.x} * kThreads) {
    float s = 0.0f;
    for (int64_t k = 0; k < S; ++k) s += partial[k * C + c];
    dweight[c] = accumulate ? dweight[c] + s : s;
  }
}

unsigned row_blocks(int64_t N) { return static_cast<unsigned>(ceil_div(N, kWarps)); }

}  // namespace

void rmsnorm_forward(const bf16* x, const bf16* weight, int64_t N, int64_t C, float eps, bf16* y, float* rstd,
                     cudaStream_t stream) {
  const char* what = "rmsnorm_forward";
  nn_detail::check_matrix_shape(what, "N", N, "C", C);
  FP4MOE_CHECK(std::isfinite(eps) && eps > 0, "{}: eps must be finite and > 0, got {}", what, eps);
  FP4MOE_CHECK(N <= int64_t{0x7FFFFFFF} * kWarps, "{}: N={} rows exceed the grid", what, N);
  if (N == 0) return;
  const std::pair<const char*, const void*> bf16_args[] = {{"x", x}, {"weight", weight}, {"y", y}};
  bool vec = C % 8 == 0;
  for (const auto& [name, p] : bf16_args) {
    nn_detail::check_not_null(what, name, p);
    nn_detail::check_aligned(what, name, p, 2);
    vec = vec && nn_detail::is_aligned(p, 16);
  }
  if (rstd != nullptr) nn_detail::check_aligned(what, "rstd", rstd, 4);
  if (vec)
    rmsnorm_forward_kernel<8><<<row_blocks(N), kThreads, 0, stream>>>(x, weight, N, C, eps, y, rstd);
  else
    rmsnorm_forward_kernel<1><<<row_blocks(N), kThreads, 0, stream>>>(x, weight, N, C, eps, y, rstd);
  CUDA_CHECK_LAUNCH();
}

int64_t rmsnorm_backward_workspace_floats(int64_t N, int64_t C) {
  nn_detail::check_matrix_shape("rmsnorm_backward_workspace_floats", "N", N, "C", C);
  return dweight_splits(N) * C;
}

void rmsnorm_backward(const bf16* dy, const bf16* x, const bf16* weight, const float* rstd, int64_t N, int64_t C,
                      bf16* dx, float* dweight, bool accumulate_dweight, float* workspace, cudaStream_t stream) {
  const char* what = "rmsnorm_backward";
  nn_detail::check_matrix_shape(what, "N", N, "C", C);
  FP4MOE_CHECK(N <= int64_t{0x7FFFFFFF} * kWarps, "{}: N={} rows exceed the grid", what, N);
  const std::pair<const char*, const void*> fp32_args[] = {{"rstd", rstd}, {"dweight", dweight},
                                                           {"workspace", workspace}};
  for (const auto& [name, p] : fp32_args) {
    nn_detail::check_not_null(what, name, p);
    nn_detail::check_aligned(what, name, p, 4);
  }
  const std::pair<const char*, const void*> bf16_args[] = {{"dy", dy}, {"x", x}, {"weight", weight}, {"dx", dx}};
  bool vec = C % 8 == 0;
  if (N > 0) {
    for (const auto& [name, p] : bf16_args) {
      nn_detail::check_not_null(what, name, p);
      nn_detail::check_aligned(what, name, p, 2);
      vec = vec && nn_detail::is_aligned(p, 16);
    }
  }
  const int64_t S = dweight_splits(N);
  const unsigned finish_blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(C, kThreads), 4096));
  if (N == 0) {  // empty sums: dweight = 0, or unchanged when accumulating
    if (!accumulate_dweight) CUDA_CHECK(cudaMemsetAsync(dweight, 0, C * sizeof(float), stream));
    return;
  }
  const int64_t rows_per_split = ceil_div(N, S);
  // dweight first: dx may overwrite dy (in place).
  if (vec) {
    const dim3 grid(static_cast<unsigned>(ceil_div(C, 32 * 8)), static_cast<unsigned>(S));
    rmsnorm_backward_dweight_partial_kernel<8><<<grid, kThreads, 0, stream>>>(dy, x, rstd, N, C, rows_per_split,
                                                                                workspace);
    CUDA_CHECK_LAUNCH();
    rmsnorm_backward_dx_kernel<8><<<row_blocks(N), kThreads, 0, stream>>>(dy, x, weight, rstd, N, C, dx);
  } else {
    const dim3 grid(static_cast<unsigned>(ceil_div(C, 32)), static_cast<unsigned>(S));
    rmsnorm_backward_dweight_partial_kernel<1><<<grid, kThreads, 0, stream>>>(dy, x, rstd, N, C, rows_per_split,
                                                                                workspace);
    CUDA_CHECK_LAUNCH();
    rmsnorm_backward_dx_kernel<1><<<row_blocks(N), kThreads, 0, stream>>>(dy, x, weight, rstd, N, C, dx);
  }
  CUDA_CHECK_LAUNCH();
  rmsnorm_backward_dweight_finish_kernel<<<finish_blocks, kThreads, 0, stream>>>(workspace, S, C,
                                                                                  accumulate_dweight, dweight);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
