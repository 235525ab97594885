// MoE token permutation kernels (permute.h). BF16 tensors are handled as their uint16 bit patterns and widened /
// rounded with the exact codecs of formats.h, so that the CPU reference in float reproduces them bit for bit.
// The map: one block per expert, a block prefix sum of match counts over tiles of assignments in order. The copies and combines: one
// block per output row (grid-striding), threads along the hidden dimension, sums over the k slots in slot order.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <initializer_list>

#include "kernels/formats/formats.h"
#include "kernels/nn/permute.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kMapItems = 8;  // assignments per thread and tile in permute_map
constexpr int64_t kMaxGrid = 65536;

__device__ __forceinline__ float widen(uint16_t b) { return bf16_bits_to_f32(b); }

// One block per expert e. The assignments are walked in tiles of kThreads * kMapItems; thread i of a tile owns
// kMapItems consecutive assignments, so an exclusive block sum of the per-thread match counts gives each thread
// the rank of its first match: rows follow assignment order (stable) with no atomics.
__global__ void permute_map_kernel(const int32_t* __restrict__ topk_idx, const int32_t* __restrict__ offsets,
                                   int64_t n, int32_t* __restrict__ row_of, int32_t* __restrict__ assignment_of) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  const int e = blockIdx.x;
  const int32_t first_row = offsets[e];
  int base = 0;
  for (int64_t a0 = 0; a0 < n; a0 += static_cast<int64_t>(kThreads) * kMapItems) {
    const int64_t first = a0 + static_cast<int64_t>(threadIdx.x) * kMapItems;
    unsigned matches = 0;
    int count = 0;
#pragma unroll
    for (int i = 0; i < kMapItems; ++i)
      if (first + i < n && topk_idx[first + i] == e) {
        matches |= 1u << i;
        ++count;
      }
    int prefix = 0, total = 0;
    Scan(temp).ExclusiveSum(count, prefix, total);
    int32_t r = first_row + base + prefix;
#pragma unroll
    for (int i = 0; i < kMapItems; ++i)
      if (matches & (1u << i)) {
        row_of[first + i] = r;
        assignment_of[r] = static_cast<int32_t>(first + i);
        ++r;
      }
    base += total;
    __syncthreads();  // temp storage is reused by the next tile
  }
}

// xs[r, :] = x[assignment_of[r] / k, :], in units of Vec (uint16 or 16-byte uint4); D in units of Vec.
template <typename Vec>
__global__ void permute_forward_kernel(const Vec* __restrict__ x, const int32_t* __restrict__ assignment_of,
                                       int64_t rows, int k, int64_t D, Vec* __restrict__ xs) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = assignment_of[r] / k;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) xs[r * D + d] = x[t * D + d];
  }
}

__global__ void permute_backward_kernel(const uint16_t* __restrict__ dxs, const int32_t* __restrict__ row_of,
                                        int64_t T, int k, int64_t D, uint16_t* __restrict__ dx) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x)
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < k; ++j) acc = __fadd_rn(acc, widen(dxs[static_cast<int64_t>(row_of[t * k + j]) * D + d]));
      dx[t * D + d] = f32_to_bf16_bits(acc);
    }
}

__global__ void unpermute_forward_kernel(const uint16_t* __restrict__ ys, const float* __restrict__ w,
                                         const int32_t* __restrict__ row_of, int64_t T, int k, int64_t D,
                                         uint16_t* __restrict__ y) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x)
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < k; ++j)
        acc = __fadd_rn(acc, __fmul_rn(w[t * k + j], widen(ys[static_cast<int64_t>(row_of[t * k + j]) * D + d])));
      y[t * D + d] = f32_to_bf16_bits(acc);
    }
}

// Fixed-shape tree sum over the block (kThreads a power of two): the same order on every run.
__device__ float block_sum(float v, float* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) scratch[threadIdx.x] = __fadd_rn(scratch[threadIdx.x], scratch[threadIdx.x + s]);
    __syncthreads();
  }
  const float total = scratch[0];
  __syncthreads();  // scratch is reused by the next call
  return total;
}

__global__ void unpermute_backward_kernel(const uint16_t* __restrict__ dy, const uint16_t* __restrict__ ys,
                                          const float* __restrict__ w, const int32_t* __restrict__ row_of, int64_t T,
                                          int k, int64_t D, uint16_t* __restrict__ dys, float* __restrict__ dw) {
  __shared__ float scratch[kThreads];
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x)
    for (int j = 0; j < k; ++j) {
      const int64_t r = row_of[t * k + j];
      const float wj = w[t * k + j];
      float part = 0.0f;
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        const float g = widen(dy[t * D + d]);
        dys[r * D + d] = f32_to_bf16_bits(__fmul_rn(wj, g));
        part = __fadd_rn(part, __fmul_rn(g, widen(ys[r * D + d])));
      }
      const float total = block_sum(part, scratch);
      if (threadIdx.x == 0) dw[t * k + j] = total;
    }
}

unsigned grid_for(int64_t rows) { return static_cast<unsigned>(std::max<int64_t>(1, std::min(rows, kMaxGrid))); }

const uint16_t* bits(const bf16* p) { return reinterpret_cast<const uint16_t*>(p); }
uint16_t* bits(bf16* p) { return reinterpret_cast<uint16_t*>(p); }

void check_pointers(const char* what, std::initializer_list<const void*> ptrs, const char* names) {
  for (const void* p : ptrs) FP4MOE_CHECK(p != nullptr, "{}: null pointer among {}", what, names);
}

}  // namespace

void permute_map(const int32_t* topk_idx, const int32_t* offsets, int64_t T, int64_t k, int64_t E, int32_t* row_of,
                 int32_t* assignment_of, cudaStream_t stream) {
  const char* what = "permute_map";
  detail::check_permute_shape(what, T, k, 1);
  FP4MOE_CHECK(E >= 1 && E <= (int64_t{1} << 31) - 1, "{}: expected 1 <= E < 2^31, got E={}", what, E);
  if (T == 0) return;
  check_pointers(what, {topk_idx, offsets, row_of, assignment_of},
                 "topk_idx [T, k], offsets [E+1], row_of [T*k], assignment_of [T*k]");
  permute_map_kernel<<<static_cast<unsigned>(E), kThreads, 0, stream>>>(topk_idx, offsets, T * k, row_of,
                                                                       assignment_of);
  CUDA_CHECK_LAUNCH();
}

void permute_forward(const bf16* x, const int32_t* assignment_of, int64_t T, int64_t k, int64_t D, bf16* xs,
                     cudaStream_t stream) {
  const char* what = "permute_forward";
  detail::check_permute_shape(what, T, k, D);
  if (T == 0) return;
  check_pointers(what, {x, assignment_of, xs}, "x [T, D], assignment_of [T*k], xs [T*k, D]");
  const int64_t rows = T * k;
  const bool vec16 = D % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(xs) % 16 == 0;
  if (vec16) {
    permute_forward_kernel<uint4><<<grid_for(rows), kThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(x), assignment_of, rows, static_cast<int>(k), D / 8,
        reinterpret_cast<uint4*>(xs));
  } else {
    permute_forward_kernel<uint16_t><<<grid_for(rows), kThreads, 0, stream>>>(bits(x), assignment_of, rows,
                                                                              static_cast<int>(k), D, bits(xs));
  }
  CUDA_CHECK_LAUNCH();
}

void permute_backward(const bf16* dxs, const int32_t* row_of, int64_t T, int64_t k, int64_t D, bf16* dx,
                      cudaStream_t stream) {
  const char* what = "permute_backward";
  detail::check_permute_shape(what, T, k, D);
  if (T == 0) return;
  check_pointers(what, {dxs, row_of, dx}, "dxs [T*k, D], row_of [T*k], dx [T, D]");
  permute_backward_kernel<<<grid_for(T), kThreads, 0, stream>>>(bits(dxs), row_of, T, static_cast<int>(k), D,
                                                                bits(dx));
  CUDA_CHECK_LAUNCH();
}

void unpermute_forward(const bf16* ys, const float* w, const int32_t* row_of, int64_t T, int64_t k, int64_t D,
                       bf16* y, cudaStream_t stream) {
  const char* what = "unpermute_forward";
  detail::check_permute_shape(what, T, k, D);
  if (T == 0) return;
  check_pointers(what, {ys, w, row_of, y}, "ys [T*k, D], w [T, k], row_of [T*k], y [T, D]");
  unpermute_forward_kernel<<<grid_for(T), kThreads, 0, stream>>>(bits(ys), w, row_of, T, static_cast<int>(k), D,
                                                                 bits(y));
  CUDA_CHECK_LAUNCH();
}

void unpermute_backward(const bf16* dy, const bf16* ys, const float* w, const int32_t* row_of, int64_t T, int64_t k,
                        int64_t D, bf16* dys, float* dw, cudaStream_t stream) {
  const char* what = "unpermute_backward";
  detail::check_permute_shape(what, T, k, D);
  if (T == 0) return;
  check_pointers(what, {dy, ys, w, row_of, dys, dw},
                 "dy [T, D], ys [T*k, D], w [T, k], row_of [T*k], dys [T*k, D], dw [T, k]");
  unpermute_backward_kernel<<<grid_for(T), kThreads, 0, stream>>>(bits(dy), bits(ys), w, row_of, T,
                                                                  static_cast<int>(k), D, bits(dys), dw);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
